//! `Trainer`: the data-parallel training run of `distopt::train` (the synthetic task, or a data
//! set given from JS such as the digits `Trainer.parseDigits` reads), stepped from JS (the
//! browser demo's engine).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Array, Float32Array, Float64Array, Object, Promise, Reflect, Uint8Array};
use serde::Serialize;
use serde_json::Value;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, busy, js};
use super::convert::{count_arg, json_from_js, rank_arg, set, tensors_to_js};
use super::session::current_backend;
use super::typings::IntegerArg;
use super::world::{WorldHandle, world_handle_of};
use distopt::diloco::Compression;
use distopt::error::{Error, Result};
use distopt::train::{
    Algorithm, AlgorithmName, AlgorithmSettings, Dataset, DatasetConfig, DatasetTask,
    Evaluation as TrainEvaluation, StepReport as TrainStepReport, SyntheticTask, Task, TaskConfig,
    TrainConfig, Trainer,
};

#[wasm_bindgen]
extern "C" {
    /// `new Trainer(settings)`'s settings (see `TrainerSettings`).
    #[wasm_bindgen(typescript_type = "TrainerSettings")]
    pub type TrainerSettingsArg;

    /// The bytes of `www/data/digits.bin`.
    #[wasm_bindgen(typescript_type = "ArrayBuffer | Uint8Array")]
    pub type DigitsBytesArg;
}

#[wasm_bindgen(typescript_custom_section)]
const TRAINER_SETTINGS: &'static str = r#"
export interface TrainerSettings {
  /** R, the number of ranks (and shards). */
  ranks: number;
  /**
   * Synchronous SGD (default), post-local SGD with periodic or hierarchical averaging, ZeRO
   * (synchronous SGD whose momentum is sharded over the ranks by a ZeroRedundancyOptimizer), or
   * DiLoCo (local SGD steps, and every `period` steps the mean pseudo-gradient applied by an
   * outer SGD with lr 0.7 and Nesterov momentum 0.9).
   */
  algorithm?: 'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco';
  /**
   * Averaging period; for `hierarchical`, the world-level period of the default hierarchy; for
   * `diloco`, the inner steps between syncs (`sync_every`) (default 8).
   */
  period?: number;
  /** `diloco`: fragments of Streaming DiLoCo, syncing staggered (default 1: plain DiLoCo; at most `period`). */
  fragments?: number;
  /**
   * `diloco`: torchft's `fragment_sync_delay`, inner steps between a fragment's all-reduce and
   * its outer step (default 0; smaller than `period / fragments`). Another algorithm: ValueError.
   */
  fragmentSyncDelay?: number;
  /**
   * `diloco`: torchft's `fragment_update_alpha`, the weight of the local parameters mixed with
   * the outer step's result (default 0, in [0, 1]). Another algorithm: ValueError.
   */
  fragmentUpdateAlpha?: number;
  /** `diloco`: the pseudo-gradients' wire format (default `'none'`: each parameter's own dtype). */
  compress?: 'none' | 'bf16' | 'f16';
  /** Warm-up steps of synchronous SGD before local SGD (default 20, as the command line's `--warmup`). */
  warmup?: number;
  /** `hierarchical`: `[[period, groupSize], …]` (default `Trainer.defaultHierarchy(period, ranks)`). */
  levels?: ReadonlyArray<readonly [number, number]>;
  /** `hierarchical`: all-reduce the gradients within groups of this size after warm-up. */
  subgroupSize?: number | null;
  /** SGD learning rate (default 0.05). */
  lr?: number;
  /** SGD momentum (default 0.9). */
  momentum?: number;
  /** Samples per rank per step (default 32). */
  batchSize?: number;
  /** Seed of the mini-batch sampling (default 0). */
  seed?: number;
  /** The synthetic task (default), or a real data set with a held-out split. */
  task?: TaskSettings | DatasetTaskSettings;
  /**
   * The world to train in: by default a simulated world of `ranks` ranks; this process's rank
   * of a run over NATS (`World.joinNats`, a world of `ranks` ranks) trains its own shard, every
   * process of the run constructing the same Trainer and making the same calls. A world joined
   * with `join: true` is taken in by `await trainer.admit()` before its first step.
   */
  world?: World;
}
"#;

