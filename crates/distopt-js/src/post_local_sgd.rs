//! `PostLocalSGDOptimizer` and `PostLocalSGDState` (the post-local-SGD gradient hook).

use std::cell::{Ref, RefCell};
use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::averaging::averager_of;
use super::boundary::{JsResult, busy, js};
use super::convert::{count_arg, optional_integer_arg, or_undefined};
use super::optim::optimizer_of;
use super::replicas::{borrow_mut, replicas_of};
use super::slot::Owner;
use super::world::{communicator, world_of};
use super::wrapper::{RankState, Wrapper, rank_state};
use distopt::averaging::ModelAverager;
use distopt::optim::LocalOptimizer;
use distopt::post_local_sgd::{PostLocalSgdOptimizer, PostLocalSgdState};

use super::typings::{
    AnyLocalOptimizerArg, BooleanArg, IntegerArg, ModelAveragerArg, ReplicasArg, StateDictArg,
    WorldArg,
};

/// A `PostLocalSGDOptimizer` and the replicas its optimizer was made over.
type PostLocalCore = Wrapper<PostLocalSgdOptimizer>;

rank_state!(PostLocalSgdOptimizer);

/// The optimizer object reads its state through the wrapper it moved into.
impl Owner<dyn LocalOptimizer> for PostLocalCore {
    fn class(&self) -> &'static str {
        "PostLocalSGDOptimizer"
    }

    fn refusal(&self) -> &'static str {
        "step, load and extend it through that"
    }

    fn inner(&self) -> Option<Ref<'_, dyn LocalOptimizer + 'static>> {
        Some(Ref::map(self.get().ok()?, |opt| opt.optim()))
    }
}

/// The averager object reads its counter through the wrapper it moved into.
impl Owner<dyn ModelAverager> for PostLocalCore {
    fn class(&self) -> &'static str {
        "PostLocalSGDOptimizer"
    }

    fn refusal(&self) -> &'static str {
        "it averages through that optimizer's step()"
    }

    fn inner(&self) -> Option<Ref<'_, dyn ModelAverager + 'static>> {
        Some(Ref::map(self.get().ok()?, |opt| opt.averager()))
    }
}

/// `PostLocalSGDOptimizer(optim, averager)`: the local step on every rank, then model averaging
/// over the optimizer's parameters. `optim` and `averager` move into it (as PyTorch's wrapper
/// owns them): they still report their state (`stateDict`, `paramGroups`, `step`), but step
/// only through this object.
#[wasm_bindgen(js_name = PostLocalSGDOptimizer)]
pub struct PostLocalSgdOptimizerJs {
    core: Rc<PostLocalCore>,
}

#[wasm_bindgen(js_class = PostLocalSGDOptimizer)]
impl PostLocalSgdOptimizerJs {
    /// Wraps `optim` (an `SGD`, `Adam` or `AdamW`) and `averager` (a `PeriodicModelAverager`
    /// or `HierarchicalModelAverager`).
    #[wasm_bindgen(constructor)]
    pub fn new(
        optim: AnyLocalOptimizerArg,
        averager: ModelAveragerArg,
    ) -> JsResult<PostLocalSgdOptimizerJs> {
        let optim_core = js(optimizer_of(&optim))?;
        let averager_core = js(averager_of(&averager))?;
        let local = js(optim_core.slot.take())?;
        let averaging = match averager_core.slot.take() {
            Ok(a) => a,
            Err(err) => {
                optim_core.slot.restore(local);
                return Err(super::boundary::js_error(err));
            }
        };
        let core = PostLocalCore::new(
            "PostLocalSGDOptimizer",
            optim_core.replicas.clone(),
            PostLocalSgdOptimizer::new(local, averaging),
        );
        optim_core.slot.wrap(core.clone());
        averager_core.slot.wrap(core.clone());
        Ok(PostLocalSgdOptimizerJs { core })
    }

    /// The local step, then averaging if due. Returns the averaging group size, or `null`
    /// when this step did not average.
    #[wasm_bindgen(unchecked_return_type = "number | null")]
    pub fn step(&self) -> JsResult<JsValue> {
        let used = self.core.with_mut(|opt, replicas| opt.step(replicas))?;
        Ok(used.map_or(JsValue::NULL, |g| JsValue::from_f64(g as f64)))
    }

