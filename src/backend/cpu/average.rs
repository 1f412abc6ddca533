//! The CPU backend's group averaging: float32 arenas averaged in float32 split across threads
//! along the element axis ([`super::parts`]), each part summing every group's ranks block by
//! block; the other formats and layouts that are not slot-aligned run the reference's
//! arithmetic group by group. Bit for bit the reference in `backend/kernels/average.rs`; its GPU
//! twins are `backend/gpu/average.rs` and `shaders/average.wgsl`.

use super::parts::{PartWork, Segment, plan, run_best};
use super::threads::{for_each_rank, run_parts};
use crate::backend::kernels::{
    AverageArgs, Groups, MeanOrder, average_group, check_average_args, group_slices, host_words_mut,
};
use crate::backend::quotient::{ByDivision, ByScale, Divide, Quotient};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// [`average_reference`](crate::backend::kernels::average_reference), split across threads along
/// the element axis (every group's ranks of one element range per part), for float32 arenas
/// averaged in float32; the other formats run the reference.
pub(crate) fn average(threads: usize, args: AverageArgs<'_>) -> Result<()> {
    let (ranks, len) = (args.arena.ranks(), args.arena.rank_len());
    let (group_size, active) = (args.group_size, args.active);
    let usable = args.arena.format() == StorageFormat::F32
        && args.arith == StorageFormat::F32
        && check_average_args(&args).is_ok();
    // Split one rank's element axis; every part then covers all ranks.
    let planned = plan(
        1,
        len,
        args.starts,
        |j| active.get(j).copied().unwrap_or(false),
        threads,
    );
    let plan = match planned {
        Some(plan) if usable => plan,
        _ => return average_by_group(args),
    };
    let words = host_words_mut(args.arena)?;
    let values: &mut [f32] = bytemuck::cast_slice_mut(words);
    // Per part, every rank's slice of the part's element range.
    let mut per_part: Vec<Vec<&mut [f32]>> = plan.parts.iter().map(|_| Vec::new()).collect();
    for rank in values.chunks_mut(len.max(1)).take(ranks) {
        let mut rest = rank;
        let mut at = 0;
        for (k, slot) in per_part.iter_mut().enumerate() {
            let (head, tail) = rest.split_at_mut(plan.bounds[k + 1] - at);
            at = plan.bounds[k + 1];
            slot.push(head);
            rest = tail;
        }
    }
    let work: Vec<_> = plan.parts.into_iter().zip(per_part).collect();
    let quotient = Quotient::by(group_size as f32);
    let sum_first = args.order == MeanOrder::SumThenDivide;
    run_parts(work, |(segments, rows)| match quotient {
        Quotient::Divide(d) => run_best(AveragePart {
            segments,
            rows,
            group_size,
            quotient: ByDivision(d),
            sum_first,
        }),
        Quotient::Scale(s) => run_best(AveragePart {
            segments,
            rows,
            group_size,
            quotient: ByScale(s),
            sum_first,
        }),
    });
    Ok(())
}

/// Elements of every row summed before the mean is written back.
const AVERAGE_BLOCK: usize = 1024;

/// One part of an averaging step: every rank's slice of the part's element range.
struct AveragePart<'a, Q> {
    segments: Vec<Segment>,
    rows: Vec<&'a mut [f32]>,
    group_size: usize,
    /// Division by the group size (a product when that is exact).
    quotient: Q,
    /// [`MeanOrder::SumThenDivide`]: the sum is divided, not each value.
    sum_first: bool,
}

impl<Q: Divide> PartWork for AveragePart<'_, Q> {
    #[inline(always)]
    fn run(mut self) {
        let mut acc = [0f32; AVERAGE_BLOCK];
        for seg in &self.segments {
            let mut first = seg.first;
            let end = seg.first + seg.len;
            while first < end {
                let n = AVERAGE_BLOCK.min(end - first);
                for group in self.rows.chunks_mut(self.group_size) {
                    let acc = &mut acc[..n];
                    if self.sum_first {
                        acc.copy_from_slice(&group[0][first..first + n]);
                        for row in &group[1..] {
                            for (a, &x) in acc.iter_mut().zip(&row[first..first + n]) {
                                *a += x;
                            }
                        }
                        for a in acc.iter_mut() {
                            *a = self.quotient.of(*a);
                        }
                    } else {
                        for (a, &x) in acc.iter_mut().zip(&group[0][first..first + n]) {
                            *a = self.quotient.of(x);
                        }
                        for row in &group[1..] {
                            for (a, &x) in acc.iter_mut().zip(&row[first..first + n]) {
                                *a += self.quotient.of(x);
                            }
                        }
                    }
                    for row in group.iter_mut() {
                        row[first..first + n].copy_from_slice(acc);
                    }
                }
                first += n;
            }
        }
    }
}

