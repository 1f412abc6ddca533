//! The per-parameter tables the optimizer and averaging kernels read, shared by both backends,
//! and the plain-Rust reference implementations of those kernels.
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
trait Real:
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

/// Runs `work(rank, rank slices…)` for every rank, on scoped threads natively when the arena
/// is large enough to pay for them.
fn for_each_rank<T: Send>(items: Vec<T>, elements: usize, work: impl Fn(usize, T) + Sync) {
    #[cfg(target_arch = "wasm32")]
    let _ = elements;
    #[cfg(not(target_arch = "wasm32"))]
    if items.len() > 1 && elements * items.len() >= 1 << 16 {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(items.len());
        if threads > 1 {
            let mut buckets: Vec<Vec<(usize, T)>> = (0..threads).map(|_| Vec::new()).collect();
            for (rank, item) in items.into_iter().enumerate() {
                buckets[rank % threads].push((rank, item));
            }
            std::thread::scope(|scope| {
                let work = &work;
                for bucket in buckets {
                    scope.spawn(move || {
                        for (rank, item) in bucket {
                            work(rank, item);
                        }
                    });
                }
            });
            return;
        }
    }
    for (rank, item) in items.into_iter().enumerate() {
        work(rank, item);
    }
}

/// `Some(slice)` per rank, or `None` per rank.
fn optional_rank_slices(
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

/// Checks the arenas and table of an SGD step (shared by every host implementation).
pub(crate) fn check_sgd_arenas(
    params: &Arena,
    grads: &Arena,
    momentum: Option<&Arena>,
    starts: &ParamStarts,
    scalars: &[SgdScalars],
) -> Result<()> {
    check_same_layout("sgd", params, grads)?;
    check_table("sgd", params, starts, scalars)?;
    if let Some(m) = momentum {
        check_same_layout("sgd momentum", params, m)?;
    }
    check_sgd_state(momentum.is_some(), scalars)
}

/// A `ValueError` when an active entry has momentum but no momentum arena is given (every
/// backend's SGD).
pub(crate) fn check_sgd_state(has_momentum: bool, scalars: &[SgdScalars]) -> Result<()> {
    let needs_momentum = scalars.iter().any(|s| s.active && s.momentum != 0.0);
    if needs_momentum && !has_momentum {
        return Err(Error::value(
            "sgd: momentum is set but no momentum arena was given",
        ));
    }
    Ok(())
}

/// A `ValueError` when an active entry has amsgrad but no `max_exp_avg_sq` arena is given
/// (every backend's Adam).
pub(crate) fn check_adam_state(has_max: bool, scalars: &[AdamScalars]) -> Result<()> {
    if scalars.iter().any(|s| s.active && s.amsgrad) && !has_max {
        return Err(Error::value(
            "adam: amsgrad is set but no max_exp_avg_sq arena was given",
        ));
    }
    Ok(())
}

/// `torch.optim.SGD`'s single-tensor step over every rank and parameter of an arena.
///
/// # Errors
/// A `ValueError` when `grads` or `momentum` differ from `params` in ranks, length or format,
/// when `starts` is empty or `scalars` does not hold one entry per (rank, parameter), or when
/// an active entry has momentum but no momentum arena is given; a `RuntimeError` when an arena
/// lives on a GPU device (the reference runs on host arenas).
pub fn sgd_reference(
    params: &mut Arena,
    grads: &Arena,
    momentum: Option<&mut Arena>,
    starts: &ParamStarts,
    scalars: &[SgdScalars],
) -> Result<()> {
    check_sgd_arenas(params, grads, momentum.as_deref(), starts, scalars)?;
    let format = params.format();
    let (ranks, len) = (params.ranks(), params.rank_len());
    let rank_words = format.words_for(len);
    let g = host_words(grads)?;
    let buffers =
        optional_rank_slices(momentum.map(host_words_mut).transpose()?, rank_words, ranks);
    let p = host_words_mut(params)?;
    let items: Vec<_> = p
        .chunks_mut(rank_words.max(1))
        .zip(g.chunks(rank_words.max(1)))
        .zip(buffers)
        .collect();
    let count = starts.0.len();
    for_each_rank(items, len, |rank, ((p, g), buf)| {
        let table = &scalars[rank * count..(rank + 1) * count];
        if format == StorageFormat::F64 {
            sgd_rank::<f64>(format, p, g, buf, starts, table, len);
        } else if format == StorageFormat::F32 && !table.iter().any(|s| s.fused) {
            sgd_rank_f32(p, g, buf, starts, table, len);
        } else {
            sgd_rank::<f32>(format, p, g, buf, starts, table, len);
        }
    });
    Ok(())
}

/// [`sgd_rank`] for float32 storage without `fused`: the same operations on `f32` slices, with
/// the per-parameter choices taken outside the element loops so that they vectorize.
fn sgd_rank_f32(
    p: &mut [u32],
    g: &[u32],
    mut buf: Option<&mut [u32]>,
    starts: &ParamStarts,
    table: &[SgdScalars],
    len: usize,
) {
    let p: &mut [f32] = bytemuck::cast_slice_mut(p);
    let g: &[f32] = bytemuck::cast_slice(g);
    for (j, s) in table.iter().enumerate() {
        if !s.active {
            continue;
        }
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let (p, g) = (&mut p[start..end], &g[start..end]);
        let (lr, wd, mom, damp) = (
            -s.lr as f32,
            s.weight_decay as f32,
            s.momentum as f32,
            s.one_minus_dampening as f32,
        );
        let sign = if s.maximize { -1.0f32 } else { 1.0 };
        let momentum = match buf.as_deref_mut() {
            Some(b) if s.momentum != 0.0 => {
                Some(&mut bytemuck::cast_slice_mut::<u32, f32>(b)[start..end])
            }
            _ => None,
        };
        match momentum {
            None if s.weight_decay == 0.0 => {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p += lr * (sign * g);
                }
            }
            None => {
                for (p, &g) in p.iter_mut().zip(g) {
                    let grad = sign * g + wd * *p;
                    *p += lr * grad;
                }
            }
            Some(b) => {
                for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                    let mut grad = sign * g;
                    if s.weight_decay != 0.0 {
                        grad += wd * *p;
                    }
                    let new = if s.first_step {
                        grad
                    } else {
                        *b * mom + damp * grad
                    };
                    *b = new;
                    grad = if s.nesterov { grad + mom * new } else { new };
                    *p += lr * grad;
                }
            }
        }
    }
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

