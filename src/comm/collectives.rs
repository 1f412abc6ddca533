//! The descriptions of the all-reduces over arenas: what every rank passes alike to
//! [`super::Communicator::all_reduce_mean`], [`super::Communicator::all_reduce_mean_live`] and
//! [`super::Communicator::all_reduce_scaled_sum`].

use super::subgroups::Subgroups;
use crate::backend::kernels::{MeanOrder, ParamStarts};
use crate::dtype::StorageFormat;

/// An all-reduce-mean within every group of `groups`, over the parameters flagged `active`;
/// the same on every rank.
#[derive(Debug, Clone, Copy)]
pub struct AllReduceMeanArgs<'a> {
    /// The groups each averaged within (the whole world: [`Subgroups::world`]).
    pub groups: Subgroups,
    /// The precision of the quotients and sums.
    pub arith: StorageFormat,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: averaged or left alone.
    pub active: &'a [bool],
    /// The bytes of one rank's averaged values, as [`super::CommStats`] counts them.
    pub bytes_per_rank: u64,
    /// Whether each value is divided before the sum (PyTorch's averagers) or the sum after it
    /// (DiLoCo's pseudo-gradients, as torchft averages them).
    pub order: MeanOrder,
}

impl AllReduceMeanArgs<'_> {
    /// Checks the description against a world of `world_size` ranks (one rank per process).
    ///
    /// # Errors
    /// A `ValueError` when `groups` partitions another world or `active` does not hold one
    /// flag per parameter.
    #[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
    pub(crate) fn check(&self, world_size: usize) -> crate::error::Result<()> {
        if self.groups.world_size() != world_size || self.active.len() != self.starts.0.len() {
            return Err(crate::error::Error::value(format!(
                "all_reduce over groups of a world of {} in a world of {world_size}, or {} flags for {} parameters",
                self.groups.world_size(),
                self.active.len(),
                self.starts.0.len()
            )));
        }
        Ok(())
    }
}

/// `DistributedDataParallel`'s gradient all-reduce, joined ranks included; the same on every
/// rank but for `scales` and `present`, which are the local ranks'.
#[derive(Debug, Clone, Copy)]
pub struct AllReduceScaledSumArgs<'a> {
    /// The precision of every product and partial sum.
    pub arith: StorageFormat,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: summed or left alone (the same on every rank).
    pub reduced: &'a [bool],
    /// One entry per local rank: the scale of a rank that contributes and receives, `None` for
    /// a joined rank shadowing the collective.
    pub scales: &'a [Option<f64>],
    /// One flag per (local rank, parameter), rank-major: whether the rank's value is present.
    pub present: &'a [bool],
    /// The bytes of one rank's summed values, as [`super::CommStats`] counts them.
    pub bytes_per_rank: u64,
}

impl AllReduceScaledSumArgs<'_> {
    /// Checks the description against `arena` (its local ranks and parameters).
    ///
    /// # Errors
    /// Those of [`check_scaled_sum`](crate::backend::kernels::check_scaled_sum).
    #[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
    pub(crate) fn check(&self, arena: &crate::backend::Arena) -> crate::error::Result<()> {
        crate::backend::kernels::check_scaled_sum(
            arena,
            self.starts,
            self.reduced,
            self.scales,
            self.present,
        )
    }
}
