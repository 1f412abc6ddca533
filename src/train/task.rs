//! What the trainer learns: a [`Task`] is a classification data set split into one shard per
//! rank (plus, for a real data set, a held-out test split) and the model that learns it.
//!
//! - [`SyntheticTask`]: Gaussian clusters, a few per class, generated from a seed; each
//!   shard skewed towards one class.
//! - [`DatasetTask`]: a [`Dataset`] given by the caller (features and labels), such as the
//!   UCI hand-written digits embedded in the library ([`Dataset::digits`]), split into a
//!   held-out test set and R training shards that are **non-IID by label**: the training
//!   samples are sorted by label (with a `heterogeneity` share of them; the rest placed at
//!   random) and cut into R contiguous shards, so that at full heterogeneity each rank sees
//!   about `classes / R` of the digits (the "sorted by label" split of McMahan et al., 2017).
//!
//! [`TaskKind`] names the built-in tasks (`synthetic`, `digits`) for command lines and
//! settings.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::Mlp;
use crate::error::{Error, ErrorKind, Result};
use crate::rng::SplitMix64;
use crate::tensor::Tensor;

/// Gaussian clusters per class (two make the classes not linearly separable in general).
const CLUSTERS_PER_CLASS: usize = 2;
/// Expected distance between two cluster centres, in units of the per-coordinate noise.
const SEPARATION: f64 = 5.0;
/// Largest data set (samples × features) and largest model × ranks, in elements: generous for
/// a demo, small enough that no input makes it allocate without bound.
const MAX_ELEMENTS: usize = 1 << 25;

/// A classification problem split into one training shard per rank, and the two-layer
/// perceptron that learns it: what a [`Trainer`](super::Trainer) trains on.
///
/// The library's tasks are [`SyntheticTask`] and [`DatasetTask`].
pub trait Task: fmt::Debug + Send + Sync {
    /// A short name: `synthetic`, or the data set's name (`digits`).
    fn name(&self) -> &str;

    /// One line about the data, the split and the model.
    fn describe(&self) -> String;

    /// Number of shards (ranks).
    fn ranks(&self) -> usize;

    /// Classes.
    fn classes(&self) -> usize;

    /// Samples in rank `rank`'s shard (0 for a rank out of range).
    fn shard_len(&self, rank: usize) -> usize;

    /// How many samples of each class rank `rank`'s shard holds (empty out of range).
    fn class_counts(&self, rank: usize) -> Vec<usize>;

    /// The model's parameter shapes: `[hidden, features]`, `[hidden]`, `[classes, hidden]`,
    /// `[classes]`.
    fn param_shapes(&self) -> Vec<Vec<usize>>;

    /// Scalar parameters of one replica.
    fn num_params(&self) -> usize;

    /// The deterministic initial parameters (float32): weights drawn from N(0, 1/fan_in),
    /// biases zero.
    ///
    /// # Errors
    /// Only if a tensor cannot be made (not for a task that was constructed).
    fn initial_params(&self) -> Result<Vec<Tensor>>;

    /// Mean loss of `params` over rank `rank`'s samples `batch` (indices into the shard), and
    /// its gradient (one vector per parameter).
    ///
    /// # Errors
    /// `IndexError` for a rank or sample out of range; `ValueError` for an empty batch or
    /// parameters of the wrong number or sizes.
    fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        rank: usize,
        batch: &[usize],
    ) -> Result<(f64, Vec<Vec<f64>>)>;

    /// Mean loss and accuracy of `params` on the evaluation samples: the held-out test split
    /// when [`Task::held_out`], otherwise every sample of every shard.
    ///
    /// # Errors
    /// `ValueError` for parameters of the wrong number or sizes.
    fn evaluate(&self, params: &[Vec<f64>]) -> Result<(f64, f64)>;

    /// Whether [`Task::evaluate`] measures samples no rank trains on.
    fn held_out(&self) -> bool;

    /// Samples [`Task::evaluate`] measures.
    fn evaluation_len(&self) -> usize;
}