fn sgd_rank<T: Real>(
    format: StorageFormat,
    p: &mut [u32],
    g: &[u32],
    mut buf: Option<&mut [u32]>,
    starts: &ParamStarts,
    table: &[SgdScalars],
    len: usize,
) {
    for (j, s) in table.iter().enumerate() {
        if !s.active {
            continue;
        }
        let rounding = rounding_format(format, s.fused);
        let r = |x: T| T::round(rounding, x);
        // `x.add(y, alpha=a)` (see [`add_scaled`]); `mul_(momentum)` takes its scalar unrounded.
        let add = |x: T, alpha: T, y: T| add_scaled(rounding, x, alpha, y);
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let (lr, wd, mom, damp) = (
            T::scalar(-s.lr),
            T::scalar(s.weight_decay),
            T::scalar(s.momentum),
            T::scalar(s.one_minus_dampening),
        );
        if s.fused {
            // PyTorch's fused kernel (FusedSGDKernel.cpp): the compute precision throughout,
            // its multiply-adds single-rounded (`vec::fmadd`, and the scalar tail's
            // expressions contracted alike), each tensor rounded once, when stored.
            for i in start..end {
                let param = T::load(format, p, i);
                let mut grad = T::load(format, g, i);
                if s.maximize {
                    grad = -grad;
                }
                if s.weight_decay != 0.0 {
                    grad = param.mul_add(wd, grad);
                }
                if s.momentum != 0.0 {
                    if let Some(buf) = buf.as_deref_mut() {
                        let b = if s.first_step {
                            grad
                        } else {
                            grad.mul_add(damp, T::load(format, buf, i) * mom)
                        };
                        T::store(format, buf, i, b);
                        grad = if s.nesterov { b.mul_add(mom, grad) } else { b };
                    }
                }
                T::store(format, p, i, grad.mul_add(lr, param));
            }
            continue;
        }
        for i in start..end {
            let param = T::load(format, p, i);
            let mut grad = T::load(format, g, i);
            if s.maximize {
                grad = -grad;
            }
            if s.weight_decay != 0.0 {
                grad = add(grad, wd, param);
            }
            if s.momentum != 0.0 {
                if let Some(buf) = buf.as_deref_mut() {
                    let b = if s.first_step {
                        grad
                    } else {
                        add(r(T::load(format, buf, i) * mom), damp, grad)
                    };
                    T::store(format, buf, i, b);
                    grad = if s.nesterov { add(grad, mom, b) } else { b };
                }
            }
            T::store(format, p, i, add(param, lr, grad));
        }
    }
}

