//! How the CPU backend's optimizer kernels (`sgd.rs`, `adam.rs`, `average.rs`) split a step
//! into parts: the active (rank, parameter) runs cut into nearly equal, slot-aligned element
//! ranges, one per thread, each part's words of an arena, and [`run_best`], which compiles a
//! part's work for the best vector extension the host has (AVX-512 or AVX2 with FMA). The
//! step (`step.rs`, `host_step.rs`) and the roofline use `run_best` too.

use crate::backend::PARAM_ALIGN_ELEMENTS;
use crate::backend::kernels::ParamStarts;
use crate::dtype::StorageFormat;

/// Elements per thread below which fewer threads are used (spawning costs more than it saves).
const MIN_PART_ELEMENTS: usize = 1 << 15;

/// A run of one (rank, parameter)'s elements inside one part.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    /// Index into the scalar table (rank-major).
    pub(super) entry: usize,
    /// First element, counted from the part's first element in the arena's flat
    /// `[rank][element]` space.
    pub(super) first: usize,
    /// Elements.
    pub(super) len: usize,
    /// The index of its first element in its parameter.
    pub(super) in_param: usize,
}

/// The work of one step split into parts: part `k` covers flat elements
/// `bounds[k]..bounds[k + 1]` (slot-aligned, so 16-bit parts start on a word) and the listed
/// segments inside them.
pub(super) struct Plan {
    pub(super) bounds: Vec<usize>,
    pub(super) parts: Vec<Vec<Segment>>,
}

/// Splits the active (rank, parameter) runs into at most `threads` parts of nearly equal
/// element counts. `None` when the arena's layout is not slot-aligned (the caller falls back to
/// the reference).
pub(super) fn plan(
    ranks: usize,
    rank_len: usize,
    starts: &ParamStarts,
    active: impl Fn(usize) -> bool,
    threads: usize,
) -> Option<Plan> {
    let count = starts.0.len();
    if !rank_len.is_multiple_of(PARAM_ALIGN_ELEMENTS)
        || starts
            .0
            .iter()
            .any(|&s| !(s as usize).is_multiple_of(PARAM_ALIGN_ELEMENTS) || s as usize > rank_len)
    {
        return None;
    }
    // Every active run, in flat order.
    let mut runs = Vec::new();
    for rank in 0..ranks {
        for (j, range) in starts.ranges(rank_len).enumerate() {
            let entry = rank * count + j;
            if active(entry) && !range.is_empty() {
                runs.push((entry, rank * rank_len + range.start, range.len()));
            }
        }
    }
    let total: usize = runs.iter().map(|r| r.2).sum();
    let parts = threads
        .min(total / MIN_PART_ELEMENTS)
        .clamp(1, threads.max(1));
    let target = total.div_ceil(parts);
    let mut bounds = vec![0];
    let mut out: Vec<Vec<Segment>> = vec![Vec::new()];
    let mut filled = 0;
    for (entry, mut first, mut len) in runs {
        let run_start = first;
        while len > 0 {
            let room = target.saturating_sub(filled);
            // Close the part when it is full and another part may still start.
            if room == 0 && out.len() < parts {
                let at = first;
                bounds.push(at);
                out.push(Vec::new());
                filled = 0;
                continue;
            }
            let take = if out.len() < parts && room < len {
                // Split inside the run at a slot boundary (at least one slot).
                room.div_ceil(PARAM_ALIGN_ELEMENTS) * PARAM_ALIGN_ELEMENTS
            } else {
                len
            }
            .min(len);
            let base = *bounds.last().unwrap_or(&0);
            if let Some(part) = out.last_mut() {
                part.push(Segment {
                    entry,
                    first: first - base,
                    len: take,
                    in_param: first - run_start,
                });
            }
            filled += take;
            first += take;
            len -= take;
        }
    }
    bounds.push(ranks * rank_len);
    Some(Plan { bounds, parts: out })
}

