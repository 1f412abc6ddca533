//! What a wrapper class (`PostLocalSGDOptimizer`, `DiLoCo`) holds: its algorithm and the
//! replicas the wrapped optimizers were made over, borrowed together by each call, and the
//! per-rank state-dict calls both classes have.

use std::cell::{Ref, RefCell, RefMut};
use std::rc::Rc;

use js_sys::Promise;
use serde_json::Value;
use wasm_bindgen::JsValue;

use super::boundary::{JsResult, busy, js, promise_now};
use super::convert::{json_from_js, json_to_js, rank_arg};
use super::replicas::{SharedReplicas, borrow, borrow_mut};
use distopt::error::Result;
use distopt::replicas::Replicas;

/// An algorithm whose state is saved and loaded one rank at a time, in PyTorch's layout.
pub(crate) trait RankState {
    /// Rank `rank`'s state dict.
    async fn state_dict(&self, replicas: &Replicas, rank: usize) -> Result<Value>;

    /// Loads rank `rank`'s state from `state_dict`.
    fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()>;
}

/// Implements [`RankState`] for a library type through its own methods of the same names.
macro_rules! rank_state {
    ($type:ty) => {
        impl RankState for $type {
            async fn state_dict(
                &self,
                replicas: &distopt::replicas::Replicas,
                rank: usize,
            ) -> distopt::error::Result<serde_json::Value> {
                <$type>::state_dict(self, replicas, rank).await
            }

            fn load_state_dict(
                &mut self,
                replicas: &mut distopt::replicas::Replicas,
                rank: usize,
                state_dict: &serde_json::Value,
            ) -> distopt::error::Result<()> {
                <$type>::load_state_dict(self, replicas, rank, state_dict)
            }
        }
    };
}
pub(crate) use rank_state;

/// A wrapper's algorithm `A` and the replicas it steps.
pub(crate) struct Wrapper<A> {
    /// The replicas the wrapped optimizers were made over.
    pub(crate) replicas: SharedReplicas,
    algorithm: RefCell<A>,
    /// The JS class, as "busy" errors name it.
    class: &'static str,
}

impl<A> Wrapper<A> {
    /// `algorithm` over `replicas`, held by an object of JS class `class`.
    pub(crate) fn new(class: &'static str, replicas: SharedReplicas, algorithm: A) -> Rc<Self> {
        Rc::new(Wrapper {
            replicas,
            algorithm: RefCell::new(algorithm),
            class,
        })
    }

    /// The algorithm, borrowed (an error while an earlier asynchronous call holds it).
    pub(crate) fn get(&self) -> Result<Ref<'_, A>> {
        self.algorithm.try_borrow().map_err(|_| busy(self.class))
    }

    /// The algorithm, borrowed mutably.
    pub(crate) fn get_mut(&self) -> Result<RefMut<'_, A>> {
        self.algorithm
            .try_borrow_mut()
            .map_err(|_| busy(self.class))
    }

    /// Runs `f` on the algorithm and the replicas, both borrowed mutably.
    pub(crate) fn with_mut<R>(
        &self,
        f: impl FnOnce(&mut A, &mut Replicas) -> Result<R>,
    ) -> JsResult<R> {
        let mut algorithm = js(self.get_mut())?;
        let mut replicas = js(borrow_mut(&self.replicas))?;
        js(f(&mut algorithm, &mut replicas))
    }
}

impl<A: RankState + 'static> Wrapper<A> {
    /// `stateDict(rank)`: a promise of rank `rank`'s state dict, read as of the call.
    pub(crate) fn state_dict_js(self: &Rc<Self>, rank: &JsValue) -> JsResult<Promise> {
        let rank = js(rank_arg(rank, js(borrow(&self.replicas))?.ranks()))?;
        let wrapper = self.clone();
        Ok(promise_now(async move {
            js(wrapper
                .state_dict(rank)
                .await
                .and_then(|sd| json_to_js(&sd)))
        }))
    }

    /// Holds the algorithm and the replicas across the readback on purpose: a change made
    /// meanwhile is refused (`busy`) instead of racing the read.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn state_dict(&self, rank: usize) -> Result<Value> {
        let algorithm = self.get()?;
        let replicas = borrow(&self.replicas)?;
        algorithm.state_dict(&replicas, rank).await
    }

    /// `loadStateDict(rank, stateDict)`.
    pub(crate) fn load_state_dict_js(&self, rank: &JsValue, state_dict: &JsValue) -> JsResult<()> {
        let state_dict = js(json_from_js(state_dict, "stateDict"))?;
        self.with_mut(|algorithm, replicas| {
            let rank = rank_arg(rank, replicas.ranks())?;
            algorithm.load_state_dict(replicas, rank, &state_dict)
        })
    }
}
