//! The CPU backend's `torch.optim.Adam`/`AdamW` step: one fused pass over memory, split into
//! equal element ranges across the host's threads ([`super::parts`]), the per-(rank,
//! parameter) choices hoisted out of the element loops so that they vectorize, float16 and
//! bfloat16 read and written in place ([`super::storage`]); float64 arenas and layouts that are
//! not slot-aligned run the reference's arithmetic rank by rank. Bit for bit the reference in
//! `backend/kernels/adam.rs`; its GPU twins are `backend/gpu/adam.rs` and `shaders/adam.wgsl`.

use super::parts::{
    Closure, PartWork, Segment, plan, run_best, split_optional, split_words, split_words_ref,
};
use super::storage::{
    OnStorage, Storage, add_scaled, rows, rows_mut, signed, used_or_empty, with_storage,
};
use super::threads::{for_each_rank, run_parts};
use crate::backend::kernels::{
    AdamArenas, AdamScalars, Chunking, ParamStarts, adam_rank, adam_rank_slices, check_adam_arenas,
    fma_f32, host_words, host_words_mut, maximum, std_max,
};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// One (rank, parameter)'s Adam constants in float32.
#[derive(Clone, Copy)]
struct Adam {
    flip: u32,
    w: f32,
    w_minus_one: f32,
    wd: f32,
    decay: f32,
    beta2: f32,
    one_minus_beta2: f32,
    neg_step: f32,
    bc2: f32,
    eps: f32,
}

impl Adam {
    /// The constants as the kernel uses them (`add(alpha=)`'s scalar and `eps`, which PyTorch
    /// makes a tensor of the parameter's dtype, rounded to the storage format).
    fn of<S: Storage>(s: &AdamScalars, rnd: S) -> Adam {
        let w = s.one_minus_beta1 as f32;
        Adam {
            flip: if s.maximize { 0x8000_0000 } else { 0 },
            w,
            w_minus_one: w - 1.0,
            wd: rnd.r(s.weight_decay as f32),
            decay: s.decay_factor as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: s.one_minus_beta2 as f32,
            neg_step: -s.step_size as f32,
            bc2: s.bias_correction2_sqrt as f32,
            eps: rnd.r(s.eps as f32),
        }
    }
}

/// The Adam update of `adam_rank` in `backend/kernels/`, element by element. `DECAY`: 0 none,
/// 1 L2 (Adam's weight decay), 2 decoupled (AdamW). `UPPER`: `1 - beta1 >= 0.5` (PyTorch's lerp
/// takes its other formula).
#[inline(always)]
fn adam_block<const DECAY: u8, const UPPER: bool, const AMSGRAD: bool, S: Storage>(
    c: Adam,
    st: S,
    a: AdamRows<'_, S::Elem>,
) {
    let remainder = a.remainder;
    let r = |x| st.r(x);
    let n = a.p.len();
    let (g, m, v) = (&a.g[..n], &mut a.m[..n], &mut a.v[..n]);
    let vmax: &mut [S::Elem] = if AMSGRAD { &mut a.vmax[..n] } else { &mut [] };
    for i in 0..n {
        let mut param = st.load(a.p[i]);
        let mut grad = signed(st.load(g[i]), c.flip);
        if DECAY == 2 {
            param = r(param * c.decay);
        } else if DECAY == 1 {
            grad = add_scaled(st, grad, c.wd, param);
        }
        let m_old = st.load(m[i]);
        let diff = grad - m_old;
        let m_new = if UPPER {
            r(fma_f32(c.w_minus_one, diff, grad))
        } else {
            r(fma_f32(c.w, diff, m_old))
        };
        m[i] = st.store(m_new);
        let v_scaled = r(st.load(v[i]) * c.beta2);
        let v_new = r(fma_f32(c.one_minus_beta2 * grad, grad, v_scaled));
        v[i] = st.store(v_new);
        let second = if AMSGRAD {
            let old = st.load(vmax[i]);
            // PyTorch's fused kernel's scalar remainder (`AdamScalars::remainder_from`): the
            // rows' last ones at most, a separate call from `AdamSegment::run`.
            let new = if remainder {
                std_max(old, v_new)
            } else {
                maximum(v_new, old)
            };
            vmax[i] = st.store(new);
            new
        } else {
            v_new
        };
        // `(sqrt / bc2).add_(eps)`, then `param.addcdiv_(exp_avg, denom, value=-step_size)`
        // left to right, rounded once.
        let denom = r(r(r(second.sqrt()) / c.bc2) + c.eps);
        a.p[i] = st.store(r(param + c.neg_step * m_new / denom));
    }
}

