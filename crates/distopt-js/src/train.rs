//! `Trainer`: the data-parallel training run of `distopt::train` (the synthetic task, or a data
//! set given from JS such as the digits `Trainer.parseDigits` reads), stepped from JS (the
//! browser demo's engine).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Array, Float32Array, Float64Array, Object, Promise, Uint8Array};
use serde::Serialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, busy, js};
use super::convert::{count_arg, rank_arg, set, tensors_to_js};
use super::session::current_backend;
use super::trainer_settings::{TrainerPlan, read_settings};
use super::typings::IntegerArg;
use distopt::error::{Error, Result};
use distopt::train::{
    Algorithm, Dataset, Evaluation as TrainEvaluation, StepReport as TrainStepReport,
    SyntheticTask, Task, Trainer,
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
        let TrainerPlan {
            ranks,
            config,
            dataset,
            synthetic,
            world,
        } = read_settings(settings)?;
        let task: Arc<dyn Task> = match dataset {
            Some(task) => Arc::new(task),
            None => Arc::new(SyntheticTask::new(synthetic, ranks)?),
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
