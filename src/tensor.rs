//! `Tensor`: a dtype, a shape and storage that lives on the host or resident on a device.

use std::sync::Arc;

use half::{bf16, f16};

use crate::backend::Arena;
use crate::dtype::{DType, StorageFormat};
use crate::error::{Error, Result};

/// Element values held on the host, one vector variant per dtype.
#[derive(Debug, Clone, PartialEq)]
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
                HostData::Float32(bytemuck::cast_slice(&words[..len]).to_vec())
            }
            (DType::Float64, StorageFormat::F32) => HostData::Float64(
                words[..len]
                    .iter()
                    .map(|&w| f64::from(f32::from_bits(w)))
                    .collect(),
            ),
            (DType::Float16, StorageFormat::F16) => HostData::Float16(
                (0..len)
                    .map(|i| f16::from_bits(half_bits(words, i)))
                    .collect(),
            ),
            (DType::BFloat16, StorageFormat::BF16) => HostData::BFloat16(
                (0..len)
                    .map(|i| bf16::from_bits(half_bits(words, i)))
                    .collect(),
            ),
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

/// A tensor's elements resident on a device: a slice of one rank of an [`Arena`].
#[derive(Debug, Clone)]
pub struct DeviceSlice {
    pub(crate) dtype: DType,
    pub(crate) arena: Arc<Arena>,
    pub(crate) rank: usize,
    /// First element, in the rank's element space of the arena.
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl DeviceSlice {
    /// The arena this slice lives in.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }
}

/// Where a tensor's elements live.
#[derive(Debug, Clone)]
pub enum Storage {
    /// In host memory.
    Host(HostData),
    /// Resident on a device, in an arena.
    Device(DeviceSlice),
}

/// A dense, row-major tensor of one float dtype.
///
/// Tensors are immutable values: a clone shares the elements with the original (cloning costs
/// no copy of the data), and nothing can write through either, so copies stay independent.
///
/// ```
/// use distopt::{DType, Tensor};
/// let t = Tensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
/// assert_eq!(t.dtype(), DType::Float32);
/// assert_eq!(t.numel(), 4);
/// assert!(Tensor::from_f32(&[3], vec![1.0]).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    storage: Arc<Storage>,
}

/// Product of a shape's dimensions (1 for a scalar), or an error if it overflows.
///
/// # Errors
/// A `ValueError` when the product overflows `usize`.
pub fn numel_of(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::value(format!(
                "shape {} has more elements than fit in memory",
                format_shape(shape)
            ))
        })
}

/// A shape as PyTorch prints it in messages: `[2, 3]`, `[]`.
pub fn format_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

impl Tensor {
    /// A host tensor; `data` must hold exactly `product(shape)` elements.
    ///
    /// # Errors
    /// A `ValueError` when the shape's element count overflows `usize` or `data` holds another
    /// number of elements.
    pub fn new(shape: &[usize], data: HostData) -> Result<Tensor> {
        let numel = numel_of(shape)?;
        if data.len() != numel {
            return Err(Error::value(format!(
                "data has {} elements but shape {} needs {numel}",
                data.len(),
                format_shape(shape)
            )));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            storage: Arc::new(Storage::Host(data)),
        })
    }

    /// A host float32 tensor.
    ///
    /// # Errors
    /// As [`Tensor::new`].
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        Tensor::new(shape, HostData::Float32(data))
    }

    /// A host tensor of `dtype` from `f64` values (rounded to nearest even).
    ///
    /// # Errors
    /// A `ValueError` when `data` does not hold `product(shape)` elements; a `RuntimeError`
    /// when the converted values do not fit the memory budget ([`crate::budget`]).
    pub fn from_f64(dtype: DType, shape: &[usize], data: &[f64]) -> Result<Tensor> {
        let numel = numel_of(shape)?;
        if data.len() != numel {
            return Err(Error::value(format!(
                "data has {} elements but shape {} needs {numel}",
                data.len(),
                format_shape(shape)
            )));
        }
        let what = format!("a {} tensor of shape {}", dtype.name(), format_shape(shape));
        crate::budget::check(
            crate::budget::bytes_of(numel, dtype.size_bytes(), &what)?,
            &what,
        )?;
        Tensor::new(shape, HostData::from_f64(dtype, data))
    }

    pub(crate) fn from_device(shape: Vec<usize>, slice: DeviceSlice) -> Tensor {
        Tensor {
            shape,
            storage: Arc::new(Storage::Device(slice)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &*self.storage {
            Storage::Host(data) => data.dtype(),
            Storage::Device(slice) => slice.dtype,
        }
    }

    /// The dimensions (`[]` for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        match &*self.storage {
            Storage::Host(data) => data.len(),
            Storage::Device(slice) => slice.len,
        }
    }

    /// Where the elements live.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Whether this tensor and `other` share their elements (one is a clone of the other).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether the elements are resident on a device.
    pub fn is_on_device(&self) -> bool {
        matches!(*self.storage, Storage::Device(_))
    }

    /// The host values, or `None` for a device-resident tensor (see [`Tensor::to_host`]).
    pub fn host_data(&self) -> Option<&HostData> {
        match &*self.storage {
            Storage::Host(data) => Some(data),
            Storage::Device(_) => None,
        }
    }

    /// A copy of this tensor in host memory (reads the device back if it is resident there).
    ///
    /// # Errors
    /// For a device-resident tensor, a `RuntimeError` when the readback fails (a GPU error, a lost
    /// device). A host tensor never fails.
    pub async fn to_host(&self) -> Result<Tensor> {
        match &*self.storage {
            Storage::Host(_) => Ok(self.clone()),
            Storage::Device(slice) => {
                let words = slice
                    .arena
                    .read_range(slice.rank, slice.offset, slice.len)
                    .await?;
                let data = HostData::decode(slice.dtype, slice.arena.format(), &words, slice.len);
                Tensor::new(&self.shape, data)
            }
        }
    }

    /// Blocking [`Tensor::to_host`] for native callers.
    ///
    /// # Errors
    /// As [`Tensor::to_host`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_host_blocking(&self) -> Result<Tensor> {
        pollster::block_on(self.to_host())
    }

    /// All values as `f64` (host tensors only; exact).
    ///
    /// # Errors
    /// A `RuntimeError` for a device-resident tensor (read it back with [`Tensor::to_host`] first).
    pub fn values_f64(&self) -> Result<Vec<f64>> {
        match &*self.storage {
            Storage::Host(data) => Ok(data.to_f64_vec()),
            Storage::Device(_) => Err(Error::runtime(
                "tensor is resident on a device: call to_host() before reading its values",
            )),
        }
    }
}
