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
//!
//! Files: `shards.rs` (the samples shard by shard, the size checks), `synthetic.rs`,
//! `dataset.rs` (a data set and the embedded digits), `dataset_task.rs`, `kind.rs`.

use std::fmt;

use crate::error::Result;
use crate::tensor::Tensor;

mod dataset;
mod dataset_task;
mod kind;
mod shards;
mod synthetic;
#[cfg(test)]
mod tests;

pub use dataset::{DIGITS_BIN, Dataset};
pub use dataset_task::{DatasetConfig, DatasetTask};
pub use kind::TaskKind;
pub use synthetic::{SyntheticTask, TaskConfig};

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
