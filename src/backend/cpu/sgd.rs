//! The CPU backend's `torch.optim.SGD` step: one fused pass over memory, split into equal
//! element ranges across the host's threads ([`super::parts`]), the per-(rank, parameter)
//! choices hoisted out of the element loops so that they vectorize, float16 and bfloat16 read
//! and written in place ([`super::storage`]); float64 arenas and layouts that are not
//! slot-aligned run the reference's arithmetic rank by rank. Bit for bit the reference in
//! `backend/kernels/sgd.rs`; its GPU twins are `backend/gpu/sgd.rs` and `shaders/sgd.wgsl`.

use super::parts::{
    Closure, PartWork, Segment, plan, run_best, split_optional, split_words, split_words_ref,
};
use super::storage::{
    OnStorage, Storage, add_scaled, rows, rows_mut, signed, used_or_empty, with_storage,
};
use super::threads::{for_each_rank, run_parts};
use crate::backend::kernels::{
    Chunking, SgdArgs, SgdScalars, check_sgd_arenas, host_words, host_words_mut, sgd_rank,
    sgd_rank_slices,
};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// One (rank, parameter)'s SGD constants in float32.
#[derive(Clone, Copy)]
struct Sgd {
    flip: u32,
    neg_lr: f32,
    wd: f32,
    momentum: f32,
    momentum_alpha: f32,
    damp: f32,
}

impl Sgd {
    /// The constants as the kernel uses them: the scalars of `add(alpha=)` rounded to the
    /// storage format (see [`add_scaled`]); `mul_(momentum)` takes its scalar unrounded, but
    /// for `_foreach_mul_` ([`SgdScalars::foreach_momentum`]).
    fn of<S: Storage>(s: &SgdScalars, rnd: S) -> Sgd {
        Sgd {
            flip: if s.maximize { 0x8000_0000 } else { 0 },
            neg_lr: rnd.r(-s.lr as f32),
            wd: rnd.r(s.weight_decay as f32),
            momentum: if s.foreach_momentum {
                rnd.r(s.momentum as f32)
            } else {
                s.momentum as f32
            },
            momentum_alpha: rnd.r(s.momentum as f32),
            damp: rnd.r(s.one_minus_dampening as f32),
        }
    }
}

/// The SGD update of `sgd_rank` in `backend/kernels/`, element by element. `MOM`: 0 no
/// momentum buffer, 1 first step (the buffer starts as the gradient), 2 a running buffer.
/// Under `fused=True` (the [`Storage`] `with_storage` picks) it is `sgd_rank` with `fused`
/// (float32 throughout, one rounding per store).
#[inline(always)]
fn sgd_block<const WD: bool, const MOM: u8, const NESTEROV: bool, S: Storage>(
    c: Sgd,
    st: S,
    p: &mut [S::Elem],
    g: &[S::Elem],
    b: &mut [S::Elem],
) {
    let r = |x| st.r(x);
    // `x.add(y, alpha=alpha)` (see [`add_scaled`]).
    let add = |x: f32, alpha: f32, y: f32| add_scaled(st, x, alpha, y);
    let n = p.len().min(g.len());
    let (p, g) = (&mut p[..n], &g[..n]);
    if MOM == 0 {
        for (p, &g) in p.iter_mut().zip(g) {
            let param = st.load(*p);
            let mut grad = signed(st.load(g), c.flip);
            if WD {
                grad = add(grad, c.wd, param);
            }
            *p = st.store(add(param, c.neg_lr, grad));
        }
        return;
    }
    let b = &mut b[..n];
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        let param = st.load(*p);
        let mut grad = signed(st.load(g), c.flip);
        if WD {
            grad = add(grad, c.wd, param);
        }
        let buf = if MOM == 1 {
            grad
        } else {
            add(r(st.load(*b) * c.momentum), c.damp, grad)
        };
        *b = st.store(buf);
        grad = if NESTEROV {
            add(grad, c.momentum_alpha, buf)
        } else {
            buf
        };
        *p = st.store(add(param, c.neg_lr, grad));
    }
}

