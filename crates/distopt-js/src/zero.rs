//! `ZeroRedundancyOptimizer`: optimizer state sharded over the ranks of a `World`, bound to a
//! `Replicas` at construction.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Promise};
use serde::Deserialize;
use serde_json::Value;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, busy, js, js_ranks};
use super::convert::{json_from_js, json_to_js, or_undefined};
use super::handles;
use super::optim::{group_from_json, options};
use super::replicas::{SharedReplicas, borrow, borrow_mut, replicas_of};
use super::settings::{options_naming, read_js};
use super::typings::{
    BooleanArg, IntegerArg, OptimizerClassArg, OptimizerOptionsArg, ReplicasArg, StateDictArg,
    WorldArg,
};
use super::world::{communicator, world_of};
use distopt::dtype::DType;
use distopt::error::{Error, ErrorKind, RankErrors, Result};
use distopt::optim::OptionMap;
use distopt::replicas::Replicas;
use distopt::zero::args::{ParamItem, ParamsArg, TensorArg};
use distopt::zero::{Partition, ZeroOptions, ZeroRedundancyOptimizer};

pub(crate) type SharedZero = Rc<RefCell<ZeroRedundancyOptimizer>>;

#[wasm_bindgen]
extern "C" {
    /// ZeRO's `params`: replica parameter indices and tensor descriptions, parameter groups,
    /// a lone item, or `null` (every parameter).
    #[wasm_bindgen(
        typescript_type = "readonly ZeroParam[] | readonly ZeroParamGroup<SGDOptions | AdamOptions>[] | ZeroParam | null"
    )]
    pub type ZeroParamsArg;

    /// `ZeroRedundancyOptimizer`'s own construction options.
    #[wasm_bindgen(typescript_type = "ZeroOptions")]
    pub type ZeroOptionsArg;

    /// A parameter group for `addParamGroup`.
    #[wasm_bindgen(typescript_type = "ParamGroup<SGDOptions | AdamOptions>")]
    pub type ZeroAddedGroupArg;
}

/// `torch.distributed.optim.ZeroRedundancyOptimizer` over a simulated `World`: the parameters
/// are assigned to ranks by PyTorch's sorted-greedy partition; each rank's local optimizer
/// (`SGD`, `Adam` or `AdamW`) keeps state only for the parameters it owns and updates them
/// from that rank's own gradients; the owners then broadcast the updated parameters to every
/// rank. The optimizer is bound to the `Replicas` it was constructed with.
///
/// Global parameter indices (`rankOfParam`, `paramsPerRank`, state dict keys) number the
/// groups' parameters in order, group after group.
#[wasm_bindgen(js_name = ZeroRedundancyOptimizer)]
pub struct ZeroRedundancyOptimizerJs {
    inner: Rc<ZeroHandle>,
    name: String,
}

/// The optimizer and the replicas it was built for.
pub(crate) struct ZeroHandle {
    pub(crate) zero: SharedZero,
    pub(crate) replicas: SharedReplicas,
    /// The world rank of replica 0 (0 in a simulated world; this process's rank in a run).
    pub(crate) first_rank: usize,
}

/// The optimizer behind a JS `ZeroRedundancyOptimizer` argument, if it is one.
pub(crate) fn zero_of(value: &JsValue) -> Option<Rc<ZeroHandle>> {
    handles::resolve(value, "__distoptZero", "a ZeroRedundancyOptimizer").ok()
}

/// One item of `params` before the replica indices are resolved.
enum Item {
    /// An integer: a replica parameter index (maybe out of range).
    Index(i64),
    /// A tensor that is not one of the replicas' parameters: `{dtype, shape, device?,
    /// layout?, leaf?}` (or a tensor with data).
    Described(TensorArg),
    /// A parameter group: `{params: [...], ...options}` (`params` may be missing).
    Group(Option<Vec<Item>>, OptionMap),
    /// Anything else, by its Python type name.
    Other(String),
}

/// Python's name of a JSON value's type.
fn python_type(value: &Value) -> String {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
    .into()
}

#[wasm_bindgen(typescript_custom_section)]
const ZERO_PARAMS: &'static str = r#"
/**
 * A tensor given to `ZeroRedundancyOptimizer` that is not one of the replicas' parameters (a
 * replica parameter is its index): PyTorch's checks see it with its dtype, device, layout and
 * leaf-ness, and reject it as PyTorch does (a meta or sparse tensor, a non-leaf tensor, a dtype
 * unlike the others); one that passes the checks is a ValueError, it has no data to optimize.
 */
