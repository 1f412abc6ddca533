//! `HostData`: element values held on the host, one vector per dtype, and their encoding into
//! and decoding from the arenas' packed words. The data layer: it knows formats, not backends.

use half::{bf16, f16};

use crate::dtype::{DType, StorageFormat};

/// Element values held on the host, one vector variant per dtype.
#[derive(Debug, PartialEq)]
pub enum HostData {
    /// `float32` values.
    Float32(Vec<f32>),
    /// `float16` values.
    Float16(Vec<f16>),
    /// `bfloat16` values.
    BFloat16(Vec<bf16>),
    /// `float64` values.
    Float64(Vec<f64>),
}

/// A copy into memory a dropped buffer used before when [`crate::recycle`] keeps one of a
/// close size (no page faults), otherwise into fresh memory.
impl Clone for HostData {
    fn clone(&self) -> HostData {
        fn copy<T: Copy + crate::recycle::Recyclable>(v: &[T]) -> Vec<T> {
            let mut out = crate::recycle::with_capacity(v.len());
            out.extend_from_slice(v);
            out
        }
        match self {
            HostData::Float32(v) => HostData::Float32(copy(v)),
            HostData::Float16(v) => HostData::Float16(copy(v)),
            HostData::BFloat16(v) => HostData::BFloat16(copy(v)),
            HostData::Float64(v) => HostData::Float64(copy(v)),
        }
    }
}

/// A large buffer's memory goes to [`crate::recycle`] for the next output of its size.
impl Drop for HostData {
    fn drop(&mut self) {
        match self {
            HostData::Float32(v) => crate::recycle::give(std::mem::take(v)),
            HostData::Float16(v) => crate::recycle::give(std::mem::take(v)),
            HostData::BFloat16(v) => crate::recycle::give(std::mem::take(v)),
            HostData::Float64(v) => crate::recycle::give(std::mem::take(v)),
        }
    }
}

impl HostData {
    /// The dtype of these values.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::Float32(_) => DType::Float32,
            HostData::Float16(_) => DType::Float16,
            HostData::BFloat16(_) => DType::BFloat16,
            HostData::Float64(_) => DType::Float64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::Float32(v) => v.len(),
            HostData::Float16(v) => v.len(),
            HostData::BFloat16(v) => v.len(),
            HostData::Float64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `index` as `f64` (exact for every dtype).
    pub fn get_f64(&self, index: usize) -> f64 {
        match self {
            HostData::Float32(v) => f64::from(v[index]),
            HostData::Float16(v) => f64::from(v[index]),
            HostData::BFloat16(v) => f64::from(v[index]),
            HostData::Float64(v) => v[index],
        }
    }

    /// All elements as `f64` (exact).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get_f64(i)).collect()
    }

    /// Values of `dtype` from `f64`s, each rounded to nearest even.
    pub fn from_f64(dtype: DType, values: &[f64]) -> HostData {
        match dtype {
            DType::Float32 => HostData::Float32(values.iter().map(|&v| v as f32).collect()),
            DType::Float16 => HostData::Float16(
                values
                    .iter()
                    .map(|&v| f16::from_bits(crate::dtype::f64_to_f16_bits(v)))
                    .collect(),
            ),
            DType::BFloat16 => HostData::BFloat16(
                values
                    .iter()
                    .map(|&v| bf16::from_bits(crate::dtype::f64_to_bf16_bits(v)))
                    .collect(),
            ),
            DType::Float64 => HostData::Float64(values.to_vec()),
        }
    }

    /// Writes these values in `format` into `words`, starting at element 0. Float64 is
    /// rounded to float32 (nearest even) and float16/bfloat16 values are converted to float32
    /// exactly when the format is wider than the dtype.
    ///
    /// # Panics
    ///
    /// If `words` is shorter than `format.words_for(self.len())`.
    pub fn encode_into(&self, format: StorageFormat, words: &mut [u32]) {
        match (self, format) {
            (HostData::Float32(v), StorageFormat::F32) => {
                words[..v.len()].copy_from_slice(bytemuck::cast_slice(v))
            }
            (HostData::Float16(v), StorageFormat::F16) => {
                pack_halves(v.iter().map(|x| x.to_bits()), words)
            }
            (HostData::BFloat16(v), StorageFormat::BF16) => {
                pack_halves(v.iter().map(|x| x.to_bits()), words)
            }
            (HostData::Float64(v), StorageFormat::F64) => {
                for (i, &x) in v.iter().enumerate() {
                    format.store_f64(words, i, x);
                }
            }
            (HostData::Float64(v), StorageFormat::F32) => {
                for (word, &x) in words.iter_mut().zip(v) {
                    *word = (x as f32).to_bits();
                }
            }
            _ => {
                for i in 0..self.len() {
                    format.store(words, i, self.get_f32(i));
                }
            }
        }
    }

    /// Element `index` converted to `f32` (nearest even for float64, exact otherwise).
    #[inline]
    pub fn get_f32(&self, index: usize) -> f32 {
        match self {
            HostData::Float32(v) => v[index],
            HostData::Float16(v) => v[index].to_f32(),
            HostData::BFloat16(v) => v[index].to_f32(),
            HostData::Float64(v) => v[index] as f32,
        }
    }

    /// Decodes `len` elements of `dtype` stored in `format` from `words` (element 0 first).
    pub(crate) fn decode(
        dtype: DType,
        format: StorageFormat,
        words: &[u32],
        len: usize,
    ) -> HostData {
        match (dtype, format) {
            (DType::Float32, StorageFormat::F32) => {
                let mut v = crate::recycle::with_capacity(len);
                v.extend_from_slice(bytemuck::cast_slice(&words[..len]));
                HostData::Float32(v)
            }
            (DType::Float64, StorageFormat::F32) => {
                let mut v = crate::recycle::with_capacity(len);
                v.extend(words[..len].iter().map(|&w| f64::from(f32::from_bits(w))));
                HostData::Float64(v)
            }
            (DType::Float16, StorageFormat::F16) => {
                let mut v = crate::recycle::with_capacity(len);
                v.extend((0..len).map(|i| f16::from_bits(half_bits(words, i))));
                HostData::Float16(v)
            }
            (DType::BFloat16, StorageFormat::BF16) => {
                let mut v = crate::recycle::with_capacity(len);
                v.extend((0..len).map(|i| bf16::from_bits(half_bits(words, i))));
                HostData::BFloat16(v)
            }
            _ => {
                let values: Vec<f64> = (0..len).map(|i| format.load_f64(words, i)).collect();
                HostData::from_f64(dtype, &values)
            }
        }
    }
}

fn half_bits(words: &[u32], index: usize) -> u16 {
    (words[index / 2] >> ((index % 2) * 16)) as u16
}

fn pack_halves(bits: impl ExactSizeIterator<Item = u16>, words: &mut [u32]) {
    for (i, b) in bits.enumerate() {
        let shift = (i % 2) * 16;
        let word = &mut words[i / 2];
        *word = (*word & !(0xffff << shift)) | (u32::from(b) << shift);
    }
}