#[inline(always)]
fn sgd_dispatch<S: Storage>(
    s: &SgdScalars,
    rnd: S,
    p: &mut [S::Elem],
    g: &[S::Elem],
    b: &mut [S::Elem],
) {
    let c = Sgd::of(s, rnd);
    let wd = s.weight_decay != 0.0;
    let mom = match (s.momentum != 0.0, s.first_step) {
        (false, _) => 0,
        (true, true) => 1,
        (true, false) => 2,
    };
    macro_rules! go {
        ($wd:literal, $mom:literal, $nest:literal) => {
            sgd_block::<$wd, $mom, $nest, S>(c, rnd, p, g, b)
        };
    }
    match (wd, mom, s.nesterov && mom != 0) {
        (false, 0, _) => go!(false, 0, false),
        (true, 0, _) => go!(true, 0, false),
        (false, 1, false) => go!(false, 1, false),
        (false, 1, true) => go!(false, 1, true),
        (true, 1, false) => go!(true, 1, false),
        (true, 1, true) => go!(true, 1, true),
        (false, _, false) => go!(false, 2, false),
        (false, _, true) => go!(false, 2, true),
        (true, _, false) => go!(true, 2, false),
        (true, _, true) => go!(true, 2, true),
    }
}

/// `torch.optim.SGD`'s step over every rank and parameter of host arenas: the fused,
/// multi-threaded twin of [`sgd_reference`](crate::backend::kernels::sgd_reference) (bit for bit
/// the same results).
pub(crate) fn sgd(threads: usize, args: SgdArgs<'_>) -> Result<()> {
    let (format, scalars) = (args.params.format(), args.scalars);
    let aligned = plan(
        args.params.ranks(),
        args.params.rank_len(),
        args.starts,
        |e| scalars.get(e).is_some_and(|s| s.active),
        threads,
    );
    let plan = match aligned {
        Some(plan)
            if format != StorageFormat::F64 && check_sgd_arenas(&args, Chunking::Any).is_ok() =>
        {
            plan
        }
        _ => return sgd_by_rank(args),
    };
    let g = split_words_ref(host_words(args.grads)?, format, &plan.bounds);
    let b = split_optional(
        args.momentum.map(host_words_mut).transpose()?,
        format,
        &plan.bounds,
    );
    let p = split_words(host_words_mut(args.params)?, format, &plan.bounds);
    let work: Vec<_> = plan
        .parts
        .into_iter()
        .zip(p)
        .zip(g)
        .zip(b)
        .map(|(((segments, p), g), b)| (segments, p, g, b))
        .collect();
    run_parts(work, |(segments, p, g, b)| {
        run_best(SgdPart {
            format,
            scalars,
            segments,
            p,
            g,
            b,
        })
    });
    Ok(())
}

/// One part of an SGD step.
struct SgdPart<'a> {
    format: StorageFormat,
    scalars: &'a [SgdScalars],
    segments: Vec<Segment>,
    p: &'a mut [u32],
    g: &'a [u32],
    b: Option<&'a mut [u32]>,
}

impl PartWork for SgdPart<'_> {
    #[inline(always)]
    fn run(mut self) {
        for seg in &self.segments {
            let s = &self.scalars[seg.entry];
            let b = used_or_empty(&mut self.b, s.momentum != 0.0);
            let segment = SgdSegment {
                s,
                seg,
                arrays: [&mut *self.p, b],
                g: self.g,
            };
            with_storage(self.format, s.fused, segment);
        }
    }
}

/// One segment of a part: SGD over its rows of the parameters, gradients and momentum buffers.
struct SgdSegment<'a> {
    s: &'a SgdScalars,
    seg: &'a Segment,
    arrays: [&'a mut [u32]; 2],
    g: &'a [u32],
}

impl OnStorage for SgdSegment<'_> {
    #[inline(always)]
    fn run<S: Storage>(self, st: S) {
        let [p, b] = self.arrays;
        let (s, seg) = (self.s, self.seg);
        let (p, g, b) = (rows_mut(p, seg), rows(self.g, seg), rows_mut(b, seg));
        // The rows before `half_tail_from` are PyTorch's vector body, the others its scalar
        // tail: each takes its own call, so each loop is as simple as before.
        let k = s.half_tail_from.saturating_sub(seg.in_param).min(seg.len);
        let (p, p_tail) = p.split_at_mut(k);
        let (g, g_tail) = g.split_at(k);
        let (b, b_tail) = b.split_at_mut(k.min(b.len()));
        if k > 0 {
            sgd_dispatch(s, st.vector(), p, g, b);
        }
        if k < seg.len {
            sgd_dispatch(s, st, p_tail, g_tail, b_tail);
        }
    }
}