/// Training samples laid out shard after shard, and the model dimensions.
#[derive(Debug, Clone)]
struct Shards {
    mlp: Mlp,
    features: usize,
    classes: usize,
    /// `samples × features`, row-major; shard r is the rows `ranges[r]`.
    inputs: Vec<f64>,
    labels: Vec<usize>,
    ranges: Vec<Range<usize>>,
}

impl Shards {
    fn shard_len(&self, rank: usize) -> usize {
        self.ranges.get(rank).map_or(0, |s| s.len())
    }

    fn class_counts(&self, rank: usize) -> Vec<usize> {
        let Some(shard) = self.ranges.get(rank) else {
            return Vec::new();
        };
        let mut counts = vec![0; self.classes];
        for &label in &self.labels[shard.clone()] {
            counts[label] += 1;
        }
        counts
    }

    fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        rank: usize,
        batch: &[usize],
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        let shard = self.ranges.get(rank).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::IndexError,
                format!("rank {rank} out of range for {} shards", self.ranges.len()),
            )
        })?;
        if batch.is_empty() {
            return Err(Error::value("an empty batch has no loss"));
        }
        if let Some(&bad) = batch.iter().find(|&&i| i >= shard.len()) {
            return Err(Error::new(
                ErrorKind::IndexError,
                format!(
                    "sample {bad} out of range for shard {rank} of {} samples",
                    shard.len()
                ),
            ));
        }
        self.mlp.loss_and_grad(
            params,
            &self.inputs,
            &self.labels,
            batch.iter().map(|&i| shard.start + i),
        )
    }
}

/// Checks that `ranks` × the model fits; the model's scalar count.
/// A `ValueError` unless a task's `heterogeneity` lies in `[0, 1]`.
fn check_heterogeneity(heterogeneity: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&heterogeneity) {
        return Err(Error::value(format!(
            "heterogeneity must lie in [0, 1], got {heterogeneity}"
        )));
    }
    Ok(())
}

fn check_model(mlp: &Mlp, ranks: usize) -> Result<usize> {
    let too_big = |what: &str| Error::value(format!("the {what} is too large for a demo"));
    let numel = mlp
        .numel()
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| too_big("model"))?;
    numel
        .checked_mul(ranks)
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| too_big("model × ranks"))?;
    Ok(numel)
}

/// The synthetic classification problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskConfig {
    /// Input features (default 32).
    pub features: usize,
    /// Hidden units of the perceptron (default 32).
    pub hidden: usize,
    /// Classes (default 4).
    pub classes: usize,
    /// Samples in all shards together (default 4096).
    pub samples: usize,
    /// How strongly each shard is skewed towards its own class, in `[0, 1]`: a sample of shard
    /// r belongs to class `r mod classes` with probability `h + (1 − h)/classes`, otherwise to
    /// a uniformly drawn class. 0 is IID; 1 gives every shard one class (default 0.8).
    pub heterogeneity: f64,
    /// Seed of the data and of the initial parameters (default 0).
    pub seed: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            features: 32,
            hidden: 32,
            classes: 4,
            samples: 4096,
            heterogeneity: 0.8,
            seed: 0,
        }
    }
}

/// A deterministic synthetic data set split into one shard per rank, and the model that
/// learns it. Its evaluation covers every shard (there is no held-out split: the clusters are
/// the distribution).
#[derive(Debug, Clone)]
pub struct SyntheticTask {
    config: TaskConfig,
    data: Shards,
}

