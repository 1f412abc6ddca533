//! [`DatasetTask`]: a [`Dataset`] split into a held-out test set and R training shards that
//! are non-IID by label.

use serde::{Deserialize, Serialize};

use super::super::model::Mlp;
use super::Task;
use super::dataset::Dataset;
use super::shards::{Shards, check_heterogeneity, check_model};
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::tensor::Tensor;

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
        self.train.evaluate(params)
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
