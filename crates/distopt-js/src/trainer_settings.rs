//! `new Trainer(settings)`'s settings as serde types ([`settings::read`]): `TrainerSettings`,
//! the synthetic task's `TaskSettings`, and a data set's `DatasetTaskSettings` and
//! `DatasetInput`. Each key is declared once, here; `index.d.ts` gets the interfaces from these
//! declarations (tsify).

use std::rc::Rc;

use js_sys::{Array, Float64Array, Reflect};
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tsify::Tsify;
use wasm_bindgen::{JsCast, JsValue};

use super::convert::{get, js_number, truncated};
use super::settings::{Naming, fail, read, read_js};
use super::world::{WorldHandle, world_handle_of};
use distopt::diloco::Compression;
use distopt::error::{Error, Result};
use distopt::train::{
    AlgorithmName, AlgorithmSettings, Dataset, DatasetConfig, DatasetTask, TaskConfig, TrainConfig,
};

/// `new Trainer(settings)`'s settings: everything but `ranks` has a default, an unknown key is
/// a TypeError.
#[derive(Deserialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct TrainerSettings {
    /// R, the number of ranks (and shards).
    ranks: usize,
    /// Synchronous SGD (default), post-local SGD with periodic or hierarchical averaging, ZeRO
    /// (synchronous SGD whose momentum is sharded over the ranks by a ZeroRedundancyOptimizer),
    /// or DiLoCo (local SGD steps, and every `period` steps the mean pseudo-gradient applied by
    /// an outer SGD with lr 0.7 and Nesterov momentum 0.9).
    #[tsify(
        optional,
        type = "'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco'"
    )]
    algorithm: Option<NamedAlgorithm>,
    /// Averaging period; for `hierarchical`, the world-level period of the default hierarchy;
    /// for `diloco`, the inner steps between syncs (`sync_every`) (default 8).
    #[tsify(optional)]
    period: Option<u64>,
    /// `diloco`: fragments of Streaming DiLoCo, syncing staggered (default 1: plain DiLoCo; at
    /// most `period`).
    #[tsify(optional)]
    fragments: Option<usize>,
    /// `diloco`: torchft's `fragment_sync_delay`, inner steps between a fragment's all-reduce
    /// and its outer step (default 0; smaller than `period / fragments`). Another algorithm:
    /// ValueError.
    #[tsify(optional)]
    fragment_sync_delay: Option<u64>,
    /// `diloco`: torchft's `fragment_update_alpha`, the weight of the local parameters mixed
    /// with the outer step's result, in [0, 1], mixed as torchft does, at 0 too (default: no
    /// mix). Another algorithm: ValueError.
    #[tsify(optional)]
    fragment_update_alpha: Option<f64>,
    /// `diloco`: the pseudo-gradients' wire format (default `'none'`: each parameter's own
    /// dtype).
    #[tsify(optional, type = "'none' | 'bf16' | 'f16'")]
    compress: Option<NamedCompression>,
    /// Warm-up steps of synchronous SGD before local SGD (default 20, as the command line's
    /// `--warmup`).
    #[tsify(optional)]
    warmup: Option<u64>,
    /// `hierarchical`: `[[period, groupSize], …]` (default `Trainer.defaultHierarchy(period,
    /// ranks)`).
    #[tsify(optional, type = "ReadonlyArray<readonly [number, number]>")]
    levels: Option<Levels>,
    /// `hierarchical`: all-reduce the gradients within groups of this size after warm-up.
    #[tsify(optional, type = "number | null")]
    subgroup_size: Option<usize>,
    /// SGD learning rate (default 0.05).
    #[tsify(optional)]
    lr: Option<f64>,
    /// SGD momentum (default 0.9).
    #[tsify(optional)]
    momentum: Option<f64>,
    /// Samples per rank per step (default 32).
    #[tsify(optional)]
    batch_size: Option<usize>,
    /// Seed of the mini-batch sampling (default 0).
    #[tsify(optional)]
    seed: Option<u64>,
    /// The synthetic task (default), or a real data set with a held-out split.
    #[tsify(optional, type = "TaskSettings | DatasetTaskSettings")]
    task: Option<Value>,
    /// The world to train in: by default a simulated world of `ranks` ranks; this process's
    /// rank of a run over NATS (`World.joinNats`, a world of `ranks` ranks) trains its own
    /// shard, every process of the run constructing the same Trainer and making the same calls.
    /// A world joined with `join: true` is taken in by `await trainer.admit()` before its first
    /// step.
    #[tsify(optional, type = "World")]
    #[expect(
        dead_code,
        reason = "declared for the interface; the world is taken from JS"
    )]
    world: Option<IgnoredAny>,
}