impl SyntheticTask {
    /// Generates the data for `ranks` shards (each gets `samples / ranks` samples, the first
    /// `samples % ranks` one more).
    ///
    /// # Errors
    /// `ValueError` for an empty or oversized configuration.
    pub fn new(config: TaskConfig, ranks: usize) -> Result<SyntheticTask> {
        if ranks == 0 {
            return Err(Error::value("the task needs at least one rank"));
        }
        if config.features == 0 || config.hidden == 0 {
            return Err(Error::value("features and hidden units must be positive"));
        }
        if config.classes < 2 {
            return Err(Error::value(format!(
                "a classification task needs at least 2 classes, got {}",
                config.classes
            )));
        }
        if config.samples < ranks {
            return Err(Error::value(format!(
                "{} samples cannot fill {ranks} shards: every rank needs at least one",
                config.samples
            )));
        }
        check_heterogeneity(config.heterogeneity)?;
        let data_len = config
            .samples
            .checked_mul(config.features)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                Error::value("the data set (samples × features) is too large for a demo")
            })?;
        let mlp = Mlp::new(config.features, config.hidden, config.classes);
        check_model(&mlp, ranks)?;

        let (d, c) = (config.features, config.classes);
        let mut rng = SplitMix64::new(config.seed, 1);
        let scale = SEPARATION / (2.0 * d as f64).sqrt();
        let centers: Vec<f64> = (0..c * CLUSTERS_PER_CLASS * d)
            .map(|_| rng.normal() * scale)
            .collect();
        let mut inputs = Vec::with_capacity(data_len);
        let mut labels = Vec::with_capacity(config.samples);
        let mut ranges = Vec::with_capacity(ranks);
        let (base, extra) = (config.samples / ranks, config.samples % ranks);
        for rank in 0..ranks {
            let start = labels.len();
            let len = base + usize::from(rank < extra);
            for _ in 0..len {
                let class = if rng.uniform() < config.heterogeneity {
                    rank % c
                } else {
                    rng.below(c)
                };
                let cluster = class * CLUSTERS_PER_CLASS + rng.below(CLUSTERS_PER_CLASS);
                let center = &centers[cluster * d..(cluster + 1) * d];
                inputs.extend(center.iter().map(|&m| m + rng.normal()));
                labels.push(class);
            }
            ranges.push(start..labels.len());
        }
        Ok(SyntheticTask {
            data: Shards {
                mlp,
                features: d,
                classes: c,
                inputs,
                labels,
                ranges,
            },
            config,
        })
    }

    /// The configuration the data was generated from.
    pub fn config(&self) -> &TaskConfig {
        &self.config
    }

    /// Number of shards (ranks).
    pub fn ranks(&self) -> usize {
        self.data.ranges.len()
    }

    /// Samples in rank `rank`'s shard (0 for a rank out of range).
    pub fn shard_len(&self, rank: usize) -> usize {
        self.data.shard_len(rank)
    }

    /// How many samples of each class rank `rank`'s shard holds (empty out of range).
    pub fn class_counts(&self, rank: usize) -> Vec<usize> {
        self.data.class_counts(rank)
    }

    /// The model's parameter shapes: `[hidden, features]`, `[hidden]`, `[classes, hidden]`,
    /// `[classes]`.
    pub fn param_shapes(&self) -> Vec<Vec<usize>> {
        self.data.mlp.shapes()
    }

    /// Scalar parameters of one replica.
    pub fn num_params(&self) -> usize {
        self.data.mlp.numel().unwrap_or(0)
    }

    /// The deterministic initial parameters (float32): weights drawn from N(0, 1/fan_in),
    /// biases zero.
    ///
    /// # Errors
    /// Only if a tensor cannot be made.
    pub fn initial_params(&self) -> Result<Vec<Tensor>> {
        self.data.mlp.initial_params(self.config.seed)
    }

    /// Mean loss of `params` over rank `rank`'s samples `batch` (indices into the shard), and
    /// its gradient (one vector per parameter).
    ///
    /// # Errors
    /// See [`Task::loss_and_grad`].
    pub fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        rank: usize,
        batch: &[usize],
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        self.data.loss_and_grad(params, rank, batch)
    }

    /// Mean loss and accuracy of `params` over every sample of every shard.
    ///
    /// # Errors
    /// `ValueError` for parameters of the wrong number or sizes.
    pub fn evaluate(&self, params: &[Vec<f64>]) -> Result<(f64, f64)> {
        self.data
            .mlp
            .evaluate(params, &self.data.inputs, &self.data.labels)
    }
}

