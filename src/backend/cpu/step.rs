//! The CPU backend's data-parallel SGD step: one fused pass over memory. Per block of elements
//! the gradients of every rank are summed into an accumulator that stays in L1, the means and
//! the updated parameters are computed from it, and every output word is written once. When
//! the step moves more bytes than the caches hold, the outputs are written with non-temporal
//! (streaming) stores on x86-64, which spares the read-for-ownership of every destination
//! line: the step then costs the `(2R+2)·N` element sizes of traffic a `memcpy` of the same
//! bytes costs.

use super::f16c;
use super::half::{BFloat16, Binary16, HalfFormat};
use super::stream::{STREAMING_THRESHOLD_BYTES, store_fence, store_words};
use super::threads::{BLOCK, PARALLEL_THRESHOLD, part_bounds, run_parts, split_ranks};
use crate::backend::Arena;
use crate::backend::check_step_arenas;
use crate::backend::quotient::{ByDivision, ByScale, Divide, Quotient};
use crate::backend::{host_words as host, host_words_mut as host_mut};
use crate::dtype::StorageFormat;
use crate::error::Result;

// ---------------------------------------------------------------------------------------------
// The data-parallel SGD step.

/// The storage formats the step has dedicated loops for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fast {
    F32,
    F16,
    BF16,
    /// Any other format: element by element through `StorageFormat::load`/`store`.
    Generic,
}

impl Fast {
    fn of(format: StorageFormat) -> Fast {
        if format == StorageFormat::F32 {
            Fast::F32
        } else if format == StorageFormat::F16 {
            Fast::F16
        } else if format == StorageFormat::BF16 {
            Fast::BF16
        } else {
            Fast::Generic
        }
    }
}

/// What every part of one step shares.
#[derive(Clone, Copy)]
struct StepKernel {
    param_format: StorageFormat,
    grad_format: StorageFormat,
    param: Fast,
    grad: Fast,
    /// How a sum becomes a mean: `sum / R`, by a product where that is exact.
    quotient: Quotient,
    learning_rate: f32,
    streaming: bool,
    /// binary16 parameters are converted in hardware ([`f16c`]), with the sums interleaved.
    f16_hardware: bool,
}

/// `acc[i] = 0 + g` (`first`) or `acc[i] += g`, for `g` the f32 words of `src`. Starting
/// from +0.0 matters: `0.0 + -0.0` is +0.0, as in the reference's accumulator.
#[inline(always)]
fn add_f32(acc: &mut [f32], src: &[u32], first: bool) {
    if first {
        for (a, &w) in acc.iter_mut().zip(src) {
            *a = 0.0 + f32::from_bits(w);
        }
    } else {
        for (a, &w) in acc.iter_mut().zip(src) {
            *a += f32::from_bits(w);
        }
    }
}

/// Adds the f32 words of `src` (element pairs) to the split accumulators.
#[inline(always)]
fn add_f32_split(lo: &mut [f32], hi: &mut [f32], src: &[u32], first: bool) {
    if first {
        for ((l, h), w) in lo.iter_mut().zip(hi.iter_mut()).zip(src.chunks_exact(2)) {
            *l = 0.0 + f32::from_bits(w[0]);
            *h = 0.0 + f32::from_bits(w[1]);
        }
    } else {
        for ((l, h), w) in lo.iter_mut().zip(hi.iter_mut()).zip(src.chunks_exact(2)) {
            *l += f32::from_bits(w[0]);
            *h += f32::from_bits(w[1]);
        }
    }
}

/// Adds the packed 16-bit pairs of `src` to the split accumulators.
#[inline(always)]
fn add_half_split<H: HalfFormat>(lo: &mut [f32], hi: &mut [f32], src: &[u32], first: bool) {
    if first {
        for ((l, h), &w) in lo.iter_mut().zip(hi.iter_mut()).zip(src) {
            *l = 0.0 + H::decode(w);
            *h = 0.0 + H::decode(w >> 16);
        }
    } else {
        for ((l, h), &w) in lo.iter_mut().zip(hi.iter_mut()).zip(src) {
            *l += H::decode(w);
            *h += H::decode(w >> 16);
        }
    }
}

