//! The per-parameter tables the optimizer and averaging kernels read, shared by both backends,
//! and the plain-Rust reference implementations of those kernels.
//!
//! Arithmetic model (what makes the two backends agree bit for bit): every primitive operation
//! (+, −, ×, ÷, √) is rounded to the *compute* precision — float32 for float32/float16/bfloat16
//! parameters (PyTorch's "opmath"), float64 for float64 — and the result of every PyTorch tensor
//! operation is rounded to the parameter's storage format. The reference computes each
//! primitive in `f64` and rounds it; for one IEEE operation that equals computing it in the
//! narrower format directly.

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

/// Rounding helpers of the arithmetic model.
#[derive(Clone, Copy)]
struct Arith {
    compute: StorageFormat,
    storage: StorageFormat,
}

impl Arith {
    fn new(storage: StorageFormat) -> Arith {
        let compute = if storage == StorageFormat::F64 {
            StorageFormat::F64
        } else {
            StorageFormat::F32
        };
        Arith { compute, storage }
    }
    /// A primitive operation's result, rounded to the compute precision.
    #[inline]
    fn c(self, x: f64) -> f64 {
        self.compute.round_f64(x)
    }
    /// A scalar argument as the kernel sees it (cast to the compute precision).
    #[inline]
    fn s(self, x: f64) -> f64 {
        self.compute.round_f64(x)
    }
    /// A tensor operation's result, rounded to the storage format.
    #[inline]
    fn p(self, x: f64) -> f64 {
        self.storage.round_f64(self.compute.round_f64(x))
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

/// `torch.optim.SGD`'s single-tensor step over every rank and parameter of an arena.
pub fn sgd_reference(
    params: &mut Arena,
    grads: &Arena,
    momentum: Option<&mut Arena>,
    starts: &ParamStarts,
    scalars: &[SgdScalars],
) -> Result<()> {
    check_same_layout("sgd", params, grads)?;
    check_table("sgd", params, starts, scalars)?;
    let format = params.format();
    let a = Arith::new(format);
    let (ranks, len, count) = (params.ranks(), params.rank_len(), starts.0.len());
    let rank_words = format.words_for(len);
    let g = host_words(grads)?;
    let mut momentum_words = match momentum {
        Some(m) => {
            check_same_layout("sgd momentum", params, m)?;
            Some(host_words_mut(m)?)
        }
        None => None,
    };
    let p = host_words_mut(params)?;
    for rank in 0..ranks {
        let range = rank * rank_words..(rank + 1) * rank_words;
        let (p, g) = (&mut p[range.clone()], &g[range.clone()]);
        let mut buf = momentum_words.as_mut().map(|m| &mut m[range.clone()]);
        for j in 0..count {
            let s = scalars[rank * count + j];
            if !s.active {
                continue;
            }
            let start = starts.0[j] as usize;
            let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
            for i in start..end {
                let param = format.load_f64(p, i);
                let mut grad = format.load_f64(g, i);
                if s.maximize {
                    grad = -grad;
                }
                if s.weight_decay != 0.0 {
                    grad = a.p(grad + a.c(a.s(s.weight_decay) * param));
                }
                if s.momentum != 0.0 {
                    let buf = buf.as_deref_mut().ok_or_else(|| {
                        Error::value("sgd: momentum is set but no momentum arena was given")
                    })?;
                    let b = if s.first_step {
                        grad
                    } else {
                        let scaled = a.p(format.load_f64(buf, i) * a.s(s.momentum));
                        a.p(scaled + a.c(a.s(s.one_minus_dampening) * grad))
                    };
                    format.store_f64(buf, i, b);
                    grad = if s.nesterov {
                        a.p(grad + a.c(a.s(s.momentum) * b))
                    } else {
                        b
                    };
                }
                format.store_f64(p, i, a.p(param + a.c(a.s(-s.lr) * grad)));
            }
        }
    }
    Ok(())
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

/// `torch.optim.Adam`/`AdamW`'s single-tensor step over every rank and parameter of an arena.
pub fn adam_reference(
    arenas: AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
) -> Result<()> {
    let AdamArenas {
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    } = arenas;
    check_same_layout("adam", params, grads)?;
    check_same_layout("adam exp_avg", params, exp_avg)?;
    check_same_layout("adam exp_avg_sq", params, exp_avg_sq)?;
    check_table("adam", params, starts, scalars)?;
    let format = params.format();
    let a = Arith::new(format);
    let (ranks, len, count) = (params.ranks(), params.rank_len(), starts.0.len());
    let rank_words = format.words_for(len);
    let g = host_words(grads)?;
    let m = host_words_mut(exp_avg)?;
    let v = host_words_mut(exp_avg_sq)?;
    let mut vmax = match max_exp_avg_sq {
        Some(x) => {
            check_same_layout("adam max_exp_avg_sq", params, x)?;
            Some(host_words_mut(x)?)
        }
        None => None,
    };
    let p = host_words_mut(params)?;
    for rank in 0..ranks {
        let range = rank * rank_words..(rank + 1) * rank_words;
        let (p, g) = (&mut p[range.clone()], &g[range.clone()]);
        let (m, v) = (&mut m[range.clone()], &mut v[range.clone()]);
        let mut vmax = vmax.as_mut().map(|x| &mut x[range.clone()]);
        for j in 0..count {
            let s = scalars[rank * count + j];
            if !s.active {
                continue;
            }
            let start = starts.0[j] as usize;
            let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
            for i in start..end {
                let mut param = format.load_f64(p, i);
                let mut grad = format.load_f64(g, i);
                if s.maximize {
                    grad = -grad;
                }
                if s.decoupled {
                    param = a.p(param * a.s(s.decay_factor));
                } else if s.weight_decay != 0.0 {
                    grad = a.p(grad + a.c(a.s(s.weight_decay) * param));
                }
                // exp_avg.lerp_(grad, 1 - beta1), with PyTorch's two-sided lerp formula.
                let m_old = format.load_f64(m, i);
                let w = a.s(s.one_minus_beta1);
                let diff = a.c(grad - m_old);
                let m_new = if w < 0.5 {
                    a.p(m_old + a.c(w * diff))
                } else {
                    a.p(grad - a.c(diff * a.c(1.0 - w)))
                };
                format.store_f64(m, i, m_new);
                let v_scaled = a.p(format.load_f64(v, i) * a.s(s.beta2));
                let v_new = a.p(v_scaled + a.c(a.c(a.s(s.one_minus_beta2) * grad) * grad));
                format.store_f64(v, i, v_new);
                let second = if s.amsgrad {
                    let vmax = vmax.as_deref_mut().ok_or_else(|| {
                        Error::value("adam: amsgrad is set but no max_exp_avg_sq arena was given")
                    })?;
                    let old = format.load_f64(vmax, i);
                    // torch.maximum propagates NaN.
                    let new = if v_new.is_nan() || old.is_nan() {
                        f64::NAN
                    } else {
                        v_new.max(old)
                    };
                    format.store_f64(vmax, i, new);
                    new
                } else {
                    v_new
                };
                let root = a.p(second.sqrt());
                let denom = a.p(a.p(root / a.s(s.bias_correction2_sqrt)) + a.s(s.eps));
                let update = a.c(a.s(-s.step_size) * a.c(m_new / denom));
                format.store_f64(p, i, a.p(param + update));
            }
        }
    }
    Ok(())
}

/// Averages every group of `group_size` consecutive ranks, element by element, over the
/// parameters whose `active` flag is set: each value is divided by the group size, then the
/// quotients are summed in rank order, all in the `arith` precision (PyTorch's promoted dtype
/// of the flattened parameters), and the sum is rounded back to the arena's format and written
/// to every rank of the group.
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
    let rank_words = format.words_for(len);
    let words = host_words_mut(arena)?;
    let divisor = group_size as f64;
    let round = |x: f64| {
        if arith == StorageFormat::F64 {
            x
        } else {
            arith.round_f64(StorageFormat::F32.round_f64(x))
        }
    };
    for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
        let start = starts.0[j] as usize;
        let end = starts.0.get(j + 1).map_or(len, |&e| e as usize);
        for group in 0..ranks / group_size {
            let first = group * group_size;
            for i in start..end {
                let mut acc = round(format.load_f64(&words[first * rank_words..], i) / divisor);
                for rank in first + 1..first + group_size {
                    let quotient = round(format.load_f64(&words[rank * rank_words..], i) / divisor);
                    acc = round(acc + quotient);
                }
                for rank in first..first + group_size {
                    format.store_f64(&mut words[rank * rank_words..], i, acc);
                }
            }
        }
    }
    Ok(())
}