impl Task for SyntheticTask {
    fn name(&self) -> &str {
        "synthetic"
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "synthetic: {} samples of {} features in {} classes ({} Gaussian clusters each), heterogeneity {}; perceptron {}→{}→{}",
            c.samples,
            c.features,
            c.classes,
            CLUSTERS_PER_CLASS,
            c.heterogeneity,
            c.features,
            c.hidden,
            c.classes
        )
    }

    fn ranks(&self) -> usize {
        SyntheticTask::ranks(self)
    }

    fn classes(&self) -> usize {
        self.config.classes
    }

    fn shard_len(&self, rank: usize) -> usize {
        SyntheticTask::shard_len(self, rank)
    }

    fn class_counts(&self, rank: usize) -> Vec<usize> {
        SyntheticTask::class_counts(self, rank)
    }

    fn param_shapes(&self) -> Vec<Vec<usize>> {
        SyntheticTask::param_shapes(self)
    }

    fn num_params(&self) -> usize {
        SyntheticTask::num_params(self)
    }

    fn initial_params(&self) -> Result<Vec<Tensor>> {
        SyntheticTask::initial_params(self)
    }

    fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        rank: usize,
        batch: &[usize],
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        SyntheticTask::loss_and_grad(self, params, rank, batch)
    }

    fn evaluate(&self, params: &[Vec<f64>]) -> Result<(f64, f64)> {
        SyntheticTask::evaluate(self, params)
    }

    fn held_out(&self) -> bool {
        false
    }

    fn evaluation_len(&self) -> usize {
        self.data.labels.len()
    }
}

/// The bytes of `www/data/digits.bin`: the UCI ML hand-written digits (E. Alpaydin and
/// C. Kaynak, CC BY 4.0; see `www/data/README.md`), in the layout
/// `scripts/convert-digits.py` documents.
pub const DIGITS_BIN: &[u8] = include_bytes!("../../www/data/digits.bin");

/// A labelled classification data set: `len` samples of `features` values each and their
/// labels in `0..classes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    name: String,
    features: usize,
    classes: usize,
    /// `len × features`, row-major.
    inputs: Vec<f64>,
    labels: Vec<usize>,
}

impl Dataset {
    /// A data set from row-major `inputs` (`labels.len()` rows of `features` values) and
    /// `labels` (each below `classes`).
    ///
    /// # Errors
    /// `ValueError` when the sizes disagree, a value is not finite, a label is out of range,
    /// there are fewer than 2 classes or no samples, or the data is too large.
    pub fn new(
        name: impl Into<String>,
        features: usize,
        classes: usize,
        inputs: Vec<f64>,
        labels: Vec<usize>,
    ) -> Result<Dataset> {
        if classes < 2 {
            return Err(Error::value(format!(
                "a classification data set needs at least 2 classes, got {classes}"
            )));
        }
        if labels.is_empty() || features == 0 {
            return Err(Error::value(
                "a data set needs at least one sample of at least one feature",
            ));
        }
        if inputs.len() > MAX_ELEMENTS {
            return Err(Error::value(format!(
                "a data set of {} values is too large (at most {MAX_ELEMENTS})",
                inputs.len()
            )));
        }
        if labels.len().checked_mul(features) != Some(inputs.len()) {
            return Err(Error::value(format!(
                "{} labels of {features} features need {} values, got {}",
                labels.len(),
                labels.len().saturating_mul(features),
                inputs.len()
            )));
        }
        if let Some(i) = inputs.iter().position(|x| !x.is_finite()) {
            return Err(Error::value(format!(
                "feature {} of sample {} is {}: features must be finite",
                i % features,
                i / features,
                inputs[i]
            )));
        }
        if let Some(i) = labels.iter().position(|&l| l >= classes) {
            return Err(Error::value(format!(
                "label {} of sample {i} is out of range for {classes} classes",
                labels[i]
            )));
        }
        Ok(Dataset {
            name: name.into(),
            features,
            classes,
            inputs,
            labels,
        })
    }

