//! `ZeroRedundancyOptimizer`: optimizer state sharded over the ranks of a `World`, bound to a
//! `Replicas` at construction.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Promise};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::convert::{json_from_js, json_to_js, optional_string, param_index, rank_index};
use super::optim::{group_from_json, options, param_groups};
use super::replicas::{SharedReplicas, borrow, borrow_mut, replicas_of};
use super::world::{communicator, world_of};
use super::{JsResult, busy, js};
use crate::error::{Error, Result};
use crate::optim::OptionMap;
use crate::zero::{Partition, ZeroOptions, ZeroRedundancyOptimizer};

type SharedZero = Rc<RefCell<ZeroRedundancyOptimizer>>;

/// `torch.distributed.optim.ZeroRedundancyOptimizer` over a simulated `World`: each rank's
/// local optimizer (`SGD`, `Adam` or `AdamW`) keeps state only for the parameters it owns;
/// after each step the owners broadcast their updated parameters to every rank.
#[wasm_bindgen(js_name = ZeroRedundancyOptimizer)]
pub struct ZeroRedundancyOptimizerJs {
    zero: SharedZero,
    replicas: SharedReplicas,
    name: String,
}

/// The parameter groups: `undefined`/`null` (every parameter), a list of parameter indices
/// (one group), or PyTorch-style groups `[{params: [j, …], …options}]`.
fn zero_groups(value: &JsValue, params: usize) -> Result<Vec<(Vec<usize>, OptionMap)>> {
    if js_sys::Array::is_array(value) {
        let items: &Array = value.unchecked_ref();
        if items.length() > 0 && items.iter().all(|v| v.as_f64().is_some()) {
            let indices = items
                .iter()
                .map(|v| super::convert::count(v.as_f64().unwrap_or(f64::NAN), "params[j]"))
                .collect::<Result<Vec<usize>>>()?;
            return Ok(vec![(indices, OptionMap::new())]);
        }
    }
    param_groups(value, params)
}

/// `{parametersAsBucketView, overlapWithDdp}` (both default `false`).
fn zero_options(value: &JsValue) -> Result<ZeroOptions> {
    let map = match json_from_js(value, "zeroOptions")? {
        Value::Null => return Ok(ZeroOptions::default()),
        Value::Object(map) => map,
        _ => {
            return Err(Error::type_error(
                "zeroOptions must be an object {parametersAsBucketView, overlapWithDdp}",
            ));
        }
    };
    let mut options = ZeroOptions::default();
    for (key, value) in &map {
        let flag = match value {
            Value::Bool(b) => *b,
            Value::Null => false,
            _ => {
                return Err(Error::type_error(format!(
                    "zeroOptions.{key} must be a boolean"
                )));
            }
        };
        match key.as_str() {
            "parametersAsBucketView" => options.parameters_as_bucket_view = flag,
            "overlapWithDdp" => options.overlap_with_ddp = flag,
            other => {
                return Err(Error::type_error(format!(
                    "unknown ZeroRedundancyOptimizer option '{other}': expected parametersAsBucketView or overlapWithDdp"
                )));
            }
        }
    }
    Ok(options)
}

fn indices_to_js(indices: &[usize]) -> Array {
    indices
        .iter()
        .map(|&i| JsValue::from_f64(i as f64))
        .collect()
}

fn nested_to_js(lists: &[Vec<usize>]) -> Array {
    lists
        .iter()
        .map(|l| JsValue::from(indices_to_js(l)))
        .collect()
}

impl ZeroRedundancyOptimizerJs {
    fn zero(&self) -> Result<std::cell::Ref<'_, ZeroRedundancyOptimizer>> {
        self.zero.try_borrow().map_err(|_| busy("optimizer"))
    }

    fn zero_mut(&self) -> Result<std::cell::RefMut<'_, ZeroRedundancyOptimizer>> {
        self.zero.try_borrow_mut().map_err(|_| busy("optimizer"))
    }

    fn partition_field(&self, f: impl FnOnce(&Partition) -> JsValue) -> JsResult<JsValue> {
        let zero = js(self.zero())?;
        Ok(zero.partition().map_or(JsValue::NULL, f))
    }
}