/// The reference's arithmetic (`average_group` in `backend/kernels/average.rs`) over every
/// group, whole groups on scoped threads when the arena is large enough, float32 averaged in
/// float32 on its vectorizing twin [`average_group_f32`]: what the other formats and layouts
/// that are not slot-aligned run (the same results as the reference).
fn average_by_group(args: AverageArgs<'_>) -> Result<()> {
    // One work item per group.
    let (groups, words) = group_slices(args)?;
    let f32_only = groups.format == StorageFormat::F32 && groups.arith == StorageFormat::F32;
    for_each_rank(words, groups.len * groups.group_size, |_, group| {
        if f32_only {
            average_group_f32(&groups, group);
        } else {
            average_group(&groups, group);
        }
    });
    Ok(())
}

/// [`average_group`] for float32, block by block so that the loops vectorize.
fn average_group_f32(groups: &Groups<'_>, group: &mut [u32]) {
    let Groups {
        rank_words,
        group_size,
        ..
    } = *groups;
    const BLOCK: usize = 1024;
    // Each value divided (PyTorch's averagers), or only the sum (DiLoCo's all-reduce).
    let (each, sum) = groups.order.divisors(group_size as f64);
    let (each, sum) = (each as f32, sum as f32);
    let values: &mut [f32] = bytemuck::cast_slice_mut(group);
    let mut acc = [0f32; BLOCK];
    for range in groups.averaged() {
        let mut first = range.start;
        while first < range.end {
            let n = BLOCK.min(range.end - first);
            let acc = &mut acc[..n];
            for (a, &x) in acc.iter_mut().zip(&values[first..first + n]) {
                *a = x / each;
            }
            for rank in 1..group_size {
                let row = &values[rank * rank_words + first..rank * rank_words + first + n];
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += x / each;
                }
            }
            if sum != 1.0 {
                for a in acc.iter_mut() {
                    *a /= sum;
                }
            }
            for rank in 0..group_size {
                values[rank * rank_words + first..rank * rank_words + first + n]
                    .copy_from_slice(acc);
            }
            first += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::test_arenas::{SIZES, Values, arena, copy, same, sizes_table};
    use crate::backend::kernels::average_reference;

    #[test]
    fn average_matches_the_reference_bit_for_bit() {
        let (starts, rank_len) = sizes_table();
        let mut v = Values(3);
        let cases = [(4, 2), (6, 3), (8, 8), (3, 1)].into_iter().flat_map(|rg| {
            [MeanOrder::DivideThenSum, MeanOrder::SumThenDivide].map(|order| (rg, order))
        });
        for ((ranks, group), order) in cases {
            let a = arena(StorageFormat::F32, ranks, rank_len, &mut v);
            let active: Vec<bool> = (0..SIZES.len()).map(|j| j % 3 != 2).collect();
            let run = |threads: Option<usize>, by_group: bool| {
                let mut got = copy(&a);
                let args = AverageArgs {
                    arena: &mut got,
                    group_size: group,
                    arith: StorageFormat::F32,
                    starts: &starts,
                    active: &active,
                    order,
                };
                match threads {
                    None if by_group => average_by_group(args).unwrap(),
                    None => average_reference(args).unwrap(),
                    Some(t) => average(t, args).unwrap(),
                }
                got
            };
            let want = run(None, false);
            // The by-group fallback (other formats, layouts off the slots) computes the same.
            for threads in [Some(1), Some(2), Some(5), None] {
                let what = format!("average R={ranks} g={group} {order:?} threads {threads:?}");
                same(&run(threads, true), &want, &what);
            }
        }
    }
}