    /// Parses the `digits.bin` layout (see `scripts/convert-digits.py`): pixels become
    /// features in `[0, 1]` (divided by the largest pixel value the header gives).
    ///
    /// # Errors
    /// `ValueError` for bytes that are not that layout (wrong magic, truncated, labels out of
    /// range).
    pub fn from_digits_bin(bytes: &[u8]) -> Result<Dataset> {
        const HEADER: usize = 12;
        if bytes.len() < HEADER || &bytes[..4] != b"DGT1" {
            return Err(Error::value(
                "not a digits file: it must start with the 12-byte header \"DGT1\"…",
            ));
        }
        let samples = usize::from(u16::from_le_bytes([bytes[4], bytes[5]]));
        let features = usize::from(bytes[6]) * usize::from(bytes[7]);
        let (classes, max) = (usize::from(bytes[8]), f64::from(bytes[9]));
        if max == 0.0 {
            return Err(Error::value("a digits file's largest pixel value is 0"));
        }
        let expected = HEADER + samples * features + samples;
        if bytes.len() != expected {
            return Err(Error::value(format!(
                "a digits file of {samples} samples of {features} pixels has {expected} bytes, got {}",
                bytes.len()
            )));
        }
        let pixels = &bytes[HEADER..HEADER + samples * features];
        let labels = &bytes[HEADER + samples * features..];
        Dataset::new(
            "digits",
            features,
            classes,
            pixels.iter().map(|&p| f64::from(p) / max).collect(),
            labels.iter().map(|&l| usize::from(l)).collect(),
        )
    }

    /// The UCI ML hand-written digits embedded in the library ([`DIGITS_BIN`]): 1,797 images
    /// of 8×8 pixels scaled to `[0, 1]`, 10 classes.
    ///
    /// # Errors
    /// None in practice (the embedded file is tested); the signature keeps parsing honest.
    pub fn digits() -> Result<Dataset> {
        Dataset::from_digits_bin(DIGITS_BIN)
    }

    /// The data set's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples (never, for a data set that was constructed).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per sample.
    pub fn features(&self) -> usize {
        self.features
    }

    /// Classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// Sample `i`'s features (`None` out of range).
    pub fn sample(&self, i: usize) -> Option<&[f64]> {
        self.inputs.get(i * self.features..(i + 1) * self.features)
    }

    /// How many samples of each class the data set holds.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.classes];
        for &l in &self.labels {
            counts[l] += 1;
        }
        counts
    }
}

/// How a [`DatasetTask`] splits its data set and sizes its model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DatasetConfig {
    /// Hidden units of the perceptron (default 32).
    pub hidden: usize,
    /// Share of the samples held out for evaluation, in `[0, 1)`, drawn at random (default
    /// 0.2: 360 of the 1,797 digits).
    pub test_fraction: f64,
    /// How non-IID the training shards are, in `[0, 1]`: that share of the training samples
    /// is sorted by label, the rest is placed at random, and the result is cut into R
    /// contiguous shards. 1: each rank sees about `classes / R` of the classes; 0: IID
    /// (default 0.9).
    pub heterogeneity: f64,
    /// Seed of the split and of the initial parameters (default 0).
    pub seed: u64,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        DatasetConfig {
            hidden: 32,
            test_fraction: 0.2,
            heterogeneity: 0.9,
            seed: 0,
        }
    }
}

/// A [`Dataset`] split into a held-out test set and one non-IID training shard per rank, and
/// the perceptron `features → hidden → classes` that learns it. Its evaluation is on the
/// held-out test set.
#[derive(Debug, Clone)]
pub struct DatasetTask {
    name: String,
    config: DatasetConfig,
    train: Shards,
    test_inputs: Vec<f64>,
    test_labels: Vec<usize>,
}

