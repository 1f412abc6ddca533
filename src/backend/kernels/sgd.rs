//! `torch.optim.SGD`'s single-tensor step, the plain-Rust reference: its arguments' checks and
//! the arithmetic of the model in [`super`], element by element. Its twins: the CPU backend's
//! fused, multi-threaded kernel in `backend/cpu/sgd.rs`, the GPU dispatch in
//! `backend/gpu/sgd.rs` and the shader `shaders/sgd.wgsl`.

use super::{
    Arena, Chunking, ParamStarts, Real, SgdScalars, add_scaled_at, check_same_layout, check_table,
    optional_rank_slices, rank_slices, rank_slices_mut, rounding_format,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// The arguments of an SGD step ([`Backend::sgd`](crate::backend::Backend::sgd),
/// [`sgd_reference`]): its arenas and tables.
pub struct SgdArgs<'a> {
    /// Parameters (updated).
    pub params: &'a mut Arena,
    /// Gradients.
    pub grads: &'a Arena,
    /// Momentum buffers (updated), needed where an active entry has momentum.
    pub momentum: Option<&'a mut Arena>,
    /// Where each parameter starts in a rank.
    pub starts: &'a ParamStarts,
    /// One entry per (rank, parameter), rank-major.
    pub scalars: &'a [SgdScalars],
}

/// Checks the arenas and table of an SGD step (shared by every implementation; the GPU
/// backend's arenas are also [`Chunking::Same`]).
pub(crate) fn check_sgd_arenas(args: &SgdArgs<'_>, chunking: Chunking) -> Result<()> {
    let params = &*args.params;
    check_same_layout("sgd", params, args.grads, chunking)?;
    check_table("sgd", params, args.starts, args.scalars)?;
    if let Some(m) = args.momentum.as_deref() {
        check_same_layout("sgd momentum", params, m, chunking)?;
    }
    let needs_momentum = args.scalars.iter().any(|s| s.active && s.momentum != 0.0);
    if needs_momentum && args.momentum.is_none() {
        return Err(Error::value(
            "sgd: momentum is set but no momentum arena was given",
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
pub fn sgd_reference(args: SgdArgs<'_>) -> Result<()> {
    let (format, len) = (args.params.format(), args.params.rank_len());
    let starts = args.starts;
    for (slices, table) in sgd_rank_slices(args)? {
        if format == StorageFormat::F64 {
            sgd_rank::<f64>(format, slices, starts, table, len);
        } else {
            sgd_rank::<f32>(format, slices, starts, table, len);
        }
    }
    Ok(())
}

/// One rank's words of an SGD step's arenas: parameters, gradients and momentum buffers.
pub(in crate::backend) type SgdSlices<'a> = (&'a mut [u32], &'a [u32], Option<&'a mut [u32]>);

/// The arenas of an SGD step, checked ([`check_sgd_arenas`]) and cut into one
/// [`SgdSlices`] per rank, each with the rank's entries of the table (what the reference walks
/// in turn and the CPU backend on threads).
pub(in crate::backend) fn sgd_rank_slices(
    args: SgdArgs<'_>,
) -> Result<Vec<(SgdSlices<'_>, &[SgdScalars])>> {
    check_sgd_arenas(&args, Chunking::Any)?;
    let ranks = args.params.ranks();
    let g = rank_slices(args.grads)?;
    let buffers = optional_rank_slices(args.momentum, ranks)?;
    Ok(rank_slices_mut(args.params)?
        .zip(g)
        .zip(buffers)
        .zip(args.scalars.chunks(args.starts.0.len()))
        .map(|(((p, g), buf), table)| ((p, g, buf), table))
        .collect())
}

/// One rank's SGD update: every active parameter of `table`, element by element.
pub(in crate::backend) fn sgd_rank<T: Real>(
    format: StorageFormat,
    slices: SgdSlices<'_>,
    starts: &ParamStarts,
    table: &[SgdScalars],
    len: usize,
) {
    let (p, g, mut buf) = slices;
    let entries = table.iter().zip(starts.ranges(len));
    for (s, range) in entries.filter(|(s, _)| s.active) {
        let rounding = rounding_format(format, s.fused);
        let r = |x: T| T::round(rounding, x);
        // `x.add(y, alpha=a)` of element `i` (see [`add_scaled_at`]: one fused multiply-add, but
        // for the 16-bit formats' single-tensor arithmetic in PyTorch's scalar tail);
        // `mul_(momentum)` takes its scalar unrounded. With `fused`, PyTorch's fused kernel
        // (FusedSGDKernel.cpp): the compute precision throughout (`r` is the identity, `add` a
        // fused multiply-add), each tensor rounded once, when stored.
        let start = range.start;
        let add = |i: usize, x: T, alpha: T, y: T| {
            add_scaled_at(rounding, i - start < s.half_tail_from, x, alpha, y)
        };
        let (lr, wd, mom, damp) = (
            T::scalar(-s.lr),
            T::scalar(s.weight_decay),
            T::scalar(s.momentum),
            T::scalar(s.one_minus_dampening),
        );
        // The scalar of the buffer's `mul_`: `_foreach_mul_` rounds it to the format.
        let decay = if s.foreach_momentum { r(mom) } else { mom };
        for i in range {
            let param = T::load(format, p, i);
            let mut grad = T::load(format, g, i);
            if s.maximize {
                grad = -grad;
            }
            if s.weight_decay != 0.0 {
                grad = add(i, grad, wd, param);
            }
            if s.momentum != 0.0 {
                if let Some(buf) = buf.as_deref_mut() {
                    let b = if s.first_step {
                        grad
                    } else {
                        add(i, r(T::load(format, buf, i) * decay), damp, grad)
                    };
                    T::store(format, buf, i, b);
                    grad = if s.nesterov { add(i, grad, mom, b) } else { b };
                }
            }
            T::store(format, p, i, add(i, param, lr, grad));
        }
    }
}
