//! The training samples of a task laid out shard after shard (one per rank), the model's
//! dimensions and the size checks every task makes.

use std::ops::Range;

use super::super::model::Mlp;
use crate::error::{Error, ErrorKind, Result};

/// Largest data set (samples × features) and largest model × ranks, in elements: generous for
/// a demo, small enough that no input makes it allocate without bound.
pub(super) const MAX_ELEMENTS: usize = 1 << 25;

/// Training samples laid out shard after shard, and the model dimensions.
#[derive(Debug, Clone)]
pub(super) struct Shards {
    pub(super) mlp: Mlp,
    pub(super) features: usize,
    pub(super) classes: usize,
    /// `samples × features`, row-major; shard r is the rows `ranges[r]`.
    pub(super) inputs: Vec<f64>,
    pub(super) labels: Vec<usize>,
    pub(super) ranges: Vec<Range<usize>>,
}

impl Shards {
    pub(super) fn shard_len(&self, rank: usize) -> usize {
        self.ranges.get(rank).map_or(0, |s| s.len())
    }

    pub(super) fn class_counts(&self, rank: usize) -> Vec<usize> {
        let Some(shard) = self.ranges.get(rank) else {
            return Vec::new();
        };
        let mut counts = vec![0; self.classes];
        for &label in &self.labels[shard.clone()] {
            counts[label] += 1;
        }
        counts
    }

    /// Mean loss and accuracy of `params` over every sample of every shard.
    pub(super) fn evaluate(&self, params: &[Vec<f64>]) -> Result<(f64, f64)> {
        self.mlp.evaluate(params, &self.inputs, &self.labels)
    }

    pub(super) fn loss_and_grad(
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

/// A `ValueError` unless a task's `heterogeneity` lies in `[0, 1]`.
pub(super) fn check_heterogeneity(heterogeneity: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&heterogeneity) {
        return Err(Error::value(format!(
            "heterogeneity must lie in [0, 1], got {heterogeneity}"
        )));
    }
    Ok(())
}

/// Checks that `ranks` × the model fits; the model's scalar count.
pub(super) fn check_model(mlp: &Mlp, ranks: usize) -> Result<usize> {
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
