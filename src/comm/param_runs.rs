//! The element ranges of the parameters an all-reduce over one rank's arena covers, read from
//! where each parameter starts and one flag per parameter, as the worlds that hold one rank per
//! process (`MpiWorld`, `NatsWorld`) walk them.

use std::ops::Range;

use crate::backend::kernels::ParamStarts;

/// `(elements, parameter)` of each flagged parameter's element range, in parameter order.
#[cfg(feature = "nats")]
pub(crate) fn param_runs(
    starts: &ParamStarts,
    flags: &[bool],
    rank_len: usize,
) -> Vec<(Range<usize>, usize)> {
    flagged(starts, flags, rank_len).collect()
}

/// The element ranges of the flagged parameters, adjacent ones merged (the padding between
/// parameters travels along: it is zero on every rank).
#[cfg(all(feature = "mpi", not(target_arch = "wasm32")))]
pub(crate) fn merged_runs(
    starts: &ParamStarts,
    flags: &[bool],
    rank_len: usize,
) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (run, _) in flagged(starts, flags, rank_len) {
        match runs.last_mut() {
            Some(last) if last.end == run.start => last.end = run.end,
            _ => runs.push(run),
        }
    }
    runs
}

/// `(elements, parameter)` of each flagged parameter, the last one ending at `rank_len`.
fn flagged<'a>(
    starts: &'a ParamStarts,
    flags: &'a [bool],
    rank_len: usize,
) -> impl Iterator<Item = (Range<usize>, usize)> + 'a {
    flags
        .iter()
        .enumerate()
        .filter(|(_, f)| **f)
        .map(move |(j, _)| {
            let start = starts.0[j] as usize;
            let end = starts.0.get(j + 1).map_or(rank_len, |&e| e as usize);
            (start..end, j)
        })
}
