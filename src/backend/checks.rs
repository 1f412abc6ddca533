//! The argument checks of the kernels that do not depend on where an arena is stored, the
//! same on every backend.

use super::arena::{Arena, CopyRegion, PARAM_ALIGN_ELEMENTS};
use super::kernels::ParamStarts;
use crate::error::{Error, Result};

/// Checks a per-parameter kernel's table against the arena it describes, the same on every
/// backend: an empty table (an arena with no parameters: nothing to do), or one that starts at
/// element 0 and ascends, every start on a [`PARAM_ALIGN_ELEMENTS`] slot and within a rank's
/// elements (a start equal to `rank_len` is an empty last parameter). A `ValueError` otherwise:
/// a kernel never runs over a table that does not fit (the reference kernels would index out
/// of their rows, the shaders would read another parameter's flags).
pub(crate) fn check_param_table(what: &str, arena: &Arena, starts: &ParamStarts) -> Result<()> {
    let table = &starts.0;
    let fits = table.first().is_none_or(|&first| first == 0)
        && table.windows(2).all(|w| w[0] <= w[1])
        && table.iter().all(|&start| {
            (start as usize).is_multiple_of(PARAM_ALIGN_ELEMENTS)
                && start as usize <= arena.rank_len()
        });
    if !fits {
        return Err(Error::value(format!(
            "{what}: parameter table {table:?} does not fit an arena of {} elements per rank (parameters start at 0 and ascend, on {PARAM_ALIGN_ELEMENTS}-element slots)",
            arena.rank_len()
        )));
    }
    Ok(())
}

/// Validates a batch of copies: same format, in range, word aligned.
pub(crate) fn check_copy_regions(src: &Arena, dst: &Arena, regions: &[CopyRegion]) -> Result<()> {
    check_same_format(src, dst)?;
    let format = src.format();
    for r in regions {
        src.check_range(r.src_rank, r.src_offset, r.len)?;
        dst.check_range(r.dst_rank, r.dst_offset, r.len)?;
        if !format.is_word_aligned(r.src_offset) || !format.is_word_aligned(r.dst_offset) {
            return Err(Error::value("copy offsets must be word aligned"));
        }
    }
    Ok(())
}

/// A `ValueError` unless `src` and `dst` store the same format.
pub(crate) fn check_same_format(src: &Arena, dst: &Arena) -> Result<()> {
    if src.format() != dst.format() {
        return Err(Error::value(format!(
            "cannot copy between arenas of formats {:?} and {:?}",
            src.format(),
            dst.format()
        )));
    }
    Ok(())
}

/// The argument checks of [`super::Backend::dp_sgd_step`], the same on every backend.
pub(crate) fn check_step_arenas(
    params: &Arena,
    grads: &Arena,
    means: &Arena,
    divisor: f32,
) -> Result<()> {
    if !(divisor > 0.0 && divisor.is_finite()) {
        return Err(Error::value(format!(
            "dp_sgd_step divisor must be positive and finite, got {divisor}"
        )));
    }
    if params.ranks() != grads.ranks()
        || means.ranks() != 1
        || params.rank_len() != grads.rank_len()
        || params.rank_len() != means.rank_len()
        || params.format() != means.format()
        || params.chunk_len() != grads.chunk_len()
        || params.chunk_len() != means.chunk_len()
    {
        return Err(Error::value(format!(
            "dp_sgd_step arenas do not match: params {params:?}, grads {grads:?}, means {means:?}"
        )));
    }
    if params.ranks() == 0 {
        // A mean over no ranks.
        return Err(Error::value("dp_sgd_step needs at least one rank"));
    }
    Ok(())
}
