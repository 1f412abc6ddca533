//! Floating-point dtypes and their exact, round-to-nearest-even conversions.
//!
//! The rounding follows PyTorch's c10 conversions bit for bit on finite values, infinities
//! and subnormals (NaN payloads are not preserved, as in c10).

use crate::error::{Error, Result};
use half::{bf16, f16};

/// A tensor element type, named as PyTorch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32, `torch.float32`.
    Float32,
    /// IEEE binary16, `torch.float16`.
    Float16,
    /// bfloat16, `torch.bfloat16`.
    BFloat16,
    /// IEEE binary64, `torch.float64`.
    Float64,
}

/// How a dtype's values are laid out in a device arena. Every shader reads and writes one of
/// these; float64 has no WebGPU type and travels as float32 (the step's arithmetic is float32
/// anyway), the 16-bit types travel packed two per `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StorageFormat {
    /// One `f32` per 32-bit word.
    F32,
    /// Two IEEE binary16 values per 32-bit word, element `2k` in the low half.
    F16,
    /// Two bfloat16 values per 32-bit word, element `2k` in the low half.
    BF16,
    /// One `f64` per two 32-bit words (low word first). WebGPU has no 64-bit float, so arenas
    /// of this format always live on the host and are computed by the plain-Rust kernels,
    /// whichever backend owns them.
    F64,
}

impl StorageFormat {
    /// The value a shader's `override` constant takes for this format.
    pub const fn shader_code(self) -> u32 {
        match self {
            StorageFormat::F32 => 0,
            StorageFormat::F16 => 1,
            StorageFormat::BF16 => 2,
            StorageFormat::F64 => 3,
        }
    }

    /// Elements stored per 32-bit word (packed formats: 1 or 2; float64 takes two words per
    /// element and reports 1 here — use [`StorageFormat::word_of`] for offsets).
    pub fn elements_per_word(self) -> usize {
        match self {
            StorageFormat::F32 | StorageFormat::F64 => 1,
            StorageFormat::F16 | StorageFormat::BF16 => 2,
        }
    }

    /// Bytes per element.
    pub fn element_bytes(self) -> usize {
        match self {
            StorageFormat::F32 => 4,
            StorageFormat::F16 | StorageFormat::BF16 => 2,
            StorageFormat::F64 => 8,
        }
    }

    /// Words needed for `elements` elements (rounded up).
    pub fn words_for(self, elements: usize) -> usize {
        (elements * self.element_bytes()).div_ceil(4)
    }

    /// The word at which element `element` starts (`element` word aligned).
    pub fn word_of(self, element: usize) -> usize {
        element * self.element_bytes() / 4
    }

    /// Whether element `element` starts on a word boundary.
    pub fn is_word_aligned(self, element: usize) -> bool {
        (element * self.element_bytes()).is_multiple_of(4)
    }

    /// The same precision as a dtype.
    pub fn dtype(self) -> DType {
        match self {
            StorageFormat::F32 => DType::Float32,
            StorageFormat::F16 => DType::Float16,
            StorageFormat::BF16 => DType::BFloat16,
            StorageFormat::F64 => DType::Float64,
        }
    }

    /// Decodes element `index` of a packed word slice into `f32` (exact for every format).
    #[inline]
    pub fn load(self, words: &[u32], index: usize) -> f32 {
        match self {
            StorageFormat::F32 => f32::from_bits(words[index]),
            StorageFormat::F64 => self.load_f64(words, index) as f32,
            StorageFormat::F16 => f16::from_bits(half_of(words, index)).to_f32(),
            StorageFormat::BF16 => bf16::from_bits(half_of(words, index)).to_f32(),
        }
    }

    /// Rounds `value` to this format (round to nearest even) and stores it at element `index`.
    #[inline]
    pub fn store(self, words: &mut [u32], index: usize, value: f32) {
        match self {
            StorageFormat::F32 => words[index] = value.to_bits(),
            StorageFormat::F64 => self.store_f64(words, index, f64::from(value)),
            StorageFormat::F16 => set_half(words, index, f32_to_f16_bits(value)),
            StorageFormat::BF16 => set_half(words, index, f32_to_bf16_bits(value)),
        }
    }

    /// Decodes element `index` into `f64` (exact for every format).
    #[inline]
    pub fn load_f64(self, words: &[u32], index: usize) -> f64 {
        match self {
            StorageFormat::F64 => f64::from_bits(
                u64::from(words[2 * index]) | (u64::from(words[2 * index + 1]) << 32),
            ),
            _ => f64::from(self.load(words, index)),
        }
    }

