//! `PeriodicModelAverager` and `HierarchicalModelAverager`.

use std::rc::Rc;

use js_sys::Array;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{count_arg, index_list, integer, optional_integer_arg, or_undefined};
use super::handles;
use super::replicas::{borrow_mut, replicas_of};
use super::slot::Slot;
use super::world::{communicator, subgroups, world_of};
use distopt::averaging::{HierarchicalModelAverager, ModelAverager, PeriodicModelAverager};
use distopt::error::{Error, Result};

use super::typings::{IndexListArg, IntegerArg, ReplicasArg, WorldArg};

#[wasm_bindgen]
extern "C" {
    /// `HierarchicalModelAverager`'s `periodGroupSizeDict`: `[period, groupSize]` pairs in
    /// insertion order, as an array or a `Map`.
    #[wasm_bindgen(
        typescript_type = "ReadonlyArray<readonly [number, number]> | ReadonlyMap<number, number>"
    )]
    pub type PeriodGroupSizeDictArg;
}

/// What both averager classes share.
pub(crate) struct AveragerCore {
    /// The averager, or the wrapper it moved into.
    pub(crate) slot: Slot<dyn ModelAverager>,
}

/// The averager behind a JS `PeriodicModelAverager` or `HierarchicalModelAverager`.
pub(crate) fn averager_of(value: &JsValue) -> Result<Rc<AveragerCore>> {
    handles::resolve(
        value,
        "__distoptAverager",
        "averager must be a PeriodicModelAverager or HierarchicalModelAverager object",
    )
}

impl AveragerCore {
    fn new(name: &'static str, averager: Box<dyn ModelAverager>) -> Rc<AveragerCore> {
        Rc::new(AveragerCore {
            slot: Slot::new(name, "averager", averager),
        })
    }

    fn step(&self) -> Result<u64> {
        self.slot.read(|a| a.step())
    }

    fn average_parameters(&self, replicas: &JsValue, params: &JsValue) -> Result<JsValue> {
        let shared = replicas_of(replicas)?;
        let params = if params.is_undefined() || params.is_null() {
            None
        } else {
            Some(index_list(params, "params")?)
        };
        let mut replicas = borrow_mut(&shared)?;
        let used = self
            .slot
            .write(|a| a.average_parameters(&mut replicas, params.as_deref()))?;
        Ok(used.map_or(JsValue::NULL, |g| JsValue::from_f64(g as f64)))
    }

    fn set_step(&self, step: &JsValue) -> Result<()> {
        let step = count_arg(step, "step")? as u64;
        self.slot.write(|a| {
            a.set_step(step);
            Ok(())
        })
    }
}

/// The members both averager classes have, over their `core`; `$average_doc` documents
/// `averageParameters`.
macro_rules! averager_methods {
    ($type:ident, $js:ident, $average_doc:literal) => {
        #[wasm_bindgen(js_class = $js)]
        impl $type {
            /// Hands the averager to the call it is passed to (internal: `handles::resolve`).
            #[wasm_bindgen(js_name = __distoptAverager, skip_typescript)]
            pub fn hand_over(&self) {
                handles::hand_over(self.core.clone());
            }

            /// Calls of `averageParameters` so far.
            #[wasm_bindgen(getter)]
            pub fn step(&self) -> JsResult<f64> {
                Ok(js(self.core.step())? as f64)
            }

            /// Calls of `averageParameters` so far.
            #[wasm_bindgen(setter)]
            pub fn set_step(&self, step: IntegerArg) -> JsResult<()> {
                js(self.core.set_step(&step))
            }

            #[doc = $average_doc]
            #[wasm_bindgen(js_name = averageParameters, unchecked_return_type = "number | null")]
            pub fn average_parameters(
                &self,
                replicas: ReplicasArg,
                params: Option<IndexListArg>,
            ) -> JsResult<JsValue> {
                js(self
                    .core
                    .average_parameters(&replicas, &or_undefined(params)))
            }
        }
    };
}

/// `PeriodicModelAverager(period, warmup_steps)`: call number s averages the parameters that
/// have a gradient iff `s >= warmupSteps` and `(s − warmupSteps) % period == 0`, over the world
/// (or within each group of `groupSize` contiguous ranks).
#[wasm_bindgen(js_name = PeriodicModelAverager)]
pub struct PeriodicModelAveragerJs {
    core: Rc<AveragerCore>,
    period: u64,
    warmup_steps: u64,
}