/// Settings a `new Trainer({...})` accepts (`TrainerSettings`).
const KEYS: [&str; 15] = [
    "ranks",
    "algorithm",
    "period",
    "fragments",
    "fragmentSyncDelay",
    "fragmentUpdateAlpha",
    "compress",
    "warmup",
    "levels",
    "subgroupSize",
    "lr",
    "momentum",
    "batchSize",
    "seed",
    "task",
];
/// Settings of `task` with a `dataset`.
const DATASET_TASK_KEYS: [&str; 5] = ["dataset", "hidden", "testFraction", "heterogeneity", "seed"];
/// Settings of `task.dataset`.
const DATASET_KEYS: [&str; 5] = ["features", "labels", "classes", "name", "featureCount"];
/// Settings of the synthetic `task`.
const TASK_KEYS: [&str; 6] = [
    "features",
    "hidden",
    "classes",
    "samples",
    "heterogeneity",
    "seed",
];

fn unknown_key(map: &serde_json::Map<String, Value>, known: &[&str], what: &str) -> Result<()> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(Error::type_error(format!(
            "{what} got an unexpected setting '{key}' (known: {})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// A count or a seed among the settings: a non-negative integer (JS's `-0` is 0); a negative
/// integer is a `ValueError`, anything else (a fraction, a string, a boolean) a `TypeError`.
fn get_u64(map: &serde_json::Map<String, Value>, key: &str, default: u64) -> Result<u64> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match (v.as_u64(), v.as_f64()) {
            (Some(n), _) => Ok(n),
            // JS's -0 (a float pattern matches it too).
            (None, Some(0.0)) => Ok(0),
            (None, Some(x)) if x < 0.0 && x.fract() == 0.0 => Err(Error::value(format!(
                "'{key}' must be a non-negative integer, got {v}"
            ))),
            _ => Err(Error::type_error(format!(
                "'{key}' must be a non-negative integer, got {v}"
            ))),
        },
    }
}

fn get_usize(map: &serde_json::Map<String, Value>, key: &str, default: usize) -> Result<usize> {
    usize::try_from(get_u64(map, key, default as u64)?)
        .map_err(|_| Error::value(format!("'{key}' is too large")))
}

/// A NaN or infinite number among the settings (or `task`'s) is reported as JS writes it:
/// JSON, the settings' form in the library, has no NaN, so it would read as the string "nan".
/// `settings` less its `world` (a `World` is no setting to read as data), and that world.
fn take_world(settings: &JsValue) -> Result<(JsValue, Option<std::rc::Rc<WorldHandle>>)> {
    let given = super::convert::get(settings, "world");
    if given.is_undefined() || !settings.is_object() {
        return Ok((settings.clone(), None));
    }
    let world = world_handle_of(&given)?;
    let rest = js_sys::Object::assign(&js_sys::Object::new(), settings.unchecked_ref());
    let _ = js_sys::Reflect::delete_property(&rest, &JsValue::from_str("world"));
    Ok((rest.into(), Some(world)))
}

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
                super::convert::truncated(&key),
                super::convert::js_number(x)
            )));
        }
        if key == "task" {
            check_finite_settings(&item, "task setting ")?;
        }
    }
    Ok(())
}

fn get_f64(map: &serde_json::Map<String, Value>, key: &str, default: f64) -> Result<f64> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::type_error(format!("'{key}' must be a number, got {v}"))),
    }
}