/// The four arenas of an Adam step.
pub struct AdamArenas<'a> {
    /// Parameters (updated).
    pub params: &'a mut Arena,
    /// Gradients.
    pub grads: &'a Arena,
    /// First moments (updated).
    pub exp_avg: &'a mut Arena,
    /// Second moments (updated).
    pub exp_avg_sq: &'a mut Arena,
    /// Running maxima of the second moments (amsgrad only).
    pub max_exp_avg_sq: Option<&'a mut Arena>,
}

/// Checks the arenas and table of an Adam step (shared by every host implementation).
pub(crate) fn check_adam_arenas(
    arenas: &AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    let params = &*arenas.params;
    check_same_layout("adam", params, arenas.grads)?;
    check_same_layout("adam exp_avg", params, arenas.exp_avg)?;
    check_same_layout("adam exp_avg_sq", params, arenas.exp_avg_sq)?;
    check_table("adam", params, starts, scalars)?;
    if let Some(x) = &arenas.max_exp_avg_sq {
        check_same_layout("adam max_exp_avg_sq", params, x)?;
    }
    check_adam_state(arenas.max_exp_avg_sq.is_some(), scalars)
}

/// `torch.optim.Adam`/`AdamW`'s single-tensor step over every rank and parameter of an arena.
///
/// # Errors
/// A `ValueError` when an arena differs from the parameters in ranks, length or format, when
/// `starts` is empty or `scalars` does not hold one entry per (rank, parameter), or when an
/// active entry has `amsgrad` but no `max_exp_avg_sq` arena is given; a `RuntimeError` when an
/// arena lives on a GPU device.
pub fn adam_reference(
    arenas: AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    check_adam_arenas(&arenas, starts, scalars)?;
    let AdamArenas {
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    } = arenas;
    let format = params.format();
    let (ranks, len) = (params.ranks(), params.rank_len());
    let rank_words = format.words_for(len).max(1);
    let g = host_words(grads)?;
    let m = host_words_mut(exp_avg)?;
    let v = host_words_mut(exp_avg_sq)?;
    let maxes = optional_rank_slices(
        max_exp_avg_sq.map(host_words_mut).transpose()?,
        rank_words,
        ranks,
    );
    let p = host_words_mut(params)?;
    let items: Vec<_> = p
        .chunks_mut(rank_words)
        .zip(g.chunks(rank_words))
        .zip(m.chunks_mut(rank_words))
        .zip(v.chunks_mut(rank_words))
        .zip(maxes)
        .collect();
    let count = starts.0.len();
    for_each_rank(items, len, |rank, ((((p, g), m), v), vmax)| {
        let table = &scalars[rank * count..(rank + 1) * count];
        if format == StorageFormat::F64 {
            adam_rank::<f64>(format, AdamSlices { p, g, m, v, vmax }, starts, table, len);
        } else if format == StorageFormat::F32 && !table.iter().any(|s| s.amsgrad || s.fused) {
            adam_rank_f32(AdamSlices { p, g, m, v, vmax }, starts, table, len);
        } else {
            adam_rank::<f32>(format, AdamSlices { p, g, m, v, vmax }, starts, table, len);
        }
    });
    Ok(())
}

struct AdamSlices<'a> {
    p: &'a mut [u32],
    g: &'a [u32],
    m: &'a mut [u32],
    v: &'a mut [u32],
    vmax: Option<&'a mut [u32]>,
}

