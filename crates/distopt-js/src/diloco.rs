//! `DiLoCo`: inner optimizer steps on every rank, and every `syncEvery` of them an outer step
//! with the world's mean pseudo-gradient.

use std::cell::{BorrowError, Ref, RefCell};
use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, busy, js};
use super::convert::{integer_arg, json_from_js, json_to_js, rank_arg};
use super::optim::{OptimSlot, OptimizerOwner, optimizer_of};
use super::replicas::{SharedReplicas, borrow, borrow_mut};
use super::world::{communicator, world_of};
use distopt::diloco::{DiLoCo, DiLoCoOptions};
use distopt::error::{Error, Result};
use distopt::optim::LocalOptimizer;

/// A `DiLoCo` and the replicas its optimizers were made over.
pub(crate) struct DiLoCoCore {
    pub(crate) replicas: SharedReplicas,
    pub(crate) diloco: RefCell<DiLoCo>,
}

/// Which of a `DiLoCo`'s optimizers an optimizer object is.
#[derive(Clone, Copy)]
enum Role {
    Inner,
    Outer,
}

/// One of a `DiLoCo`'s two optimizers, as its optimizer object reads it through the `DiLoCo`.
struct InDiLoCo {
    core: Rc<DiLoCoCore>,
    role: Role,
}

impl OptimizerOwner for InDiLoCo {
    fn class(&self) -> &'static str {
        "DiLoCo"
    }

    fn refusal(&self) -> &'static str {
        "step and load it through that"
    }

    fn optimizer(&self) -> std::result::Result<Ref<'_, dyn LocalOptimizer>, BorrowError> {
        let role = self.role;
        Ok(Ref::map(
            self.core.diloco.try_borrow()?,
            |diloco| match role {
                Role::Inner => diloco.inner(),
                Role::Outer => diloco.outer(),
            },
        ))
    }
}

/// `DiLoCo(inner, outer, syncEvery, world, options?)`: `inner` (an `SGD`, `Adam` or `AdamW`)
/// steps every rank; every `syncEvery` steps the ranks' pseudo-gradients (parameters at the
/// last sync minus the current ones) are averaged over `world`, the parameters go back to the
/// last sync's, and `outer` (built over the same `Replicas`) steps with that gradient.
/// `options.compress` (`'bf16'`, `'f16'` or `'none'`, the default) sends the pseudo-gradients
/// in that precision (averaged in it, then converted back to each parameter's dtype).
/// `options.fragments` (lists of parameter indices) makes it Streaming DiLoCo as torchft runs
/// it, with `options.fragmentSyncDelay` (torchft's `fragment_sync_delay`: a fragment's
/// all-reduce starts that many inner steps before its outer step) and
/// `options.fragmentUpdateAlpha` (torchft's `fragment_update_alpha`: the outer step's result
/// lerped towards the local parameters). torchft's `should_quantize` is refused (a
/// `ValueError`): `compress` is distopt's 16-bit wire format.
///
/// Both optimizers move into it, as `PostLocalSGDOptimizer` takes its optimizer: afterwards
/// they still report their state (`stateDict`, `paramGroups`) but step only through this
/// object.
#[wasm_bindgen(js_name = DiLoCo)]
pub struct DiLoCoJs {
    core: Rc<DiLoCoCore>,
}

impl DiLoCoJs {
    fn diloco_mut(&self) -> Result<std::cell::RefMut<'_, DiLoCo>> {
        self.core
            .diloco
            .try_borrow_mut()
            .map_err(|_| busy("DiLoCo"))
    }

    fn diloco(&self) -> Result<std::cell::Ref<'_, DiLoCo>> {
        self.core.diloco.try_borrow().map_err(|_| busy("DiLoCo"))
    }
}

#[wasm_bindgen(js_class = DiLoCo)]
impl DiLoCoJs {
    /// Wraps `inner` and `outer`, two optimizers over the same `Replicas` (one rank per rank of
    /// `world`); the current parameters become the first sync point.
    #[wasm_bindgen(constructor)]
    pub fn new(
        inner: JsValue,
        outer: JsValue,
        sync_every: JsValue,
        world: JsValue,
        options: JsValue,
    ) -> JsResult<DiLoCoJs> {
        let sync_every = js(integer_arg(&sync_every, "syncEvery"))?;
        let options = js(json_from_js(&options, "options")
            .and_then(|options| DiLoCoOptions::from_options(&options)))?;
        let world = js(world_of(&world))?;
        let inner_core = js(optimizer_of(&inner))?;
        let outer_core = js(optimizer_of(&outer))?;
        if Rc::ptr_eq(&inner_core, &outer_core) {
            return Err(super::boundary::js_error(Error::value(
                "the inner and the outer optimizer must be two different optimizers",
            )));
        }
        if !Rc::ptr_eq(&inner_core.replicas, &outer_core.replicas) {
            return Err(super::boundary::js_error(Error::value(
                "the inner and the outer optimizer must be built over the same Replicas",
            )));
        }
        js(borrow(&inner_core.replicas).and_then(|replicas| {
            DiLoCo::check_arguments(&replicas, sync_every, &*communicator(&world))?;
            options.check(replicas.len(), sync_every)
        }))?;
        let inner_opt = js(inner_core.take())?;
        let outer_opt = match outer_core.take() {
            Ok(o) => o,
            Err(err) => {
                inner_core.install(OptimSlot::Own(inner_opt));
                return Err(super::boundary::js_error(err));
            }
        };
        let built = borrow(&inner_core.replicas).and_then(|replicas| {
            DiLoCo::with_options(
                &replicas,
                inner_opt,
                outer_opt,
                sync_every,
                communicator(&world),
                options,
            )
        });
        let diloco = match built {
            Ok(d) => d,
            Err(err) => {
                // Arguments were checked above: only allocating the backups can fail here
                // (device out of memory), and the optimizers went down with the constructor.
                // Their JS objects then report "busy" until freed.
                return Err(super::boundary::js_error(err));
            }
        };
        let core = Rc::new(DiLoCoCore {
            replicas: inner_core.replicas.clone(),
            diloco: RefCell::new(diloco),
        });
        inner_core.install(OptimSlot::Wrapped(Rc::new(InDiLoCo {
            core: core.clone(),
            role: Role::Inner,
        })));
        outer_core.install(OptimSlot::Wrapped(Rc::new(InDiLoCo {
            core: core.clone(),
            role: Role::Outer,
        })));
        Ok(DiLoCoJs { core })
    }

