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
        f32::mul_add(self, b, c)
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

/// `x.add(y, alpha=alpha)` (and `add_` with a tensor `y`) as PyTorch's CPU kernel computes it
/// on one element: `x + alpha * y` with `alpha` and every intermediate in the tensor's own
/// type. For float16/bfloat16 that is c10's `Half`/`BFloat16` arithmetic: `alpha` is rounded
/// to the format (through float32, as `Scalar::to` converts), the product is rounded to the
/// format, then the sum (ATen's `ufunc::add`, whose CPU kernel is generated for `scalar_t`, not
/// for its float32 opmath type). For float32/float64 this is one product and one sum, each
/// rounded (PyTorch may fuse them into one FMA; the cases' tolerance covers it).
#[inline(always)]
pub(super) fn add_scaled<T: Real>(format: StorageFormat, x: T, alpha: T, y: T) -> T {
    let r = |v: T| T::round(format, v);
    r(x + r(r(alpha) * y))
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