/// [`adam_rank`] for float32 storage without amsgrad or `fused`, on `f32` slices so that it
/// vectorizes.
fn adam_rank_f32(slices: AdamSlices<'_>, starts: &ParamStarts, table: &[AdamScalars], len: usize) {
    let AdamSlices { p, g, m, v, .. } = slices;
    let p: &mut [f32] = bytemuck::cast_slice_mut(p);
    let g: &[f32] = bytemuck::cast_slice(g);
    let m: &mut [f32] = bytemuck::cast_slice_mut(m);
    let v: &mut [f32] = bytemuck::cast_slice_mut(v);
    for (j, s) in table.iter().enumerate() {
        if !s.active {
            continue;
        }
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let w = s.one_minus_beta1 as f32;
        let (wd, decay) = (
            if s.decoupled {
                0.0
            } else {
                s.weight_decay as f32
            },
            s.decay_factor as f32,
        );
        let (beta2, one_minus_beta2) = (s.beta2 as f32, s.one_minus_beta2 as f32);
        let (neg_step, bc2, eps) = (
            -s.step_size as f32,
            s.bias_correction2_sqrt as f32,
            s.eps as f32,
        );
        let sign = if s.maximize { -1.0f32 } else { 1.0 };
        let (decoupled, upper) = (s.decoupled, w >= 0.5);
        let one_minus_w = 1.0 - w;
        let rows = p[start..end]
            .iter_mut()
            .zip(&g[start..end])
            .zip(m[start..end].iter_mut())
            .zip(v[start..end].iter_mut());
        for (((p, &g), m), v) in rows {
            let mut param = *p;
            let mut grad = sign * g;
            if decoupled {
                param *= decay;
            } else if wd != 0.0 {
                grad += wd * param;
            }
            let diff = grad - *m;
            let m_new = if upper {
                grad - diff * one_minus_w
            } else {
                *m + w * diff
            };
            *m = m_new;
            let v_new = *v * beta2 + (one_minus_beta2 * grad) * grad;
            *v = v_new;
            let denom = v_new.sqrt() / bc2 + eps;
            *p = param + neg_step * m_new / denom;
        }
    }
}

fn adam_rank<T: Real>(
    format: StorageFormat,
    slices: AdamSlices<'_>,
    starts: &ParamStarts,
    table: &[AdamScalars],
    len: usize,
) {
    let AdamSlices {
        p,
        g,
        m,
        v,
        mut vmax,
    } = slices;
    for (j, s) in table.iter().enumerate() {
        if !s.active {
            continue;
        }
        let rounding = rounding_format(format, s.fused);
        let r = |x: T| T::round(rounding, x);
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let w = T::scalar(s.one_minus_beta1);
        let (wd, decay) = (T::scalar(s.weight_decay), T::scalar(s.decay_factor));
        let (beta2, one_minus_beta2) = (T::scalar(s.beta2), T::scalar(s.one_minus_beta2));
        let (neg_step, bc2, eps) = (
            T::scalar(-s.step_size),
            T::scalar(s.bias_correction2_sqrt),
            T::scalar(s.eps),
        );
        for i in start..end {
            let mut param = T::load(format, p, i);
            let mut grad = T::load(format, g, i);
            if s.maximize {
                grad = -grad;
            }
            // With `fused`, PyTorch's fused kernel (FusedAdamKernel.cpp) single-rounds three
            // multiply-adds: the L2 term, the lerp (`vec::fmadd`) and the second moment's
            // `(1 - beta2) * g * g` term (contracted by the compiler, in the vector body and
            // the scalar tail alike).
            if s.decoupled {
                param = r(param * decay);
            } else if s.weight_decay != 0.0 {
                grad = if s.fused {
                    param.mul_add(wd, grad)
                } else {
                    add_scaled(rounding, grad, wd, param)
                };
            }
            // exp_avg.lerp_(grad, 1 - beta1), with PyTorch's two-sided lerp formula.
            let m_old = T::load(format, m, i);
            let diff = grad - m_old;
            let m_new = match (w < T::HALF, s.fused) {
                (true, false) => r(m_old + w * diff),
                (false, false) => r(grad - diff * (T::ONE - w)),
                (true, true) => w.mul_add(diff, m_old),
                (false, true) => (w - T::ONE).mul_add(diff, grad),
            };
            T::store(format, m, i, m_new);
            let v_scaled = r(T::load(format, v, i) * beta2);
            let v_new = if s.fused {
                (one_minus_beta2 * grad).mul_add(grad, v_scaled)
            } else {
                r(v_scaled + (one_minus_beta2 * grad) * grad)
            };
            T::store(format, v, i, v_new);
            let second = match vmax.as_deref_mut() {
                Some(vmax) if s.amsgrad => {
                    let old = T::load(format, vmax, i);
                    // torch.maximum propagates NaN.
                    let new = if v_new.is_nan() || old.is_nan() {
                        if v_new.is_nan() { v_new } else { old }
                    } else if v_new > old {
                        v_new
                    } else {
                        old
                    };
                    T::store(format, vmax, i, new);
                    new
                }
                _ => v_new,
            };
            // `(sqrt / bc2).add_(eps)`: `eps` becomes a tensor of the parameter's dtype first.
            let denom = add_scaled(rounding, r(r(second.sqrt()) / bc2), T::ONE, eps);
            // `param.addcdiv_(exp_avg, denom, value=-step_size)`: `p + value * m / d`, left to
            // right, in the compute precision, rounded once.
            T::store(format, p, i, r(param + neg_step * m_new / denom));
        }
    }
}

