//! `DistributedDataParallel` (the gradient all-reduce) and `Join` (uneven inputs) over a
//! simulated `World`, run in lock-step: see `join` in the library.

use std::cell::{RefCell, RefMut};
use std::rc::Rc;

use js_sys::Array;
use serde::Deserialize;
use serde_json::Value;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, busy, js, js_ranks};
use super::convert::{json_from_js, or_undefined};
use super::handles;
use super::replicas::{SharedReplicas, borrow_mut, replicas_of};
use super::settings::{options_naming, read_js};
use super::typings::{ReplicasArg, WorldArg};
use super::world::{communicator, world_of};
use super::zero::{ZeroHandle, zero_of};
use distopt::ddp::DistributedDataParallel;
use distopt::error::{Error, Result};
use distopt::join::{Join, JoinOptions, Joinable};
use distopt::zero::ZeroRedundancyOptimizer;

/// The DDP module and the replicas it wraps.
pub(crate) struct DdpHandle {
    ddp: RefCell<DistributedDataParallel>,
    replicas: SharedReplicas,
}

#[wasm_bindgen]
extern "C" {
    /// The joinables of a `Join`.
    #[wasm_bindgen(
        typescript_type = "readonly (DistributedDataParallel | ZeroRedundancyOptimizer)[]"
    )]
    pub type JoinablesArg;

    /// `Join`'s options.
    #[wasm_bindgen(typescript_type = "JoinOptions")]
    pub type JoinOptionsArg;

    /// Per rank: whether it still has an input.
    #[wasm_bindgen(typescript_type = "readonly boolean[]")]
    pub type HasInputArg;
}

/// `torch.nn.parallel.DistributedDataParallel`'s gradient synchronization over a simulated
/// `World`, the model held by a `Replicas` (one replica per rank). The constructor broadcasts
/// rank 0's parameters to every rank, as DDP's does.
#[wasm_bindgen(js_name = DistributedDataParallel)]
pub struct DistributedDataParallelJs {
    inner: Rc<DdpHandle>,
}

impl DdpHandle {
    fn ddp(&self) -> Result<RefMut<'_, DistributedDataParallel>> {
        self.ddp
            .try_borrow_mut()
            .map_err(|_| busy("DistributedDataParallel"))
    }
}

#[wasm_bindgen(js_class = DistributedDataParallel)]
impl DistributedDataParallelJs {
    /// Wraps `replicas` (one rank per replica of `world`) and broadcasts rank 0's parameters
    /// to every rank, as DDP's constructor does.
    #[wasm_bindgen(constructor)]
    pub fn new(world: WorldArg, replicas: ReplicasArg) -> JsResult<DistributedDataParallelJs> {
        let world = js(world_of(&world))?;
        let shared = js(replicas_of(&replicas))?;
        let ddp = {
            let mut replicas = js(borrow_mut(&shared))?;
            js(DistributedDataParallel::new(
                communicator(&world),
                &mut replicas,
            ))?
        };
        let inner = Rc::new(DdpHandle {
            ddp: RefCell::new(ddp),
            replicas: shared,
        });
        Ok(DistributedDataParallelJs { inner })
    }

    /// Hands the module to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptDdp, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// The backward pass's gradient all-reduce, once every rank's local gradients are set:
    /// every rank with inputs gets `Σ_r fl32(G_r · fl32(1/D))` over the ranks with inputs (a
    /// missing gradient counts as zeros), `D` the world size, or, in a `Join` with
    /// `divideByInitialWorldSize: false` of which DDP is the first joinable, the number of
    /// ranks with inputs. Ranks that joined contribute zeros and keep their own gradients. A
    /// failure carries every rank's error (`rankErrors`).
    #[wasm_bindgen(js_name = synchronizeGradients)]
    pub fn synchronize_gradients(&self) -> JsResult<()> {
        let mut ddp = js(self.inner.ddp())?;
        let mut replicas = js(borrow_mut(&self.inner.replicas))?;
        js_ranks(ddp.synchronize_gradients(&mut replicas))
    }
}

/// A participant of a `Join`.
enum Participant {
    Ddp(Rc<DdpHandle>),
    Zero(Rc<ZeroHandle>),
}

