//! `DiLoCo`: inner optimizer steps on every rank, and every `syncEvery` of them an outer step
//! with the world's mean pseudo-gradient.

use std::cell::Ref;
use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{integer_arg, json_from_js, json_to_js, or_undefined};
use super::optim::optimizer_of;
use super::replicas::{borrow, borrow_mut};
use super::slot::Owner;
use super::world::{communicator, world_of};
use super::wrapper::{RankState, Wrapper, rank_state};
use distopt::diloco::{DiLoCo, DiLoCoOptions};
use distopt::error::{Error, Result};
use distopt::optim::LocalOptimizer;

use super::typings::AnyLocalOptimizerArg;
use super::typings::{IntegerArg, WorldArg};

#[wasm_bindgen]
extern "C" {
    /// `DiLoCo`'s options (see `DiLoCoOptions`).
    #[wasm_bindgen(typescript_type = "DiLoCoOptions")]
    pub type DiLoCoOptionsArg;

    /// A `DiLoCo` state dict as `loadStateDict` reads it (see `DiLoCoStateDictInput`).
    #[wasm_bindgen(typescript_type = "DiLoCoStateDictInput")]
    pub type DiLoCoStateDictArg;
}

#[wasm_bindgen(typescript_custom_section)]
const DILOCO_OPTIONS: &'static str = r#"
/** `DiLoCo` options. */
export interface DiLoCoOptions {
  /**
   * Send the pseudo-gradients in bfloat16 or float16 (OpenDiLoCo's compressed all-reduce):
   * each rank's pseudo-gradient rounded to it, averaged in it (every quotient and addition
   * rounded), converted back to each parameter's dtype. Default `'none'`.
   */
  compress?: 'none' | 'bf16' | 'f16';
  /**
   * Streaming DiLoCo (torchft's `model_fragments`): the parameters split into fragments (lists of
   * parameter indices, each parameter in exactly one, at most `syncEvery` of them). With `F`
   * fragments, fragment `f`'s outer step comes after local step `(f+1)·syncEvery/F` of every
   * period (torchft's schedule). Default: one fragment of every parameter (plain DiLoCo).
   */
  fragments?: readonly (readonly number[])[];
  /**
   * torchft's `fragment_sync_delay`: a fragment's pseudo-gradient all-reduce starts this many
   * inner steps before its outer step (the inner steps in between still update it). A
   * non-negative integer below `syncEvery / F` (rounded down). Default 0.
   */
  fragmentSyncDelay?: number;
  /**
   * torchft's `fragment_update_alpha` in `[0, 1]`: after an outer step the fragment's parameters
   * become `global.lerp(local, alpha)` (0: the outer step's result; 1: the local parameters, the
   * outer step only moving the saved copy). Default: no mix, the outer step's result as it is.
   * Given, the mix is torchft's even at 0: a value not finite in the outer step's result or
   * the local parameters becomes NaN, as in torchft. torchft's `should_quantize` is not
   * supported (a ValueError): `compress` is distopt's own 16-bit wire format.
   */
  fragmentUpdateAlpha?: number;
}
"#;

#[wasm_bindgen(typescript_custom_section)]
const DILOCO_STATE_DICT: &'static str = r#"
/** A `DiLoCo` state dict (one rank's). */
export interface DiLoCoStateDict {
  /** The inner optimizer's `state_dict()`. */
  inner_optimizer: StateDict;
  /** The outer optimizer's `state_dict()`. */
  outer_optimizer: StateDict;
  /** Inner steps since the start of the period (plain DiLoCo: since the last sync). */
  local_step: number;
  /** The parameters at their fragment's last sync, one tensor per parameter. */
  original_parameters: Tensor[];
  /**
   * The fragment in flight (inside a `fragmentSyncDelay` window): its index and its
   * all-reduced pseudo-gradients (one tensor per parameter of the fragment, in its order), or `null`.
   */
  pending: { fragment: number; pseudo_gradients: Tensor[] } | null;
}