/// Averages every group of `group_size` consecutive ranks, element by element, over the
/// parameters whose `active` flag is set: each value is divided by the group size, then the
/// quotients are summed in rank order, all in the `arith` precision (PyTorch's promoted dtype
/// of the flattened parameters), and the sum is rounded back to the arena's format and written
/// to every rank of the group.
///
/// # Errors
/// A `ValueError` when `group_size` is 0 or does not divide the arena's ranks, or `active`
/// does not hold one flag per parameter of `starts`; a `RuntimeError` when the arena lives on
/// a GPU device.
pub fn average_reference(
    arena: &mut Arena,
    group_size: usize,
    arith: StorageFormat,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    let ranks = arena.ranks();
    if group_size == 0 || !ranks.is_multiple_of(group_size) || active.len() != starts.0.len() {
        return Err(Error::value(format!(
            "average: group size {group_size} does not divide {ranks} ranks, or {} flags for {} parameters",
            active.len(),
            starts.0.len()
        )));
    }
    let format = arena.format();
    let len = arena.rank_len();
    let rank_words = format.words_for(len).max(1);
    let words = host_words_mut(arena)?;
    // Each group's ranks are contiguous: one work item per group.
    let items: Vec<&mut [u32]> = words.chunks_mut(rank_words * group_size).collect();
    for_each_rank(items, len * group_size, |_, group| {
        if arith == StorageFormat::F64 {
            average_group::<f64>(
                format, arith, group, rank_words, group_size, starts, active, len,
            );
        } else if format == StorageFormat::F32 && arith == StorageFormat::F32 {
            average_group_f32(group, rank_words, group_size, starts, active, len);
        } else {
            average_group::<f32>(
                format, arith, group, rank_words, group_size, starts, active, len,
            );
        }
    });
    Ok(())
}

/// [`average_group`] for float32, block by block so that the loops vectorize.
fn average_group_f32(
    group: &mut [u32],
    rank_words: usize,
    group_size: usize,
    starts: &ParamStarts,
    active: &[bool],
    len: usize,
) {
    const BLOCK: usize = 1024;
    let divisor = group_size as f32;
    let values: &mut [f32] = bytemuck::cast_slice_mut(group);
    let mut acc = [0f32; BLOCK];
    for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let mut first = start;
        while first < end {
            let n = BLOCK.min(end - first);
            let acc = &mut acc[..n];
            for (a, &x) in acc.iter_mut().zip(&values[first..first + n]) {
                *a = x / divisor;
            }
            for rank in 1..group_size {
                let row = &values[rank * rank_words + first..rank * rank_words + first + n];
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += x / divisor;
                }
            }
            for rank in 0..group_size {
                values[rank * rank_words + first..rank * rank_words + first + n]
                    .copy_from_slice(acc);
            }
            first += n;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn average_group<T: Real>(
    format: StorageFormat,
    arith: StorageFormat,
    group: &mut [u32],
    rank_words: usize,
    group_size: usize,
    starts: &ParamStarts,
    active: &[bool],
    len: usize,
) {
    let divisor = T::scalar(group_size as f64);
    let round = |x: T| T::round(arith, x);
    for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        for i in start..end {
            let mut acc = round(T::load(format, &group[..rank_words], i) / divisor);
            for rank in 1..group_size {
                let quotient = round(T::load(format, &group[rank * rank_words..], i) / divisor);
                acc = round(acc + quotient);
            }
            for rank in 0..group_size {
                T::store(format, &mut group[rank * rank_words..], i, acc);
            }
        }
    }
}

