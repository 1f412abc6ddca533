//! The arithmetic model of the reference kernels (see the module's documentation): the
//! compute precision ([`Real`]) and the roundings PyTorch's operations make.

use crate::dtype::StorageFormat;

/// The compute precision of the arithmetic model: `f32` for float32/float16/bfloat16 storage
/// (each operation computed natively is the correctly rounded one), `f64` for float64.
pub(crate) trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    fn scalar(x: f64) -> Self;
    fn load(format: StorageFormat, words: &[u32], i: usize) -> Self;
    fn store(format: StorageFormat, words: &mut [u32], i: usize, value: Self);
    /// A tensor operation's result rounded to the storage format.
    fn round(format: StorageFormat, value: Self) -> Self;
    fn sqrt(self) -> Self;
    /// `self * b + c` rounded once (a fused multiply-add).
    fn mul_add(self, b: Self, c: Self) -> Self;
    fn is_nan(self) -> bool;
    const ONE: Self;
    const HALF: Self;
}

impl Real for f32 {
    fn scalar(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn load(format: StorageFormat, words: &[u32], i: usize) -> f32 {
        match format {
            StorageFormat::F32 => f32::from_bits(words[i]),
            other => other.load(words, i),
        }
    }
    #[inline(always)]
    fn store(format: StorageFormat, words: &mut [u32], i: usize, value: f32) {
        match format {
            StorageFormat::F32 => words[i] = value.to_bits(),
            other => other.store(words, i, value),
        }
    }
    #[inline(always)]
    fn round(format: StorageFormat, value: f32) -> f32 {
        match format {
            StorageFormat::F32 | StorageFormat::F64 => value,
            other => other.round(value),
        }
    }
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn mul_add(self, b: f32, c: f32) -> f32 {
        fma_f32(self, b, c)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    const ONE: f32 = 1.0;
    const HALF: f32 = 0.5;
}

impl Real for f64 {
    fn scalar(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn load(format: StorageFormat, words: &[u32], i: usize) -> f64 {
        format.load_f64(words, i)
    }
    #[inline(always)]
    fn store(format: StorageFormat, words: &mut [u32], i: usize, value: f64) {
        format.store_f64(words, i, value);
    }
    #[inline(always)]
    fn round(format: StorageFormat, value: f64) -> f64 {
        format.round_f64(value)
    }
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn mul_add(self, b: f64, c: f64) -> f64 {
        f64::mul_add(self, b, c)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    const ONE: f64 = 1.0;
    const HALF: f64 = 0.5;
}

/// `a * b + c` rounded once (IEEE `fusedMultiplyAdd`) in float32: the target's instruction
/// ([`f32::mul_add`]), or on wasm32, which has none (Rust would call a software `fmaf`, one
/// call per element), [`fma_f32_via_f64`].
#[inline(always)]
pub(crate) fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "wasm32")]
    return fma_f32_via_f64(a, b, c);
    #[cfg(not(target_arch = "wasm32"))]
    a.mul_add(b, c)
}

/// `a * b + c` rounded once, from float64 operations. The product of two float32 values is
/// exact in float64 and the sum `s` rounds once; rounding `s` to float32 is then the correct
/// rounding unless `s` is itself a float32 rounding midpoint (a sum the first rounding moved
/// onto one, which the second would round as a tie) or lies in float32's subnormal range,
/// where the midpoints are further apart. Only those take the slow path: the sum's exact error
/// `e` (Knuth's TwoSum), and an inexact `s` made odd toward it before the rounding (rounding to
/// odd in 53 bits, then to nearest in 24 or fewer, is the correct rounding: Boldo and
/// Melquiond). The same emulation as `exact_fma` in shaders/optim_math.wgsl, without its range
/// limits, since float64 holds every float32 product.
#[cfg(any(target_arch = "wasm32", test))]
#[inline(always)]
pub(crate) fn fma_f32_via_f64(a: f32, b: f32, c: f32) -> f32 {
    let (p, c) = (f64::from(a) * f64::from(b), f64::from(c));
    let s = p + c;
    let bits = s.to_bits();
    // Not a float32 midpoint (1 then 28 zeros below float32's last bit of a float64
    // significand), and at least float32's smallest normal in magnitude (a NaN passes too).
    if bits & 0x1fff_ffff != 0x1000_0000 && (bits >> 52) & 0x7ff >= 1023 - 126 {
        return s as f32;
    }
    fma_f32_rounded_to_odd(p, c, s)
}

/// The slow path of [`fma_f32_via_f64`]: `s = p + c` rounded, made odd toward its error.
#[cfg(any(target_arch = "wasm32", test))]
#[cold]
#[inline(never)]
fn fma_f32_rounded_to_odd(p: f64, c: f64, s: f64) -> f32 {
    let pb = s - p;
    let e = (p - (s - pb)) + (c - pb);
    let bits = s.to_bits();
    let odd = if s.is_finite() && e != 0.0 && bits & 1 == 0 {
        // One unit toward the error: up in magnitude when it has the sum's sign.
        if (e > 0.0) == (s > 0.0) {
            bits + 1
        } else {
            bits - 1
        }
    } else {
        bits
    };
    f64::from_bits(odd) as f32
}

/// `x.add(y, alpha=alpha)` (and `add_` with a tensor `y`) as PyTorch's CPU kernel computes it
/// on one element, `format` being the format the operation rounds to:
///
/// * float32 and float64 (and the compute precision of a `fused=True` update): one fused
///   multiply-add, `alpha * y + x` rounded once. ATen's vectorized `add` is `vec::fmadd`, and
///   its scalar remainder is contracted alike by the compiler PyTorch's wheels are built with;
///   measured against torch 2.15 on float32 and float64, body and tail, bit for bit.
/// * float16 and bfloat16 (the single-tensor path): c10's `Half`/`BFloat16` arithmetic, as the
///   scalar remainder of ATen's loop computes it: `alpha` is rounded to the format (through
///   float32, as `Scalar::to` converts), the product is rounded to the format, then the sum.
///   (The vectorized body of the same loop computes in float32 with one fused multiply-add:
///   [`add_scaled_at`].)
#[inline(always)]
pub(super) fn add_scaled<T: Real>(format: StorageFormat, x: T, alpha: T, y: T) -> T {
    match format {
        StorageFormat::F32 | StorageFormat::F64 => alpha.mul_add(y, x),
        _ => {
            let r = |v: T| T::round(format, v);
            r(x + r(r(alpha) * y))
        }
    }
}

/// [`add_scaled`] on an element of PyTorch's vector body (`body`) or of its scalar tail: in
/// the body, float16 and bfloat16 round `alpha` to the format and then compute one fused
/// multiply-add in float32, rounded to the format once (measured against torch 2.15 on AVX2);
/// float32, float64 and the fused path compute alike in both.
#[inline(always)]
pub(super) fn add_scaled_at<T: Real>(format: StorageFormat, body: bool, x: T, alpha: T, y: T) -> T {
    match format {
        StorageFormat::F16 | StorageFormat::BF16 if body => {
            T::round(format, T::round(format, alpha).mul_add(y, x))
        }
        _ => add_scaled(format, x, alpha, y),
    }
}

/// C++'s `std::max(old, new)`: `new` only when `old < new`, so a NaN `new` keeps `old` (the
/// running maximum of PyTorch's fused Adam in its scalar remainder; see
/// [`AdamScalars::remainder_from`](super::AdamScalars::remainder_from)).
#[inline(always)]
pub(crate) fn std_max<T: Real>(old: T, new: T) -> T {
    if old < new { new } else { old }
}

/// `torch.maximum` of two elements: the larger, or a NaN where either is one (`a`'s first).
#[inline(always)]
pub(crate) fn maximum<T: Real>(a: T, b: T) -> T {
    if a.is_nan() || b.is_nan() {
        if a.is_nan() { a } else { b }
    } else if a > b {
        a
    } else {
        b
    }
}

/// The format each tensor operation's result is rounded to: the storage format, or, for a
/// fused update, the compute precision's own (the identity): float64 for float64 storage,
/// float32 for the others (PyTorch's `opmath_type`).
pub(super) fn rounding_format(format: StorageFormat, fused: bool) -> StorageFormat {
    match (fused, format) {
        (false, _) => format,
        (true, StorageFormat::F64) => StorageFormat::F64,
        (true, _) => StorageFormat::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::fma_f32_via_f64;
    use crate::rng::SplitMix64;

    /// The float64 emulation equals the hardware's fused multiply-add bit for bit: random
    /// operands over the whole exponent range, products that cancel the addend, halfway cases,
    /// subnormal results, zeros of both signs, infinities and NaN.
    #[test]
    fn fma_via_f64_is_the_fused_multiply_add() {
        let mut rng = SplitMix64::new(7, 0);
        let check = |a: f32, b: f32, c: f32| {
            let (want, got) = (a.mul_add(b, c), fma_f32_via_f64(a, b, c));
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "fma({a:e}, {b:e}, {c:e}): {want:e} from the instruction, {got:e} emulated"
            );
        };
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0 + f32::EPSILON,
            0.5 * f32::EPSILON,
        ];
        for &a in &specials {
            for &b in &specials {
                for &c in &specials {
                    check(a, b, c);
                }
            }
        }
        for _ in 0..2_000_000 {
            let word = rng.next_u64();
            let (a, b) = (
                f32::from_bits(word as u32),
                f32::from_bits((word >> 32) as u32),
            );
            let c = match rng.next_u64() % 4 {
                // The addend cancels the product's leading bits.
                0 => -(a * b),
                // A float32 neighbour of the product: the sum sits near a halfway point.
                1 => -f32::from_bits((a * b).to_bits() ^ 1) * 0.5,
                2 => f32::from_bits(rng.next_u64() as u32),
                _ => f32::from_bits(rng.next_u64() as u32 & 0x80ff_ffff),
            };
            check(a, b, c);
            // A product just short of half a unit of an odd addend: its float64 sum is the
            // float32 midpoint, which a second rounding to nearest even would round away.
            let x = f32::from_bits((word as u32 & 0x3fff_ffff | 1) + 0x0800_0000);
            let half_unit = f32::from_bits(x.to_bits() & 0xff80_0000) * f32::EPSILON * 0.5;
            let (up, down) = (1.0 + 2f32.powi(-15), 1.0 - 2f32.powi(-15));
            check(half_unit * up, down, x);
            check(-half_unit * up, down, -x);
            check(half_unit * up, -down, x);
            // Small operands: results in and near the subnormal range.
            let small = |x: f32| f32::from_bits(x.to_bits() & 0x807f_ffff | 0x1f00_0000);
            check(small(a), small(b), c * 1e-30);
        }
    }
}