/// The algorithm named by `algorithm` (`"sync"`, `"periodic"`, `"hierarchical"`, `"zero"`,
/// `"diloco"`; `train::AlgorithmName`) with its settings, the library's defaults where absent
/// (`train::AlgorithmSettings`: DiLoCo syncs every `period` steps, over `fragments` fragments).
fn algorithm(map: &serde_json::Map<String, Value>, ranks: usize) -> Result<Algorithm> {
    let name: AlgorithmName = match map.get("algorithm") {
        None | Some(Value::Null) => AlgorithmName::Sync,
        Some(Value::String(s)) => s.parse()?,
        Some(other) => {
            return Err(Error::type_error(format!(
                "'algorithm' must be \"sync\", \"periodic\", \"hierarchical\", \"zero\" or \"diloco\", got {other}"
            )));
        }
    };
    let defaults = AlgorithmSettings::default();
    let mut settings = AlgorithmSettings::default();
    settings.period = get_u64(map, "period", defaults.period)?;
    settings.warmup = get_u64(map, "warmup", defaults.warmup)?;
    settings.fragments = get_usize(map, "fragments", defaults.fragments)?;
    // torchft's Streaming DiLoCo knobs: DiLoCo's only, as the CLI's flags are.
    for key in ["fragmentSyncDelay", "fragmentUpdateAlpha"] {
        let given = !matches!(map.get(key), None | Some(Value::Null));
        if given && name != AlgorithmName::DiLoCo {
            return Err(Error::value(format!(
                "'{key}' applies to algorithm 'diloco' only"
            )));
        }
    }
    settings.fragment_sync_delay = get_u64(map, "fragmentSyncDelay", defaults.fragment_sync_delay)?;
    settings.fragment_update_alpha =
        get_f64(map, "fragmentUpdateAlpha", defaults.fragment_update_alpha)?;
    settings.compress = match map.get("compress") {
        None | Some(Value::Null) => Compression::None,
        Some(Value::String(name)) => Compression::parse(name)?,
        Some(other) => {
            return Err(Error::type_error(format!(
                "'compress' must be 'none', 'bf16' or 'f16', got {other}"
            )));
        }
    };
    settings.levels = match map.get("levels") {
        None | Some(Value::Null) => None,
        Some(Value::Array(pairs)) => Some(
            pairs
                .iter()
                .map(|pair| {
                    let p = pair.as_array().filter(|p| p.len() == 2);
                    p.and_then(|p| Some((p[0].as_u64()?, usize::try_from(p[1].as_u64()?).ok()?)))
                        .ok_or_else(|| {
                            Error::type_error(format!(
                                "'levels' must be [period, groupSize] pairs of non-negative integers, got {pair}"
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(other) => {
            return Err(Error::type_error(format!(
                "'levels' must be an array of [period, groupSize] pairs, got {other}"
            )));
        }
    };
    settings.subgroup_size = match map.get("subgroupSize") {
        None | Some(Value::Null) => None,
        Some(_) => Some(get_usize(map, "subgroupSize", 0)?),
    };
    name.build(&settings, ranks)
}

#[wasm_bindgen(typescript_custom_section)]
const TASK_SETTINGS: &'static str = r#"
/** The synthetic classification task: Gaussian clusters, one skewed shard per rank. */
export interface TaskSettings {
  /** Input features (default 32). */
  features?: number;
  /** Hidden units of the two-layer perceptron (default 32). */
  hidden?: number;
  /** Classes (default 4). */
  classes?: number;
  /** Samples in all shards together (default 4096). */
  samples?: number;
  /** 0: IID shards … 1: every shard one class (default 0.8). */
  heterogeneity?: number;
  /** Seed of the data and the initial parameters (default 0). */
  seed?: number;
}
"#;

/// The synthetic task's settings (`TaskSettings`).
fn task_config(value: Option<&Value>) -> Result<TaskConfig> {
    let defaults = TaskConfig::default();
    let map = match value {
        None | Some(Value::Null) => return Ok(defaults),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(Error::type_error(format!(
                "'task' must be an object, got {other}"
            )));
        }
    };
    unknown_key(map, &TASK_KEYS, "task")?;
    Ok(TaskConfig {
        features: get_usize(map, "features", defaults.features)?,
        hidden: get_usize(map, "hidden", defaults.hidden)?,
        classes: get_usize(map, "classes", defaults.classes)?,
        samples: get_usize(map, "samples", defaults.samples)?,
        heterogeneity: get_f64(map, "heterogeneity", defaults.heterogeneity)?,
        seed: get_u64(map, "seed", defaults.seed)?,
    })
}

#[wasm_bindgen(typescript_custom_section)]
const DATASET_TASK_SETTINGS: &'static str = r#"
/**
 * A labelled data set for `task.dataset`: `labels.length` samples of `features.length /
 * labels.length` values each (row-major), labels in `0..classes`. `Trainer.parseDigits`
 * returns one.
 */
export interface DatasetInput {
  features: Float32Array | Float64Array | Uint8Array | ArrayLike<number>;
  labels: Uint8Array | Uint16Array | Int32Array | ArrayLike<number>;
  classes: number;
  /** Shown in `taskName` (default `'dataset'`). */
  name?: string;
  /** Values per sample; checked against `features.length / labels.length` when given. */
  featureCount?: number;
}

/**
 * A real data set, split into a held-out test set and one non-IID training shard per rank (a
 * `heterogeneity` share of the samples sorted by label, the rest placed at random, cut into R
 * contiguous shards).
 */
export interface DatasetTaskSettings {
  dataset: DatasetInput;
  /** Hidden units of the two-layer perceptron (default 32). */
  hidden?: number;
  /** Share of the samples held out for `evaluate()`, in [0, 1) (default 0.2). */
  testFraction?: number;
  /** 0: IID shards … 1: shards sorted by label (default 0.9). */
  heterogeneity?: number;
  /** Seed of the split and the initial parameters (default 0). */
  seed?: number;
}
"#;

/// The dataset task's settings (`task` holds a `dataset`: `DatasetTaskSettings`), or `None`
/// for the synthetic task.
/// The features and labels are read from the JS values themselves (typed arrays or arrays),
/// not from their JSON form.
fn dataset_task(
    settings: &JsValue,
    map: &serde_json::Map<String, Value>,
    ranks: usize,
) -> Result<Option<DatasetTask>> {
    let Some(Value::Object(task)) = map.get("task") else {
        return Ok(None);
    };
    if task.get("dataset").is_none_or(Value::is_null) {
        return Ok(None);
    }
    unknown_key(task, &DATASET_TASK_KEYS, "task (with a dataset)")?;
    let Some(Value::Object(dataset)) = task.get("dataset") else {
        return Err(Error::type_error(
            "'task.dataset' must be an object {features, labels, classes, name, featureCount}",
        ));
    };
    unknown_key(dataset, &DATASET_KEYS, "task.dataset")?;
    let get = |object: &JsValue, key: &str| {
        Reflect::get(object, &JsValue::from_str(key))
            .map_err(|_| Error::type_error(format!("cannot read '{key}' of the settings")))
    };
    let js_dataset = get(&get(settings, "task")?, "dataset")?;
    let numbers = |key: &str| -> Result<Vec<f64>> {
        let value = get(&js_dataset, key)?;
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
    let classes = match dataset.get("classes") {
        Some(Value::Number(n)) => n.as_u64().and_then(|c| usize::try_from(c).ok()),
        _ => None,
    }
    .ok_or_else(|| Error::type_error("'task.dataset.classes' must be a non-negative integer"))?;
    let name = match dataset.get("name") {
        None | Some(Value::Null) => "dataset".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(Error::type_error(format!(
                "'task.dataset.name' must be a string, got {other}"
            )));
        }
    };
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
    if let Some(count) = dataset.get("featureCount").filter(|v| !v.is_null()) {
        if count.as_u64() != Some(width as u64) {
            return Err(Error::value(format!(
                "'task.dataset.featureCount' is {count}, but {} values for {} labels are {width} per sample",
                features.len(),
                labels.len()
            )));
        }
    }
    let dataset = Dataset::new(name, width, classes, features, labels)?;
    let defaults = DatasetConfig::default();
    let config = DatasetConfig {
        hidden: get_usize(task, "hidden", defaults.hidden)?,
        test_fraction: get_f64(task, "testFraction", defaults.test_fraction)?,
        heterogeneity: get_f64(task, "heterogeneity", defaults.heterogeneity)?,
        seed: get_u64(task, "seed", defaults.seed)?,
    };
    DatasetTask::new(&dataset, config, ranks).map(Some)
}

#[wasm_bindgen(typescript_custom_section)]
const DIGITS: &'static str = r#"
/** What `Trainer.parseDigits` reads from `www/data/digits.bin`. */
export interface Digits extends DatasetInput {
  name: 'digits';
  /** 1,797 × 64 pixels scaled to [0, 1]. */
  features: Float32Array;
  /** 1,797 labels, 0..9. */
  labels: Uint8Array;
  classes: 10;
  featureCount: 64;
}
"#;

/// The digits data set as `Trainer.parseDigits` returns it (`Digits`), for `task.dataset`.
fn digits_to_js(dataset: &Dataset) -> Object {
    let features: Vec<f32> = (0..dataset.len())
        .flat_map(|i| {
            dataset
                .sample(i)
                .unwrap_or_default()
                .iter()
                .map(|&x| x as f32)
        })
        .collect();
    let labels: Vec<u8> = dataset.labels().iter().map(|&l| l as u8).collect();
    let obj = Object::new();
    set(&obj, "name", dataset.name());
    set(&obj, "features", Float32Array::from(features.as_slice()));
    set(&obj, "labels", Uint8Array::from(labels.as_slice()));
    set(&obj, "classes", dataset.classes() as f64);
    set(&obj, "featureCount", dataset.features() as f64);
    obj
}

fn bytes_to_js(bytes: &[u64]) -> Array {
    bytes.iter().map(|&b| JsValue::from_f64(b as f64)).collect()
}

/// What one `Trainer.step()` did.
#[derive(Serialize, Tsify)]
#[tsify(missing_as_null)]
#[serde(rename_all = "camelCase")]
pub struct StepReport {
    /// Steps completed, this one included.
    step: f64,
    /// Each rank's mini-batch loss.
    #[serde(with = "serde_wasm_bindgen::preserve")]
    #[tsify(type = "Float64Array")]
    loss_per_rank: JsValue,
    mean_loss: f64,
    /// The largest L2 distance of a replica from the mean of the replicas (0 when identical).
    divergence: f64,
    /// Bytes each rank has sent so far (cumulative).
    bytes_communicated_per_rank: f64,
    /// Group size the gradients were all-reduced over this step, or `null`.
    gradients_reduced: Option<f64>,
    /// Group size the parameters were averaged over this step, or `null`.
    averaged: Option<f64>,
    /// Bytes of optimizer state (momentum) each rank holds after the step: the whole model's for
    /// a local SGD, the rank's shard for ZeRO.
    optimizer_state_bytes_per_rank: Vec<f64>,
}

fn report_to_js(report: &TrainStepReport) -> JsResult<JsValue> {
    let optional = |g: Option<usize>| g.map(|g| g as f64);
    super::typings::to_js(&StepReport {
        step: report.step as f64,
        loss_per_rank: Float64Array::from(report.loss_per_rank.as_slice()).into(),
        mean_loss: report.mean_loss,
        divergence: report.divergence,
        bytes_communicated_per_rank: report.bytes_communicated_per_rank as f64,
        gradients_reduced: optional(report.gradients_reduced),
        averaged: optional(report.averaged),
        optimizer_state_bytes_per_rank: report
            .optimizer_state_bytes_per_rank
            .iter()
            .map(|&b| b as f64)
            .collect(),
    })
}

/// The replicas' quality on the evaluation samples: a data set's held-out split, or every shard
/// of the synthetic task.
#[derive(Serialize, Tsify)]
#[tsify(missing_as_null)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// Loss of the mean of the replicas' parameters.
    mean_model_loss: f64,
    /// Accuracy of the mean of the replicas' parameters.
    mean_model_accuracy: f64,
    /// Each replica's own loss.
    #[serde(with = "serde_wasm_bindgen::preserve")]
    #[tsify(type = "Float64Array")]
    loss_per_rank: JsValue,
    /// Whether the samples are held out (no rank trains on them).
    held_out: bool,
    /// Samples measured.
    samples: f64,
}

fn evaluation_to_js(evaluation: &TrainEvaluation) -> JsResult<JsValue> {
    super::typings::to_js(&Evaluation {
        mean_model_loss: evaluation.mean_model_loss,
        mean_model_accuracy: evaluation.mean_model_accuracy,
        loss_per_rank: Float64Array::from(evaluation.loss_per_rank.as_slice()).into(),
        held_out: evaluation.held_out,
        samples: evaluation.samples as f64,
    })
}

/// R simulated ranks training a two-layer perceptron on a synthetic task or a real data set
/// (`task.dataset`, e.g. the digits from `Trainer.parseDigits`), one step at a time, through
/// distopt's replicas, gradient hook, SGD and averagers.
///
/// Each rank trains on its own skewed shard, with synchronous SGD, post-local SGD (periodic or
/// hierarchical model averaging), ZeRO or DiLoCo (`TrainerSettings.algorithm`).
#[wasm_bindgen(js_name = Trainer)]
pub struct TrainerJs {
    inner: Rc<RefCell<Trainer>>,
    ranks: usize,
    description: String,
    algorithm: &'static str,
    task: Arc<dyn Task>,
}

impl TrainerJs {
    fn borrow(&self) -> Result<std::cell::Ref<'_, Trainer>> {
        self.inner.try_borrow().map_err(|_| busy("trainer"))
    }
}

#[wasm_bindgen(js_class = Trainer)]
impl TrainerJs {
    /// A run as `settings` describe it (`TrainerSettings`: everything but `ranks` has a
    /// default; an unknown setting is a TypeError).
    #[wasm_bindgen(constructor)]
    pub fn new(settings: TrainerSettingsArg) -> JsResult<TrainerJs> {
        js(Self::build(&settings))
    }

    fn build(settings: &JsValue) -> Result<TrainerJs> {
        check_finite_settings(settings, "")?;
        let (settings, world) = take_world(settings)?;
        let settings = &settings;
        let Value::Object(map) = json_from_js(settings, "settings")? else {
            return Err(Error::type_error(
                "Trainer needs a settings object: {ranks, algorithm, …}",
            ));
        };
        unknown_key(&map, &KEYS, "Trainer")?;
        let ranks = match map.get("ranks") {
            Some(_) => get_usize(&map, "ranks", 0)?,
            None => return Err(Error::type_error("Trainer settings need 'ranks'")),
        };
        let defaults = TrainConfig::default();
        let config = TrainConfig {
            algorithm: algorithm(&map, ranks)?,
            lr: get_f64(&map, "lr", defaults.lr)?,
            momentum: get_f64(&map, "momentum", defaults.momentum)?,
            batch_size: get_usize(&map, "batchSize", defaults.batch_size)?,
            seed: get_u64(&map, "seed", defaults.seed)?,
        };
        let task: Arc<dyn Task> = match dataset_task(settings, &map, ranks)? {
            Some(task) => Arc::new(task),
            None => Arc::new(SyntheticTask::new(task_config(map.get("task"))?, ranks)?),
        };
        let description = config.algorithm.describe();
        let name = config.algorithm.name();
        let trainer = match world {
            None => Trainer::new(current_backend()?, task.clone(), config)?,
            Some(world) if world.joining() => Trainer::joining(
                current_backend()?,
                task.clone(),
                config,
                world.communicator(),
            )?,
            Some(world) => Trainer::with_world(
                current_backend()?,
                task.clone(),
                config,
                world.communicator(),
            )?,
        };
        Ok(TrainerJs {
            inner: Rc::new(RefCell::new(trainer)),
            ranks,
            description,
            algorithm: name,
            task,
        })
    }

    /// The default hierarchy for `ranks` ranks with world-level period `period`: `[[period,
    /// groupSize], …]` (8 ranks, period 8: `[[2, 2], [4, 4], [8, 8]]`).
    #[wasm_bindgen(
        js_name = defaultHierarchy,
        unchecked_return_type = "Array<[number, number]>"
    )]
    pub fn default_hierarchy(period: IntegerArg, ranks: IntegerArg) -> JsResult<Array> {
        let period = js(count_arg(&period, "period"))? as u64;
        let ranks = js(count_arg(&ranks, "ranks"))?;
        if period == 0 {
            return Err(super::boundary::js_error(Error::value(
                "period must be a positive integer, got 0",
            )));
        }
        if ranks == 0 {
            return Err(super::boundary::js_error(Error::value(
                "ranks must be a positive integer, got 0",
            )));
        }
        Ok(Algorithm::default_hierarchy(period, ranks)
            .into_iter()
            .map(|(p, g)| {
                let pair = Array::new();
                pair.push(&JsValue::from_f64(p as f64));
                pair.push(&JsValue::from_f64(g as f64));
                JsValue::from(pair)
            })
            .collect())
    }

    /// Reads the UCI hand-written digits file (`www/data/digits.bin` of the repository: CC BY 4.0,
    /// E. Alpaydin and C. Kaynak) into a data set for `task.dataset`.
    #[wasm_bindgen(js_name = parseDigits, unchecked_return_type = "Digits")]
    pub fn parse_digits(bytes: DigitsBytesArg) -> JsResult<Object> {
        let bytes = JsValue::from(bytes);
        let bytes = if bytes.is_instance_of::<Uint8Array>() {
            bytes.unchecked_into::<Uint8Array>().to_vec()
        } else if bytes.is_instance_of::<js_sys::ArrayBuffer>() {
            Uint8Array::new(&bytes).to_vec()
        } else {
            return js(Err(Error::type_error(
                "Trainer.parseDigits takes the file's bytes: an ArrayBuffer or a Uint8Array",
            )));
        };
        let dataset = js(Dataset::from_digits_bin(&bytes))?;
        Ok(digits_to_js(&dataset))
    }

    /// `'synthetic'` or the data set's name (`'digits'`).
    #[wasm_bindgen(getter, js_name = taskName)]
    pub fn task_name(&self) -> String {
        self.task.name().into()
    }

    /// The data, its split and the model, in words.
    #[wasm_bindgen(getter, js_name = taskDescription)]
    pub fn task_description(&self) -> String {
        self.task.describe()
    }

    /// Whether `evaluate()` measures held-out samples (a data set's test split).
    #[wasm_bindgen(getter, js_name = heldOut)]
    pub fn held_out(&self) -> bool {
        self.task.held_out()
    }

    /// R, the number of ranks.
    #[wasm_bindgen(getter)]
    pub fn ranks(&self) -> f64 {
        self.ranks as f64
    }

    /// The algorithm's name (`TrainerSettings.algorithm`).
    #[wasm_bindgen(
        getter,
        unchecked_return_type = "'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco'"
    )]
    pub fn algorithm(&self) -> String {
        self.algorithm.into()
    }

    /// The algorithm in words, with its settings.
    #[wasm_bindgen(getter)]
    pub fn description(&self) -> String {
        self.description.clone()
    }

    /// Steps completed.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> JsResult<f64> {
        Ok(js(self.borrow())?.steps() as f64)
    }

    /// Scalar parameters of one replica.
    #[wasm_bindgen(getter, js_name = numParams)]
    pub fn num_params(&self) -> JsResult<f64> {
        Ok(js(self.borrow())?.task().num_params() as f64)
    }

    /// How many samples of each class rank `rank`'s shard holds.
    #[wasm_bindgen(js_name = classCounts)]
    pub fn class_counts(&self, rank: IntegerArg) -> JsResult<Vec<f64>> {
        let trainer = js(self.borrow())?;
        let rank = js(rank_arg(&rank, self.ranks))?;
        Ok(trainer
            .task()
            .class_counts(rank)
            .into_iter()
            .map(|c| c as f64)
            .collect())
    }

    /// Bytes sent so far, per rank, by kind (as `World.stats()`).
    #[wasm_bindgen(js_name = commStats, unchecked_return_type = "CommStats")]
    pub fn comm_stats(&self) -> JsResult<JsValue> {
        super::world::stats_to_js(&js(self.borrow())?.comm_stats())
    }

    /// Bytes of optimizer state each rank holds now (the whole model's momentum for a local
    /// SGD, the rank's shard for ZeRO).
    #[wasm_bindgen(js_name = optimizerStateBytesPerRank, unchecked_return_type = "number[]")]
    pub fn optimizer_state_bytes_per_rank(&self) -> JsResult<Array> {
        Ok(bytes_to_js(
            &js(self.borrow())?.optimizer_state_bytes_per_rank(),
        ))
    }

    /// One step on every rank.
    #[wasm_bindgen(unchecked_return_type = "Promise<StepReport>")]
    pub fn step(&self) -> Promise {
        let inner = self.inner.clone();
        super::boundary::promise_now(async move {
            let report = js(step(&inner).await)?;
            report_to_js(&report)
        })
    }

    /// Takes this process in at its run's next sync point, healed there from a live rank
    /// (a world joined with `join: true`; call it once, before the first step).
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn admit(&self) -> Promise {
        let inner = self.inner.clone();
        super::boundary::promise_now(async move {
            js(admit(&inner).await)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The loss of every replica and of their mean (and its accuracy) on the evaluation samples
    /// (the held-out split of a data set; every shard of the synthetic task).
    #[wasm_bindgen(unchecked_return_type = "Promise<Evaluation>")]
    pub fn evaluate(&self) -> Promise {
        let inner = self.inner.clone();
        super::boundary::promise_now(async move {
            let evaluation = js(evaluate(&inner).await)?;
            evaluation_to_js(&evaluation)
        })
    }

    /// Every rank's parameters (`[rank][param]`).
    #[wasm_bindgen(unchecked_return_type = "Promise<Tensor[][]>")]
    pub fn params(&self) -> Promise {
        let inner = self.inner.clone();
        super::boundary::promise_now(async move {
            let params = js(params(&inner).await)?;
            let out = Array::new();
            for rank in &params {
                out.push(&js(tensors_to_js(rank))?.into());
            }
            Ok(out.into())
        })
    }
}

// The trainer is held across its readbacks on purpose: a second call meanwhile is refused
// (`busy`) instead of interleaving two steps.
#[allow(clippy::await_holding_refcell_ref)]
async fn step(inner: &RefCell<Trainer>) -> Result<TrainStepReport> {
    let mut trainer = inner.try_borrow_mut().map_err(|_| busy("trainer"))?;
    trainer.step().await
}

#[allow(clippy::await_holding_refcell_ref)]
async fn admit(inner: &RefCell<Trainer>) -> Result<()> {
    let mut trainer = inner.try_borrow_mut().map_err(|_| busy("trainer"))?;
    trainer.admit().await
}

#[allow(clippy::await_holding_refcell_ref)]
async fn evaluate(inner: &RefCell<Trainer>) -> Result<TrainEvaluation> {
    let mut trainer = inner.try_borrow_mut().map_err(|_| busy("trainer"))?;
    trainer.evaluate().await
}

#[allow(clippy::await_holding_refcell_ref)]
async fn params(inner: &RefCell<Trainer>) -> Result<Vec<Vec<distopt::Tensor>>> {
    let trainer = inner.try_borrow().map_err(|_| busy("trainer"))?;
    trainer.replicas().all_params().await
}