export interface TensorDescription {
  dtype: DTypeName;
  shape?: readonly number[];
  device?: 'cpu' | 'meta';
  layout?: 'strided' | 'sparse_coo';
  leaf?: boolean;
}

/** An item of ZeRO's `params`: a replica parameter index or a tensor description. */
export type ZeroParam = number | TensorDescription;

/** A ZeRO parameter group: its parameters and its options (without `params`: PyTorch's ValueError). */
export type ZeroParamGroup<O> = O & { params?: readonly ZeroParam[] };
"#;

/// Turns `params` (as JSON) into items; descriptions get ids after the replicas' parameters.
struct ParamsReader<'a> {
    replicas: &'a Replicas,
    described: usize,
}

impl ParamsReader<'_> {
    fn description(&mut self, map: &serde_json::Map<String, Value>) -> Result<TensorArg> {
        let dtype = DType::parse(map["dtype"].as_str().unwrap_or_default())?;
        self.described += 1;
        Ok(TensorArg {
            id: self.replicas.len() + self.described - 1,
            dtype,
            meta: map.get("device").and_then(Value::as_str) == Some("meta"),
            sparse: map.get("layout").and_then(Value::as_str) == Some("sparse_coo"),
            leaf: map.get("leaf").and_then(Value::as_bool).unwrap_or(true),
        })
    }

    fn item(&mut self, value: &Value) -> Result<Item> {
        Ok(match value {
            Value::Number(n) if n.is_i64() || n.is_u64() => {
                Item::Index(n.as_i64().unwrap_or(i64::MAX))
            }
            Value::Object(map) if map.contains_key("dtype") => {
                Item::Described(self.description(map)?)
            }
            Value::Object(map) => {
                let mut options = map.clone();
                let params = match options.remove("params") {
                    None => None,
                    Some(Value::Array(items)) => Some(
                        items
                            .iter()
                            .map(|v| self.item(v))
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    Some(other) => Some(vec![self.item(&other)?]),
                };
                Item::Group(params, options)
            }
            other => Item::Other(python_type(other)),
        })
    }

    fn tensor(&self, index: i64) -> Option<TensorArg> {
        let j = usize::try_from(index)
            .ok()
            .filter(|&j| j < self.replicas.len())?;
        Some(TensorArg {
            id: j,
            dtype: self.replicas.dtype(j),
            meta: false,
            sparse: false,
            leaf: true,
        })
    }

    /// A group's tensor; anything else is PyTorch's `add_param_group` TypeError.
    fn group_tensor(&self, item: Item) -> Result<TensorArg> {
        match item {
            Item::Index(i) => self.tensor(i).ok_or_else(|| out_of_range(i, self.replicas)),
            Item::Described(t) => Ok(t),
            Item::Group(..) => Err(Error::type_error(
                "optimizer can only optimize Tensors, but one of the params is dict",
            )),
            Item::Other(name) => Err(Error::type_error(format!(
                "optimizer can only optimize Tensors, but one of the params is {name}"
            ))),
        }
    }

    fn list_item(&self, item: Item) -> Result<ParamItem> {
        Ok(match item {
            Item::Index(i) => match self.tensor(i) {
                Some(t) => ParamItem::Tensor(t),
                None => ParamItem::Other("int".into()),
            },
            Item::Described(t) => ParamItem::Tensor(t),
            Item::Group(params, options) => ParamItem::Group {
                params: params
                    .map(|items| {
                        items
                            .into_iter()
                            .map(|i| self.group_tensor(i))
                            .collect::<Result<Vec<_>>>()
                    })
                    .transpose()?,
                options,
            },
            Item::Other(name) => ParamItem::Other(name),
        })
    }
}

fn out_of_range(index: i64, replicas: &Replicas) -> Error {
    Error::new(
        ErrorKind::IndexError,
        format!(
            "parameter index {index} out of range for {} parameters",
            replicas.len()
        ),
    )
}

