//! `Tensor`: a dtype, a shape and storage that lives on the host ([`HostData`]) or resident on a
//! device (a [`DeviceSlice`] of a backend's arena). It sits above the backends: the data layer
//! below them is `HostData`.

use std::sync::Arc;

use crate::backend::Arena;
use crate::dtype::DType;
use crate::error::{Error, Result};
pub use crate::host_data::HostData;

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

/// `product(shape)`, checked against the `len` elements given for it.
fn numel_for(shape: &[usize], len: usize) -> Result<usize> {
    let numel = numel_of(shape)?;
    if len != numel {
        return Err(Error::value(format!(
            "data has {len} elements but shape {} needs {numel}",
            format_shape(shape)
        )));
    }
    Ok(numel)
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
        numel_for(shape, data.len())?;
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
        let numel = numel_for(shape, data.len())?;
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