#[wasm_bindgen(js_class = PeriodicModelAverager)]
impl PeriodicModelAveragerJs {
    /// @param period default 1 (warns, as PyTorch does)
    /// @param warmupSteps default 0; checked before `period`
    /// @param groupSize average within contiguous groups of this many ranks (default: the world)
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "number | undefined")] period: Option<IntegerArg>,
        #[wasm_bindgen(js_name = warmupSteps, unchecked_param_type = "number | undefined")]
        warmup_steps: Option<IntegerArg>,
        world: WorldArg,
        #[wasm_bindgen(js_name = groupSize)] group_size: Option<IntegerArg>,
    ) -> JsResult<PeriodicModelAveragerJs> {
        let period = or_undefined(period);
        let warmup_steps = or_undefined(warmup_steps);
        let group_size = or_undefined(group_size);
        let world = js(world_of(&world))?;
        let period = js(optional_integer_arg(&period, "period"))?.unwrap_or(1);
        let warmup = js(optional_integer_arg(&warmup_steps, "warmupSteps"))?.unwrap_or(0);
        let group = js(subgroups(&*world, &group_size))?;
        let averager = js(PeriodicModelAverager::with_group(
            period,
            warmup,
            communicator(&world),
            group,
        ))?;
        Ok(PeriodicModelAveragerJs {
            period: averager.period(),
            warmup_steps: averager.warmup_steps(),
            core: AveragerCore::new("PeriodicModelAverager", Box::new(averager)),
        })
    }

    /// The averaging period.
    #[wasm_bindgen(getter)]
    pub fn period(&self) -> f64 {
        self.period as f64
    }

    /// The warm-up steps.
    #[wasm_bindgen(getter, js_name = warmupSteps)]
    pub fn warmup_steps(&self) -> f64 {
        self.warmup_steps as f64
    }
}

averager_methods!(
    PeriodicModelAveragerJs,
    PeriodicModelAverager,
    "Averages (if the schedule says so) the parameters in `params` (default all) that have a\ngradient on rank 0, and advances the counter. Returns the group size used, or `null`\nwhen this call did not average.\n@throws ValueError `torch.cat(): expected a non-empty list of Tensors` when averaging is\n   due and no parameter has a gradient"
);

/// `(period, group size)` pairs in insertion order from an array of pairs or a `Map`.
fn period_group_sizes(value: &JsValue) -> Result<Vec<(i64, i64)>> {
    let pairs: Array = if let Some(map) = value.dyn_ref::<js_sys::Map>() {
        js_sys::Array::from(&map.entries().into())
    } else if Array::is_array(value) {
        value.clone().unchecked_into()
    } else {
        return Err(Error::type_error(
            "periodGroupSizeDict must be an array of [period, groupSize] pairs or a Map (a plain object would lose the insertion order, which matters)",
        ));
    };
    pairs
        .iter()
        .enumerate()
        .map(|(i, pair)| {
            let what = format!("periodGroupSizeDict[{i}]");
            let items = super::convert::array(&pair, &what)?;
            if items.length() != 2 {
                return Err(Error::type_error(format!(
                    "{what} must be a [period, groupSize] pair"
                )));
            }
            let number = |v: JsValue, name: &str| {
                v.as_f64()
                    .ok_or_else(|| Error::type_error(format!("{what}: {name} must be an integer")))
                    .and_then(|x| integer(x, &format!("{what}: {name}")))
            };
            Ok((
                number(items.get(0), "period")?,
                number(items.get(1), "groupSize")?,
            ))
        })
        .collect()
}

/// `HierarchicalModelAverager(period_group_size_dict, warmup_steps)`: call s averages iff
/// `s >= warmupSteps` and some period divides s; the periods are searched from the last
/// inserted to the first, and the first match picks the group size (averaging within
/// contiguous groups of that many ranks).
#[wasm_bindgen(js_name = HierarchicalModelAverager)]
pub struct HierarchicalModelAveragerJs {
    core: Rc<AveragerCore>,
}

#[wasm_bindgen(js_class = HierarchicalModelAverager)]
impl HierarchicalModelAveragerJs {
    /// PyTorch's checks, errors and warnings, in its order.
    /// @param periodGroupSizeDict `[[period, groupSize], …]` or a `Map`, in insertion order (a
    ///   plain object would lose it); the last group size must be the world size
    /// @param warmupSteps default 0, checked after the dict (as PyTorch does)
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(js_name = periodGroupSizeDict)]
        period_group_size_dict: PeriodGroupSizeDictArg,
        #[wasm_bindgen(js_name = warmupSteps, unchecked_param_type = "number | undefined")]
        warmup_steps: Option<IntegerArg>,
        world: WorldArg,
    ) -> JsResult<HierarchicalModelAveragerJs> {
        let warmup_steps = or_undefined(warmup_steps);
        let world = js(world_of(&world))?;
        let dict = js(period_group_sizes(&period_group_size_dict))?;
        let warmup = js(optional_integer_arg(&warmup_steps, "warmupSteps"))?.unwrap_or(0);
        let averager = js(HierarchicalModelAverager::new(
            &dict,
            warmup,
            communicator(&world),
        ))?;
        Ok(HierarchicalModelAveragerJs {
            core: AveragerCore::new("HierarchicalModelAverager", Box::new(averager)),
        })
    }
}

averager_methods!(
    HierarchicalModelAveragerJs,
    HierarchicalModelAverager,
    "As `PeriodicModelAverager.averageParameters`: returns the group size used, or `null`."
);
