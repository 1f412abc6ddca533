//! binary16 conversions in hardware (x86-64 F16C, eight elements per instruction) for the CPU
//! step's block loops: bit for bit what [`Binary16::decode`](super::half::HalfFormat::decode)
//! and [`Binary16::encode`](super::half::HalfFormat::encode) give, NaNs included (a NaN is
//! stored as the signed canonical quiet NaN, as `encode` writes it). Elements are `u16` bits (a
//! packed arena's words read as `u16`, the low half first, or a tensor's `f16`s). Each function
//! does the leading whole groups of eight elements it is given and returns how many elements
//! that was; the caller's portable loops do the rest, and all of it where the host lacks F16C.

use crate::backend::quotient::Quotient;

/// Whether the host converts binary16 in hardware.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `acc[i] = 0 + x[i]` (`first`) or `acc[i] += x[i]`, for `x` the binary16 elements of `src`,
/// over the leading whole groups of eight. Returns the elements done: 0 where the host lacks
/// F16C.
///
/// # Panics
/// When `acc` is shorter than `src`.
pub(super) fn add(acc: &mut [f32], src: &[u16], first: bool) -> usize {
    assert!(acc.len() >= src.len(), "f16c::add: accumulator too short");
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the host has AVX and F16C (checked above); the lengths were checked.
        return unsafe { x86::add(acc, src, first) };
    }
    let _ = first;
    0
}

/// The step's update of one block from the gradient sums `acc`: the means, `round(sum / R)`,
/// into `means`, and the updated parameters, `round(p0 − lr · mean)` from rank 0's parameters
/// `p0`, into `out`, over the leading whole groups of eight elements. Returns the elements done:
/// 0 where the host lacks F16C.
///
/// # Panics
/// When `acc`, `means` or `out` is shorter than `p0`.
pub(super) fn update(
    acc: &[f32],
    p0: &[u16],
    means: &mut [u16],
    out: &mut [u16],
    quotient: Quotient,
    lr: f32,
) -> usize {
    assert!(
        acc.len() >= p0.len() && means.len() >= p0.len() && out.len() >= p0.len(),
        "f16c::update: slices too short"
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the host has AVX and F16C (checked above); the lengths were checked.
        return unsafe { x86::update(acc, p0, means, out, quotient, lr) };
    }
    let _ = (quotient, lr);
    0
}

/// Every rank's binary16 elements `first..` of an arena read as `u16`: rank `r`'s element `e`
/// is `halves[r * stride + e]`.
#[derive(Clone, Copy)]
pub(super) struct RankRows<'a> {
    pub(super) halves: &'a [u16],
    pub(super) stride: usize,
    pub(super) ranks: usize,
    pub(super) first: usize,
}