/// Splits `words` (the flat arena) into the parts' word ranges (`bounds` are element
/// indices, slot-aligned).
pub(super) fn split_words<'a>(
    mut words: &'a mut [u32],
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<&'a mut [u32]> {
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for pair in bounds.windows(2) {
        let len = (format.word_of(pair[1]) - format.word_of(pair[0])).min(words.len());
        let (head, tail) = std::mem::take(&mut words).split_at_mut(len);
        out.push(head);
        words = tail;
    }
    out
}

pub(super) fn split_words_ref<'a>(
    mut words: &'a [u32],
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<&'a [u32]> {
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for pair in bounds.windows(2) {
        let len = format.word_of(pair[1]) - format.word_of(pair[0]);
        let (head, tail) = words.split_at(len.min(words.len()));
        out.push(head);
        words = tail;
    }
    out
}

pub(super) fn split_optional<'a>(
    words: Option<&'a mut [u32]>,
    format: StorageFormat,
    bounds: &[usize],
) -> Vec<Option<&'a mut [u32]>> {
    match words {
        Some(w) => split_words(w, format, bounds)
            .into_iter()
            .map(Some)
            .collect(),
        None => (1..bounds.len()).map(|_| None).collect(),
    }
}

/// One part's work, compiled for the best vector extension the host has by [`run_best`]. The
/// implementations mark `run` `#[inline(always)]`, so that the whole loop nest is compiled
/// inside the AVX2 function (a closure would be a separate function LLVM may not inline).
pub(super) trait PartWork {
    fn run(self);
}

/// A closure as [`PartWork`] (the reference kernels' rank-by-rank path). LLVM may keep the
/// closure's body out of line, compiled for the baseline target: its results are the same,
/// only slower.
pub(super) struct Closure<F>(pub(super) F);

impl<F: FnOnce()> PartWork for Closure<F> {
    #[inline(always)]
    fn run(self) {
        (self.0)()
    }
}

/// Runs `work` compiled for AVX-512 (with its byte/word and 256-bit forms) or AVX2 when the
/// host has it (the same IEEE operations, wider vectors), otherwise for the baseline target.
/// Both come with FMA, so that the optimizer kernels' `mul_add`s (PyTorch's single-rounded
/// multiply-adds) are single instructions; a host with AVX2 but no FMA takes the baseline,
/// where `mul_add` is the C library's `fma`, as exact and slower. (Rust never contracts a
/// product and a sum by itself: no other result depends on the extension.)
pub(super) fn run_best<W: PartWork>(work: W) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
        fn avx512<W: PartWork>(work: W) {
            work.run()
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<W: PartWork>(work: W) {
            work.run()
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the host supports every feature enabled (checked just above).
            unsafe { avx512(work) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the host supports AVX2 and FMA (checked just above).
            unsafe { avx2(work) };
            return;
        }
    }
    work.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::test_arenas::{SIZES, sizes_table};

    #[test]
    fn plans_cover_every_active_element_once_at_slot_boundaries() {
        let (starts, rank_len) = sizes_table();
        for threads in [1, 2, 3, 8] {
            for ranks in [1, 3] {
                let active = |e: usize| e % 3 != 1;
                let plan = plan(ranks, rank_len, &starts, active, threads).unwrap();
                assert!(plan.parts.len() <= threads);
                assert_eq!(plan.bounds.len(), plan.parts.len() + 1);
                let mut seen = vec![0u8; ranks * rank_len];
                for (k, part) in plan.parts.iter().enumerate() {
                    assert_eq!(plan.bounds[k] % PARAM_ALIGN_ELEMENTS, 0);
                    for seg in part {
                        let first = plan.bounds[k] + seg.first;
                        assert!(first + seg.len <= plan.bounds[k + 1]);
                        for x in &mut seen[first..first + seg.len] {
                            *x += 1;
                        }
                    }
                }
                for rank in 0..ranks {
                    for (j, &n) in SIZES.iter().enumerate() {
                        let want = u8::from(active(rank * SIZES.len() + j));
                        let at = rank * rank_len + starts.0[j] as usize;
                        assert!(seen[at..at + n].iter().all(|&x| x == want));
                    }
                }
            }
        }
    }
}