impl DatasetTask {
    /// Splits `dataset` for `ranks` ranks as `config` says (module docs: the split).
    ///
    /// # Errors
    /// `ValueError` for no ranks, a fraction or heterogeneity out of range, a test split or
    /// shards left empty, zero hidden units or an oversized model.
    pub fn new(dataset: &Dataset, config: DatasetConfig, ranks: usize) -> Result<DatasetTask> {
        if ranks == 0 {
            return Err(Error::value("the task needs at least one rank"));
        }
        if config.hidden == 0 {
            return Err(Error::value("hidden units must be positive"));
        }
        if !(0.0..1.0).contains(&config.test_fraction) {
            return Err(Error::value(format!(
                "test_fraction must lie in [0, 1), got {}",
                config.test_fraction
            )));
        }
        check_heterogeneity(config.heterogeneity)?;
        let n = dataset.len();
        let test_len = (n as f64 * config.test_fraction).round() as usize;
        if test_len == 0 {
            return Err(Error::value(format!(
                "a test fraction of {} of {n} samples holds out none: nothing to evaluate on",
                config.test_fraction
            )));
        }
        let train_len = n - test_len;
        if train_len < ranks {
            return Err(Error::value(format!(
                "{train_len} training samples cannot fill {ranks} shards: every rank needs at least one"
            )));
        }
        let mlp = Mlp::new(dataset.features, config.hidden, dataset.classes);
        check_model(&mlp, ranks)?;

        let mut rng = SplitMix64::new(config.seed, 4);
        let mut order: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut order);
        let (test, train) = order.split_at(test_len);
        // Sort keys: a `heterogeneity` share of the samples by label (random within a label),
        // the others anywhere; then R contiguous shards.
        let classes = dataset.classes as f64;
        let mut keyed: Vec<(f64, usize)> = train
            .iter()
            .map(|&i| {
                let key = if rng.uniform() < config.heterogeneity {
                    dataset.labels[i] as f64 + rng.uniform()
                } else {
                    rng.uniform() * classes
                };
                (key, i)
            })
            .collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let gather = |indices: &mut dyn Iterator<Item = usize>| {
            let mut inputs = Vec::new();
            let mut labels = Vec::new();
            for i in indices {
                inputs.extend_from_slice(
                    &dataset.inputs[i * dataset.features..(i + 1) * dataset.features],
                );
                labels.push(dataset.labels[i]);
            }
            (inputs, labels)
        };
        let (inputs, labels) = gather(&mut keyed.iter().map(|&(_, i)| i));
        let (test_inputs, test_labels) = gather(&mut test.iter().copied());
        let (base, extra) = (train_len / ranks, train_len % ranks);
        let mut ranges = Vec::with_capacity(ranks);
        let mut start = 0;
        for rank in 0..ranks {
            let len = base + usize::from(rank < extra);
            ranges.push(start..start + len);
            start += len;
        }
        Ok(DatasetTask {
            name: dataset.name.clone(),
            config,
            train: Shards {
                mlp,
                features: dataset.features,
                classes: dataset.classes,
                inputs,
                labels,
                ranges,
            },
            test_inputs,
            test_labels,
        })
    }

    /// The embedded digits ([`Dataset::digits`]) split for `ranks` ranks with the default
    /// [`DatasetConfig`].
    ///
    /// # Errors
    /// As [`DatasetTask::new`].
    pub fn digits(ranks: usize) -> Result<DatasetTask> {
        DatasetTask::new(&Dataset::digits()?, DatasetConfig::default(), ranks)
    }

    /// The split's configuration.
    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// Input features.
    pub fn features(&self) -> usize {
        self.train.features
    }

    /// Held-out test samples.
    pub fn test_len(&self) -> usize {
        self.test_labels.len()
    }

    /// Training samples (all shards).
    pub fn train_len(&self) -> usize {
        self.train.labels.len()
    }

    /// Mean loss and accuracy of `params` over every training sample (all shards).
    ///
    /// # Errors
    /// `ValueError` for parameters of the wrong number or sizes.
    pub fn evaluate_train(&self, params: &[Vec<f64>]) -> Result<(f64, f64)> {
        self.train
            .mlp
            .evaluate(params, &self.train.inputs, &self.train.labels)
    }
}

impl Task for DatasetTask {
    fn name(&self) -> &str {
        &self.name
    }

    fn describe(&self) -> String {
        format!(
            "{}: {} training samples in {} non-IID shards (heterogeneity {}, sorted by label), {} held out; {} features, {} classes; perceptron {}→{}→{}",
            self.name,
            self.train_len(),
            self.train.ranges.len(),
            self.config.heterogeneity,
            self.test_len(),
            self.train.features,
            self.train.classes,
            self.train.features,
            self.config.hidden,
            self.train.classes
        )
    }

    fn ranks(&self) -> usize {
        self.train.ranges.len()
    }

