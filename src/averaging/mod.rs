//! Model averagers: `PeriodicModelAverager` and `HierarchicalModelAverager`, with PyTorch's
//! schedules, validation errors and warnings. Averaging runs as one all-reduce-mean per arena
//! over every group of the chosen partition at once.

mod hierarchical;
mod periodic;

pub use hierarchical::HierarchicalModelAverager;
pub use periodic::PeriodicModelAverager;

use crate::comm::{Communicator, Subgroups};
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};
use crate::replicas::{Replicas, Values};

/// The common surface of the averagers (PyTorch's `ModelAverager`).
pub trait ModelAverager: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// The step counter: calls of `average_parameters` so far.
    fn step(&self) -> u64;

    /// Sets the step counter (used when loading a checkpoint).
    fn set_step(&mut self, step: u64);

    /// Averages, if the schedule says so, the parameters in `params` (all when `None`) that
    /// have a gradient; advances the step counter. Returns the group size used, or `None` when
    /// this step did not average.
    ///
    /// # Errors
    /// On a step that averages, those of [`average_parameters`]: an `IndexError` for an index
    /// in `params` out of range, a `ValueError` when no selected parameter has a gradient on
    /// rank 0 or the group partition or `replicas` do not fit the averager's world, a
    /// `RuntimeError` from the backend (a GPU error, a lost device). A
    /// [`HierarchicalModelAverager`] whose schedule reaches a period of 0 raises a
    /// `ZeroDivisionError`. The step counter advances only on success.
    fn average_parameters(
        &mut self,
        replicas: &mut Replicas,
        params: Option<&[usize]>,
    ) -> Result<Option<usize>>;
}

/// PyTorch's type promotion of the dtypes `torch.cat` flattens together.
pub fn promoted_format(dtypes: impl IntoIterator<Item = DType>) -> Option<StorageFormat> {
    let mut result: Option<DType> = None;
    for dtype in dtypes {
        result = Some(match (result, dtype) {
            (None, d) => d,
            (Some(a), b) if a == b => a,
            (Some(DType::Float64), _) | (_, DType::Float64) => DType::Float64,
            _ => DType::Float32,
        });
    }
    result.map(DType::storage)
}

/// `utils.average_parameters_or_parameter_groups`: all-reduce-mean of the parameters (all, or
/// those listed) that have a gradient, within every group of `groups`. The gradient test uses
/// rank 0's gradients (PyTorch requires every rank to pass the same list).
///
/// # Errors
/// An `IndexError` for an index in `params` out of range; a `ValueError` when none of the
/// selected parameters has a gradient on rank 0 (PyTorch's `torch.cat()` error), or from the
/// collective when `groups` partitions another world size or `replicas` does not hold the
/// world's local ranks; a `RuntimeError` from the backend (a GPU error, a lost device).
pub fn average_parameters(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    groups: Subgroups,
    params: Option<&[usize]>,
) -> Result<()> {
    let selected: Vec<usize> = match params {
        Some(list) => list.to_vec(),
        None => (0..replicas.len()).collect(),
    };
    if let Some(&bad) = selected.iter().find(|&&j| j >= replicas.len()) {
        return Err(Error::new(
            crate::ErrorKind::IndexError,
            format!(
                "parameter index {bad} out of range for {} parameters",
                replicas.len()
            ),
        ));
    }
    let averaged: Vec<usize> = selected
        .into_iter()
        .filter(|&j| replicas.has_grad(0, j))
        .collect();
    let Some(arith) = promoted_format(averaged.iter().map(|&j| replicas.dtype(j))) else {
        return Err(Error::value(
            "torch.cat(): expected a non-empty list of Tensors",
        ));
    };
    let mut wanted = vec![false; replicas.len()];
    for &j in &averaged {
        wanted[j] = true;
    }
    replicas.all_reduce_mean(world, Values::Params, groups, &wanted, Some(arith))?;
    Ok(())
}

/// The warning PyTorch emits for a period of 1.
pub(crate) const PERIOD_ONE_WARNING: &str = "When period is 1, no need to use model averaging because the communication cost of all-reducing parameters will be no less than the cost of all-reducing gradients by DistributedDataParallel in the backward pass. Therefore, only DistributedDataParallel should be used for this case.";

/// The warning PyTorch emits when the last period of a hierarchy is 1.
pub(crate) const MAX_PERIOD_ONE_WARNING: &str = "When the maximum period in arg ``period_group_size_dict`` is 1, no need to use model averaging because the communication cost of all-reducing parameters will be no less than the cost of all-reducing gradients by DistributedDataParallel in the backward pass. Therefore, only DistributedDataParallel should be used for this case.";

/// The `warmup_steps` error shared by both averagers.
pub(crate) fn warmup_error() -> Error {
    Error::value("Arg ``warmup_steps`` must be a non-negative number.")
}