/// Adds the packed 16-bit pairs of `src` to the interleaved accumulator.
#[inline(always)]
fn add_half<H: HalfFormat>(acc: &mut [f32], src: &[u32], first: bool) {
    for (a, &w) in acc.chunks_exact_mut(2).zip(src) {
        let (x, y) = (H::decode(w), H::decode(w >> 16));
        if first {
            a[0] = 0.0 + x;
            a[1] = 0.0 + y;
        } else {
            a[0] += x;
            a[1] += y;
        }
    }
}

/// Means and updated parameters of one block of a 16-bit format from the sums of each word's
/// (low, high) element pair: packed means into `means`, packed parameters into `out`, from
/// rank 0's packed parameters `p0`.
#[inline(always)]
fn update_half<H: HalfFormat, Q: Divide>(
    sums: impl Iterator<Item = (f32, f32)>,
    p0: &[u32],
    means: &mut [u32],
    out: &mut [u32],
    quotient: Q,
    lr: f32,
) {
    for ((((l, h), &p), m), o) in sums.zip(p0).zip(means.iter_mut()).zip(out.iter_mut()) {
        let (ml, mh) = (H::encode(quotient.of(l)), H::encode(quotient.of(h)));
        *m = ml | (mh << 16);
        let (ml, mh) = (H::decode(ml), H::decode(mh));
        let (pl, ph) = (H::decode(p), H::decode(p >> 16));
        *o = H::encode(pl - lr * ml) | (H::encode(ph - lr * mh) << 16);
    }
}