/// The synthetic classification task: Gaussian clusters, one skewed shard per rank.
#[derive(Deserialize, Tsify)]
pub struct TaskSettings {
    /// Input features (default 32).
    #[tsify(optional)]
    features: Option<usize>,
    /// Hidden units of the two-layer perceptron (default 32).
    #[tsify(optional)]
    hidden: Option<usize>,
    /// Classes (default 4).
    #[tsify(optional)]
    classes: Option<usize>,
    /// Samples in all shards together (default 4096).
    #[tsify(optional)]
    samples: Option<usize>,
    /// 0: IID shards … 1: every shard one class (default 0.8).
    #[tsify(optional)]
    heterogeneity: Option<f64>,
    /// Seed of the data and the initial parameters (default 0).
    #[tsify(optional)]
    seed: Option<u64>,
}

/// A real data set, split into a held-out test set and one non-IID training shard per rank (a
/// `heterogeneity` share of the samples sorted by label, the rest placed at random, cut into R
/// contiguous shards).
#[derive(Deserialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct DatasetTaskSettings {
    /// The samples and their labels.
    #[tsify(type = "DatasetInput")]
    dataset: Value,
    /// Hidden units of the two-layer perceptron (default 32).
    #[tsify(optional)]
    hidden: Option<usize>,
    /// Share of the samples held out for `evaluate()`, in [0, 1) (default 0.2).
    #[tsify(optional)]
    test_fraction: Option<f64>,
    /// 0: IID shards … 1: shards sorted by label (default 0.9).
    #[tsify(optional)]
    heterogeneity: Option<f64>,
    /// Seed of the split and the initial parameters (default 0).
    #[tsify(optional)]
    seed: Option<u64>,
}

/// A labelled data set for `task.dataset`: `labels.length` samples of `features.length /
/// labels.length` values each (row-major), labels in `0..classes`. `Trainer.parseDigits`
/// returns one.
#[derive(Deserialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct DatasetInput {
    /// The samples' values, row-major (read from the JS value itself, not its JSON form).
    #[tsify(type = "Float32Array | Float64Array | Uint8Array | ArrayLike<number>")]
    #[expect(dead_code, reason = "read from the JS value itself")]
    features: Option<IgnoredAny>,
    /// Each sample's label (read from the JS value itself).
    #[tsify(type = "Uint8Array | Uint16Array | Int32Array | ArrayLike<number>")]
    #[expect(dead_code, reason = "read from the JS value itself")]
    labels: Option<IgnoredAny>,
    /// Classes.
    #[tsify(type = "number")]
    classes: Option<Classes>,
    /// Shown in `taskName` (default `'dataset'`).
    #[tsify(optional)]
    name: Option<String>,
    /// Values per sample; checked against `features.length / labels.length` when given.
    #[tsify(optional, type = "number")]
    feature_count: Option<Value>,
}

/// `algorithm`: a name `AlgorithmName` parses.
struct NamedAlgorithm(AlgorithmName);

impl<'de> Deserialize<'de> for NamedAlgorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(name) => name.parse().map(NamedAlgorithm).map_err(fail),
            other => Err(fail(Error::type_error(format!(
                "'algorithm' must be \"sync\", \"periodic\", \"hierarchical\", \"zero\" or \"diloco\", got {other}"
            )))),
        }
    }
}

/// `compress`: a name `Compression::parse` reads.
struct NamedCompression(Compression);

impl<'de> Deserialize<'de> for NamedCompression {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(name) => Compression::parse(&name)
                .map(NamedCompression)
                .map_err(fail),
            other => Err(fail(Error::type_error(format!(
                "'compress' must be 'none', 'bf16' or 'f16', got {other}"
            )))),
        }
    }
}

/// `levels`: `[period, groupSize]` pairs of non-negative integers.
struct Levels(Vec<(u64, usize)>);

impl<'de> Deserialize<'de> for Levels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let Value::Array(pairs) = Value::deserialize(d)? else {
            return Err(fail(Error::type_error(
                "'levels' must be an array of [period, groupSize] pairs",
            )));
        };
        let pair = |pair: &Value| {
            let p = pair.as_array().filter(|p| p.len() == 2)?;
            Some((p[0].as_u64()?, usize::try_from(p[1].as_u64()?).ok()?))
        };
        pairs
            .iter()
            .map(|p| {
                pair(p).ok_or_else(|| {
                    fail(Error::type_error(format!(
                        "'levels' must be [period, groupSize] pairs of non-negative integers, got {p}"
                    )))
                })
            })
            .collect::<std::result::Result<_, _>>()
            .map(Levels)
    }
}

/// `task.dataset.classes`: a non-negative integer (anything else a TypeError).
struct Classes(usize);

