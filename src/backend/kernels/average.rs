//! Group averaging, the plain-Rust reference (the mean of every group of consecutive ranks,
//! in the promoted precision). Its twins: the CPU backend's multi-threaded kernel in
//! `backend/cpu/average.rs`, the GPU dispatch in `backend/gpu/average.rs` and the shader
//! `shaders/average.wgsl`.

use super::{Arena, ParamStarts, Real, host_words_mut};
use crate::backend::check_average_args;
use crate::dtype::StorageFormat;
use crate::error::Result;

/// Averages every group of `group_size` consecutive ranks, element by element, over the
/// parameters whose `active` flag is set: each value is divided by the group size, then the
/// quotients are summed in rank order, all in the `arith` precision (PyTorch's promoted dtype
/// of the flattened parameters), and the sum is rounded back to the arena's format and written
/// to every rank of the group.
///
/// # Errors
/// A `ValueError` when `group_size` is 0 or does not divide the arena's ranks, or `active`
/// does not hold one flag per parameter of `starts`; a `RuntimeError` when the arena lives on
/// a GPU device.
pub fn average_reference(
    arena: &mut Arena,
    group_size: usize,
    arith: StorageFormat,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    let (format, len) = (arena.format(), arena.rank_len());
    let rank_words = format.words_for(len).max(1);
    for group in group_slices(arena, group_size, starts, active)? {
        if arith == StorageFormat::F64 {
            average_group::<f64>(
                format, arith, group, rank_words, group_size, starts, active, len,
            );
        } else {
            average_group::<f32>(
                format, arith, group, rank_words, group_size, starts, active, len,
            );
        }
    }
    Ok(())
}

/// The arena of an average, checked ([`check_average_args`]) and cut into its groups' words (each
/// group's ranks are contiguous): what the reference walks in turn and the CPU backend on
/// threads.
pub(in crate::backend) fn group_slices<'a>(
    arena: &'a mut Arena,
    group_size: usize,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<Vec<&'a mut [u32]>> {
    check_average_args(arena, group_size, starts, active)?;
    let rank_words = arena.format().words_for(arena.rank_len()).max(1);
    Ok(host_words_mut(arena)?
        .chunks_mut(rank_words * group_size)
        .collect())
}

/// One group's mean, written to each of its ranks: `group` holds the group's ranks, each
/// `rank_words` long.
#[allow(clippy::too_many_arguments)]
pub(in crate::backend) fn average_group<T: Real>(
    format: StorageFormat,
    arith: StorageFormat,
    group: &mut [u32],
    rank_words: usize,
    group_size: usize,
    starts: &ParamStarts,
    active: &[bool],
    len: usize,
) {
    let divisor = T::scalar(group_size as f64);
    let round = |x: T| T::round(arith, x);
    for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        for i in start..end {
            let mut acc = round(T::load(format, &group[..rank_words], i) / divisor);
            for rank in 1..group_size {
                let quotient = round(T::load(format, &group[rank * rank_words..], i) / divisor);
                acc = round(acc + quotient);
            }
            for rank in 0..group_size {
                T::store(format, &mut group[rank * rank_words..], i, acc);
            }
        }
    }
}