/// The `params` argument as PyTorch's ZeRO sees it: `undefined`/`null` (every parameter),
/// or a list of replica parameter indices and of tensor descriptions, or of groups
/// `{params: [...], ...options}`; any other value reaches PyTorch's checks as what it is in
/// Python (a number is an `int` or a `float`, a lone `{dtype, shape}` a single tensor). A
/// list of the right form with an index out of range is an `IndexError`.
fn params_arg(value: &JsValue, replicas: &Replicas) -> Result<ParamsArg> {
    let json = json_from_js(value, "params")?;
    let mut reader = ParamsReader {
        replicas,
        described: 0,
    };
    let items = match json {
        Value::Null => {
            return Ok(ParamsArg::List(
                (0..replicas.len() as i64)
                    .filter_map(|j| reader.tensor(j).map(ParamItem::Tensor))
                    .collect(),
            ));
        }
        Value::Array(items) => items
            .iter()
            .map(|v| reader.item(v))
            .collect::<Result<Vec<_>>>()?,
        Value::Object(map) if map.contains_key("dtype") => {
            return Ok(ParamsArg::Tensor(reader.description(&map)?));
        }
        // Iterating a dict yields its keys (strings); a string yields strings.
        Value::Object(map) => map.keys().map(|_| Item::Other("str".into())).collect(),
        Value::String(text) => text.chars().map(|_| Item::Other("str".into())).collect(),
        other => return Ok(ParamsArg::NotIterable(python_type(&other))),
    };
    let tensors = items
        .iter()
        .all(|i| matches!(i, Item::Index(_) | Item::Described(_)));
    let groups = items.iter().all(|i| matches!(i, Item::Group(..)));
    if !tensors && !groups {
        // PyTorch rejects the form before it looks into any group.
        return Ok(ParamsArg::List(
            items
                .into_iter()
                .map(|i| match i {
                    Item::Group(_, options) => ParamItem::Group {
                        params: Some(Vec::new()),
                        options,
                    },
                    other => reader
                        .list_item(other)
                        .unwrap_or(ParamItem::Other("int".into())),
                })
                .collect(),
        ));
    }
    if let Some(&Item::Index(i)) = items
        .iter()
        .find(|i| matches!(i, Item::Index(i) if reader.tensor(*i).is_none()))
    {
        // Of the right form: an index out of range is an IndexError.
        return Err(out_of_range(i, replicas));
    }
    Ok(ParamsArg::List(
        items
            .into_iter()
            .map(|i| reader.list_item(i))
            .collect::<Result<Vec<_>>>()?,
    ))
}

/// `ZeroRedundancyOptimizer`'s own construction options (`null` reads as false).
#[derive(Default, Deserialize, Tsify)]
#[serde(rename_all = "camelCase")]
#[tsify(rename = "ZeroOptions")]
pub struct ZeroSettings {
    /// Pack each rank's parameters into one flat bucket, broadcast as one transfer (default
    /// false).
    #[tsify(optional)]
    parameters_as_bucket_view: Option<bool>,
    /// Overlap the optimizer with DDP's backward (default false). Without DDP the optimizer
    /// never finishes initializing, as in PyTorch: `step()` only warns, the partition getters
    /// are `null`, and the state-dict methods throw a RuntimeError.
    #[tsify(optional)]
    overlap_with_ddp: Option<bool>,
}

/// ZeRO's own options (`ZeroOptions`).
fn zero_options(value: &JsValue) -> Result<ZeroOptions> {
    let s: ZeroSettings = read_js(
        value,
        "zeroOptions",
        "zeroOptions must be an object {parametersAsBucketView, overlapWithDdp}",
        &options_naming("ZeroRedundancyOptimizer", |key| {
            format!("zeroOptions.{key}")
        }),
    )?
    .unwrap_or_default();
    Ok(ZeroOptions::default()
        .with_parameters_as_bucket_view(s.parameters_as_bucket_view.unwrap_or(false))
        .with_overlap_with_ddp(s.overlap_with_ddp.unwrap_or(false)))
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
        self.inner.zero.try_borrow().map_err(|_| busy("optimizer"))
    }

    fn zero_mut(&self) -> Result<std::cell::RefMut<'_, ZeroRedundancyOptimizer>> {
        self.inner
            .zero
            .try_borrow_mut()
            .map_err(|_| busy("optimizer"))
    }

    fn partition_field(&self, f: impl FnOnce(&Partition) -> JsValue) -> JsResult<JsValue> {
        let zero = js(self.zero())?;
        Ok(zero.partition().map_or(JsValue::NULL, f))
    }
}