/// The reference's arithmetic (`sgd_rank` in `backend/kernels/sgd.rs`) over every rank, whole
/// ranks on scoped threads when the arena is large enough, each compiled for the host's best
/// vector extension ([`run_best`]): what float64 arenas and layouts that are not slot-aligned
/// run.
fn sgd_by_rank(args: SgdArgs<'_>) -> Result<()> {
    let (format, len) = (args.params.format(), args.params.rank_len());
    let starts = args.starts;
    let ranks = sgd_rank_slices(args)?;
    for_each_rank(ranks, len, |_, (slices, table)| {
        run_best(Closure(|| {
            if format == StorageFormat::F64 {
                sgd_rank::<f64>(format, slices, starts, table, len);
            } else {
                sgd_rank::<f32>(format, slices, starts, table, len);
            }
        }))
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::test_arenas::{
        FORMATS, SIZES, Values, arena, copy, same, sizes_table,
    };
    use crate::backend::kernels::{sgd_reference, vector_tail_from};

    #[test]
    fn sgd_matches_the_reference_bit_for_bit() {
        let (starts, rank_len) = sizes_table();
        let ranks = 3;
        let mut v = Values(7);
        for format in FORMATS {
            for variant in 0..64u32 {
                if variant & 16 == 16 && format == StorageFormat::F64 || variant & 48 == 48 {
                    continue; // float64 runs the reference, fused or not; fused excludes foreach
                }
                let scalars: Vec<SgdScalars> = (0..ranks * SIZES.len())
                    .map(|e| SgdScalars {
                        active: !(e as u32 + variant).is_multiple_of(5),
                        first_step: variant & 1 == 1,
                        nesterov: variant & 2 == 2 && e % 2 == 0,
                        maximize: e % 3 == 0,
                        lr: 0.1,
                        momentum: if variant & 4 == 4 { 0.0 } else { 0.9 },
                        one_minus_dampening: if e % 2 == 0 { 1.0 } else { 0.7 },
                        weight_decay: if variant & 8 == 8 || e % 4 == 1 {
                            0.01
                        } else {
                            0.0
                        },
                        fused: variant & 16 == 16,
                        foreach_momentum: variant & 48 == 32,
                        // PyTorch's, or anywhere.
                        half_tail_from: if e % 2 == 0 {
                            vector_tail_from(SIZES[e % SIZES.len()])
                        } else {
                            (e * 41) % 120
                        },
                    })
                    .collect();
                let (p, g, b) = (
                    arena(format, ranks, rank_len, &mut v),
                    arena(format, ranks, rank_len, &mut v),
                    arena(format, ranks, rank_len, &mut v),
                );
                let run = |threads: Option<usize>, by_rank: bool| {
                    let (mut p1, mut b1) = (copy(&p), copy(&b));
                    let args = SgdArgs {
                        params: &mut p1,
                        grads: &g,
                        momentum: Some(&mut b1),
                        starts: &starts,
                        scalars: &scalars,
                    };
                    match threads {
                        None if by_rank => sgd_by_rank(args).unwrap(),
                        None => sgd_reference(args).unwrap(),
                        Some(t) => sgd(t, args).unwrap(),
                    }
                    (p1, b1)
                };
                let (p0, b0) = run(None, false);
                // The by-rank fallback (float64, layouts off the slots) computes the same.
                for threads in [Some(1), Some(2), Some(3), None] {
                    let (p1, b1) = run(threads, true);
                    let what = format!("sgd {format:?} variant {variant} threads {threads:?}");
                    same(&p1, &p0, &format!("{what}: params"));
                    same(&b1, &b0, &format!("{what}: momentum"));
                }
            }
        }
    }
}