    /// One inner step on every rank, then the sync work due at this step (a fragment's outer
    /// step; with `fragmentSyncDelay`, the start of the next fragment's all-reduce). Returns
    /// whether an outer step was applied. A failed step does not count (the step counter stays).
    pub fn step(&self) -> JsResult<bool> {
        let mut diloco = js(self.diloco_mut())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        js(diloco.step(&mut replicas))
    }

    /// `step()`, returning the fragments whose outer step was applied (an array of indices).
    #[wasm_bindgen(js_name = stepFragments)]
    pub fn step_fragments(&self) -> JsResult<Vec<f64>> {
        let mut diloco = js(self.diloco_mut())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        Ok(js(diloco.step_fragments(&mut replicas))?
            .into_iter()
            .map(|f| f as f64)
            .collect())
    }

    /// The fragments' parameter indices (one fragment of every parameter without
    /// `options.fragments`).
    #[wasm_bindgen(getter)]
    pub fn fragments(&self) -> JsResult<JsValue> {
        let fragments = serde_json::json!(js(self.diloco())?.fragments());
        js(json_to_js(&fragments))
    }

    /// torchft's `fragment_sync_delay`.
    #[wasm_bindgen(getter, js_name = fragmentSyncDelay)]
    pub fn fragment_sync_delay(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.fragment_sync_delay() as f64)
    }

    /// torchft's `fragment_update_alpha`.
    #[wasm_bindgen(getter, js_name = fragmentUpdateAlpha)]
    pub fn fragment_update_alpha(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.fragment_update_alpha())
    }

    /// The fragment whose all-reduce has started and whose outer step waits (inside its
    /// `fragmentSyncDelay` window), or `null`.
    #[wasm_bindgen(getter, js_name = pendingFragment)]
    pub fn pending_fragment(&self) -> JsResult<JsValue> {
        Ok(js(self.diloco())?
            .pending_fragment()
            .map_or(JsValue::NULL, |f| JsValue::from_f64(f as f64)))
    }

    /// The outer step now (whatever the local step counter says).
    pub fn sync(&self) -> JsResult<()> {
        let mut diloco = js(self.diloco_mut())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        js(diloco.sync(&mut replicas))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        let diloco = js(self.diloco())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        diloco.zero_grad(&mut replicas);
        Ok(())
    }

    /// Inner steps since the start of the current period (for plain DiLoCo: since the last
    /// sync).
    #[wasm_bindgen(getter, js_name = localStep)]
    pub fn local_step(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.local_step() as f64)
    }

    /// The pseudo-gradients' wire precision: `'none'`, `'bf16'` or `'f16'`.
    #[wasm_bindgen(getter)]
    pub fn compress(&self) -> JsResult<String> {
        Ok(js(self.diloco())?.compression().name().to_string())
    }

    /// Inner steps between syncs.
    #[wasm_bindgen(getter, js_name = syncEvery)]
    pub fn sync_every(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.sync_every() as f64)
    }

    /// Rank `rank`'s state (a promise): `{inner_optimizer, outer_optimizer, local_step,
    /// original_parameters, pending}` (`pending`: `null`, or the fragment in flight and its
    /// held pseudo-gradients).
    #[wasm_bindgen(js_name = stateDict)]
    pub fn state_dict(&self, rank: JsValue) -> JsResult<Promise> {
        let rank = js(rank_arg(&rank, js(borrow(&self.core.replicas))?.ranks()))?;
        let core = self.core.clone();
        Ok(super::boundary::promise_now(async move {
            js(state_dict_json(&core, rank)
                .await
                .and_then(|sd| json_to_js(&sd)))
        }))
    }

    /// Loads rank `rank`'s state saved by `stateDict`: both optimizers, the local step counter
    /// and the parameters at the last sync.
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(&self, rank: JsValue, state_dict: JsValue) -> JsResult<()> {
        let state_dict = js(json_from_js(&state_dict, "stateDict"))?;
        let mut diloco = js(self.diloco_mut())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        js(diloco.load_state_dict(&mut replicas, rank, &state_dict))
    }
}

/// Holds DiLoCo and the replicas across the readback on purpose: a change made meanwhile is
/// refused (`busy`) instead of racing the read.
#[allow(clippy::await_holding_refcell_ref)]
async fn state_dict_json(core: &DiLoCoCore, rank: usize) -> Result<serde_json::Value> {
    let diloco = core.diloco.try_borrow().map_err(|_| busy("DiLoCo"))?;
    let replicas = borrow(&core.replicas)?;
    diloco.state_dict(&replicas, rank).await
}
