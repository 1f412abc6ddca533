//! The per-parameter tables the optimizer and averaging kernels read, shared by both backends,
//! and the plain-Rust reference implementations of those kernels, one file per kernel: `sgd`,
//! `adam`, `average`, `scaled_sum`, `pseudo_gradient`, `convert`. Each has its twins under the
//! same name in the other trees: the CPU backend's fast version in `backend/cpu/<kernel>.rs`
//! (SGD, Adam and averaging; the others run the reference), the GPU dispatch in
//! `backend/gpu/<kernel>.rs` and its shader in `shaders/<kernel>.wgsl`. This file holds what
//! the kernels share: the tables, the arithmetic model below, host access to an arena's words
//! and the argument checks.
//!
//! Arithmetic model (what makes the two backends agree bit for bit): every primitive operation
//! (+, −, ×, ÷, √) is rounded to the *compute* precision — float32 for float32/float16/bfloat16
//! parameters (PyTorch's "opmath"), float64 for float64 — and the result of every PyTorch tensor
//! operation is rounded to the parameter's storage format. The reference computes each
//! primitive in `f64` and rounds it; for one IEEE operation that equals computing it in the
//! narrower format directly. PyTorch's `add(alpha=)` on float16/bfloat16 also rounds its
//! scalar and its product to the format (see `add_scaled`).
//!
//! With PyTorch's `fused=True` (`SgdScalars::fused`, `AdamScalars::fused`) the kernels follow
//! PyTorch's fused CPU kernels (aten/src/ATen/native/cpu/FusedSGDKernel.cpp and
//! FusedAdamKernel.cpp, `sgd_math` and `adam_math`):
//!
//! * the compute precision is PyTorch's `opmath_type`: float64 for float64 parameters, float32
//!   for float32, float16 and bfloat16; every intermediate stays in it (no per-operation
//!   rounding to a 16-bit format) and a value is rounded to the storage format once, when it
//!   is stored (the `convert_from_float(...).store(...)` and `ptr[d] = scalar_t(...)` lines);
//!   the scalars are taken in the compute precision (`opmath_t(weight_decay)`, not rounded to
//!   the format);
//! * the multiply-adds PyTorch's kernels round once are fused multiply-adds here
//!   ([`f32::mul_add`], [`f64::mul_add`]): Adam's lerp
//!   (`vec::fmadd(coeff, grad - exp_avg, base)`, with `coeff = w` and `base = exp_avg` when
//!   `|w| < 0.5`, else `coeff = w - 1` and `base = grad`, `w = 1 - beta1`), Adam's L2 term
//!   `grad + param * weight_decay`, the second moment's `exp_avg_sq * beta2 + (1 - beta2) * g * g`
//!   as `fma((1 - beta2) * g, g, exp_avg_sq * beta2)`, and SGD's weight decay, momentum
//!   (`fma(grad, 1 - dampening, buf * momentum)`), Nesterov term and `param - lr * grad`.
//!   Some are explicit `vec::fmadd`s; the others are contracted by the compiler PyTorch's
//!   wheels are built with (GCC contracts `a * b + c` by default), in the vector body and the
//!   scalar tail alike. Measured against torch 2.x on an AVX-512 host (float16, bfloat16,
//!   float32; sizes 31 to 4099, beta1 0.3 to 0.9): bit for bit, where the unfused formulas
//!   differ in a last bit of `exp_avg` at a few elements in a thousand.
//!
//! One quirk of PyTorch's build is not reproduced: in the last `numel % 16` elements of each
//! tensor (the scalar remainder of the loop the compiler vectorized out of the kernel's own
//! scalar tail, on AVX-512) the second moment is contracted the other way,
//! `fma(exp_avg_sq, beta2, (1 - beta2) * g * g)`. It can change the last bit of
//! `exp_avg_sq` there (a few elements in ten thousand of those), and its extent depends on the
//! host PyTorch ran on (AVX2 halves the vector widths); the 16-bit tolerances of the cases in
//! tests/torch-cases/ are tighter than one unit in the last place, and none of those cases
//! meets it.
//!
//! The fused and the single-tensor arithmetic agree for float64 up to the fused
//! multiply-adds; they differ for float32 in last bits, and for float16 and bfloat16 in the
//! rounding of every intermediate.

mod adam;
mod average;
mod convert;
mod pseudo_gradient;
mod scaled_sum;
mod sgd;

pub use adam::{AdamArenas, adam_reference};
pub(in crate::backend) use adam::{AdamSlices, adam_rank, adam_rank_slices};
pub(crate) use adam::{check_adam_arenas, check_adam_state};
pub use average::average_reference;
pub(in crate::backend) use average::{average_group, group_slices};
pub(crate) use convert::check_convert;
pub use convert::convert_reference;
pub use pseudo_gradient::pseudo_gradient_reference;
pub(crate) use scaled_sum::check_scaled_sum;
pub use scaled_sum::scaled_sum_reference;
pub use sgd::sgd_reference;
pub(crate) use sgd::{check_sgd_arenas, check_sgd_state};
pub(in crate::backend) use sgd::{sgd_rank, sgd_rank_slices};

use super::{Arena, ArenaStorage};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Where each parameter of an arena starts in a rank's element space (ascending, one entry per
/// parameter; a parameter runs to the next one's start).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamStarts(pub Vec<u32>);