    fn classes(&self) -> usize {
        self.train.classes
    }

    fn shard_len(&self, rank: usize) -> usize {
        self.train.shard_len(rank)
    }

    fn class_counts(&self, rank: usize) -> Vec<usize> {
        self.train.class_counts(rank)
    }

    fn param_shapes(&self) -> Vec<Vec<usize>> {
        self.train.mlp.shapes()
    }

    fn num_params(&self) -> usize {
        self.train.mlp.numel().unwrap_or(0)
    }

    fn initial_params(&self) -> Result<Vec<Tensor>> {
        self.train.mlp.initial_params(self.config.seed)
    }

    fn loss_and_grad(
        &self,
        params: &[Vec<f64>],
        rank: usize,
        batch: &[usize],
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        self.train.loss_and_grad(params, rank, batch)
    }

    fn evaluate(&self, params: &[Vec<f64>]) -> Result<(f64, f64)> {
        self.train
            .mlp
            .evaluate(params, &self.test_inputs, &self.test_labels)
    }

    fn held_out(&self) -> bool {
        true
    }

    fn evaluation_len(&self) -> usize {
        self.test_labels.len()
    }
}

/// The built-in tasks by name: `synthetic` or `digits` (`"digits".parse::<TaskKind>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskKind {
    /// [`SyntheticTask`] with the default [`TaskConfig`].
    Synthetic,
    /// [`DatasetTask::digits`]: the UCI hand-written digits, non-IID shards, 20 % held out.
    Digits,
}

impl TaskKind {
    /// Every built-in task.
    pub const ALL: [TaskKind; 2] = [TaskKind::Synthetic, TaskKind::Digits];