impl<'de> Deserialize<'de> for Classes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Value::deserialize(d)?
            .as_u64()
            .and_then(|c| usize::try_from(c).ok())
            .map(Classes)
            .ok_or_else(|| {
                fail(Error::type_error(
                    "'task.dataset.classes' must be a non-negative integer",
                ))
            })
    }
}

/// The messages of `new Trainer`: `'period' must be …`, `Trainer got an unexpected setting …`.
fn naming(name: &'static str, key: fn(&str) -> String) -> Naming {
    Naming {
        name,
        key,
        unknown: |object, key, known| {
            format!(
                "{object} got an unexpected setting '{key}' (known: {})",
                known.join(", ")
            )
        },
        missing: |key| format!("Trainer settings need '{key}'"),
    }
}

fn quoted(key: &str) -> String {
    format!("'{key}'")
}

/// What `new Trainer(settings)` builds from its settings.
pub(crate) struct TrainerPlan {
    pub(crate) ranks: usize,
    pub(crate) config: TrainConfig,
    /// The data set's task, or `None` for the synthetic one ([`TrainerPlan::synthetic`]).
    pub(crate) dataset: Option<DatasetTask>,
    pub(crate) synthetic: TaskConfig,
    pub(crate) world: Option<Rc<WorldHandle>>,
}

/// Reads `new Trainer(settings)`'s settings.
pub(crate) fn read_settings(settings: &JsValue) -> Result<TrainerPlan> {
    check_finite_settings(settings, "")?;
    let (settings, world) = take_world(settings)?;
    const NOT_OBJECT: &str = "Trainer needs a settings object: {ranks, algorithm, …}";
    let s: TrainerSettings = read_js(
        &settings,
        "settings",
        NOT_OBJECT,
        &naming("Trainer", quoted),
    )?
    .ok_or_else(|| Error::type_error(NOT_OBJECT))?;
    let name = s.algorithm.map_or(AlgorithmName::Sync, |a| a.0);
    // torchft's Streaming DiLoCo knobs: DiLoCo's only, as the CLI's flags are.
    for (key, given) in [
        ("fragmentSyncDelay", s.fragment_sync_delay.is_some()),
        ("fragmentUpdateAlpha", s.fragment_update_alpha.is_some()),
    ] {
        if given && name != AlgorithmName::DiLoCo {
            return Err(Error::value(format!(
                "'{key}' applies to algorithm 'diloco' only"
            )));
        }
    }
    let d = AlgorithmSettings::default();
    let mut algorithm = AlgorithmSettings::default();
    algorithm.period = s.period.unwrap_or(d.period);
    algorithm.warmup = s.warmup.unwrap_or(d.warmup);
    algorithm.fragments = s.fragments.unwrap_or(d.fragments);
    algorithm.fragment_sync_delay = s.fragment_sync_delay.unwrap_or(d.fragment_sync_delay);
    algorithm.fragment_update_alpha = s.fragment_update_alpha.or(d.fragment_update_alpha);
    algorithm.compress = s.compress.map_or(d.compress, |c| c.0);
    algorithm.levels = s.levels.map(|l| l.0);
    algorithm.subgroup_size = s.subgroup_size;
    let defaults = TrainConfig::default();
    let config = TrainConfig {
        algorithm: name.build(&algorithm, s.ranks)?,
        lr: s.lr.unwrap_or(defaults.lr),
        momentum: s.momentum.unwrap_or(defaults.momentum),
        batch_size: s.batch_size.unwrap_or(defaults.batch_size),
        seed: s.seed.unwrap_or(defaults.seed),
    };
    let task = s.task.unwrap_or(Value::Null);
    let dataset = match task.get("dataset") {
        Some(given) if !given.is_null() => Some(dataset_task(&settings, &task, s.ranks)?),
        _ => None,
    };
    let synthetic = match (&task, &dataset) {
        (_, Some(_)) | (Value::Null, _) => TaskConfig::default(),
        (Value::Object(_), None) => synthetic_task(&task)?,
        (other, None) => {
            return Err(Error::type_error(format!(
                "'task' must be an object, got {other}"
            )));
        }
    };
    Ok(TrainerPlan {
        ranks: s.ranks,
        config,
        dataset,
        synthetic,
        world,
    })
}

/// The synthetic task's settings (`TaskSettings`).
fn synthetic_task(task: &Value) -> Result<TaskConfig> {
    let s: TaskSettings = read(task, &naming("task", quoted))?;
    let d = TaskConfig::default();
    Ok(TaskConfig {
        features: s.features.unwrap_or(d.features),
        hidden: s.hidden.unwrap_or(d.hidden),
        classes: s.classes.unwrap_or(d.classes),
        samples: s.samples.unwrap_or(d.samples),
        heterogeneity: s.heterogeneity.unwrap_or(d.heterogeneity),
        seed: s.seed.unwrap_or(d.seed),
    })
}