/// The rows of one Adam segment, as float32.
struct AdamRows<'a, E> {
    p: &'a mut [E],
    g: &'a [E],
    m: &'a mut [E],
    v: &'a mut [E],
    vmax: &'a mut [E],
    /// The rows are in PyTorch's fused scalar remainder (`AdamScalars::remainder_from`).
    remainder: bool,
}

impl<E> AdamRows<'_, E> {
    /// The rows before `k` (at most all), and those from `k` on.
    fn split_at(self, k: usize) -> (Self, Self) {
        let k = k.min(self.p.len());
        let (p, p_rest) = self.p.split_at_mut(k);
        let (g, g_rest) = self.g.split_at(k);
        let (m, m_rest) = self.m.split_at_mut(k);
        let (v, v_rest) = self.v.split_at_mut(k);
        let (vmax, vmax_rest) = self.vmax.split_at_mut(k.min(self.vmax.len()));
        let rest = AdamRows {
            p: p_rest,
            g: g_rest,
            m: m_rest,
            v: v_rest,
            vmax: vmax_rest,
            remainder: self.remainder,
        };
        let body = AdamRows {
            p,
            g,
            m,
            v,
            vmax,
            remainder: self.remainder,
        };
        (body, rest)
    }
}

#[inline(always)]
fn adam_dispatch<S: Storage>(s: &AdamScalars, rnd: S, rows: AdamRows<'_, S::Elem>) {
    let c = Adam::of(s, rnd);
    let decay = if s.decoupled {
        2
    } else if s.weight_decay != 0.0 {
        1
    } else {
        0
    };
    let upper = c.w >= 0.5;
    macro_rules! go {
        ($d:literal, $u:literal, $a:literal) => {
            adam_block::<$d, $u, $a, S>(c, rnd, rows)
        };
    }
    match (decay, upper, s.amsgrad) {
        (0, false, false) => go!(0, false, false),
        (0, false, true) => go!(0, false, true),
        (0, true, false) => go!(0, true, false),
        (0, true, true) => go!(0, true, true),
        (1, false, false) => go!(1, false, false),
        (1, false, true) => go!(1, false, true),
        (1, true, false) => go!(1, true, false),
        (1, true, true) => go!(1, true, true),
        (_, false, false) => go!(2, false, false),
        (_, false, true) => go!(2, false, true),
        (_, true, false) => go!(2, true, false),
        (_, true, true) => go!(2, true, true),
    }
}

/// `torch.optim.Adam`/`AdamW`'s step over every rank and parameter of host arenas: the fused,
/// multi-threaded twin of [`adam_reference`](crate::backend::kernels::adam_reference) (bit for
/// bit the same results).
pub(crate) fn adam(
    threads: usize,
    arenas: AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    let format = arenas.params.format();
    let planned = plan(
        arenas.params.ranks(),
        arenas.params.rank_len(),
        starts,
        |e| scalars.get(e).is_some_and(|s| s.active),
        threads,
    );
    let plan = match planned {
        Some(plan)
            if format != StorageFormat::F64
                && check_adam_arenas(&arenas, starts, scalars, Chunking::Any).is_ok() =>
        {
            plan
        }
        _ => return adam_by_rank(arenas, starts, scalars),
    };
    let bounds = &plan.bounds;
    let g = split_words_ref(host_words(arenas.grads)?, format, bounds);
    let m = split_words(host_words_mut(arenas.exp_avg)?, format, bounds);
    let v = split_words(host_words_mut(arenas.exp_avg_sq)?, format, bounds);
    let x = split_optional(
        arenas.max_exp_avg_sq.map(host_words_mut).transpose()?,
        format,
        bounds,
    );
    let p = split_words(host_words_mut(arenas.params)?, format, bounds);
    let work: Vec<_> = plan
        .parts
        .into_iter()
        .zip(p)
        .zip(g)
        .zip(m)
        .zip(v)
        .zip(x)
        .map(|(((((segments, p), g), m), v), x)| (segments, p, g, m, v, x))
        .collect();
    run_parts(work, |(segments, p, g, m, v, x)| {
        run_best(AdamPart {
            format,
            scalars,
            segments,
            arrays: [p, m, v],
            g,
            x,
        })
    });
    Ok(())
}