/// The data-parallel SGD step over one element range ([`StepRange`]). Per element, in f32:
/// `mean = round_P((0 + g_0 + … + g_{R-1}) / R)`, and on every rank `p = round_P(p_0 − lr·mean)`,
/// the division made by `quotient`.
#[inline(always)]
fn dp_sgd_step_range<Q: Divide>(quotient: Q, range: StepRange<'_, '_>) {
    let StepRange {
        kernel,
        params,
        means,
        grads,
        grad_rank_words,
        elements,
        first_element,
    } = range;
    let ranks = params.len();
    if ranks == 0 || elements == 0 {
        return;
    }
    let (pf, gf) = (kernel.param_format, kernel.grad_format);
    let lr = kernel.learning_rate;
    // The gradient sums, then (f32 and generic formats) the means. 16-bit parameters keep the
    // sums of even and odd elements apart (`acc[..BLOCK / 2]` and `acc[BLOCK / 2..]`), so
    // that every portable loop runs over whole packed words; binary16 parameters converted in
    // hardware keep them in element order.
    let split = matches!(kernel.param, Fast::F16 | Fast::BF16)
        && !(kernel.param == Fast::F16 && kernel.f16_hardware);
    let mut acc = [0f32; BLOCK];
    // The packed updated parameters of one block (room for two words per element, for
    // formats wider than f32) and, for 16-bit formats, the packed means.
    let mut packed = [0u32; 2 * BLOCK];
    let mut packed_means = [0u32; BLOCK / 2];
    let mut start = 0;
    while start < elements {
        let n = BLOCK.min(elements - start);
        // Blocks start on even elements; an odd-length rank's last element is the `tail`.
        let pairs = n / 2;
        let g_at = first_element + start;
        let at = pf.words_for(start);
        // binary16 gradients and parameters in hardware: the block's whole groups of eight
        // elements are summed in registers and stepped in one pass, into `packed_means` and
        // `packed`; the loops below do the rest of the block, from element `skip` on.
        let skip = if !split && kernel.param == Fast::F16 && kernel.grad == Fast::F16 {
            let sources = f16c::RankRows {
                halves: bytemuck::cast_slice(grads),
                stride: 2 * grad_rank_words,
                ranks,
                first: g_at,
            };
            f16c::step(
                sources,
                bytemuck::cast_slice(&params[0][at..at + pairs]),
                bytemuck::cast_slice_mut(&mut packed_means[..pairs]),
                bytemuck::cast_slice_mut(&mut packed[..pairs]),
                quotient.quotient(),
                lr,
            )
        } else {
            0
        };
        let mut tail_sum = 0f32;
        for rank in 0..ranks {
            let words = &grads[rank * grad_rank_words..(rank + 1) * grad_rank_words];
            let first = rank == 0;
            if split {
                let (lo, hi) = acc.split_at_mut(BLOCK / 2);
                let (lo, hi) = (&mut lo[..pairs], &mut hi[..pairs]);
                match kernel.grad {
                    Fast::F32 => add_f32_split(lo, hi, &words[g_at..g_at + 2 * pairs], first),
                    Fast::F16 => {
                        add_half_split::<Binary16>(lo, hi, &words[g_at / 2..][..pairs], first)
                    }
                    Fast::BF16 => {
                        add_half_split::<BFloat16>(lo, hi, &words[g_at / 2..][..pairs], first)
                    }
                    Fast::Generic => {
                        for k in 0..pairs {
                            let (x, y) = (
                                gf.load(words, g_at + 2 * k),
                                gf.load(words, g_at + 2 * k + 1),
                            );
                            lo[k] = if first { 0.0 + x } else { lo[k] + x };
                            hi[k] = if first { 0.0 + y } else { hi[k] + y };
                        }
                    }
                }
                if n % 2 == 1 {
                    let g = gf.load(words, g_at + n - 1);
                    tail_sum = if first { 0.0 + g } else { tail_sum + g };
                }
            } else {
                // Elements `skip..n` (`skip` is a multiple of eight).
                let (acc, g_at, n, pairs) =
                    (&mut acc[skip..n], g_at + skip, n - skip, pairs - skip / 2);
                let done = match kernel.grad {
                    Fast::F32 => {
                        add_f32(acc, &words[g_at..g_at + n], first);
                        n
                    }
                    Fast::F16 => {
                        let src = &words[g_at / 2..][..pairs];
                        let words_done = f16c::add(acc, bytemuck::cast_slice(src), first) / 2;
                        let (acc, src) = (&mut acc[2 * words_done..], &src[words_done..]);
                        add_half::<Binary16>(acc, src, first);
                        2 * pairs
                    }
                    Fast::BF16 => {
                        add_half::<BFloat16>(acc, &words[g_at / 2..][..pairs], first);
                        2 * pairs
                    }
                    Fast::Generic => 0,
                };
                for (k, a) in acc.iter_mut().enumerate().skip(done) {
                    let g = gf.load(words, g_at + k);
                    *a = if first { 0.0 + g } else { *a + g };
                }
            }
        }

        // The words of this block that every rank gets from `packed`, and (16-bit formats,
        // odd-length ranks) the last element, stored on its own so that the other half of its
        // word, which is padding, stays as it is.
        let mut words = pf.words_for(start + n) - at;
        let mut tail: Option<(usize, f32)> = None;
        match kernel.param {
            Fast::F32 => {
                let acc = &mut acc[..n];
                let p0 = &params[0][at..at + n];
                for ((a, out), &p) in acc.iter_mut().zip(packed.iter_mut()).zip(p0) {
                    let mean = quotient.of(*a);
                    *a = mean;
                    let scaled = lr * mean;
                    *out = (f32::from_bits(p) - scaled).to_bits();
                }
                let mean_values: &[f32] = acc;
                let mean_words: &[u32] = bytemuck::cast_slice(mean_values);
                store_words(&mut means[at..at + n], mean_words, kernel.streaming);
            }
            Fast::F16 | Fast::BF16 => {
                words = pairs;
                let p0 = &params[0][at..at + pairs];
                let (m, out) = (&mut packed_means[..pairs], &mut packed[..pairs]);
                if split {
                    let (lo, hi) = acc.split_at(BLOCK / 2);
                    let sums = lo[..pairs].iter().copied().zip(hi[..pairs].iter().copied());
                    if kernel.param == Fast::F16 {
                        update_half::<Binary16, Q>(sums, p0, m, out, quotient, lr);
                    } else {
                        update_half::<BFloat16, Q>(sums, p0, m, out, quotient, lr);
                    }
                } else {
                    // binary16 in hardware: the sums are in element order (from `skip` on: the
                    // words before it are done).
                    let h = skip / 2;
                    let done = h + f16c::update(
                        &acc[skip..2 * pairs],
                        bytemuck::cast_slice(&p0[h..]),
                        bytemuck::cast_slice_mut(&mut m[h..]),
                        bytemuck::cast_slice_mut(&mut out[h..]),
                        quotient.quotient(),
                        lr,
                    ) / 2;
                    let sums = acc[2 * done..2 * pairs]
                        .chunks_exact(2)
                        .map(|s| (s[0], s[1]));
                    let (p0, m, out) = (&p0[done..], &mut m[done..], &mut out[done..]);
                    update_half::<Binary16, Q>(sums, p0, m, out, quotient, lr);
                    if n % 2 == 1 {
                        tail_sum = acc[n - 1];
                    }
                }
                let m = &packed_means[..pairs];
                if n % 2 == 1 {
                    let k = start + n - 1;
                    let mean = pf.round(quotient.of(tail_sum));
                    pf.store(means, k, mean);
                    tail = Some((k, pf.load(params[0], k) - lr * mean));
                }
                store_words(&mut means[at..at + pairs], m, kernel.streaming);
            }
            Fast::Generic => {
                let p0 = &params[0][at..at + words];
                let means = &mut means[at..at + words];
                let packed = &mut packed[..words];
                packed.copy_from_slice(p0);
                for (k, a) in acc[..n].iter().enumerate() {
                    let mean = pf.round(quotient.of(*a));
                    pf.store(means, k, mean);
                    let updated = pf.load(p0, k) - lr * mean;
                    pf.store(packed, k, updated);
                }
            }
        }
        for rank_words in params.iter_mut() {
            store_words(
                &mut rank_words[at..at + words],
                &packed[..words],
                kernel.streaming,
            );
            if let Some((k, updated)) = tail {
                pf.store(rank_words, k, updated);
            }
        }
        start += n;
    }
    store_fence(kernel.streaming);
}

