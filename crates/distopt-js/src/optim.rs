//! `SGD`, `Adam` and `AdamW`: local optimizers over every rank of a `Replicas`, bound to it at
//! construction as PyTorch's optimizers are bound to their parameters.

use std::rc::Rc;

use js_sys::{Array, Promise};
use serde_json::Value;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{json_from_js, json_to_js, or_undefined, rank_arg};
use super::handles;
use super::replicas::{SharedReplicas, borrow, borrow_mut, replicas_of};
use super::slot::Slot;
use super::typings::{IntegerArg, ReplicasArg, StateDictArg};
use distopt::error::{Error, Result};
use distopt::optim::{self, LocalOptimizer, OptionMap};

#[wasm_bindgen]
extern "C" {
    /// `SGD`'s options (see `SGDOptions`).
    #[wasm_bindgen(typescript_type = "SGDOptions")]
    pub type SgdOptionsArg;

    /// `Adam`'s and `AdamW`'s options (see `AdamOptions`).
    #[wasm_bindgen(typescript_type = "AdamOptions")]
    pub type AdamOptionsArg;

    /// One `SGD` parameter group.
    #[wasm_bindgen(typescript_type = "ParamGroup<SGDOptions>")]
    pub type SgdParamGroupArg;

    /// One `Adam`/`AdamW` parameter group.
    #[wasm_bindgen(typescript_type = "ParamGroup<AdamOptions>")]
    pub type AdamParamGroupArg;

    /// `SGD`'s parameter groups.
    #[wasm_bindgen(typescript_type = "readonly ParamGroup<SGDOptions>[]")]
    pub type SgdParamGroupsArg;

    /// `Adam`'s and `AdamW`'s parameter groups.
    #[wasm_bindgen(typescript_type = "readonly ParamGroup<AdamOptions>[]")]
    pub type AdamParamGroupsArg;
}

/// What the `SGD`, `Adam` and `AdamW` classes share.
pub(crate) struct OptimizerCore {
    pub(crate) name: &'static str,
    pub(crate) replicas: SharedReplicas,
    /// The optimizer, or the wrapper it moved into.
    pub(crate) slot: Slot<dyn LocalOptimizer>,
}

/// The optimizer behind a JS `SGD`, `Adam` or `AdamW` object.
pub(crate) fn optimizer_of(value: &JsValue) -> Result<Rc<OptimizerCore>> {
    handles::resolve(
        value,
        "__distoptOptimizer",
        "optim must be an SGD, Adam or AdamW object",
    )
}

/// Parses PyTorch-style parameter groups: `[{params: [j, …], <option>: value, …}, …]`.
pub(crate) fn param_groups(value: &JsValue, params: usize) -> Result<Vec<(Vec<usize>, OptionMap)>> {
    if value.is_undefined() || value.is_null() {
        return Ok(vec![((0..params).collect(), OptionMap::new())]);
    }
    let Value::Array(groups) = json_from_js(value, "paramGroups")? else {
        return Err(Error::type_error(
            "paramGroups must be an array of {params: [...], ...options} objects",
        ));
    };
    groups
        .into_iter()
        .enumerate()
        .map(|(k, group)| group_from_json(group, &format!("paramGroups[{k}]")))
        .collect()
}

pub(crate) fn group_from_json(group: Value, what: &str) -> Result<(Vec<usize>, OptionMap)> {
    let Value::Object(mut options) = group else {
        return Err(Error::type_error(format!(
            "{what} must be an object {{params: [...], ...options}}"
        )));
    };
    let indices = match options.remove("params") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().and_then(|i| usize::try_from(i).ok()))
            .collect::<Option<Vec<usize>>>(),
        _ => None,
    }
    .ok_or_else(|| {
        Error::type_error(format!(
            "{what}.params must be an array of parameter indices"
        ))
    })?;
    Ok((indices, options))
}

/// Whether no parameter groups were given (the optimizer takes every parameter: PyTorch's
/// `SGD(model.parameters())`, an empty list when the replicas hold none).
fn groups_value_absent(value: &JsValue) -> bool {
    value.is_undefined() || value.is_null()
}