/// Checks the tables of a scaled sum against its arena.
pub(crate) fn check_scaled_sum(
    arena: &Arena,
    starts: &ParamStarts,
    reduced: &[bool],
    scales: &[Option<f64>],
    present: &[bool],
) -> Result<()> {
    let (ranks, params) = (arena.ranks(), starts.0.len());
    if reduced.len() != params || scales.len() != ranks || present.len() != ranks * params {
        return Err(Error::value(format!(
            "scaled sum: {} reduced flags, {} scales and {} presence flags for {ranks} ranks of {params} parameters",
            reduced.len(),
            scales.len(),
            present.len()
        )));
    }
    Ok(())
}

/// The data-parallel gradient all-reduce of `DistributedDataParallel`, joined ranks included:
/// for every element of the parameters flagged `reduced`, the sum over the ranks in rank order
/// of `c_r = round(x_r · scale_r)` for a rank with `scales[r] = Some(scale_r)` whose
/// value is `present` (`present[r * params + j]`), and of `+0` for the others (a joined rank,
/// an absent gradient: DDP's bucket holds zeros there). The scale is taken in the compute
/// precision (float32, float64 for float64), every product and every partial sum is rounded
/// to the `arith` precision; the sum, rounded to the arena's format,
/// is written to every rank whose scale is `Some`. Ranks with `None` keep their data.
///
/// # Errors
/// A `ValueError` when `reduced` does not hold one flag per parameter, `scales` one entry per
/// rank or `present` one flag per (rank, parameter); a `RuntimeError` when the arena lives on
/// a GPU device.
pub fn scaled_sum_reference(
    arena: &mut Arena,
    arith: StorageFormat,
    starts: &ParamStarts,
    reduced: &[bool],
    scales: &[Option<f64>],
    present: &[bool],
) -> Result<()> {
    check_scaled_sum(arena, starts, reduced, scales, present)?;
    let format = arena.format();
    let (ranks, len, params) = (arena.ranks(), arena.rank_len(), starts.0.len());
    let rank_words = format.words_for(len).max(1);
    let words = host_words_mut(arena)?;
    if arith == StorageFormat::F64 {
        scaled_sum_ranks::<f64>(
            format, arith, words, rank_words, ranks, params, starts, reduced, scales, present, len,
        );
    } else {
        scaled_sum_ranks::<f32>(
            format, arith, words, rank_words, ranks, params, starts, reduced, scales, present, len,
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn scaled_sum_ranks<T: Real>(
    format: StorageFormat,
    arith: StorageFormat,
    words: &mut [u32],
    rank_words: usize,
    ranks: usize,
    params: usize,
    starts: &ParamStarts,
    reduced: &[bool],
    scales: &[Option<f64>],
    present: &[bool],
    len: usize,
) {
    let round = |x: T| T::round(arith, x);
    // The scale in the compute precision (PyTorch's opmath), not rounded to a 16-bit ARITH.
    let scales: Vec<Option<T>> = scales.iter().map(|s| s.map(T::scalar)).collect();
    let zero = T::scalar(0.0);
    for (j, _) in reduced.iter().enumerate().filter(|(_, r)| **r) {
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        let contribution = |words: &[u32], rank: usize, i: usize| match scales[rank] {
            Some(s) if present[rank * params + j] => {
                round(T::load(format, &words[rank * rank_words..], i) * s)
            }
            _ => zero,
        };
        for i in start..end {
            let mut acc = contribution(words, 0, i);
            for rank in 1..ranks {
                acc = round(acc + contribution(words, rank, i));
            }
            for rank in (0..ranks).filter(|&r| scales[r].is_some()) {
                T::store(format, &mut words[rank * rank_words..], i, acc);
            }
        }
    }
}

/// Converts the parameters flagged in `active` of every rank of `src` into `dst`, an arena of
/// the same ranks and layout in another storage format: `dst = round(src)`, each value decoded
/// exactly and rounded once to `dst`'s format (round to nearest even, overflow to ±inf, as c10
/// does; float64 → 16-bit rounds once through [`StorageFormat::store_f64`]). Widening is exact.
/// DiLoCo's compressed pseudo-gradients go through it to the wire format and back. Inactive
/// parameters are left alone. A `ValueError` for arenas of different ranks or lengths.
///
/// # Errors
/// A `ValueError` when the arenas differ in ranks or length or `active` does not hold one
/// flag per parameter of `starts`; a `RuntimeError` when either arena lives on a GPU device.
pub fn convert_reference(
    src: &Arena,
    dst: &mut Arena,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    check_convert(src, dst, starts, active)?;
    let (from_format, to_format) = (src.format(), dst.format());
    let (ranks, len) = (src.ranks(), src.rank_len());
    let (from_words, to_words) = (from_format.words_for(len), to_format.words_for(len));
    let from = host_words(src)?;
    let to = host_words_mut(dst)?;
    let wide = from_format == StorageFormat::F64 || to_format == StorageFormat::F64;
    for rank in 0..ranks {
        let (from, to) = (
            &from[rank * from_words..(rank + 1) * from_words],
            &mut to[rank * to_words..(rank + 1) * to_words],
        );
        for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
            let start = starts.0[j] as usize;
            let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
            for i in start..end {
                if wide {
                    to_format.store_f64(to, i, from_format.load_f64(from, i));
                } else {
                    to_format.store(to, i, from_format.load(from, i));
                }
            }
        }
    }
    Ok(())
}

/// Checks the arenas and flags of a conversion (shared by every implementation).
pub(crate) fn check_convert(
    src: &Arena,
    dst: &Arena,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    if src.ranks() != dst.ranks() || src.rank_len() != dst.rank_len() {
        return Err(Error::value(format!(
            "convert: arenas do not match ({src:?} vs {dst:?})"
        )));
    }
    if active.len() != starts.0.len() {
        return Err(Error::value(format!(
            "convert: {} flags for {} parameters",
            active.len(),
            starts.0.len()
        )));
    }
    Ok(())
}

/// DiLoCo's pseudo-gradient over three arenas of one layout, every rank at once, for the
/// parameters flagged in `active`: `grads = round(backup - params)` (one subtraction in the
/// format's precision: float32 for the 32- and 16-bit formats, rounded once to the format;
/// float64 for float64), then `params = backup` (the bits). Inactive parameters are left
/// alone in all three arenas.
///
/// # Errors
/// A `ValueError` when `backup` or `grads` differ from `params` in ranks, length or format, or
/// `active` does not hold one flag per parameter of `starts`; a `RuntimeError` when an arena
/// lives on a GPU device.
pub fn pseudo_gradient_reference(
    params: &mut Arena,
    backup: &Arena,
    grads: &mut Arena,
    starts: &ParamStarts,
    active: &[bool],
) -> Result<()> {
    check_same_layout("pseudo_gradient backup", params, backup)?;
    check_same_layout("pseudo_gradient grads", params, grads)?;
    if active.len() != starts.0.len() {
        return Err(Error::value(format!(
            "pseudo_gradient: {} flags for {} parameters",
            active.len(),
            starts.0.len()
        )));
    }
    let format = params.format();
    let (ranks, len) = (params.ranks(), params.rank_len());
    let from = host_words(backup)?;
    let to = host_words_mut(grads)?;
    let current = host_words_mut(params)?;
    for rank in 0..ranks {
        for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
            // Parameters start at multiples of 64 elements and run to the next start: whole
            // words in every format.
            let start = rank * len + starts.0[j] as usize;
            let end = rank * len + starts.0.get(j + 1).map_or(len, |&e| e as usize);
            match format {
                StorageFormat::F32 => {
                    let (o, p, g): (&[f32], &[f32], &mut [f32]) = (
                        bytemuck::cast_slice(&from[start..end]),
                        bytemuck::cast_slice(&current[start..end]),
                        bytemuck::cast_slice_mut(&mut to[start..end]),
                    );
                    for ((g, &o), &p) in g.iter_mut().zip(o).zip(p) {
                        *g = o - p;
                    }
                }
                StorageFormat::F64 => {
                    for i in start..end {
                        let d = format.load_f64(from, i) - format.load_f64(current, i);
                        format.store_f64(to, i, d);
                    }
                }
                _ => {
                    for i in start..end {
                        let d = format.load(from, i) - format.load(current, i);
                        format.store(to, i, d);
                    }
                }
            }
            let words = format.word_of(start)..format.word_of(end);
            current[words.clone()].copy_from_slice(&from[words]);
        }
    }
    Ok(())
}
