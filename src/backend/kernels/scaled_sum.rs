//! DDP's gradient all-reduce with joined ranks (the scaled sum), the plain-Rust reference. The
//! CPU backend runs it as it is (`backend/cpu/mod.rs`); its GPU twins are the dispatch in
//! `backend/gpu/scaled_sum.rs` and the shader `shaders/scaled_sum.wgsl`.

use super::{Arena, ParamStarts, Real, host_words_mut};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// The arguments of a scaled sum ([`Backend::scaled_sum`](crate::backend::Backend::scaled_sum),
/// [`scaled_sum_reference`]).
pub struct ScaledSumArgs<'a> {
    /// The arena summed over its ranks (updated where a rank has a scale).
    pub arena: &'a mut Arena,
    /// The precision of every product and partial sum.
    pub arith: StorageFormat,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One flag per parameter: summed or left alone.
    pub reduced: &'a [bool],
    /// One entry per rank: the scale of a rank that contributes and receives, `None` for a
    /// joined rank.
    pub scales: &'a [Option<f64>],
    /// One flag per (rank, parameter), rank-major: whether the rank's value is present.
    pub present: &'a [bool],
}

/// Checks the tables of a scaled sum against its arena (also the communicators' all-reduce
/// check).
pub(crate) fn check_scaled_sum(
    arena: &Arena,
    starts: &ParamStarts,
    reduced: &[bool],
    scales: &[Option<f64>],
    present: &[bool],
) -> Result<()> {
    let (ranks, params) = (arena.ranks(), starts.0.len());
    if reduced.len() != params || scales.len() != ranks || present.len() != ranks * params {
        return Err(Error::value(format!(
            "scaled sum: {} reduced flags, {} scales and {} presence flags for {ranks} ranks of {params} parameters",
            reduced.len(),
            scales.len(),
            present.len()
        )));
    }
    Ok(())
}

impl ScaledSumArgs<'_> {
    /// [`check_scaled_sum`] of these arguments.
    pub(crate) fn check(&self) -> Result<()> {
        check_scaled_sum(
            self.arena,
            self.starts,
            self.reduced,
            self.scales,
            self.present,
        )
    }
}

/// The data-parallel gradient all-reduce of `DistributedDataParallel`, joined ranks included:
/// for every element of the parameters flagged `reduced`, the sum over the ranks in rank order
/// of `c_r = round(x_r · scale_r)` for a rank with `scales[r] = Some(scale_r)` whose
/// value is `present` (`present[r * params + j]`), and of `+0` for the others (a joined rank,
/// an absent gradient: DDP's bucket holds zeros there). The scale is taken in the compute
/// precision (float32, float64 for float64), every product and every partial sum is rounded
/// to the `arith` precision; the sum, rounded to the arena's format,
/// is written to every rank whose scale is `Some`. Ranks with `None` keep their data.
///
/// # Errors
/// A `ValueError` when `reduced` does not hold one flag per parameter, `scales` one entry per
/// rank or `present` one flag per (rank, parameter); a `RuntimeError` when the arena lives on
/// a GPU device.
pub fn scaled_sum_reference(args: ScaledSumArgs<'_>) -> Result<()> {
    args.check()?;
    if args.arith == StorageFormat::F64 {
        scaled_sum_in::<f64>(args)
    } else {
        scaled_sum_in::<f32>(args)
    }
}

fn scaled_sum_in<T: Real>(args: ScaledSumArgs<'_>) -> Result<()> {
    let ScaledSumArgs {
        arena,
        arith,
        starts,
        reduced,
        scales,
        present,
    } = args;
    let format = arena.format();
    let (ranks, len, params) = (arena.ranks(), arena.rank_len(), starts.0.len());
    let rank_words = format.words_for(len).max(1);
    let words = host_words_mut(arena)?;
    let round = |x: T| T::round(arith, x);
    // The scale in the compute precision (PyTorch's opmath), not rounded to a 16-bit ARITH.
    let scales: Vec<Option<T>> = scales.iter().map(|s| s.map(T::scalar)).collect();
    let zero = T::scalar(0.0);
    for (j, _) in reduced.iter().enumerate().filter(|(_, r)| **r) {
        let contribution = |words: &[u32], rank: usize, i: usize| match scales[rank] {
            Some(s) if present[rank * params + j] => {
                round(T::load(format, &words[rank * rank_words..], i) * s)
            }
            _ => zero,
        };
        for i in starts.range(j, len) {
            let mut acc = contribution(words, 0, i);
            for rank in 1..ranks {
                acc = round(acc + contribution(words, rank, i));
            }
            for rank in (0..ranks).filter(|&r| scales[r].is_some()) {
                T::store(format, &mut words[rank * rank_words..], i, acc);
            }
        }
    }
    Ok(())
}