#[wasm_bindgen(typescript_custom_section)]
const OPTIMIZER_OPTIONS: &'static str = r#"
/** `torch.optim.SGD`'s keyword arguments (PyTorch's names and defaults). */
export interface SGDOptions {
  /** Learning rate (default 1e-3). */
  lr?: number;
  /** Momentum factor (default 0). */
  momentum?: number;
  /** Dampening for momentum (default 0). */
  dampening?: number;
  /** L2 penalty (default 0). */
  weight_decay?: number;
  /** Nesterov momentum (default false; needs momentum > 0 and no dampening). */
  nesterov?: boolean;
  /** Maximize the objective (default false). */
  maximize?: boolean;
  /**
   * PyTorch's multi-tensor update (default null, which on CPU is false): recorded in the state
   * dict, and with momentum on a float16/bfloat16 parameter the buffer is scaled by the
   * momentum rounded to its dtype, as PyTorch's `_foreach_mul_` does.
   */
  foreach?: boolean | null;
  differentiable?: boolean;
  /**
   * PyTorch's fused update (default null, which is false): a float16/bfloat16 parameter's
   * update is computed in float32 and rounded once per stored tensor, as PyTorch's fused
   * kernel does. With `foreach: true` or `differentiable: true` it is PyTorch's `RuntimeError`.
   */
  fused?: boolean | null;
}

/** `torch.optim.Adam` / `AdamW`'s keyword arguments. */
export interface AdamOptions {
  /** Learning rate (default 1e-3). */
  lr?: number;
  /** Running-average coefficients (default [0.9, 0.999]). */
  betas?: readonly [number, number];
  /** Added to the denominator (default 1e-8). */
  eps?: number;
  /** Adam: L2 penalty (default 0); AdamW: decoupled weight decay (default 1e-2). */
  weight_decay?: number;
  /** AMSGrad (default false). */
  amsgrad?: boolean;
  /** Maximize the objective (default false). */
  maximize?: boolean;
  /**
   * PyTorch's multi-tensor update (default null, which on CPU is false): recorded in the state
   * dict, and on a float16/bfloat16 parameter the second moment is scaled by `beta2`, and
   * AdamW's parameter by `1 - lr * weight_decay`, rounded to its dtype, as PyTorch's
   * `_foreach_mul_` does.
   */
  foreach?: boolean | null;
  capturable?: boolean;
  differentiable?: boolean;
  /** PyTorch's fused update: as in `SGDOptions.fused`. */
  fused?: boolean | null;
  decoupled_weight_decay?: boolean;
}
"#;

/// Options as an `OptionMap` (`undefined` and `null`: none).
pub(crate) fn options(value: &JsValue) -> Result<OptionMap> {
    check_option_strings(value)?;
    optim::option_map(&json_from_js(value, "options")?)
}

/// Refuses an option that is a long string without echoing all of it. NaN and infinite
/// numbers pass to the library as `"nan"`, `"inf"` and `"-inf"`, where each optimizer checks
/// them as PyTorch does (`Invalid learning rate: nan` for Adam; SGD's `lr < 0.0` lets NaN
/// through, as PyTorch's does).
fn check_option_strings(value: &JsValue) -> Result<()> {
    if !value.is_object() || js_sys::Array::is_array(value) {
        return Ok(());
    }
    for entry in js_sys::Object::entries(value.unchecked_ref()).iter() {
        let pair: &Array = entry.unchecked_ref();
        let key = pair.get(0).as_string().unwrap_or_default();
        let item = pair.get(1);
        if let Some(text) = item.as_string().filter(|t| t.chars().count() > 64) {
            // No optimizer option is a long string: say so without echoing all of it.
            return Err(Error::type_error(format!(
                "option '{}' must be a number, got a string ({:?})",
                super::convert::truncated(&key),
                super::convert::truncated(&text)
            )));
        }
    }
    Ok(())
}

