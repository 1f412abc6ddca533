//! [`SyntheticTask`]: Gaussian clusters, a few per class, generated from a seed; each shard
//! skewed towards one class.

use serde::{Deserialize, Serialize};

use super::super::model::Mlp;
use super::Task;
use super::shards::{MAX_ELEMENTS, Shards, check_heterogeneity, check_model};
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::tensor::Tensor;

/// Gaussian clusters per class (two make the classes not linearly separable in general).
const CLUSTERS_PER_CLASS: usize = 2;
/// Expected distance between two cluster centres, in units of the per-coordinate noise.
const SEPARATION: f64 = 5.0;

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
    pub(super) data: Shards,
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
        self.data.evaluate(params)
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
