//! The per-parameter tables the optimizer and averaging kernels read, the same on every
//! backend, and their checks against the arenas they describe.

use std::ops::Range;

use crate::backend::Arena;
use crate::error::{Error, Result};

/// Where each parameter of an arena starts in a rank's element space (ascending, one entry per
/// parameter; a parameter runs to the next one's start).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamStarts(pub Vec<u32>);

impl ParamStarts {
    /// The elements of parameter `j` in a rank of `len` elements: from its start to the next
    /// parameter's (the last one's, to `len`).
    pub(crate) fn range(&self, j: usize, len: usize) -> Range<usize> {
        self.0[j] as usize..self.0.get(j + 1).map_or(len, |&e| e as usize)
    }

    /// [`range`](Self::range) of every parameter, in order.
    pub(crate) fn ranges(&self, len: usize) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.0.len()).map(move |j| self.range(j, len))
    }

    /// [`range`](Self::range) of every parameter flagged in `active` (one flag per parameter),
    /// in order.
    pub(crate) fn active_ranges<'a>(
        &'a self,
        active: &'a [bool],
        len: usize,
    ) -> impl Iterator<Item = Range<usize>> + 'a {
        self.ranges(len)
            .zip(active)
            .filter(|(_, a)| **a)
            .map(|(range, _)| range)
    }

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
    /// PyTorch's `foreach=True` multiplies the momentum buffers with `_foreach_mul_`, which
    /// rounds its scalar to the storage format first (through float32; bfloat16's 0.9 is
    /// 0.8984375), where the single-tensor `mul_` keeps it in float32. The host sets it when
    /// `_multi_tensor_sgd` takes that path: `foreach=True`, with every parameter of the group
    /// and dtype that has a gradient already holding a buffer.
    pub foreach_momentum: bool,
    /// The element of the parameter from which PyTorch's single-tensor `add(alpha=)` on
    /// float16 and bfloat16 is its loop's scalar tail's (alpha and the product rounded to the
    /// format before the sum) instead of its vector body's (alpha rounded, then one float32
    /// fused multiply-add rounded once): [`vector_tail_from`]. 0 (the default): every element
    /// the tail's. Read by the 16-bit single-tensor arithmetic only.
    pub half_tail_from: usize,
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
    /// The element of the parameter from which AMSGrad's running maximum is that of PyTorch's
    /// fused CPU kernel's scalar remainder, `std::max(max_exp_avg_sq, exp_avg_sq)`, which keeps
    /// the old maximum where the new second moment is NaN, instead of its vector body's
    /// `maximum`, where NaN wins ([`remainder_from`]; set under `fused` and `amsgrad` only).
    /// The element count or more: no element (`torch.maximum` throughout, as every other path).
    pub remainder_from: usize,
    /// The element of the parameter from which PyTorch's single-tensor `add(alpha=)` on
    /// float16 and bfloat16 is its loop's scalar tail's (alpha and the product rounded to the
    /// format before the sum) instead of its vector body's (alpha rounded, then one float32
    /// fused multiply-add rounded once): [`vector_tail_from`]. 0 (the default): every element
    /// the tail's. Read by the 16-bit single-tensor arithmetic only.
    pub half_tail_from: usize,
}

/// Where PyTorch's fused CPU Adam kernel (`adam_math` in
/// aten/src/ATen/native/cpu/FusedAdamKernel.cpp) leaves its vector loop for its scalar
/// remainder in a parameter of `numel` elements stored `element_bytes` wide: the last `numel %
/// V` elements, `V` the elements of one 256-bit ATen vector (8 float32, 4 float64, 16 float16
/// or bfloat16). 256 bits is ATen's vector on AVX2 and Arm hosts (measured on AVX2 with torch
/// 2.15: every thread count, sizes 1 to 400,003); an AVX-512 host's remainder is `numel %
/// 2V`, which ends with this one.
pub fn remainder_from(numel: usize, element_bytes: usize) -> usize {
    let lanes = 32 / element_bytes.max(1);
    numel - numel % lanes
}

/// Where the loop of PyTorch's element-wise CPU kernels (ATen's `vectorized_loop`, two vectors
/// per iteration) leaves its vector body for its scalar tail in a contiguous float16 or
/// bfloat16 tensor of `numel` elements: the last `numel % 32` elements (two 256-bit vectors
/// of 16; measured on AVX2 with torch 2.15, sizes 1 to 130). An AVX-512 host steps 64 and an
/// Arm host 16 elements at a time, and a tensor of more than 32,768 elements split across
/// threads has a tail at the end of each thread's range, which this does not model.
pub fn vector_tail_from(numel: usize) -> usize {
    numel - numel % 32
}

/// Whether the arenas of one kernel call must also be chunked alike: the GPU backend binds
/// them chunk by chunk, the host kernels walk whole ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunking {
    /// Any chunking (host arenas).
    Any,
    /// The same chunk length (device arenas).
    Same,
}

/// A `ValueError` unless `b` has the ranks, length and format of `a` (and its chunking, for
/// [`Chunking::Same`]).
pub(super) fn check_same_layout(
    what: &str,
    a: &Arena,
    b: &Arena,
    chunking: Chunking,
) -> Result<()> {
    if a.ranks() != b.ranks()
        || a.rank_len() != b.rank_len()
        || (chunking == Chunking::Same && a.chunk_len() != b.chunk_len())
        || a.format() != b.format()
    {
        return Err(Error::value(format!(
            "{what}: arenas do not match ({a:?} vs {b:?})"
        )));
    }
    Ok(())
}

/// A `ValueError` unless `active` holds one flag per parameter of `starts`.
pub(super) fn check_flags(what: &str, active: &[bool], starts: &ParamStarts) -> Result<()> {
    if active.len() != starts.0.len() {
        return Err(Error::value(format!(
            "{what}: {} flags for {} parameters",
            active.len(),
            starts.0.len()
        )));
    }
    Ok(())
}

pub(super) fn check_table<T>(
    what: &str,
    arena: &Arena,
    starts: &ParamStarts,
    scalars: &[T],
) -> Result<()> {
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