impl OptimizerCore {
    fn create(
        name: &'static str,
        replicas: &JsValue,
        options_value: &JsValue,
        groups: &JsValue,
    ) -> Result<Rc<OptimizerCore>> {
        let shared = replicas_of(replicas)?;
        let groups_arg = groups;
        let optim = {
            let replicas = borrow(&shared)?;
            let groups = param_groups(groups, replicas.len())?;
            if groups.is_empty() || (groups_value_absent(groups_arg) && replicas.is_empty()) {
                // PyTorch: `SGD([])`.
                return Err(Error::value("optimizer got an empty parameter list"));
            }
            optim::create(name, &replicas, groups, &options(options_value)?)?
        };
        Ok(Rc::new(OptimizerCore {
            name,
            replicas: shared,
            slot: Slot::new(name, "optimizer", optim),
        }))
    }

    fn step(&self) -> Result<()> {
        self.slot.write(|o| {
            let mut replicas = borrow_mut(&self.replicas)?;
            o.step(&mut replicas)
        })
    }

    fn zero_grad(&self) -> Result<()> {
        borrow_mut(&self.replicas)?.zero_grad();
        Ok(())
    }

    fn param_groups(&self) -> Result<Array> {
        self.slot.read(|o| {
            o.param_groups()
                .into_iter()
                .map(|g| {
                    g.into_iter()
                        .map(|j| JsValue::from_f64(j as f64))
                        .collect::<Array>()
                })
                .collect()
        })
    }

    fn add_param_group(&self, group: &JsValue) -> Result<()> {
        let (params, options) = group_from_json(json_from_js(group, "group")?, "group")?;
        self.slot.write(|o| o.add_param_group(params, &options))
    }

    fn load_state_dict(&self, rank: &JsValue, state_dict: &JsValue) -> Result<()> {
        let state_dict = json_from_js(state_dict, "stateDict")?;
        self.slot.write(|o| {
            let mut replicas = borrow_mut(&self.replicas)?;
            let rank = rank_arg(rank, replicas.ranks())?;
            o.load_state_dict(&mut replicas, rank, &state_dict)
        })
    }

    fn state_dict(self: &Rc<Self>, rank: &JsValue) -> Result<Promise> {
        let rank = rank_arg(rank, borrow(&self.replicas)?.ranks())?;
        let core = self.clone();
        Ok(super::boundary::promise_now(async move {
            js(core
                .state_dict_json(rank)
                .await
                .and_then(|sd| json_to_js(&sd)))
        }))
    }

    /// Holds the optimizer and the replicas across the readback on purpose: a change made
    /// meanwhile is refused (`busy`) instead of racing the read.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn state_dict_json(&self, rank: usize) -> Result<Value> {
        let place = self.slot.place()?;
        let replicas = borrow(&self.replicas)?;
        let mut wrapped = None;
        let optim = place.value(&mut wrapped, self.slot.kind())?;
        optim.state_dict(&replicas, rank).await
    }
}