    /// Rounds `value` to this format (nearest even) and stores it at element `index`.
    #[inline]
    pub fn store_f64(self, words: &mut [u32], index: usize, value: f64) {
        match self {
            StorageFormat::F64 => {
                let bits = value.to_bits();
                words[2 * index] = bits as u32;
                words[2 * index + 1] = (bits >> 32) as u32;
            }
            StorageFormat::F32 => words[index] = (value as f32).to_bits(),
            StorageFormat::F16 => set_half(words, index, f64_to_f16_bits(value)),
            StorageFormat::BF16 => set_half(words, index, f64_to_bf16_bits(value)),
        }
    }

    /// `value` rounded to this format (nearest even) and widened back to `f64`. One IEEE
    /// operation computed in `f64` and rounded here equals the same operation computed in this
    /// format (f64 carries more than twice the bits of each narrower format), which is why the
    /// plain-Rust kernels compute every tensor operation in `f64` and round after it.
    #[inline]
    pub fn round_f64(self, value: f64) -> f64 {
        match self {
            StorageFormat::F64 => value,
            StorageFormat::F32 => f64::from(value as f32),
            StorageFormat::F16 => f64::from(f16::from_bits(f64_to_f16_bits(value))),
            StorageFormat::BF16 => f64::from(bf16::from_bits(f64_to_bf16_bits(value))),
        }
    }

    /// `value` rounded to this format and widened back to `f32`.
    #[inline]
    pub fn round(self, value: f32) -> f32 {
        match self {
            StorageFormat::F32 | StorageFormat::F64 => value,
            StorageFormat::F16 => f16::from_bits(f32_to_f16_bits(value)).to_f32(),
            StorageFormat::BF16 => bf16::from_bits(f32_to_bf16_bits(value)).to_f32(),
        }
    }
}

#[inline]
fn half_of(words: &[u32], index: usize) -> u16 {
    (words[index / 2] >> ((index % 2) * 16)) as u16
}

#[inline]
fn set_half(words: &mut [u32], index: usize, bits: u16) {
    let shift = (index % 2) * 16;
    let word = &mut words[index / 2];
    *word = (*word & !(0xffff << shift)) | (u32::from(bits) << shift);
}

/// float32 → float16 bits, round to nearest even, overflow to ±inf, subnormals honoured,
/// NaN to the canonical quiet NaN (c10's `fp16_ieee_from_fp32_value`).
#[inline]
pub fn f32_to_f16_bits(value: f32) -> u16 {
    if value.is_nan() {
        return ((value.to_bits() >> 16) as u16 & 0x8000) | 0x7e00;
    }
    f16::from_f32(value).to_bits()
}

/// `value` rounded to float32 *to odd*: truncated toward zero, with the last bit set when
/// anything was lost. Rounding that result to a format with at least two fewer bits gives the
/// correctly rounded result of `value` itself: f64 → f32 → f16/bf16 would otherwise round twice.
fn f64_to_f32_round_to_odd(value: f64) -> f32 {
    let nearest = value as f32;
    if !nearest.is_finite() || f64::from(nearest) == value {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if f64::from(nearest).abs() > value.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// float64 → float16 bits, rounded once to nearest even (NaN to the canonical quiet NaN).
#[inline]
pub fn f64_to_f16_bits(value: f64) -> u16 {
    f32_to_f16_bits(f64_to_f32_round_to_odd(value))
}

/// float64 → bfloat16 bits, rounded once to nearest even.
#[inline]
pub fn f64_to_bf16_bits(value: f64) -> u16 {
    f32_to_bf16_bits(f64_to_f32_round_to_odd(value))
}

/// float32 → bfloat16 bits, round to nearest even (c10's `round_to_nearest_even`).
#[inline]
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    if value.is_nan() {
        return 0x7fc0;
    }
    let bits = value.to_bits();
    let rounding_bias = ((bits >> 16) & 1) + 0x7fff;
    (bits.wrapping_add(rounding_bias) >> 16) as u16
}

impl DType {
    /// Every supported dtype.
    pub const ALL: [DType; 4] = [
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Float64,
    ];

    /// PyTorch's name without the `torch.` prefix, e.g. `"bfloat16"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Float64 => "float64",
        }
    }

    /// Parses a dtype name (`"float32"`, `"torch.float16"`, `"bf16"`, …). Integer and other
    /// dtypes are an `unsupported dtype` `ValueError`.
    ///
    /// # Errors
    /// A `ValueError` for a name that is not one of the four float dtypes' (with or without the
    /// `torch.` prefix).
    pub fn parse(name: &str) -> Result<DType> {
        let bare = name.strip_prefix("torch.").unwrap_or(name);
        Ok(match bare {
            "float32" | "float" | "f32" => DType::Float32,
            "float16" | "half" | "f16" => DType::Float16,
            "bfloat16" | "bf16" => DType::BFloat16,
            "float64" | "double" | "f64" => DType::Float64,
            _ => {
                return Err(Error::value(format!(
                    "unsupported dtype '{name}': expected one of float32, float16, bfloat16, float64"
                )));
            }
        })
    }

    /// Bytes per element on the host.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Float32 => 4,
            DType::Float16 | DType::BFloat16 => 2,
            DType::Float64 => 8,
        }
    }

    /// A scalar as PyTorch's `_foreach_mul_` multiplies a tensor of this dtype by it: rounded
    /// to float16 or bfloat16 (through float32), unchanged for float32 and float64 (whose
    /// single-tensor `mul_` takes it as it is too).
    pub fn foreach_scalar(self, value: f64) -> f64 {
        match self {
            DType::Float16 | DType::BFloat16 => f64::from(self.storage().round(value as f32)),
            DType::Float32 | DType::Float64 => value,
        }
    }

    /// The arena storage format of this dtype.
    pub fn storage(self) -> StorageFormat {
        match self {
            DType::Float32 => StorageFormat::F32,
            DType::Float64 => StorageFormat::F64,
            DType::Float16 => StorageFormat::F16,
            DType::BFloat16 => StorageFormat::BF16,
        }
    }
}