impl Participant {
    fn replicas(&self) -> &SharedReplicas {
        match self {
            Participant::Ddp(h) => &h.replicas,
            Participant::Zero(h) => &h.replicas,
        }
    }
}

/// The borrowed joinables of a `Join`, in order.
enum Borrowed<'a> {
    Ddp(RefMut<'a, DistributedDataParallel>),
    Zero(RefMut<'a, ZeroRedundancyOptimizer>),
}

fn borrow_all(participants: &[Participant]) -> Result<Vec<Borrowed<'_>>> {
    participants
        .iter()
        .map(|p| match p {
            Participant::Ddp(h) => h.ddp().map(Borrowed::Ddp),
            Participant::Zero(h) => h
                .zero
                .try_borrow_mut()
                .map(Borrowed::Zero)
                .map_err(|_| busy("optimizer")),
        })
        .collect()
}

fn as_joinables<'a>(borrowed: &'a mut [Borrowed<'_>]) -> Vec<&'a mut dyn Joinable> {
    borrowed
        .iter_mut()
        .map(|b| match b {
            Borrowed::Ddp(d) => &mut **d as &mut dyn Joinable,
            Borrowed::Zero(z) => &mut **z as &mut dyn Joinable,
        })
        .collect()
}

/// `Join`'s options (PyTorch's keyword arguments and their defaults).
#[derive(Deserialize, Tsify)]
#[serde(rename_all = "camelCase", default)]
#[tsify(rename = "JoinOptions")]
pub struct JoinSettings {
    /// Uneven-input detection (default true); off, uneven inputs are a RuntimeError.
    enable: bool,
    /// Raise on every rank as soon as one runs out of inputs (default false): `RuntimeError`
    /// `Rank r exhausted all inputs.` on the ranks that did, `Detected at least one rank that
    /// exhausted inputs. Throwing across all ranks.` on the others, each in `rankErrors`.
    throw_on_early_termination: bool,
    /// DDP's join hook keyword (default true): divide by the initial world size, not the
    /// active ranks.
    divide_by_initial_world_size: bool,
}

impl Default for JoinSettings {
    fn default() -> Self {
        let d = JoinOptions::default();
        JoinSettings {
            enable: d.enable,
            throw_on_early_termination: d.throw_on_early_termination,
            divide_by_initial_world_size: d.divide_by_initial_world_size,
        }
    }
}

/// `Join`'s options, PyTorch's defaults where absent (`JoinOptions`).
fn join_options(value: &JsValue) -> Result<JoinOptions> {
    let s: JoinSettings = read_js(
        value,
        "options",
        "options must be an object {enable, throwOnEarlyTermination, divideByInitialWorldSize}",
        &options_naming("Join", |key| format!("options.{key}")),
    )?
    .unwrap_or_default();
    let mut options = JoinOptions::default();
    options.enable = s.enable;
    options.throw_on_early_termination = s.throw_on_early_termination;
    options.divide_by_initial_world_size = s.divide_by_initial_world_size;
    Ok(options)
}

/// `torch.distributed.algorithms.Join` over `DistributedDataParallel` and
/// `ZeroRedundancyOptimizer` objects sharing one `Replicas`, run in lock-step: every global
/// iteration starts with `iteration(hasInput)`; the joinables' calls that follow
/// (`ddp.synchronizeGradients()`, `zero.step()`) make one collective for all ranks, in which
/// the ranks that joined run their join hooks (DDP's shadows the all-reduce with zeros, ZeRO's
/// steps with the gradients the rank still holds); `exit()` ends the context and runs the
/// post-hooks (DDP broadcasts the final model from the last rank to join). Put DDP first, as
/// PyTorch requires.
#[wasm_bindgen(js_name = Join)]
pub struct JoinJs {
    join: RefCell<Join>,
    participants: Vec<Participant>,
}

#[wasm_bindgen(js_class = Join)]
impl JoinJs {
    /// `Join(joinables, enable, throw_on_early_termination, divide_by_initial_world_size=…)`
    /// over `DistributedDataParallel` and `ZeroRedundancyOptimizer` objects sharing one
    /// `Replicas` (DDP first). A ValueError without joinables (`The join context manager
    /// requires at least one joinable`).
    #[wasm_bindgen(constructor)]
    pub fn new(joinables: JoinablesArg, options: Option<JoinOptionsArg>) -> JsResult<JoinJs> {
        let options = or_undefined(options);
        js(Self::build(&joinables, &options))
    }

    fn build(joinables: &JsValue, options: &JsValue) -> Result<JoinJs> {
        let options = join_options(options)?;
        if !Array::is_array(joinables) {
            return Err(Error::type_error(
                "joinables must be an array of DistributedDataParallel and ZeroRedundancyOptimizer objects",
            ));
        }
        let items: &Array = joinables.unchecked_ref();
        let participants = items
            .iter()
            .enumerate()
            .map(|(k, item)| {
                if let Some(zero) = zero_of(&item) {
                    return Ok(Participant::Zero(zero));
                }
                handles::resolve(
                    &item,
                    "__distoptDdp",
                    &format!(
                        "joinables[{k}] must be a DistributedDataParallel or a ZeroRedundancyOptimizer"
                    ),
                )
                .map(Participant::Ddp)
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(first) = participants.first() {
            if participants
                .iter()
                .any(|p| !Rc::ptr_eq(p.replicas(), first.replicas()))
            {
                return Err(Error::value(
                    "the joinables of a Join must share one Replicas (the model they train)",
                ));
            }
        }
        let join = {
            let mut borrowed = borrow_all(&participants)?;
            Join::new(&mut as_joinables(&mut borrowed), options)?
        };
        Ok(JoinJs {
            join: RefCell::new(join),
            participants,
        })
    }

    fn join(&self) -> Result<RefMut<'_, Join>> {
        self.join.try_borrow_mut().map_err(|_| busy("Join"))
    }

    /// The start of a global iteration: `hasInput[i]` is whether the rank of replica `i` still
    /// has an input (a rank without one joins for good): every rank of a simulated world, this
    /// process's rank in a run over NATS.
    pub fn iteration(
        &self,
        #[wasm_bindgen(js_name = hasInput)] has_input: HasInputArg,
    ) -> JsResult<()> {
        let flags = match js(json_from_js(&has_input, "hasInput"))? {
            Value::Array(items) if items.iter().all(Value::is_boolean) => items
                .iter()
                .map(|v| v.as_bool().unwrap_or(false))
                .collect::<Vec<bool>>(),
            _ => {
                return Err(super::boundary::js_error(Error::type_error(
                    "hasInput must be an array of booleans, one per rank",
                )));
            }
        };
        js(js(self.join())?.iteration(&flags))
    }

    /// The end of the `with` block: the post-hooks of every joinable (with
    /// `throwOnEarlyTermination`, the errors of ranks still shadowing; each rank's in
    /// `rankErrors`).
    pub fn exit(&self) -> JsResult<()> {
        let mut join = js(self.join())?;
        let mut borrowed = js(borrow_all(&self.participants))?;
        let shared = self
            .participants
            .first()
            .map(|p| p.replicas().clone())
            .ok_or_else(|| super::boundary::js_error(Error::value("a Join has joinables")))?;
        let mut replicas = js(borrow_mut(&shared))?;
        js_ranks(join.exit(&mut as_joinables(&mut borrowed), &mut replicas))
    }

    /// Per rank: whether it has joined.
    #[wasm_bindgen(getter, unchecked_return_type = "boolean[]")]
    pub fn joined(&self) -> JsResult<Vec<JsValue>> {
        Ok(js(self.join())?
            .joined()
            .into_iter()
            .map(JsValue::from_bool)
            .collect())
    }

    /// Per rank: shadow iterations it ran since it joined.
    #[wasm_bindgen(js_name = shadowIterations, unchecked_return_type = "number[]")]
    pub fn shadow_iterations(&self) -> JsResult<Array> {
        Ok(js(self.join())?
            .shadow_iterations()
            .into_iter()
            .map(|n| JsValue::from_f64(n as f64))
            .collect())
    }
}
