//! Group averaging, the plain-Rust reference (the mean of every group of consecutive ranks,
//! in the promoted precision). Its twins: the CPU backend's multi-threaded kernel in
//! `backend/cpu/average.rs`, the GPU dispatch in `backend/gpu/average.rs` and the shader
//! `shaders/average.wgsl`.

use std::ops::Range;

use super::{Arena, ParamStarts, Real, host_words_mut};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Where a mean divides by the number of values: the two references disagree, and in 16 bits
/// or for a group of three the results differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeanOrder {
    /// Each value divided, then the quotients summed: PyTorch's model averagers
    /// (`average_parameters`: `flat /= group size`, then `all_reduce(SUM)`) and the post-local
    /// SGD gradient hook.
    #[default]
    DivideThenSum,
    /// The values summed, then the sum divided once: `all_reduce(SUM)`, then `div_(W)`, as
    /// torchft's `Manager.allreduce` averages DiLoCo's pseudo-gradients (and the golden
    /// `diloco` reference does).
    SumThenDivide,
}

impl MeanOrder {
    /// The divisors of each value and of their sum for a mean of `n` values: `(n, 1)` or
    /// `(1, n)`. A division by 1 is exact (NaN, infinities and subnormals included), so a loop
    /// may divide at both places whatever the order.
    pub fn divisors(self, n: f64) -> (f64, f64) {
        match self {
            MeanOrder::DivideThenSum => (n, 1.0),
            MeanOrder::SumThenDivide => (1.0, n),
        }
    }
}

/// The arguments of a group average ([`Backend::average`](crate::backend::Backend::average),
/// [`average_reference`]).
pub struct AverageArgs<'a> {
    /// The arena whose groups of ranks are averaged (updated).
    pub arena: &'a mut Arena,
    /// Ranks per group (consecutive ranks); it must divide the arena's ranks.
    pub group_size: usize,
    /// The precision of the arithmetic (PyTorch's promoted dtype of the flattened parameters).
    pub arith: StorageFormat,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: averaged or left alone.
    pub active: &'a [bool],
    /// Whether each value or their sum is divided.
    pub order: MeanOrder,
}

/// The argument checks of an average that do not depend on the arena's storage, the same on
/// every backend (the GPU backend makes them for an empty table, which it does not dispatch).
pub(crate) fn check_average_args(args: &AverageArgs<'_>) -> Result<()> {
    let (ranks, group_size) = (args.arena.ranks(), args.group_size);
    if group_size == 0
        || !ranks.is_multiple_of(group_size)
        || args.active.len() != args.starts.0.len()
    {
        return Err(Error::value(format!(
            "average: group size {group_size} does not divide {ranks} ranks, or {} flags for {} parameters",
            args.active.len(),
            args.starts.0.len()
        )));
    }
    Ok(())
}

/// Averages every group of `group_size` consecutive ranks, element by element, over the
/// parameters whose `active` flag is set: each value is divided by the group size, then the
/// quotients are summed in rank order ([`MeanOrder::DivideThenSum`]; with
/// [`MeanOrder::SumThenDivide`] the values are summed in rank order and the sum divided), all
/// in the `arith` precision (PyTorch's promoted dtype of the flattened parameters), every
/// quotient and partial sum rounded to it, and the mean is rounded back to the arena's format
/// and written to every rank of the group.
///
/// # Errors
/// A `ValueError` when `group_size` is 0 or does not divide the arena's ranks, or `active`
/// does not hold one flag per parameter of `starts`; a `RuntimeError` when the arena lives on
/// a GPU device.
pub fn average_reference(args: AverageArgs<'_>) -> Result<()> {
    let (groups, words) = group_slices(args)?;
    for group in words {
        average_group(&groups, group);
    }
    Ok(())
}

/// What the mean of each group of an average needs besides the group's words.
#[derive(Clone, Copy)]
pub(in crate::backend) struct Groups<'a> {
    pub(in crate::backend) format: StorageFormat,
    pub(in crate::backend) arith: StorageFormat,
    /// Words of one rank (at least one).
    pub(in crate::backend) rank_words: usize,
    pub(in crate::backend) group_size: usize,
    pub(in crate::backend) starts: &'a ParamStarts,
    pub(in crate::backend) active: &'a [bool],
    /// Elements of one rank.
    pub(in crate::backend) len: usize,
    pub(in crate::backend) order: MeanOrder,
}

impl Groups<'_> {
    /// The elements of a rank that are averaged: the [`range`](ParamStarts::range) of every
    /// parameter flagged in `active`.
    pub(in crate::backend) fn averaged(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.starts.active_ranges(self.active, self.len)
    }
}

/// The arena of an average, checked ([`check_average_args`]) and cut into its groups' words
/// (each group's ranks are contiguous): what the reference walks in turn and the CPU backend on
/// threads.
pub(in crate::backend) fn group_slices(
    args: AverageArgs<'_>,
) -> Result<(Groups<'_>, Vec<&mut [u32]>)> {
    check_average_args(&args)?;
    let (format, len) = (args.arena.format(), args.arena.rank_len());
    let groups = Groups {
        format,
        arith: args.arith,
        rank_words: format.words_for(len).max(1),
        group_size: args.group_size,
        starts: args.starts,
        active: args.active,
        len,
        order: args.order,
    };
    let words = host_words_mut(args.arena)?
        .chunks_mut(groups.rank_words * groups.group_size)
        .collect();
    Ok((groups, words))
}

/// One group's mean, written to each of its ranks: `group` holds the group's ranks, each
/// `rank_words` long; computed in float64 for a float64 `arith`, else in float32.
pub(in crate::backend) fn average_group(groups: &Groups<'_>, group: &mut [u32]) {
    if groups.arith == StorageFormat::F64 {
        average_group_in::<f64>(groups, group);
    } else {
        average_group_in::<f32>(groups, group);
    }
}

fn average_group_in<T: Real>(groups: &Groups<'_>, group: &mut [u32]) {
    let divisor = T::scalar(groups.group_size as f64);
    let round = |x: T| T::round(groups.arith, x);
    match groups.order {
        MeanOrder::DivideThenSum => mean_of_group(groups, group, |x| round(x / divisor), |s| s),
        MeanOrder::SumThenDivide => mean_of_group(groups, group, round, |s| round(s / divisor)),
    }
}

/// [`average_group_in`]'s loop: the sum in rank order of each value's `addend`, every partial
/// sum rounded to `arith`, made the `mean` and written to every rank.
fn mean_of_group<T: Real>(
    groups: &Groups<'_>,
    group: &mut [u32],
    addend: impl Fn(T) -> T,
    mean: impl Fn(T) -> T,
) {
    let Groups {
        format,
        arith,
        rank_words,
        group_size,
        ..
    } = *groups;
    for range in groups.averaged() {
        for i in range {
            let mut acc = addend(T::load(format, &group[..rank_words], i));
            for rank in 1..group_size {
                let value = addend(T::load(format, &group[rank * rank_words..], i));
                acc = T::round(arith, acc + value);
            }
            let acc = mean(acc);
            for rank in 0..group_size {
                T::store(format, &mut group[rank * rank_words..], i, acc);
            }
        }
    }
}