impl std::str::FromStr for DType {
    type Err = crate::error::Error;

    /// As [`DType::parse`].
    fn from_str(name: &str) -> crate::error::Result<DType> {
        DType::parse(name)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_torch_edge_cases() {
        // 2^-25 ties to 0; 1.5 * 2^-24 rounds to 2^-23 (even); 65520 overflows.
        assert_eq!(f32_to_f16_bits(2f32.powi(-25)), 0);
        assert_eq!(
            f16::from_bits(f32_to_f16_bits(1.5 * 2f32.powi(-24))).to_f32(),
            2f32.powi(-23)
        );
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_f16_bits(65519.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_f16_bits(f32::NAN) & 0x7e00, 0x7e00);
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1.
        assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16_bits(f32::NAN), 0x7fc0);
    }

    #[test]
    fn packed_store_and_load_round_trip() {
        let mut words = vec![0u32; 2];
        for (format, value) in [(StorageFormat::F16, 1.5f32), (StorageFormat::BF16, -3.0)] {
            format.store(&mut words, 3, value);
            format.store(&mut words, 2, 0.25);
            assert_eq!(format.load(&words, 3), value);
            assert_eq!(format.load(&words, 2), 0.25);
        }
    }

    #[test]
    fn f64_to_bf16_rounds_once() {
        // Just above the tie between 1 and 1 + 2^-7: must round up, although the f32 nearest
        // to it is the tie itself.
        let value = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(f64_to_bf16_bits(value), 0x3f81);
        assert_eq!(f64_to_bf16_bits(1.0 + 2f64.powi(-8)), 0x3f80);
        assert_eq!(
            f64_to_bf16_bits(-(1.0 + 2f64.powi(-8) + 2f64.powi(-40))),
            0xbf81
        );
    }

    #[test]
    fn f64_to_f16_rounds_once() {
        // Just above the tie between 1 and 1 + 2^-10.
        assert_eq!(
            f64_to_f16_bits(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            0x3c01
        );
        assert_eq!(f64_to_f16_bits(1.0 + 2f64.powi(-11)), 0x3c00);
        assert_eq!(f64_to_f16_bits(1e6), 0x7c00);
        assert_eq!(f64_to_f16_bits(2f64.powi(-25)), 0);
        assert_eq!(f64_to_f16_bits(2f64.powi(-25) + 2f64.powi(-60)), 1);
    }

    #[test]
    fn f64_storage_round_trips() {
        let mut words = vec![0u32; 4];
        StorageFormat::F64.store_f64(&mut words, 1, 0.1);
        assert_eq!(StorageFormat::F64.load_f64(&words, 1), 0.1);
        assert_eq!(StorageFormat::F64.words_for(3), 6);
        assert_eq!(StorageFormat::F16.words_for(3), 2);
    }

    #[test]
    fn parse_rejects_integer_dtypes() {
        let err = DType::parse("int64").unwrap_err();
        assert!(err.message().contains("unsupported dtype"));
        assert_eq!(DType::parse("torch.bfloat16").unwrap(), DType::BFloat16);
    }
}