/// One part of an Adam step: parameters, first and second moments, gradients, maxima.
struct AdamPart<'a> {
    format: StorageFormat,
    scalars: &'a [AdamScalars],
    segments: Vec<Segment>,
    arrays: [&'a mut [u32]; 3],
    g: &'a [u32],
    x: Option<&'a mut [u32]>,
}

impl PartWork for AdamPart<'_> {
    #[inline(always)]
    fn run(mut self) {
        let [p, m, v] = self.arrays;
        for seg in &self.segments {
            let s = &self.scalars[seg.entry];
            let x = used_or_empty(&mut self.x, s.amsgrad);
            let segment = AdamSegment {
                s,
                seg,
                arrays: [&mut *p, &mut *m, &mut *v, x],
                g: self.g,
            };
            with_storage(self.format, s.fused, segment);
        }
    }
}

/// One segment of a part: Adam over its rows of the parameters, gradients, both moments and
/// the running maximum.
struct AdamSegment<'a> {
    s: &'a AdamScalars,
    seg: &'a Segment,
    arrays: [&'a mut [u32]; 4],
    g: &'a [u32],
}

impl OnStorage for AdamSegment<'_> {
    #[inline(always)]
    fn run<S: Storage>(self, st: S) {
        let [p, m, v, x] = self.arrays;
        let (s, seg) = (self.s, self.seg);
        let rows = AdamRows {
            p: rows_mut(p, seg),
            g: rows(self.g, seg),
            m: rows_mut(m, seg),
            v: rows_mut(v, seg),
            vmax: rows_mut(x, seg),
            remainder: false,
        };
        // The rows before `half_tail_from` are PyTorch's vector body of the 16-bit single-tensor
        // arithmetic, the others its scalar tail; under `fused`, those from `remainder_from`
        // on its fused kernel's scalar remainder. Each stretch takes its own call, so each
        // loop is as simple as without them.
        let body = s.half_tail_from.saturating_sub(seg.in_param);
        let remainder = s.remainder_from.saturating_sub(seg.in_param);
        let (in_body, in_tail) = rows.split_at(body);
        adam_stretch(s, st.vector(), in_body, remainder);
        adam_stretch(s, st, in_tail, remainder.saturating_sub(body));
    }
}

/// Adam over `rows` with the arithmetic `st`, those from `remainder` on as the fused
/// kernel's scalar remainder; an empty stretch makes no call.
#[inline(always)]
fn adam_stretch<S: Storage>(s: &AdamScalars, st: S, rows: AdamRows<'_, S::Elem>, remainder: usize) {
    let (before, mut after) = rows.split_at(remainder);
    after.remainder = true;
    for rows in [before, after] {
        if !rows.p.is_empty() {
            adam_dispatch(s, st, rows);
        }
    }
}