/** A `DiLoCo` state dict as `loadStateDict` accepts it (tensors in any `TensorInput` form). */
export interface DiLoCoStateDictInput {
  inner_optimizer: StateDictInput;
  outer_optimizer: StateDictInput;
  local_step: number;
  original_parameters: readonly TensorInput[];
  /** Required (non-null) exactly when `local_step` lies in a fragment's delay window; missing reads as `null`. */
  pending?: { fragment: number; pseudo_gradients: readonly TensorInput[] } | null;
}
"#;

/// A `DiLoCo` and the replicas its optimizers were made over.
type DiLoCoCore = Wrapper<DiLoCo>;

rank_state!(DiLoCo);

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

impl Owner<dyn LocalOptimizer> for InDiLoCo {
    fn class(&self) -> &'static str {
        "DiLoCo"
    }

    fn refusal(&self) -> &'static str {
        "step and load it through that"
    }

    fn inner(&self) -> Option<Ref<'_, dyn LocalOptimizer + 'static>> {
        let role = self.role;
        Some(Ref::map(self.core.get().ok()?, |diloco| match role {
            Role::Inner => diloco.inner(),
            Role::Outer => diloco.outer(),
        }))
    }
}

/// DiLoCo (torchft's): `inner` steps every rank; every `syncEvery` inner steps the ranks'
/// pseudo-gradients (parameters at the last sync minus the current ones, in each parameter's
/// dtype) are averaged over `world`, the parameters return to the last sync's, and `outer` steps
/// with that gradient. Both optimizers must be built over the same `Replicas` (one rank per rank
/// of `world`); they move into the DiLoCo (their objects still report their state, but step
/// only through it). `DiLoCoOptions` set the wire precision (`compress`) and make it Streaming
/// DiLoCo (`fragments`, `fragmentSyncDelay`, `fragmentUpdateAlpha`).
#[wasm_bindgen(js_name = DiLoCo)]
pub struct DiLoCoJs {
    core: Rc<DiLoCoCore>,
}

impl DiLoCoJs {
    fn diloco(&self) -> Result<Ref<'_, DiLoCo>> {
        self.core.get()
    }
}