/// The data set's task (`task` holds a `dataset`: `DatasetTaskSettings`). The features and
/// labels are read from the JS values themselves (typed arrays or arrays), not from their JSON
/// form.
fn dataset_task(settings: &JsValue, task: &Value, ranks: usize) -> Result<DatasetTask> {
    let s: DatasetTaskSettings = read(task, &naming("task (with a dataset)", quoted))?;
    if !s.dataset.is_object() {
        return Err(Error::type_error(
            "'task.dataset' must be an object {features, labels, classes, name, featureCount}",
        ));
    }
    let input: DatasetInput = read(
        &s.dataset,
        &naming("task.dataset", |key| format!("'task.dataset.{key}'")),
    )?;
    let js_dataset = get(&get(settings, "task"), "dataset");
    let numbers = |key: &str| -> Result<Vec<f64>> {
        let value = Reflect::get(&js_dataset, &JsValue::from_str(key))
            .map_err(|_| Error::type_error(format!("cannot read '{key}' of the settings")))?;
        if !(Array::is_array(&value) || js_sys::ArrayBuffer::is_view(&value))
            || value.is_instance_of::<js_sys::DataView>()
        {
            return Err(Error::type_error(format!(
                "'task.dataset.{key}' must be a typed array or an array of numbers"
            )));
        }
        if value.is_instance_of::<js_sys::BigInt64Array>()
            || value.is_instance_of::<js_sys::BigUint64Array>()
        {
            return Err(Error::type_error(format!(
                "'task.dataset.{key}' must hold numbers, not BigInts"
            )));
        }
        // Float64Array's constructor copies any typed array or array, converting each value.
        Ok(Float64Array::new(&value).to_vec())
    };
    let features = numbers("features")?;
    let labels = numbers("labels")?;
    let classes = input.classes.ok_or_else(|| {
        Error::type_error("'task.dataset.classes' must be a non-negative integer")
    })?;
    let labels = labels
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            if l >= 0.0 && l.fract() == 0.0 && l <= u32::MAX as f64 {
                Ok(l as usize)
            } else {
                Err(Error::value(format!(
                    "label {i} is {l}: labels must be integers in 0..classes"
                )))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if labels.is_empty() || features.len() % labels.len() != 0 {
        return Err(Error::value(format!(
            "'task.dataset.features' holds {} values, not a whole number of rows for {} labels",
            features.len(),
            labels.len()
        )));
    }
    let width = features.len() / labels.len();
    if let Some(count) = input.feature_count.filter(|v| !v.is_null()) {
        if count.as_u64() != Some(width as u64) {
            return Err(Error::value(format!(
                "'task.dataset.featureCount' is {count}, but {} values for {} labels are {width} per sample",
                features.len(),
                labels.len()
            )));
        }
    }
    let name = input.name.unwrap_or_else(|| "dataset".into());
    let dataset = Dataset::new(name, width, classes.0, features, labels)?;
    let d = DatasetConfig::default();
    let config = DatasetConfig {
        hidden: s.hidden.unwrap_or(d.hidden),
        test_fraction: s.test_fraction.unwrap_or(d.test_fraction),
        heterogeneity: s.heterogeneity.unwrap_or(d.heterogeneity),
        seed: s.seed.unwrap_or(d.seed),
    };
    DatasetTask::new(&dataset, config, ranks)
}

/// `settings` less its `world` (a `World` is no setting to read as data), and that world.
fn take_world(settings: &JsValue) -> Result<(JsValue, Option<Rc<WorldHandle>>)> {
    let given = get(settings, "world");
    if given.is_undefined() || !settings.is_object() {
        return Ok((settings.clone(), None));
    }
    let world = world_handle_of(&given)?;
    let rest = js_sys::Object::assign(&js_sys::Object::new(), settings.unchecked_ref());
    let _ = Reflect::delete_property(&rest, &JsValue::from_str("world"));
    Ok((rest.into(), Some(world)))
}

/// A NaN or infinite number among the settings (or `task`'s) is reported as JS writes it:
/// JSON, the settings' form in the library, has no NaN, so it would read as the string "nan".
fn check_finite_settings(value: &JsValue, what: &str) -> Result<()> {
    if !value.is_object() || Array::is_array(value) {
        return Ok(());
    }
    for entry in js_sys::Object::entries(value.unchecked_ref()).iter() {
        let pair: &Array = entry.unchecked_ref();
        let key = pair.get(0).as_string().unwrap_or_default();
        let item = pair.get(1);
        if let Some(x) = item.as_f64().filter(|x| !x.is_finite()) {
            return Err(Error::value(format!(
                "{what}'{}' must be finite, got {}",
                truncated(&key),
                js_number(x)
            )));
        }
        if key == "task" {
            check_finite_settings(&item, "task setting ")?;
        }
    }
    Ok(())
}