#[wasm_bindgen(js_class = ZeroRedundancyOptimizer)]
impl ZeroRedundancyOptimizerJs {
    /// ZeRO over `world` (one rank per replica) and `replicas`. `params`: `null` (every
    /// parameter), parameter indices, or groups `[{params: [j, …], …options}]`; `optimizer`:
    /// `"SGD"`, `"Adam"` or `"AdamW"` with `options` (PyTorch's keyword arguments);
    /// `zeroOptions`: `{parametersAsBucketView, overlapWithDdp}`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        world: JsValue,
        replicas: JsValue,
        params: JsValue,
        optimizer: JsValue,
        options_value: JsValue,
        zero_options_value: JsValue,
    ) -> JsResult<ZeroRedundancyOptimizerJs> {
        js(Self::build(
            &world,
            &replicas,
            &params,
            &optimizer,
            &options_value,
            &zero_options_value,
        ))
    }

    fn build(
        world: &JsValue,
        replicas: &JsValue,
        params: &JsValue,
        optimizer: &JsValue,
        options_value: &JsValue,
        zero_options_value: &JsValue,
    ) -> Result<ZeroRedundancyOptimizerJs> {
        let world = world_of(world)?;
        let shared = replicas_of(replicas)?;
        let name = optional_string(optimizer, "optimizer")?
            .ok_or_else(|| Error::type_error("optimizer must be \"SGD\", \"Adam\" or \"AdamW\""))?;
        if !matches!(name.as_str(), "SGD" | "Adam" | "AdamW") {
            return Err(Error::value(format!(
                "unknown optimizer '{name}': expected SGD, Adam or AdamW"
            )));
        }
        let defaults = options(options_value)?;
        let zero_options = zero_options(zero_options_value)?;
        let zero = {
            let replicas = borrow(&shared)?;
            let groups = zero_groups(params, replicas.len())?;
            // `ZeroRedundancyOptimizer::new` reads the first index's dtype before its own range
            // check: refuse an index out of range here, with its error.
            if let Some(&j) = groups
                .iter()
                .flat_map(|(g, _)| g)
                .find(|&&j| j >= replicas.len())
            {
                return Err(Error::new(
                    crate::error::ErrorKind::IndexError,
                    format!(
                        "parameter index {j} out of range for {} parameters",
                        replicas.len()
                    ),
                ));
            }
            ZeroRedundancyOptimizer::new(
                communicator(&world),
                &replicas,
                groups,
                &name,
                &defaults,
                zero_options,
            )?
        };
        Ok(ZeroRedundancyOptimizerJs {
            zero: Rc::new(RefCell::new(zero)),
            replicas: shared,
            name,
        })
    }

    /// The local optimizer class: `"SGD"`, `"Adam"` or `"AdamW"`.
    #[wasm_bindgen(getter)]
    pub fn optimizer(&self) -> String {
        self.name.clone()
    }

    /// One step: every rank updates the parameters it owns from its own gradients, then the
    /// owners broadcast them to every rank.
    pub fn step(&self) -> JsResult<()> {
        let mut zero = js(self.zero_mut())?;
        let mut replicas = js(borrow_mut(&self.replicas))?;
        js(zero.step(&mut replicas))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        let zero = js(self.zero())?;
        let mut replicas = js(borrow_mut(&self.replicas))?;
        zero.zero_grad(&mut replicas);
        Ok(())
    }

    /// Sets `requires_grad` of parameter `j` (with `parametersAsBucketView`, frozen
    /// parameters leave the buckets at the next step).
    #[wasm_bindgen(js_name = setRequiresGrad)]
    pub fn set_requires_grad(&self, j: f64, requires_grad: JsValue) -> JsResult<()> {
        let len = js(borrow(&self.replicas))?.len();
        let j = js(param_index(j, len))?;
        let flag = requires_grad
            .as_bool()
            .ok_or_else(|| super::js_error(Error::type_error("requiresGrad must be a boolean")))?;
        js(self.zero_mut())?.set_requires_grad(j, flag);
        Ok(())
    }

    /// The parameter indices of each parameter group.
    #[wasm_bindgen(js_name = paramGroups)]
    pub fn param_groups(&self) -> JsResult<Array> {
        Ok(nested_to_js(&js(self.zero())?.param_groups()))
    }

    /// Adds `{params: [j, …], …options}` as a new parameter group (the partition is
    /// recomputed; earlier parameters keep their ranks and their state): a promise.
    #[wasm_bindgen(js_name = addParamGroup)]
    pub fn add_param_group(&self, group: JsValue) -> JsResult<Promise> {
        let (params, options) =
            js(json_from_js(&group, "group").and_then(|g| group_from_json(g, "group")))?;
        let (zero, replicas) = (self.zero.clone(), self.replicas.clone());
        Ok(future_to_promise(async move {
            js(add_param_group(&zero, &replicas, params, &options).await)?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// Gathers every rank's shard of the state on rank `to` (a `to` outside the world keeps
    /// it nowhere, as in PyTorch): a promise.
    #[wasm_bindgen(js_name = consolidateStateDict)]
    pub fn consolidate_state_dict(&self, to: Option<f64>) -> JsResult<Promise> {
        let to = js(super::convert::integer(to.unwrap_or(0.0), "to"))?;
        let (zero, replicas) = (self.zero.clone(), self.replicas.clone());
        Ok(future_to_promise(async move {
            js(consolidate(&zero, &replicas, to).await)?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// `state_dict()` as seen on rank `rank`: the consolidated state dict on the rank it was
    /// consolidated to (a `RuntimeError` elsewhere).
    #[wasm_bindgen(js_name = stateDict)]
    pub fn state_dict(&self, rank: f64) -> JsResult<JsValue> {
        let zero = js(self.zero())?;
        let ranks = js(borrow(&self.replicas))?.ranks();
        let rank = js(rank_index(rank, ranks))?;
        js(zero.state_dict(rank).and_then(|sd| json_to_js(&sd)))
    }

    /// `load_state_dict(stateDict)` on every rank: each keeps the state of the parameters it
    /// owns (whatever world size the dict was saved with).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(&self, state_dict: JsValue) -> JsResult<()> {
        let state_dict = js(json_from_js(&state_dict, "stateDict"))?;
        let mut zero = js(self.zero_mut())?;
        let replicas = js(borrow(&self.replicas))?;
        js(zero.load_state_dict(&replicas, &state_dict))
    }

    /// The owner of each parameter (global index: the groups' parameters in order), or
    /// `null` before the optimizer is initialized (`overlapWithDdp`).
    #[wasm_bindgen(getter, js_name = rankOfParam)]
    pub fn rank_of_param(&self) -> JsResult<JsValue> {
        self.partition_field(|p| indices_to_js(&p.rank_of_param).into())
    }

    /// The global indices each rank owns, or `null` before initialization.
    #[wasm_bindgen(getter, js_name = paramsPerRank)]
    pub fn params_per_rank(&self) -> JsResult<JsValue> {
        self.partition_field(|p| nested_to_js(&p.params_per_rank).into())
    }

    /// The global indices each rank owns, split by parameter group, or `null`.
    #[wasm_bindgen(getter, js_name = paramsPerRankPerGroup)]
    pub fn params_per_rank_per_group(&self) -> JsResult<JsValue> {
        self.partition_field(|p| {
            p.params_per_rank_per_group
                .iter()
                .map(|groups| JsValue::from(nested_to_js(groups)))
                .collect::<Array>()
                .into()
        })
    }

    /// Elements each rank owns, or `null` before initialization.
    #[wasm_bindgen(getter, js_name = numelPerRank)]
    pub fn numel_per_rank(&self) -> JsResult<JsValue> {
        self.partition_field(|p| indices_to_js(&p.numel_per_rank).into())
    }

    /// Per rank: how many parameters have optimizer state.
    #[wasm_bindgen(js_name = localStateSizes)]
    pub fn local_state_sizes(&self) -> JsResult<Array> {
        Ok(indices_to_js(&js(self.zero())?.local_state_sizes()))
    }

    /// Per rank: bytes of optimizer state allocated (its shard only).
    #[wasm_bindgen(js_name = stateBytesPerRank)]
    pub fn state_bytes_per_rank(&self) -> JsResult<Array> {
        Ok(indices_to_js(&js(self.zero())?.state_bytes_per_rank()))
    }
}

// These hold the optimizer and the replicas across the reads on purpose: a change made
// meanwhile is refused (`busy`) instead of racing them.

#[allow(clippy::await_holding_refcell_ref)]
async fn add_param_group(
    zero: &SharedZero,
    replicas: &SharedReplicas,
    params: Vec<usize>,
    options: &OptionMap,
) -> Result<()> {
    let mut zero = zero.try_borrow_mut().map_err(|_| busy("optimizer"))?;
    let replicas = borrow(replicas)?;
    zero.add_param_group(&replicas, params, options).await
}

#[allow(clippy::await_holding_refcell_ref)]
async fn consolidate(zero: &SharedZero, replicas: &SharedReplicas, to: i64) -> Result<()> {
    let mut zero = zero.try_borrow_mut().map_err(|_| busy("optimizer"))?;
    let replicas = borrow(replicas)?;
    zero.consolidate_state_dict(&replicas, to).await
}