/// Generates one optimizer class: the same surface over the named `torch.optim` algorithm.
/// `$options`, `$group` and `$groups` are the extern types declaring its options, one parameter
/// group and a list of them; `$literal` is the TypeScript type of its `name`.
macro_rules! optimizer_class {
    (
        $ty:ident, $js:ident, $name:literal, $literal:tt,
        $options:ident, $group:ident, $groups:ident,
        $doc:tt
    ) => {
        #[doc = $doc]
        #[wasm_bindgen(js_name = $js)]
        pub struct $ty {
            pub(crate) core: Rc<OptimizerCore>,
        }

        #[wasm_bindgen(js_class = $js)]
        impl $ty {
            /// @param options PyTorch's keyword arguments; an unknown one is a TypeError, an
            ///   invalid value PyTorch's ValueError (e.g. `Invalid learning rate: -1.0`).
            /// @param paramGroups `[{params: [j, …], …options}]`, each group's options over
            ///   `options`; default: one group of every parameter.
            #[wasm_bindgen(constructor)]
            pub fn new(
                replicas: ReplicasArg,
                options: Option<$options>,
                #[wasm_bindgen(js_name = paramGroups)] param_groups: Option<$groups>,
            ) -> JsResult<$ty> {
                let options = or_undefined(options);
                let param_groups = or_undefined(param_groups);
                Ok($ty {
                    core: js(OptimizerCore::create(
                        $name,
                        &replicas,
                        &options,
                        &param_groups,
                    ))?,
                })
            }

            /// `"SGD"`, `"Adam"` or `"AdamW"`.
            #[wasm_bindgen(getter, unchecked_return_type = $literal)]
            pub fn name(&self) -> String {
                self.core.name.into()
            }

            /// Hands the optimizer to the call it is passed to (internal: `handles::resolve`).
            #[wasm_bindgen(js_name = __distoptOptimizer, skip_typescript)]
            pub fn hand_over(&self) {
                handles::hand_over(self.core.clone());
            }

            /// One step on every rank: each parameter with a gradient on a rank is updated
            /// from it; the others are skipped, their state untouched. Throws a RuntimeError
            /// once the optimizer belongs to a PostLocalSGDOptimizer or a DiLoCo (step that
            /// instead).
            pub fn step(&self) -> JsResult<()> {
                js(self.core.step())
            }

            /// `zero_grad(set_to_none=True)` on every rank.
            #[wasm_bindgen(js_name = zeroGrad)]
            pub fn zero_grad(&self) -> JsResult<()> {
                js(self.core.zero_grad())
            }

            /// The parameter indices of each parameter group.
            #[wasm_bindgen(js_name = paramGroups, unchecked_return_type = "number[][]")]
            pub fn param_groups(&self) -> JsResult<Array> {
                js(self.core.param_groups())
            }

            /// Adds a parameter group with its own options (`{params: [j, …], …options}`).
            #[wasm_bindgen(js_name = addParamGroup)]
            pub fn add_param_group(&self, group: $group) -> JsResult<()> {
                js(self.core.add_param_group(&group))
            }

            /// Rank `rank`'s `state_dict()`, in PyTorch's layout (`{state, param_groups}`, its
            /// tensors with typed-array data).
            #[wasm_bindgen(js_name = stateDict, unchecked_return_type = "Promise<StateDict>")]
            pub fn state_dict(&self, rank: IntegerArg) -> JsResult<Promise> {
                js(self.core.state_dict(&rank))
            }

            /// `load_state_dict(stateDict)` on rank `rank`.
            #[wasm_bindgen(js_name = loadStateDict)]
            pub fn load_state_dict(
                &self,
                rank: IntegerArg,
                #[wasm_bindgen(js_name = stateDict)] state_dict: StateDictArg,
            ) -> JsResult<()> {
                js(self.core.load_state_dict(&rank, &state_dict))
            }
        }
    };
}

optimizer_class!(
    SgdJs,
    SGD,
    "SGD",
    "'SGD'",
    SgdOptionsArg,
    SgdParamGroupArg,
    SgdParamGroupsArg,
    "`torch.optim.SGD` on every rank of `replicas` (momentum, dampening, Nesterov, weight decay, maximize)."
);
optimizer_class!(
    AdamJs,
    Adam,
    "Adam",
    "'Adam'",
    AdamOptionsArg,
    AdamParamGroupArg,
    AdamParamGroupsArg,
    "`torch.optim.Adam` on every rank of `replicas` (AMSGrad, weight decay, maximize)."
);
optimizer_class!(
    AdamWJs,
    AdamW,
    "AdamW",
    "'AdamW'",
    AdamOptionsArg,
    AdamParamGroupArg,
    AdamParamGroupsArg,
    "`torch.optim.AdamW` (decoupled weight decay, default 1e-2) on every rank of `replicas`."
);

/// The local optimizer class an argument names, as ZeRO and `DistributedOptimizer` take it:
/// the class itself (`SGD`, `Adam`, `AdamW` as exported, i.e. a function of that name, as
/// PyTorch takes `torch.optim.Adam`) or its name as a string. `None` for `undefined`/`null`;
/// another name reaches the algorithm, which refuses it with PyTorch's error.
pub(crate) fn optimizer_class(value: &JsValue, what: &str) -> Result<Option<String>> {
    if let Some(class) = value.dyn_ref::<js_sys::Function>() {
        return Ok(Some(String::from(class.name())));
    }
    super::convert::optional_string(value, what)
}