#[wasm_bindgen(js_class = ZeroRedundancyOptimizer)]
impl ZeroRedundancyOptimizerJs {
    /// @param world one rank per replica (a ValueError otherwise).
    /// @param params PyTorch's `params` argument: `null` (every parameter in one group), a list of
    ///   parameter indices (and tensor descriptions), or parameter groups `[{params: [j, …],
    ///   …options}]`, checked as PyTorch checks it (an empty list is a ValueError; a list mixing
    ///   parameters and groups, or holding other values, a TypeError; a number or a lone tensor
    ///   description instead of a list a TypeError; an index out of range an IndexError). A
    ///   failure is every rank's (`rankErrors`).
    /// @param optimizer the local optimizer class, as PyTorch takes it: `SGD`, `Adam`, `AdamW`
    ///   (the classes this package exports) or their names (from plain JS, another name gets
    ///   PyTorch's error, for example for `'NAdam'` or `'_FunctionalSGD'`).
    /// @param options its keyword arguments (the defaults of every group).
    #[wasm_bindgen(constructor)]
    pub fn new(
        world: WorldArg,
        replicas: ReplicasArg,
        params: ZeroParamsArg,
        optimizer: OptimizerClassArg,
        #[wasm_bindgen(js_name = options)] options_value: Option<OptimizerOptionsArg>,
        #[wasm_bindgen(js_name = zeroOptions)] zero_options_value: Option<ZeroOptionsArg>,
    ) -> JsResult<ZeroRedundancyOptimizerJs> {
        let options_value = or_undefined(options_value);
        let zero_options_value = or_undefined(zero_options_value);
        Self::build(
            &world,
            &replicas,
            &params,
            &optimizer,
            &options_value,
            &zero_options_value,
        )
    }

    fn build(
        world: &JsValue,
        replicas: &JsValue,
        params: &JsValue,
        optimizer: &JsValue,
        options_value: &JsValue,
        zero_options_value: &JsValue,
    ) -> JsResult<ZeroRedundancyOptimizerJs> {
        let world = js(world_of(world))?;
        let shared = js(replicas_of(replicas))?;
        let name = js(super::optim::optimizer_class(optimizer, "optimizer"))?.ok_or_else(|| {
            super::boundary::js_error(Error::type_error(
                "optimizer must be \"SGD\", \"Adam\" or \"AdamW\"",
            ))
        })?;
        let defaults = js(options(options_value))?;
        let zero_options = js(zero_options(zero_options_value))?;
        let local = communicator(&world).local_ranks();
        let zero = {
            let replicas = js(borrow(&shared))?;
            // From here on every rank runs the constructor: its failures are every rank's.
            let params = js_ranks(
                params_arg(params, &replicas).map_err(|e| RankErrors::all(local.clone(), e)),
            )?;
            let len = replicas.len();
            js_ranks(ZeroRedundancyOptimizer::from_params(
                communicator(&world),
                &replicas,
                &params,
                &|t: &TensorArg| (t.id < len && !t.meta && !t.sparse).then_some(t.id),
                &name,
                &defaults,
                zero_options,
            ))?
        };
        let zero = Rc::new(RefCell::new(zero));
        let inner = Rc::new(ZeroHandle {
            zero: zero.clone(),
            replicas: shared.clone(),
            first_rank: local.start,
        });
        Ok(ZeroRedundancyOptimizerJs { inner, name })
    }

    /// Hands the optimizer to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptZero, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// The local optimizer class.
    #[wasm_bindgen(getter, unchecked_return_type = "'SGD' | 'Adam' | 'AdamW'")]
    pub fn optimizer(&self) -> String {
        self.name.clone()
    }

    /// One step: each rank updates what it owns from its own gradients, then the owners
    /// broadcast. In a `Join`, the ranks that joined run ZeRO's join hook (the same step, with
    /// the gradients they still hold). A failure carries every rank's error (`rankErrors`).
    pub fn step(&self) -> JsResult<()> {
        let mut zero = js(self.zero_mut())?;
        let mut replicas = js(borrow_mut(&self.inner.replicas))?;
        js_ranks(zero.step(&mut replicas))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        let zero = js(self.zero())?;
        let mut replicas = js(borrow_mut(&self.inner.replicas))?;
        zero.zero_grad(&mut replicas);
        Ok(())
    }