/// One part's work: `params[r]` and `means` hold the range's words (they begin at element
/// `first_element`); `grads` is the whole gradient arena, ranks `grad_rank_words` apart.
struct StepRange<'a, 'b> {
    kernel: &'a StepKernel,
    params: &'a mut [&'b mut [u32]],
    means: &'a mut [u32],
    grads: &'a [u32],
    grad_rank_words: usize,
    elements: usize,
    first_element: usize,
}

impl super::parts::PartWork for StepRange<'_, '_> {
    #[inline(always)]
    fn run(self) {
        match self.kernel.quotient {
            Quotient::Divide(d) => self.run_with(ByDivision(d)),
            Quotient::Scale(s) => self.run_with(ByScale(s)),
        }
    }
}

impl StepRange<'_, '_> {
    #[inline(always)]
    fn run_with<Q: Divide>(self, quotient: Q) {
        dp_sgd_step_range(quotient, self)
    }
}

/// The data-parallel SGD step over whole host arenas, split across `threads` threads.
pub(super) fn dp_sgd_step(
    threads: usize,
    params: &mut Arena,
    grads: &Arena,
    means: &mut Arena,
    learning_rate: f32,
    divisor: f32,
) -> Result<()> {
    check_step_arenas(params, grads, means, divisor)?;
    let (param_format, grad_format) = (params.format(), grads.format());
    let elements = params.rank_len();
    let ranks = params.ranks();
    if elements == 0 {
        return Ok(());
    }
    let grad_rank_words = grad_format.words_for(elements);
    let param_rank_words = param_format.words_for(elements);
    let grads = host(grads)?;
    let bytes = (2 * ranks + 2)
        .saturating_mul(elements)
        .saturating_mul(param_format.element_bytes());
    let kernel = StepKernel {
        param_format,
        grad_format,
        param: Fast::of(param_format),
        grad: Fast::of(grad_format),
        quotient: Quotient::by(divisor),
        learning_rate,
        streaming: bytes >= STREAMING_THRESHOLD_BYTES,
        f16_hardware: f16c::available(),
    };
    let parts = if elements.saturating_mul(ranks) >= PARALLEL_THRESHOLD {
        threads.min(elements.div_ceil(BLOCK))
    } else {
        1
    };
    let bounds = part_bounds(elements, parts);
    let word_bounds: Vec<usize> = bounds.iter().map(|&e| param_format.words_for(e)).collect();
    let param_parts = split_ranks(host_mut(params)?, param_rank_words, &word_bounds);
    let mean_parts = split_ranks(host_mut(means)?, param_rank_words, &word_bounds);
    let work: Vec<_> = param_parts
        .into_iter()
        .zip(mean_parts)
        .zip(bounds.windows(2))
        .map(|((p, mut m), w)| (p, m.pop().unwrap_or_default(), w[0], w[1] - w[0]))
        .collect();
    run_parts(work, |(mut p, m, first, n)| {
        // Compiled for the best vector extension the host has (`run_best`: AVX-512 or AVX2 on
        // x86-64, which widens the 16-bit conversion loops; the same IEEE f32 arithmetic either
        // way, so the results are identical).
        super::parts::run_best(StepRange {
            kernel: &kernel,
            params: &mut p,
            means: m,
            grads,
            grad_rank_words,
            elements: n,
            first_element: first,
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, CpuBackend};

    /// The step element by element, in the reference's terms.
    fn reference_step(
        pf: StorageFormat,
        gf: StorageFormat,
        ranks: usize,
        len: usize,
        params: &[u32],
        grads: &[u32],
        lr: f32,
    ) -> (Vec<u32>, Vec<u32>) {
        let (pw, gw) = (pf.words_for(len), gf.words_for(len));
        let mut out = params.to_vec();
        let mut means = vec![0u32; pw];
        for i in 0..len {
            let mut acc = 0f32;
            for r in 0..ranks {
                acc += gf.load(&grads[r * gw..], i);
            }
            let mean = pf.round(acc / ranks as f32);
            pf.store(&mut means, i, mean);
            let p = pf.load(&params[..pw], i) - lr * mean;
            for r in 0..ranks {
                pf.store(&mut out[r * pw..(r + 1) * pw], i, p);
            }
        }
        (out, means)
    }

    /// Values with zeros of both signs, subnormals of f32 and f16, huge values, infinities
    /// and NaNs among ordinary ones.
    fn nasty(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = (*seed >> 33) as u32;
        match r % 16 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(r >> 9),
            3 => (r as f32) * 1e-12,
            4 => f32::INFINITY,
            5 => f32::NAN,
            6 => 70000.0 * if r & 1 == 0 { 1.0 } else { -1.0 },
            7 => f32::from_bits(r),
            _ => (r as f32 / u32::MAX as f32) * 4.0 - 2.0,
        }
    }

    #[test]
    fn step_matches_the_element_by_element_reference() {
        let formats = [
            StorageFormat::F32,
            StorageFormat::F16,
            StorageFormat::BF16,
            StorageFormat::F64,
        ];
        let mut seed = 7u64;
        for &pf in &formats {
            for &gf in &formats {
                for &(ranks, len, threads) in &[
                    (1usize, 2usize, 1usize),
                    (3, 7, 1),
                    (2, 4097, 2),
                    (5, 3 * BLOCK + 6, 2),
                    (4, 40_000, 2),
                    (3, 1 << 17, 3),
                    // Above the streaming threshold (same formats only, to stay quick).
                    (3, (1 << 21) + 1, 2),
                ] {
                    if len > 1 << 20 && pf != gf {
                        continue;
                    }
                    let backend = CpuBackend::with_threads(threads);
                    let mut params = backend.create_arena(pf, ranks, len, len).unwrap();
                    let mut grads = backend.create_arena(gf, ranks, len, len).unwrap();
                    let mut means = backend.create_arena(pf, 1, len, len).unwrap();
                    let mut p0 = vec![0u32; pf.words_for(len)];
                    for i in 0..len {
                        pf.store(&mut p0, i, nasty(&mut seed));
                    }
                    // Written straight into the storage (`Arena::write` refuses the odd
                    // 16-bit lengths covered here); the padding halves get junk too.
                    for (r, rank) in host_mut(&mut params)
                        .unwrap()
                        .chunks_exact_mut(p0.len())
                        .enumerate()
                    {
                        rank.copy_from_slice(&p0);
                        rank[p0.len() - 1] ^= (r as u32 + 1) << 24;
                    }
                    for rank in host_mut(&mut grads)
                        .unwrap()
                        .chunks_exact_mut(gf.words_for(len))
                    {
                        for i in 0..len {
                            gf.store(rank, i, nasty(&mut seed));
                        }
                    }
                    let before = host(&params).unwrap().to_vec();
                    let (want_params, want_means) =
                        reference_step(pf, gf, ranks, len, &before, host(&grads).unwrap(), 0.375);
                    backend
                        .dp_sgd_step(&mut params, &grads, &mut means, 0.375)
                        .unwrap();
                    let label = format!("{pf:?}/{gf:?} ranks {ranks} len {len}");
                    // NaN payloads are not specified for f32 arithmetic (and survive in the
                    // f32 and f64 formats); every other bit is.
                    let same = |a: &[u32], b: &[u32]| {
                        a.len() == b.len()
                            && a.iter().zip(b).enumerate().all(|(i, (&x, &y))| {
                                x == y
                                    || match pf {
                                        StorageFormat::F32 => {
                                            f32::from_bits(x).is_nan() && f32::from_bits(y).is_nan()
                                        }
                                        StorageFormat::F64 => {
                                            pf.load_f64(a, i / 2).is_nan()
                                                && pf.load_f64(b, i / 2).is_nan()
                                        }
                                        _ => false,
                                    }
                            })
                    };
                    assert!(same(host(&means).unwrap(), &want_means), "means {label}");
                    assert!(same(host(&params).unwrap(), &want_params), "params {label}");
                }
            }
        }
    }

    #[test]
    fn degenerate_arenas_do_not_panic() {
        let backend = CpuBackend::with_threads(2);
        let f = StorageFormat::F32;
        let mut p = backend.create_arena(f, 0, 64, 64).unwrap();
        let g = backend.create_arena(f, 0, 64, 64).unwrap();
        let mut m = backend.create_arena(f, 1, 64, 64).unwrap();
        assert!(backend.dp_sgd_step(&mut p, &g, &mut m, 0.1).is_err());
        let mut p = backend.create_arena(f, 2, 0, 0).unwrap();
        let g = backend.create_arena(f, 2, 0, 0).unwrap();
        let mut m = backend.create_arena(f, 1, 0, 0).unwrap();
        backend.dp_sgd_step(&mut p, &g, &mut m, 0.1).unwrap();
        let src = backend.create_arena(f, 2, 0, 0).unwrap();
        backend.copy_arena(&src, &mut p).unwrap();
    }
}