/// The step over one block with binary16 gradients and parameters, each group of eight
/// elements summed over the ranks in registers (from +0, in rank order) and then updated as
/// [`update`] does, over the leading whole groups of eight of `p0`'s elements. Returns the
/// elements done: 0 where the host lacks F16C.
///
/// # Panics
/// When a rank's row is shorter than `first + p0.len()`, or `means` or `out` shorter than `p0`.
pub(super) fn step(
    grads: RankRows<'_>,
    p0: &[u16],
    means: &mut [u16],
    out: &mut [u16],
    quotient: Quotient,
    lr: f32,
) -> usize {
    let last_end = grads.ranks.saturating_sub(1) * grads.stride + grads.first + p0.len();
    assert!(
        grads.ranks > 0
            && grads.halves.len() >= last_end
            && grads.stride >= grads.first + p0.len()
            && means.len() >= p0.len()
            && out.len() >= p0.len(),
        "f16c::step: slices too short"
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the host has AVX and F16C (checked above); the lengths were checked.
        return unsafe { x86::step(grads, p0, means, out, quotient, lr) };
    }
    let _ = (quotient, lr);
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Quotient;
    use std::arch::x86_64::*;

    /// [`super::add`] on a host with AVX and F16C.
    ///
    /// # Safety
    /// The host must have AVX and F16C, and `acc.len() >= src.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn add(acc: &mut [f32], src: &[u16], first: bool) -> usize {
        let done = src.len() / 8 * 8;
        let (a, s) = (acc.as_mut_ptr(), src.as_ptr());
        // SAFETY: element k + 7 < done <= src.len() <= acc.len().
        unsafe {
            if first {
                let zero = _mm256_setzero_ps();
                for k in (0..done).step_by(8) {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(s.add(k).cast()));
                    _mm256_storeu_ps(a.add(k), _mm256_add_ps(zero, x));
                }
            } else {
                for k in (0..done).step_by(8) {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(s.add(k).cast()));
                    let sum = _mm256_add_ps(_mm256_loadu_ps(a.add(k)), x);
                    _mm256_storeu_ps(a.add(k), sum);
                }
            }
        }
        done
    }

    /// [`super::update`] on a host with AVX and F16C.
    ///
    /// # Safety
    /// The host must have AVX and F16C; `acc`, `means` and `out` must be at least as long as
    /// `p0`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn update(
        acc: &[f32],
        p0: &[u16],
        means: &mut [u16],
        out: &mut [u16],
        quotient: Quotient,
        lr: f32,
    ) -> usize {
        let done = p0.len() / 8 * 8;
        let lr = _mm256_set1_ps(lr);
        let (a, p, m, o) = (
            acc.as_ptr(),
            p0.as_ptr(),
            means.as_mut_ptr(),
            out.as_mut_ptr(),
        );
        // SAFETY: element k + 7 < done <= p0.len() <= acc.len(), means.len(), out.len().
        unsafe {
            for k in (0..done).step_by(8) {
                let sum = _mm256_loadu_ps(a.add(k));
                update8(sum, p.add(k), m.add(k), o.add(k), quotient, lr);
            }
        }
        done
    }

    /// [`super::step`] on a host with AVX and F16C.
    ///
    /// # Safety
    /// The host must have AVX and F16C; every rank's row must hold `first + p0.len()` elements
    /// (`ranks > 0`), and `means` and `out` at least `p0.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn step(
        grads: super::RankRows<'_>,
        p0: &[u16],
        means: &mut [u16],
        out: &mut [u16],
        quotient: Quotient,
        lr: f32,
    ) -> usize {
        let done = p0.len() / 8 * 8;
        let lr = _mm256_set1_ps(lr);
        let zero = _mm256_setzero_ps();
        let g = grads.halves.as_ptr().wrapping_add(grads.first);
        let (p, m, o) = (p0.as_ptr(), means.as_mut_ptr(), out.as_mut_ptr());
        // SAFETY: element k + 7 < done <= p0.len() <= means.len(), out.len(), and rank r's
        // element first + k + 7 is r · stride + first + k + 7 < halves.len() (the caller's
        // contract), so every load and store is in bounds.
        unsafe {
            for k in (0..done).step_by(8) {
                let load =
                    |r: usize| _mm256_cvtph_ps(_mm_loadu_si128(g.add(r * grads.stride + k).cast()));
                let mut sum = _mm256_add_ps(zero, load(0));
                for r in 1..grads.ranks {
                    sum = _mm256_add_ps(sum, load(r));
                }
                update8(sum, p.add(k), m.add(k), o.add(k), quotient, lr);
            }
        }
        done
    }

    /// Eight elements' update from their gradient sums: the mean, `round(sum / R)`, stored at
    /// `m`, and the parameter at `p` updated, `round(p − lr · mean)`, stored at `o`.
    ///
    /// # Safety
    /// Eight `u16`s must be readable at `p` and writable at `m` and `o`.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn update8(
        sum: __m256,
        p: *const u16,
        m: *mut u16,
        o: *mut u16,
        quotient: Quotient,
        lr: __m256,
    ) {
        let mean = match quotient {
            Quotient::Divide(d) => _mm256_div_ps(sum, _mm256_set1_ps(d)),
            Quotient::Scale(s) => _mm256_mul_ps(sum, _mm256_set1_ps(s)),
        };
        let mean = encode(mean);
        // SAFETY: the caller's contract.
        unsafe {
            _mm_storeu_si128(m.cast(), mean);
            let mean = _mm256_cvtph_ps(mean);
            let param = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            // p − lr · mean, two roundings (no fused multiply-add), as the portable loop.
            let updated = _mm256_sub_ps(param, _mm256_mul_ps(lr, mean));
            _mm_storeu_si128(o.cast(), encode(updated));
        }
    }

    /// Eight float32 values rounded to binary16 (nearest even), a NaN as the signed canonical
    /// quiet NaN (`0x7e00` with the sign): the hardware would keep part of its payload, so it
    /// is given the float32 canonical NaN, which converts to exactly that.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    fn encode(x: __m256) -> __m128i {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0));
        let canonical = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc0_0000)));
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_blendv_ps(x, canonical, nan))
    }
}

#[cfg(test)]
mod tests {
    use super::super::half::{Binary16, HalfFormat};
    use super::*;

    /// Every binary16 bit pattern.
    fn every_half() -> Vec<u16> {
        (0..=u16::MAX).collect()
    }