    /// Sets `requires_grad` of parameter j (replica index); warns at the next step (with
    /// `parametersAsBucketView`, frozen parameters leave the buckets then).
    #[wasm_bindgen(js_name = setRequiresGrad)]
    pub fn set_requires_grad(
        &self,
        j: IntegerArg,
        #[wasm_bindgen(js_name = requiresGrad)] requires_grad: BooleanArg,
    ) -> JsResult<()> {
        let len = js(borrow(&self.inner.replicas))?.len();
        let j = js(super::convert::param_arg(&j, len))?;
        let flag = js(super::convert::bool_arg(&requires_grad, "requiresGrad"))?;
        js(self.zero_mut())?.set_requires_grad(j, flag);
        Ok(())
    }

    /// The replica indices of each parameter group.
    #[wasm_bindgen(js_name = paramGroups, unchecked_return_type = "number[][]")]
    pub fn param_groups(&self) -> JsResult<Array> {
        Ok(nested_to_js(&js(self.zero())?.param_groups()))
    }

    /// Adds a parameter group (replica indices not yet optimized); the partition is
    /// recomputed, earlier parameters keep their ranks and state. A group may bring another
    /// dtype, except with `parametersAsBucketView` (a `ValueError`: one flat bucket holds one
    /// dtype). The promise is rejected with every rank's error (`rankErrors`).
    #[wasm_bindgen(js_name = addParamGroup, unchecked_return_type = "Promise<void>")]
    pub fn add_param_group(&self, group: ZeroAddedGroupArg) -> JsResult<Promise> {
        let (params, options) =
            js(json_from_js(&group, "group").and_then(|g| group_from_json(g, "group")))?;
        let (zero, replicas) = (self.inner.zero.clone(), self.inner.replicas.clone());
        Ok(super::boundary::promise_now(async move {
            add_param_group(&zero, &replicas, params, &options).await?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// Gathers every rank's shard of the state on rank `to` (default 0; outside the world:
    /// nowhere, as in PyTorch). The promise is rejected with every rank's error
    /// (`rankErrors`).
    #[wasm_bindgen(js_name = consolidateStateDict, unchecked_return_type = "Promise<void>")]
    pub fn consolidate_state_dict(
        &self,
        // Not an `Option`: `null` is no rank (a TypeError), only omitting `to` means 0.
        #[wasm_bindgen(unchecked_optional_param_type = "number")] to: JsValue,
    ) -> JsResult<Promise> {
        // `to` defaults to 0 when omitted (PyTorch's default); `null` is no rank.
        let to = if to.is_undefined() {
            0
        } else {
            js(super::convert::integer_arg(&to, "to"))?
        };
        let (zero, replicas) = (self.inner.zero.clone(), self.inner.replicas.clone());
        Ok(super::boundary::promise_now(async move {
            consolidate(&zero, &replicas, to).await?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// `state_dict()` as seen on the rank of replica `rank` (the world's rank `rank` when
    /// simulated; in a run over NATS, this process's rank for 0): a promise of the consolidated
    /// state dict in a plain optimizer's layout (a promise, as every optimizer's `stateDict`
    /// is). Rejects with a RuntimeError unless it was consolidated to that rank; an invalid
    /// `rank` throws.
    #[wasm_bindgen(js_name = stateDict, unchecked_return_type = "Promise<StateDict>")]
    pub fn state_dict(&self, rank: IntegerArg) -> JsResult<Promise> {
        let zero = js(self.zero())?;
        let ranks = js(borrow(&self.inner.replicas))?.ranks();
        let rank = self.inner.first_rank + js(super::convert::rank_arg(&rank, ranks))?;
        Ok(match zero.state_dict(rank).and_then(|sd| json_to_js(&sd)) {
            Ok(state_dict) => Promise::resolve(&state_dict),
            Err(error) => Promise::reject(&super::boundary::js_error(error)),
        })
    }

    /// `load_state_dict` on every rank: each keeps the state of what it owns (any saved world
    /// size). A failure carries every rank's error (`rankErrors`).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(
        &self,
        #[wasm_bindgen(js_name = stateDict)] state_dict: StateDictArg,
    ) -> JsResult<()> {
        let state_dict = js(json_from_js(&state_dict, "stateDict"))?;
        let mut zero = js(self.zero_mut())?;
        let replicas = js(borrow(&self.inner.replicas))?;
        js_ranks(zero.load_state_dict(&replicas, &state_dict))
    }

    /// Per rank: its local optimizer's parameter groups (`zero.optim.param_groups` read on that
    /// rank), each as the global indices of its parameters; `null` before initialization
    /// (`overlapWithDdp`).
    #[wasm_bindgen(
        js_name = localOptimizerParamGroups,
        unchecked_return_type = "number[][][] | null"
    )]
    pub fn local_optimizer_param_groups(&self) -> JsResult<JsValue> {
        Ok(js(self.zero())?
            .local_optimizer_param_groups()
            .map_or(JsValue::NULL, |ranks| {
                ranks
                    .iter()
                    .map(|groups| JsValue::from(nested_to_js(groups)))
                    .collect::<Array>()
                    .into()
            }))
    }

    /// The owner of each replica parameter (by replica index), or `null` for one not optimized
    /// (a parameter passed twice goes to its last owner, as PyTorch's `_param_to_rank`).
    #[wasm_bindgen(js_name = rankOfReplicaParam, unchecked_return_type = "(number | null)[]")]
    pub fn rank_of_replica_param(&self) -> JsResult<Array> {
        let zero = js(self.zero())?;
        let replicas = js(borrow(&self.inner.replicas))?;
        Ok(zero
            .rank_of_replica_param(&replicas)
            .into_iter()
            .map(|r| r.map_or(JsValue::NULL, |r| JsValue::from_f64(r as f64)))
            .collect())
    }

    /// The owner of each parameter (global index), or `null` before initialization.
    #[wasm_bindgen(getter, js_name = rankOfParam, unchecked_return_type = "number[] | null")]
    pub fn rank_of_param(&self) -> JsResult<JsValue> {
        self.partition_field(|p| indices_to_js(&p.rank_of_param).into())
    }

    /// The global indices each rank owns, in its local optimizer's order, or `null`.
    #[wasm_bindgen(
        getter,
        js_name = paramsPerRank,
        unchecked_return_type = "number[][] | null"
    )]
    pub fn params_per_rank(&self) -> JsResult<JsValue> {
        self.partition_field(|p| nested_to_js(&p.params_per_rank).into())
    }

    /// `paramsPerRank` split by parameter group: `[rank][group]`, or `null`.
    #[wasm_bindgen(
        getter,
        js_name = paramsPerRankPerGroup,
        unchecked_return_type = "number[][][] | null"
    )]
    pub fn params_per_rank_per_group(&self) -> JsResult<JsValue> {
        self.partition_field(|p| {
            p.params_per_rank_per_group
                .iter()
                .map(|groups| JsValue::from(nested_to_js(groups)))
                .collect::<Array>()
                .into()
        })
    }

    /// Elements each rank owns, or `null`.
    #[wasm_bindgen(
        getter,
        js_name = numelPerRank,
        unchecked_return_type = "number[] | null"
    )]
    pub fn numel_per_rank(&self) -> JsResult<JsValue> {
        self.partition_field(|p| indices_to_js(&p.numel_per_rank).into())
    }

    /// Per rank: how many parameters have optimizer state.
    #[wasm_bindgen(js_name = localStateSizes, unchecked_return_type = "number[]")]
    pub fn local_state_sizes(&self) -> JsResult<Array> {
        Ok(indices_to_js(&js(self.zero())?.local_state_sizes()))
    }

    /// Per rank: bytes of optimizer state allocated (its shard only).
    #[wasm_bindgen(js_name = stateBytesPerRank, unchecked_return_type = "number[]")]
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
) -> JsResult<()> {
    let mut zero = js(zero.try_borrow_mut().map_err(|_| busy("optimizer")))?;
    let replicas = js(borrow(replicas))?;
    js_ranks(zero.add_param_group(&replicas, params, options).await)
}

#[allow(clippy::await_holding_refcell_ref)]
async fn consolidate(zero: &SharedZero, replicas: &SharedReplicas, to: i64) -> JsResult<()> {
    let mut zero = js(zero.try_borrow_mut().map_err(|_| busy("optimizer")))?;
    let replicas = js(borrow(replicas))?;
    js_ranks(zero.consolidate_state_dict(&replicas, to).await)
}
