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
}

impl StorageFormat {
    /// The value a shader's `override` constant takes for this format.
    pub fn shader_code(self) -> u32 {
        match self {
            StorageFormat::F32 => 0,
            StorageFormat::F16 => 1,
            StorageFormat::BF16 => 2,
        }
    }

    /// Elements stored per 32-bit word.
    pub fn elements_per_word(self) -> usize {
        match self {
            StorageFormat::F32 => 1,
            StorageFormat::F16 | StorageFormat::BF16 => 2,
        }
    }

    /// Bytes per element on the device.
    pub fn element_bytes(self) -> usize {
        4 / self.elements_per_word()
    }

    /// Words needed for `elements` elements (rounded up).
    pub fn words_for(self, elements: usize) -> usize {
        elements.div_ceil(self.elements_per_word())
    }

    /// Decodes element `index` of a packed word slice into `f32` (exact for every format).
    #[inline]
    pub fn load(self, words: &[u32], index: usize) -> f32 {
        match self {
            StorageFormat::F32 => f32::from_bits(words[index]),
            StorageFormat::F16 => f16::from_bits(half_of(words, index)).to_f32(),
            StorageFormat::BF16 => bf16::from_bits(half_of(words, index)).to_f32(),
        }
    }

    /// Rounds `value` to this format (round to nearest even) and stores it at element `index`.
    #[inline]
    pub fn store(self, words: &mut [u32], index: usize, value: f32) {
        match self {
            StorageFormat::F32 => words[index] = value.to_bits(),
            StorageFormat::F16 => set_half(words, index, f32_to_f16_bits(value)),
            StorageFormat::BF16 => set_half(words, index, f32_to_bf16_bits(value)),
        }
    }

    /// `value` rounded to this format and widened back to `f32`.
    #[inline]
    pub fn round(self, value: f32) -> f32 {
        match self {
            StorageFormat::F32 => value,
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

    /// The device storage format of this dtype.
    pub fn storage(self) -> StorageFormat {
        match self {
            DType::Float32 | DType::Float64 => StorageFormat::F32,
            DType::Float16 => StorageFormat::F16,
            DType::BFloat16 => StorageFormat::BF16,
        }
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
    fn parse_rejects_integer_dtypes() {
        let err = DType::parse("int64").unwrap_err();
        assert!(err.message().contains("unsupported dtype"));
        assert_eq!(DType::parse("torch.bfloat16").unwrap(), DType::BFloat16);
    }
}