/// The reference's arithmetic (`adam_rank` in `backend/kernels/adam.rs`) over every rank, whole
/// ranks on scoped threads when the arena is large enough, each compiled for the host's best
/// vector extension ([`run_best`]): what float64 arenas and layouts that are not slot-aligned
/// run.
fn adam_by_rank(
    arenas: AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    let (format, len) = (arenas.params.format(), arenas.params.rank_len());
    let ranks = adam_rank_slices(arenas, starts, scalars)?;
    for_each_rank(ranks, len, |_, (slices, table)| {
        run_best(Closure(|| {
            if format == StorageFormat::F64 {
                adam_rank::<f64>(format, slices, starts, table, len);
            } else {
                adam_rank::<f32>(format, slices, starts, table, len);
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
    use crate::backend::kernels::{adam_reference, vector_tail_from};
    use crate::backend::{Arena, ArenaStorage};

    #[test]
    fn adam_matches_the_reference_bit_for_bit() {
        let (starts, rank_len) = sizes_table();
        let ranks = 2;
        let mut v = Values(11);
        for format in FORMATS {
            for variant in 0..16u32 {
                if variant & 8 == 8 && format == StorageFormat::F64 {
                    continue; // float64 runs the reference, fused or not
                }
                let scalars: Vec<AdamScalars> = (0..ranks * SIZES.len())
                    .map(|e| {
                        let beta1 = if e % 2 == 0 { 0.9 } else { 0.3 };
                        AdamScalars {
                            active: !(e as u32 + variant).is_multiple_of(4),
                            maximize: e % 3 == 0,
                            amsgrad: variant & 1 == 1,
                            decoupled: variant & 2 == 2,
                            weight_decay: if variant & 4 == 4 { 0.01 } else { 0.0 },
                            decay_factor: 1.0 - 1e-3 * 0.01,
                            one_minus_beta1: 1.0 - beta1,
                            beta2: 0.999,
                            one_minus_beta2: 1.0 - 0.999,
                            step_size: 1e-3 / (1.0 - beta1 * beta1),
                            bias_correction2_sqrt: (1.0f64 - 0.999 * 0.999).sqrt(),
                            eps: 1e-8,
                            fused: variant & 8 == 8,
                            // Anywhere from the first element to past the last.
                            remainder_from: (e * 37) % 160,
                            // PyTorch's, or anywhere.
                            half_tail_from: if e % 2 == 0 {
                                vector_tail_from(SIZES[e % SIZES.len()])
                            } else {
                                (e * 53) % 200
                            },
                        }
                    })
                    .collect();
                let mut a: Vec<Arena> = (0..5)
                    .map(|_| arena(format, ranks, rank_len, &mut v))
                    .collect();
                // Second moments are never negative.
                for k in [3, 4] {
                    let words = match &mut a[k].storage {
                        ArenaStorage::Host(w) => w,
                        _ => unreachable!(),
                    };
                    let n = ranks * rank_len;
                    for i in 0..n {
                        let x = if format == StorageFormat::F64 {
                            format.load_f64(words, i).abs()
                        } else {
                            f64::from(format.load(words, i).abs())
                        };
                        if format == StorageFormat::F64 {
                            format.store_f64(words, i, x);
                        } else {
                            format.store(words, i, x as f32);
                        }
                    }
                }
                let run = |threads: Option<usize>, by_rank: bool| {
                    let mut c: Vec<Arena> = a.iter().map(copy).collect();
                    let [p, g, m, s, x] = &mut c[..] else {
                        unreachable!()
                    };
                    let arenas = AdamArenas {
                        params: p,
                        grads: g,
                        exp_avg: m,
                        exp_avg_sq: s,
                        max_exp_avg_sq: Some(x),
                    };
                    match threads {
                        None if by_rank => adam_by_rank(arenas, &starts, &scalars).unwrap(),
                        None => adam_reference(arenas, &starts, &scalars).unwrap(),
                        Some(t) => adam(t, arenas, &starts, &scalars).unwrap(),
                    }
                    c
                };
                let want = run(None, false);
                // The by-rank fallback (float64, layouts off the slots) computes the same.
                for threads in [Some(1), Some(2), Some(3), None] {
                    let got = run(threads, true);
                    for (k, name) in ["params", "grads", "exp_avg", "exp_avg_sq", "max"]
                        .iter()
                        .enumerate()
                    {
                        let what = format!("adam {format:?} variant {variant} threads {threads:?}");
                        same(&got[k], &want[k], &format!("{what}: {name}"));
                    }
                }
            }
        }
    }
}