impl ParamStarts {
    /// The parameter that element `element` belongs to.
    pub fn param_of(&self, element: usize) -> usize {
        self.0
            .partition_point(|&s| s as usize <= element)
            .saturating_sub(1)
    }
}

/// One SGD update's settings for one (rank, parameter).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SgdScalars {
    /// The parameter has a gradient on this rank this step (otherwise it is skipped).
    pub active: bool,
    /// The momentum buffer does not exist yet: it starts as a clone of the gradient.
    pub first_step: bool,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Maximize instead of minimize.
    pub maximize: bool,
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no buffer).
    pub momentum: f64,
    /// `1 - dampening`, computed in double as PyTorch does.
    pub one_minus_dampening: f64,
    /// L2 penalty.
    pub weight_decay: f64,
    /// PyTorch's `fused=True`: the update is computed in the compute precision (float32 for
    /// 16-bit formats, float64 for float64) with PyTorch's fused multiply-adds, and rounded to
    /// the storage format only when a tensor is stored, instead of after every tensor
    /// operation (see the module's arithmetic model).
    pub fused: bool,
}

/// One Adam/AdamW update's settings for one (rank, parameter); the host precomputes the bias
/// corrections from that parameter's own step count.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AdamScalars {
    /// The parameter has a gradient on this rank this step (otherwise it is skipped).
    pub active: bool,
    /// Maximize instead of minimize.
    pub maximize: bool,
    /// Keep the running maximum of the second moment.
    pub amsgrad: bool,
    /// AdamW: decay the parameter by `decay_factor` instead of adding an L2 term to the gradient.
    pub decoupled: bool,
    /// L2 penalty (Adam only; AdamW uses `decay_factor`).
    pub weight_decay: f64,
    /// `1 - lr * weight_decay` (AdamW).
    pub decay_factor: f64,
    /// `1 - beta1`, the lerp weight of the first moment.
    pub one_minus_beta1: f64,
    /// `beta2`.
    pub beta2: f64,
    /// `1 - beta2`.
    pub one_minus_beta2: f64,
    /// `lr / (1 - beta1^step)`.
    pub step_size: f64,
    /// `sqrt(1 - beta2^step)`.
    pub bias_correction2_sqrt: f64,
    /// `eps`.
    pub eps: f64,
    /// PyTorch's `fused=True`: rounded to the storage format only when stored (see
    /// [`SgdScalars::fused`]).
    pub fused: bool,
}

pub(crate) fn host_words(arena: &Arena) -> Result<&[u32]> {
    match &arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the host",
        )),
    }
}

pub(crate) fn host_words_mut(arena: &mut Arena) -> Result<&mut [u32]> {
    match &mut arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the host",
        )),
    }
}

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
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    const ONE: f64 = 1.0;
    const HALF: f64 = 0.5;
}

/// `Some(slice)` per rank, or `None` per rank.
pub(in crate::backend) fn optional_rank_slices(
    words: Option<&mut [u32]>,
    rank_words: usize,
    ranks: usize,
) -> Vec<Option<&mut [u32]>> {
    match words {
        Some(w) => w
            .chunks_mut(rank_words.max(1))
            .take(ranks)
            .map(Some)
            .collect(),
        None => (0..ranks).map(|_| None).collect(),
    }
}

fn check_same_layout(what: &str, a: &Arena, b: &Arena) -> Result<()> {
    if a.ranks() != b.ranks() || a.rank_len() != b.rank_len() || a.format() != b.format() {
        return Err(Error::value(format!(
            "{what}: arenas do not match ({a:?} vs {b:?})"
        )));
    }
    Ok(())
}

fn check_table<T>(what: &str, arena: &Arena, starts: &ParamStarts, scalars: &[T]) -> Result<()> {
    if starts.0.is_empty() || scalars.len() != arena.ranks() * starts.0.len() {
        return Err(Error::value(format!(
            "{what}: table has {} entries for {} ranks of {} parameters",
            scalars.len(),
            arena.ranks(),
            starts.0.len()
        )));
    }
    Ok(())
}

/// `x.add(y, alpha=alpha)` (and `add_` with a tensor `y`) as PyTorch's CPU kernel computes it
/// on one element: `x + alpha * y` with `alpha` and every intermediate in the tensor's own
/// type. For float16/bfloat16 that is c10's `Half`/`BFloat16` arithmetic: `alpha` is rounded
/// to the format (through float32, as `Scalar::to` converts), the product is rounded to the
/// format, then the sum (ATen's `ufunc::add`, whose CPU kernel is generated for `scalar_t`, not
/// for its float32 opmath type). For float32/float64 this is one product and one sum, each
/// rounded (PyTorch may fuse them into one FMA; the cases' tolerance covers it).
#[inline(always)]
fn add_scaled<T: Real>(format: StorageFormat, x: T, alpha: T, y: T) -> T {
    let r = |v: T| T::round(format, v);
    r(x + r(r(alpha) * y))
}

/// The format each tensor operation's result is rounded to: the storage format, or, for a
/// fused update, the compute precision's own (the identity): float64 for float64 storage,
/// float32 for the others (PyTorch's `opmath_type`).
fn rounding_format(format: StorageFormat, fused: bool) -> StorageFormat {
    match (fused, format) {
        (false, _) => format,
        (true, StorageFormat::F64) => StorageFormat::F64,
        (true, _) => StorageFormat::F32,
    }
}