    #[test]
    fn add_decodes_every_binary16_as_the_portable_decode() {
        let src = every_half();
        let mut acc = vec![f32::NAN; src.len()];
        let done = add(&mut acc, &src, true);
        if !available() {
            assert_eq!(done, 0);
            return;
        }
        assert_eq!(done, src.len());
        for (i, &x) in acc.iter().enumerate() {
            let want = 0.0 + Binary16::decode(i as u32);
            assert_eq!(x.to_bits(), want.to_bits(), "binary16 {i:#06x}");
        }
        // Accumulating: the sums are float32 sums of the decoded values.
        let again = add(&mut acc, &src, false);
        assert_eq!(again, src.len());
        for (i, &x) in acc.iter().enumerate() {
            let d = Binary16::decode(i as u32);
            assert_eq!(x.to_bits(), ((0.0 + d) + d).to_bits(), "{i:#06x}");
        }
    }

    #[test]
    fn step_sums_every_rank_in_order_then_updates_as_the_portable_loops() {
        if !available() {
            return;
        }
        // Three ranks of every binary16 pattern, shifted against each other, in rows of 70001
        // halves whose elements 5.. are stepped (an offset, and a length that is no multiple of
        // eight).
        let (ranks, stride, first, n) = (3, 70_001, 5, 65_539);
        let halves: Vec<u16> = (0..ranks * stride)
            .map(|i| ((i * 7919 + i / stride * 12_345) % 65_536) as u16)
            .collect();
        let p0: Vec<u16> = (0..n).map(|i| (i * 31 % 65_536) as u16).collect();
        for quotient in [Quotient::by(4.0), Quotient::by(3.0)] {
            let (mut means, mut out) = (vec![0u16; n], vec![0u16; n]);
            let rows = RankRows {
                halves: &halves,
                stride,
                ranks,
                first,
            };
            let done = step(rows, &p0, &mut means, &mut out, quotient, 0.25);
            assert_eq!(done, n / 8 * 8);
            for k in 0..done {
                let mut sum = 0.0f32;
                for r in 0..ranks {
                    sum += Binary16::decode(u32::from(halves[r * stride + first + k]));
                }
                let mean = Binary16::encode(quotient.of(sum));
                let p = Binary16::decode(u32::from(p0[k]));
                let updated = Binary16::encode(p - 0.25 * Binary16::decode(mean));
                // Which operand's NaN an f32 operation returns is unspecified (the compiler may
                // commute this loop's additions): a NaN matches any NaN; the canonical
                // encoding is the update test's to check.
                let same = |got: u16, want: u32| {
                    u32::from(got) == want || (got & 0x7fff == 0x7e00 && want & 0x7fff == 0x7e00)
                };
                assert!(same(means[k], mean), "mean {k} {quotient:?}");
                assert!(same(out[k], updated), "param {k} {quotient:?}");
            }
        }
    }

    #[test]
    fn update_matches_the_portable_encode_for_every_kind_of_value() {
        if !available() {
            return;
        }
        // Sums around every binary16 value (exact, halfway and off-grid), overflow, subnormals,
        // infinities and NaNs with payloads; parameters from every bit pattern.
        let mut sums = Vec::new();
        for bits in (0..=0xffffu32).step_by(7) {
            let x = Binary16::decode(bits);
            sums.extend([x, x * 1.000_061, x * 0.999_97, x * 8.0]);
        }
        sums.extend([
            65_519.0,
            65_520.0,
            1e9,
            -1e9,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc0_1234),
        ]);
        sums.resize(sums.len().div_ceil(8) * 8 + 5, 0.3);
        let n = sums.len();
        let p0: Vec<u16> = every_half().into_iter().cycle().take(n).collect();
        for quotient in [Quotient::by(8.0), Quotient::by(3.0), Quotient::by(1.0)] {
            for lr in [0.1f32, -2.5, 1e-4] {
                let (mut means, mut out) = (vec![0u16; n], vec![0u16; n]);
                let done = update(&sums, &p0, &mut means, &mut out, quotient, lr);
                assert_eq!(done, n / 8 * 8);
                for k in 0..done {
                    let mean = Binary16::encode(quotient.of(sums[k]));
                    let p = Binary16::decode(u32::from(p0[k]));
                    let updated = Binary16::encode(p - lr * Binary16::decode(mean));
                    let what = format!("element {k} {quotient:?} lr {lr}");
                    assert_eq!(u32::from(means[k]), mean, "mean, {what}");
                    assert_eq!(u32::from(out[k]), updated, "param, {what}");
                }
            }
        }
    }
}
