//! `torch.optim.Adam`/`AdamW`'s single-tensor step, the plain-Rust reference: its arenas, their
//! checks and the arithmetic of the model in [`super`], element by element. Its twins: the CPU
//! backend's fused, multi-threaded kernel in `backend/cpu/adam.rs`, the GPU dispatch in
//! `backend/gpu/adam.rs` and the shader `shaders/adam.wgsl`.

use super::{
    AdamScalars, Arena, Chunking, ParamStarts, Real, add_scaled, add_scaled_at, check_same_layout,
    check_table, maximum, optional_rank_slices, rank_slices, rank_slices_mut, rounding_format,
    std_max,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

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

/// Checks the arenas and table of an Adam step (shared by every implementation; the GPU
/// backend's arenas are also [`Chunking::Same`]).
pub(crate) fn check_adam_arenas(
    arenas: &AdamArenas<'_>,
    starts: &ParamStarts,
    scalars: &[AdamScalars],
    chunking: Chunking,
) -> Result<()> {
    let params = &*arenas.params;
    check_same_layout("adam", params, arenas.grads, chunking)?;
    check_same_layout("adam exp_avg", params, arenas.exp_avg, chunking)?;
    check_same_layout("adam exp_avg_sq", params, arenas.exp_avg_sq, chunking)?;
    check_table("adam", params, starts, scalars)?;
    if let Some(x) = &arenas.max_exp_avg_sq {
        check_same_layout("adam max_exp_avg_sq", params, x, chunking)?;
    }
    if scalars.iter().any(|s| s.active && s.amsgrad) && arenas.max_exp_avg_sq.is_none() {
        return Err(Error::value(
            "adam: amsgrad is set but no max_exp_avg_sq arena was given",
        ));
    }
    Ok(())
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
    let (format, len) = (arenas.params.format(), arenas.params.rank_len());
    for (slices, table) in adam_rank_slices(arenas, starts, scalars)? {
        if format == StorageFormat::F64 {
            adam_rank::<f64>(format, slices, starts, table, len);
        } else {
            adam_rank::<f32>(format, slices, starts, table, len);
        }
    }
    Ok(())
}

/// The arenas of an Adam step, checked ([`check_adam_arenas`]) and cut into one
/// [`AdamSlices`] per rank, each with the rank's entries of the table (what the reference walks
/// in turn and the CPU backend on threads).
pub(in crate::backend) fn adam_rank_slices<'a, 's>(
    arenas: AdamArenas<'a>,
    starts: &ParamStarts,
    scalars: &'s [AdamScalars],
) -> Result<Vec<(AdamSlices<'a>, &'s [AdamScalars])>> {
    check_adam_arenas(&arenas, starts, scalars, Chunking::Any)?;
    let ranks = arenas.params.ranks();
    let g = rank_slices(arenas.grads)?;
    let m = rank_slices_mut(arenas.exp_avg)?;
    let v = rank_slices_mut(arenas.exp_avg_sq)?;
    let maxes = optional_rank_slices(arenas.max_exp_avg_sq, ranks)?;
    Ok(rank_slices_mut(arenas.params)?
        .zip(g)
        .zip(m)
        .zip(v)
        .zip(maxes)
        .zip(scalars.chunks(starts.0.len()))
        .map(|(((((p, g), m), v), vmax), table)| (AdamSlices { p, g, m, v, vmax }, table))
        .collect())
}

/// One rank's words of the arenas of an Adam step.
pub(in crate::backend) struct AdamSlices<'a> {
    pub(in crate::backend) p: &'a mut [u32],
    pub(in crate::backend) g: &'a [u32],
    pub(in crate::backend) m: &'a mut [u32],
    pub(in crate::backend) v: &'a mut [u32],
    pub(in crate::backend) vmax: Option<&'a mut [u32]>,
}

/// One rank's Adam update: every active parameter of `table`, element by element.
pub(in crate::backend) fn adam_rank<T: Real>(
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
    let entries = table.iter().zip(starts.ranges(len));
    for (s, range) in entries.filter(|(s, _)| s.active) {
        let rounding = rounding_format(format, s.fused);
        let r = |x: T| T::round(rounding, x);
        let w = T::scalar(s.one_minus_beta1);
        let (wd, decay) = (T::scalar(s.weight_decay), T::scalar(s.decay_factor));
        let (beta2, one_minus_beta2) = (T::scalar(s.beta2), T::scalar(s.one_minus_beta2));
        let (neg_step, bc2, eps) = (
            T::scalar(-s.step_size),
            T::scalar(s.bias_correction2_sqrt),
            T::scalar(s.eps),
        );
        let start = range.start;
        for i in range {
            let mut param = T::load(format, p, i);
            let mut grad = T::load(format, g, i);
            if s.maximize {
                grad = -grad;
            }
            // PyTorch's three multiply-adds are rounded once, fused or not (the single-tensor
            // kernels' `add(alpha=)`, `lerp_` and `addcmul_` are `vec::fmadd`s, their scalar
            // remainders contracted alike): the L2 term (see [`add_scaled`]), the lerp and the
            // second moment's `(1 - beta2) * g * g` term. Each result is then rounded to the
            // storage format (`r`; the identity under `fused`).
            if s.decoupled {
                param = r(param * decay);
            } else if s.weight_decay != 0.0 {
                grad = add_scaled_at(rounding, i - start < s.half_tail_from, grad, wd, param);
            }
            // exp_avg.lerp_(grad, 1 - beta1), with PyTorch's two-sided lerp: `fmadd(coeff,
            // grad - exp_avg, base)`, `coeff = w` and `base = exp_avg` when `w < 0.5`, else
            // `coeff = w - 1` and `base = grad`.
            let m_old = T::load(format, m, i);
            let diff = grad - m_old;
            let m_new = if w < T::HALF {
                r(w.mul_add(diff, m_old))
            } else {
                r((w - T::ONE).mul_add(diff, grad))
            };
            T::store(format, m, i, m_new);
            // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2).
            let v_scaled = r(T::load(format, v, i) * beta2);
            let v_new = r((one_minus_beta2 * grad).mul_add(grad, v_scaled));
            T::store(format, v, i, v_new);
            let second = match vmax.as_deref_mut() {
                Some(vmax) if s.amsgrad => {
                    let old = T::load(format, vmax, i);
                    let new = if i - start >= s.remainder_from {
                        std_max(old, v_new)
                    } else {
                        maximum(v_new, old)
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