    /// `zero_grad()` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        self.core.with_mut(|opt, replicas| {
            opt.zero_grad(replicas);
            Ok(())
        })
    }

    /// The averager's step counter.
    #[wasm_bindgen(getter, js_name = averagerStep)]
    pub fn averager_step(&self) -> JsResult<f64> {
        Ok(js(self.core.get())?.averager().step() as f64)
    }

    /// Rank `rank`'s state dict: the optimizer's plus `step`, the averager's counter.
    #[wasm_bindgen(
        js_name = stateDict,
        unchecked_return_type = "Promise<StateDict & { step: number }>"
    )]
    pub fn state_dict(&self, rank: IntegerArg) -> JsResult<Promise> {
        self.core.state_dict_js(&rank)
    }

    /// Loads rank `rank`'s state: the optimizer's and the averager's counter; without `step`
    /// it warns and sets the counter to 0 (as PyTorch does).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(
        &self,
        rank: IntegerArg,
        #[wasm_bindgen(js_name = stateDict)] state_dict: StateDictArg,
    ) -> JsResult<()> {
        self.core.load_state_dict_js(&rank, &state_dict)
    }
}

/// `PostLocalSGDState` + `post_localSGD_hook`: the gradients are all-reduced (mean) over the
/// world for the first `startLocalSGDIter` iterations, then within subgroups of `subgroupSize`
/// ranks (or not at all when `postLocalGradientAllreduce` is false).
#[wasm_bindgen(js_name = PostLocalSGDState)]
pub struct PostLocalSgdStateJs {
    inner: RefCell<PostLocalSgdState>,
}

#[wasm_bindgen(js_class = PostLocalSGDState)]
impl PostLocalSgdStateJs {
    /// @param subgroupSize `null`: the whole world (PyTorch's default, one subgroup per
    ///   machine, is the world here)
    /// @param postLocalGradientAllreduce default true
    #[wasm_bindgen(constructor)]
    pub fn new(
        world: WorldArg,
        #[wasm_bindgen(js_name = subgroupSize)] subgroup_size: Option<IntegerArg>,
        #[wasm_bindgen(js_name = startLocalSGDIter)] start_local_sgd_iter: IntegerArg,
        #[wasm_bindgen(
            js_name = postLocalGradientAllreduce,
            unchecked_optional_param_type = "boolean"
        )]
        post_local_gradient_allreduce: Option<BooleanArg>,
    ) -> JsResult<PostLocalSgdStateJs> {
        let subgroup_size = or_undefined(subgroup_size);
        let post_local_gradient_allreduce = or_undefined(post_local_gradient_allreduce);
        let world = js(world_of(&world))?;
        let post_local_gradient_allreduce = js(super::convert::optional_bool_arg(
            &post_local_gradient_allreduce,
            "postLocalGradientAllreduce",
        ))?;
        let subgroup = js(optional_integer_arg(&subgroup_size, "subgroupSize"))?;
        let start = js(count_arg(&start_local_sgd_iter, "startLocalSGDIter"))? as u64;
        Ok(PostLocalSgdStateJs {
            inner: RefCell::new(js(PostLocalSgdState::new(
                communicator(&world),
                subgroup,
                start,
                post_local_gradient_allreduce.unwrap_or(true),
            ))?),
        })
    }

    /// Iterations seen (PyTorch stops counting once local SGD starts).
    #[wasm_bindgen(getter)]
    pub fn iter(&self) -> JsResult<f64> {
        let state = js(self
            .inner
            .try_borrow()
            .map_err(|_| busy("PostLocalSGDState")))?;
        Ok(state.iter() as f64)
    }

    /// The hook, after every rank's backward pass (after `setGrads`): averages the gradients
    /// in place. Returns the group size, or `null`.
    #[wasm_bindgen(js_name = synchronizeGradients, unchecked_return_type = "number | null")]
    pub fn synchronize_gradients(&self, replicas: ReplicasArg) -> JsResult<JsValue> {
        let replicas = js(replicas_of(&replicas))?;
        let mut state = js(self
            .inner
            .try_borrow_mut()
            .map_err(|_| busy("PostLocalSGDState")))?;
        let mut replicas = js(borrow_mut(&replicas))?;
        let used = js(state.synchronize_gradients(&mut replicas))?;
        Ok(used.map_or(JsValue::NULL, |g| JsValue::from_f64(g as f64)))
    }
}