    /// `synthetic` or `digits`.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Synthetic => "synthetic",
            TaskKind::Digits => "digits",
        }
    }

    /// The task for `ranks` ranks with its default settings and seed `seed`.
    ///
    /// # Errors
    /// As [`SyntheticTask::new`] / [`DatasetTask::new`] (no ranks, too many ranks).
    pub fn build(self, ranks: usize, seed: u64) -> Result<Arc<dyn Task>> {
        Ok(match self {
            TaskKind::Synthetic => Arc::new(SyntheticTask::new(
                TaskConfig {
                    seed,
                    ..TaskConfig::default()
                },
                ranks,
            )?),
            TaskKind::Digits => Arc::new(DatasetTask::new(
                &Dataset::digits()?,
                DatasetConfig {
                    seed,
                    ..DatasetConfig::default()
                },
                ranks,
            )?),
        })
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TaskKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<TaskKind> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::value(format!("unknown task '{s}': expected synthetic or digits"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written backprop matches central finite differences.
    #[test]
    fn gradient_matches_finite_differences() {
        let config = TaskConfig {
            features: 5,
            hidden: 4,
            classes: 3,
            samples: 40,
            ..TaskConfig::default()
        };
        let task = SyntheticTask::new(config, 2).unwrap();
        let mut params: Vec<Vec<f64>> = task
            .initial_params()
            .unwrap()
            .iter()
            .map(|t| t.values_f64().unwrap())
            .collect();
        // Non-zero biases, so that their gradients are exercised away from the origin.
        params[1]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = 0.1 * i as f64);
        params[3]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = -0.2 * i as f64);
        let batch = [0, 3, 7, 11];
        let (_, grads) = task.loss_and_grad(&params, 1, &batch).unwrap();
        let eps = 1e-6;
        for j in 0..params.len() {
            for i in 0..params[j].len() {
                let mut plus = params.clone();
                plus[j][i] += eps;
                let mut minus = params.clone();
                minus[j][i] -= eps;
                let numeric = (task.loss_and_grad(&plus, 1, &batch).unwrap().0
                    - task.loss_and_grad(&minus, 1, &batch).unwrap().0)
                    / (2.0 * eps);
                assert!(
                    (numeric - grads[j][i]).abs() < 1e-6,
                    "param {j}[{i}]: numeric {numeric}, backprop {}",
                    grads[j][i]
                );
            }
        }
    }

    #[test]
    fn data_is_deterministic_and_skewed() {
        let a = SyntheticTask::new(TaskConfig::default(), 8).unwrap();
        let b = SyntheticTask::new(TaskConfig::default(), 8).unwrap();
        assert_eq!(a.data.inputs, b.data.inputs);
        assert_eq!(a.data.labels, b.data.labels);
        assert_eq!(a.shard_len(0), 512);
        let counts = a.class_counts(5);
        assert_eq!(counts.iter().sum::<usize>(), 512);
        assert!(counts[1] > 400, "{counts:?}");
    }

    #[test]
    fn digits_parse_and_split_non_iid() {
        let digits = Dataset::digits().unwrap();
        assert_eq!(digits.len(), 1797);
        assert_eq!(digits.features(), 64);
        assert_eq!(digits.classes(), 10);
        assert_eq!(
            digits.class_counts(),
            vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
        );
        // The first image of scikit-learn's copy is a 0: row 0 is 0,0,5,13,9,1,0,0.
        assert_eq!(digits.labels()[0], 0);
        let first = digits.sample(0).unwrap();
        assert_eq!(
            &first[..8],
            &[
                0.0,
                0.0,
                5.0 / 16.0,
                13.0 / 16.0,
                9.0 / 16.0,
                1.0 / 16.0,
                0.0,
                0.0
            ]
        );

        let task = DatasetTask::new(&digits, DatasetConfig::default(), 4).unwrap();
        assert_eq!(task.test_len(), 359);
        assert_eq!(task.train_len(), 1797 - 359);
        assert_eq!(
            (0..4).map(|r| Task::shard_len(&task, r)).sum::<usize>(),
            1438
        );
        // Non-IID: every shard is dominated by a few classes.
        for rank in 0..4 {
            let counts = Task::class_counts(&task, rank);
            let mut sorted = counts.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let top3: usize = sorted[..3].iter().sum();
            assert!(
                top3 * 10 > Task::shard_len(&task, rank) * 7,
                "rank {rank}: {counts:?}"
            );
        }
        // IID at heterogeneity 0: every shard holds every class.
        let iid = DatasetTask::new(
            &digits,
            DatasetConfig {
                heterogeneity: 0.0,
                ..DatasetConfig::default()
            },
            4,
        )
        .unwrap();
        for rank in 0..4 {
            assert!(Task::class_counts(&iid, rank).iter().all(|&c| c > 15));
        }
        assert_eq!("digits".parse::<TaskKind>().unwrap(), TaskKind::Digits);
        assert_eq!(TaskKind::Synthetic.to_string(), "synthetic");
        assert!("mnist".parse::<TaskKind>().is_err());
        assert_eq!(TaskKind::Digits.build(8, 0).unwrap().ranks(), 8);
    }

    #[test]
    fn bad_data_is_an_error() {
        let err = |r: Result<Dataset>| r.unwrap_err().to_string();
        assert!(err(Dataset::new("x", 2, 2, vec![0.0; 5], vec![0, 1])).contains("need 4 values"));
        assert!(err(Dataset::new("x", 1, 2, vec![0.0, f64::NAN], vec![0, 1])).contains("finite"));
        assert!(err(Dataset::new("x", 1, 2, vec![0.0, 1.0], vec![0, 2])).contains("out of range"));
        assert!(err(Dataset::new("x", 1, 1, vec![0.0], vec![0])).contains("2 classes"));
        assert!(err(Dataset::from_digits_bin(b"PNG...")).contains("not a digits file"));
        assert!(err(Dataset::from_digits_bin(&DIGITS_BIN[..1000])).contains("bytes"));
        let tiny = Dataset::new("x", 1, 2, vec![0.0, 1.0, 0.5], vec![0, 1, 0]).unwrap();
        let split = |test_fraction, ranks| {
            DatasetTask::new(
                &tiny,
                DatasetConfig {
                    test_fraction,
                    ..DatasetConfig::default()
                },
                ranks,
            )
        };
        assert!(split(0.0, 1).is_err());
        assert!(split(1.0, 1).is_err());
        assert!(split(0.4, 3).is_err());
        assert!(split(0.4, 2).is_ok());
    }
}