#[wasm_bindgen(js_class = DiLoCo)]
impl DiLoCoJs {
    /// Wraps `inner` and `outer`, two optimizers over the same `Replicas` (one rank per rank of
    /// `world`); the current parameters become the first sync point.
    ///
    /// A ValueError when `syncEvery < 1`, the replicas' ranks differ from the world's,
    /// `options.compress` is not a known format, `options.fragments` is not a partition of the
    /// parameters (an IndexError for an index out of range), `fragmentSyncDelay` or
    /// `fragmentUpdateAlpha` is out of range, or `shouldQuantize` is given; a TypeError for an
    /// unknown option or a value of the wrong type.
    #[wasm_bindgen(constructor)]
    pub fn new(
        inner: AnyLocalOptimizerArg,
        outer: AnyLocalOptimizerArg,
        #[wasm_bindgen(js_name = syncEvery)] sync_every: IntegerArg,
        world: WorldArg,
        #[wasm_bindgen(unchecked_optional_param_type = "DiLoCoOptions")] options: Option<
            DiLoCoOptionsArg,
        >,
    ) -> JsResult<DiLoCoJs> {
        let options = or_undefined(options);
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
        let inner_opt = js(inner_core.slot.take())?;
        let outer_opt = match outer_core.slot.take() {
            Ok(o) => o,
            Err(err) => {
                inner_core.slot.restore(inner_opt);
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
        let core = DiLoCoCore::new("DiLoCo", inner_core.replicas.clone(), diloco);
        inner_core.slot.wrap(Rc::new(InDiLoCo {
            core: core.clone(),
            role: Role::Inner,
        }));
        outer_core.slot.wrap(Rc::new(InDiLoCo {
            core: core.clone(),
            role: Role::Outer,
        }));
        Ok(DiLoCoJs { core })
    }

    /// One inner step on every rank, then a sync when due (a fragment's outer step; with
    /// `fragmentSyncDelay`, the start of the next fragment's all-reduce). Returns whether an
    /// outer step was applied. A failed step does not count (the step counter stays).
    pub fn step(&self) -> JsResult<bool> {
        self.core.with_mut(|diloco, replicas| diloco.step(replicas))
    }

    /// `step()`, returning the fragments whose outer step was applied (an array of indices).
    #[wasm_bindgen(js_name = stepFragments)]
    pub fn step_fragments(&self) -> JsResult<Vec<f64>> {
        Ok(self
            .core
            .with_mut(|diloco, replicas| diloco.step_fragments(replicas))?
            .into_iter()
            .map(|f| f as f64)
            .collect())
    }

    /// The fragments' parameter indices (one fragment of every parameter without
    /// `options.fragments`).
    #[wasm_bindgen(getter, unchecked_return_type = "number[][]")]
    pub fn fragments(&self) -> JsResult<JsValue> {
        let fragments = serde_json::json!(js(self.diloco())?.fragments());
        js(json_to_js(&fragments))
    }

    /// torchft's `fragment_sync_delay`.
    #[wasm_bindgen(getter, js_name = fragmentSyncDelay)]
    pub fn fragment_sync_delay(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.fragment_sync_delay() as f64)
    }

    /// torchft's `fragment_update_alpha`, or `null` when none was given (no mix).
    #[wasm_bindgen(getter, js_name = fragmentUpdateAlpha, unchecked_return_type = "number | null")]
    pub fn fragment_update_alpha(&self) -> JsResult<JsValue> {
        Ok(js(self.diloco())?
            .fragment_update_alpha()
            .map_or(JsValue::NULL, JsValue::from))
    }

    /// The fragment whose all-reduce has started and whose outer step waits (inside its
    /// `fragmentSyncDelay` window), or `null`.
    #[wasm_bindgen(getter, js_name = pendingFragment, unchecked_return_type = "number | null")]
    pub fn pending_fragment(&self) -> JsResult<JsValue> {
        Ok(js(self.diloco())?
            .pending_fragment()
            .map_or(JsValue::NULL, |f| JsValue::from_f64(f as f64)))
    }

    /// The outer step now for every fragment (one in flight is applied first), and a new period
    /// (whatever the local step counter says).
    pub fn sync(&self) -> JsResult<()> {
        self.core.with_mut(|diloco, replicas| diloco.sync(replicas))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        let diloco = js(self.diloco())?;
        let mut replicas = js(borrow_mut(&self.core.replicas))?;
        diloco.zero_grad(&mut replicas);
        Ok(())
    }

    /// Inner steps since the start of the period (plain DiLoCo: since the last sync).
    #[wasm_bindgen(getter, js_name = localStep)]
    pub fn local_step(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.local_step() as f64)
    }

    /// The pseudo-gradients' wire precision.
    #[wasm_bindgen(getter, unchecked_return_type = "'none' | 'bf16' | 'f16'")]
    pub fn compress(&self) -> JsResult<String> {
        Ok(js(self.diloco())?.compression().name().to_string())
    }

    /// Inner steps between syncs.
    #[wasm_bindgen(getter, js_name = syncEvery)]
    pub fn sync_every(&self) -> JsResult<f64> {
        Ok(js(self.diloco())?.sync_every() as f64)
    }

    /// Rank `rank`'s state: both optimizers, the local step counter, the last sync's parameters
    /// (and the fragment in flight with its held pseudo-gradients, or `null`).
    #[wasm_bindgen(js_name = stateDict, unchecked_return_type = "Promise<DiLoCoStateDict>")]
    pub fn state_dict(&self, rank: IntegerArg) -> JsResult<Promise> {
        self.core.state_dict_js(&rank)
    }

    /// Loads rank `rank`'s state saved by `stateDict`: both optimizers, the local step counter
    /// and the parameters at the last sync (the model's parameters are restored apart).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(
        &self,
        rank: IntegerArg,
        #[wasm_bindgen(js_name = stateDict)] state_dict: DiLoCoStateDictArg,
    ) -> JsResult<()> {
        self.core.load_state_dict_js(&rank, &state_dict)
    }
}
