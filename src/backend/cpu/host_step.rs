//! The data-parallel SGD step computed straight from host tensors, for the CPU backend.
//!
//! [`crate::sgd_step`] on host inputs would otherwise pack every rank's gradients into fresh
//! arenas, run the arena kernel and decode the results: three passes over memory, most of them
//! page faults on memory just allocated. Here one fused pass per block of elements reads every
//! rank's gradient and rank 0's parameter where the caller keeps them, sums in float32 in rank
//! order, and writes each output once into memory the allocator hands back (not zeroed first).
//! The arithmetic is the arena kernel's ([`super::Backend::dp_sgd_step`]) operation for
//! operation, so the results are the same bits.

use std::mem::MaybeUninit;

use half::{bf16, f16};

use super::f16c;
use super::half::{BFloat16, Binary16, HalfFormat};
use super::host_words::prefer_huge_pages;
use super::parts::{PartWork, run_best};
use super::stream::{STREAMING_THRESHOLD_BYTES, store_elements, store_fence};
use super::threads::run_parts;
use crate::backend::quotient::{ByDivision, ByScale, Divide, Quotient};
use crate::host_data::HostData;

/// Elements per block: the accumulator and the rank-0 parameter block stay in L1.
const BLOCK: usize = 2048;
/// Elements below which one thread does a parameter's work.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// One parameter of the step: rank 0's values and every rank's gradient (`None`: missing).
pub struct HostStepParam<'a> {
    /// Rank 0's parameter values.
    pub param: &'a HostData,
    /// Each rank's gradient.
    pub grads: Vec<Option<&'a HostData>>,
}

/// One parameter's outputs: the mean gradient and `copies` buffers of the updated value.
pub struct HostStepResult {
    /// The mean gradient, in the parameter's dtype.
    pub mean: HostData,
    /// The updated parameter, once per requested copy.
    pub updated: Vec<HostData>,
}

/// Adds `data[first..first + acc.len()]` (widened to float32; float64 rounds to float32 as
/// `g.to(float32)` does) into `acc`.
#[inline(always)]
fn add_block(acc: &mut [f32], data: &HostData, first: usize) {
    let n = acc.len();
    match data {
        HostData::Float32(v) => {
            for (a, &x) in acc.iter_mut().zip(&v[first..first + n]) {
                *a += x;
            }
        }
        HostData::Float16(v) => {
            let v = &v[first..first + n];
            let done = f16c::add(acc, bytemuck::cast_slice(v), false);
            for (a, &x) in acc[done..].iter_mut().zip(&v[done..]) {
                *a += Binary16::decode(u32::from(x.to_bits()));
            }
        }
        HostData::BFloat16(v) => {
            for (a, &x) in acc.iter_mut().zip(&v[first..first + n]) {
                *a += BFloat16::decode(u32::from(x.to_bits()));
            }
        }
        HostData::Float64(v) => {
            for (a, &x) in acc.iter_mut().zip(&v[first..first + n]) {
                *a += x as f32;
            }
        }
    }
}

/// A float32 result stored in a parameter's dtype: the stored element and its value widened
/// back to float32 (float64 parameters step in float32, so their results are float32 values).
trait Element: Copy + Default + Send + Sync + crate::recycle::Recyclable {
    fn round(x: f32) -> (Self, f32);
    fn widen(self) -> f32;

    /// The leading elements of a block's update done where the host has a faster way for this
    /// type (means into `means`, updated values into `out`, as the portable loop computes
    /// them); returns how many. The portable loop does the rest.
    #[inline(always)]
    fn update_fast(
        sums: &[f32],
        p0: &[Self],
        means: &mut [Self],
        out: &mut [Self],
        quotient: Quotient,
        lr: f32,
    ) -> usize {
        let _ = (sums, p0, means, out, quotient, lr);
        0
    }
}

impl Element for f32 {
    #[inline(always)]
    fn round(x: f32) -> (f32, f32) {
        (x, x)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Element for f64 {
    #[inline(always)]
    fn round(x: f32) -> (f64, f32) {
        (f64::from(x), x)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self as f32
    }
}

impl Element for f16 {
    #[inline(always)]
    fn round(x: f32) -> (f16, f32) {
        let bits = Binary16::encode(x);
        (f16::from_bits(bits as u16), Binary16::decode(bits))
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        Binary16::decode(u32::from(self.to_bits()))
    }

    /// In hardware where the host converts binary16 ([`f16c`]).
    #[inline(always)]
    fn update_fast(
        sums: &[f32],
        p0: &[f16],
        means: &mut [f16],
        out: &mut [f16],
        quotient: Quotient,
        lr: f32,
    ) -> usize {
        let (p0, means, out) = (
            bytemuck::cast_slice(p0),
            bytemuck::cast_slice_mut(means),
            bytemuck::cast_slice_mut(out),
        );
        f16c::update(sums, p0, means, out, quotient, lr)
    }
}

impl Element for bf16 {
    #[inline(always)]
    fn round(x: f32) -> (bf16, f32) {
        let bits = BFloat16::encode(x);
        (bf16::from_bits(bits as u16), BFloat16::decode(bits))
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        BFloat16::decode(u32::from(self.to_bits()))
    }
}

/// One part of one parameter: elements `first..first + mean.len()`.
struct Part<'a, T> {
    first: usize,
    mean: &'a mut [MaybeUninit<T>],
    updated: Vec<&'a mut [MaybeUninit<T>]>,
}

/// The step over one parameter whose elements are `T`, split across `threads`.
fn step_param<T: Element>(
    threads: usize,
    param: &[T],
    grads: &[Option<&HostData>],
    ranks: usize,
    lr: f32,
    copies: usize,
) -> (Vec<T>, Vec<Vec<T>>) {
    let n = param.len();
    // Memory a dropped output used before when there is some (no page faults), otherwise fresh.
    let fresh = || {
        crate::recycle::take(n).unwrap_or_else(|| {
            let v = Vec::with_capacity(n);
            prefer_huge_pages(&v);
            v
        })
    };
    let mut mean: Vec<T> = fresh();
    let mut updated: Vec<Vec<T>> = (0..copies).map(|_| fresh()).collect();
    let parts = if n >= PARALLEL_ELEMENTS {
        threads.max(1)
    } else {
        1
    };
    let bounds: Vec<usize> = (0..=parts)
        .map(|p| (n.div_ceil(BLOCK) * p / parts * BLOCK).min(n))
        .collect();
    {
        let mut mean_rest = &mut mean.spare_capacity_mut()[..n];
        let mut updated_rest: Vec<&mut [MaybeUninit<T>]> = updated
            .iter_mut()
            .map(|u| &mut u.spare_capacity_mut()[..n])
            .collect();
        let mut work = Vec::with_capacity(parts);
        for w in bounds.windows(2) {
            let len = w[1] - w[0];
            let (m, rest) = std::mem::take(&mut mean_rest).split_at_mut(len);
            mean_rest = rest;
            let mut ups = Vec::with_capacity(copies);
            for u in updated_rest.iter_mut() {
                let (head, rest) = std::mem::take(u).split_at_mut(len);
                *u = rest;
                ups.push(head);
            }
            work.push(Part {
                first: w[0],
                mean: m,
                updated: ups,
            });
        }
        let quotient = Quotient::by(ranks as f32);
        // Inputs and outputs beyond the caches: write the outputs with streaming stores.
        let moved = (grads.len() + 2 + copies) * n * std::mem::size_of::<T>();
        let streaming = moved >= STREAMING_THRESHOLD_BYTES;
        run_parts(work, |part| {
            run_best(StepPart {
                part,
                param,
                grads,
                quotient,
                lr,
                streaming,
            })
        });
    }
    // SAFETY: the parts cover 0..n (bounds run from 0 to n) and `step_part` writes every
    // element of its mean and updated slices.
    unsafe {
        mean.set_len(n);
        for u in &mut updated {
            u.set_len(n);
        }
    }
    (mean, updated)
}

/// One part's step, compiled for the best vector extension ([`run_best`]).
struct StepPart<'a, 'g, T> {
    part: Part<'a, T>,
    param: &'a [T],
    grads: &'a [Option<&'g HostData>],
    /// Division by the rank count (a product when that is exact).
    quotient: Quotient,
    lr: f32,
    streaming: bool,
}

impl<T: Element> PartWork for StepPart<'_, '_, T> {
    #[inline(always)]
    fn run(self) {
        match self.quotient {
            Quotient::Divide(d) => step_part(self, ByDivision(d)),
            Quotient::Scale(s) => step_part(self, ByScale(s)),
        }
    }
}

#[inline(always)]
fn step_part<T: Element, Q: Divide>(work: StepPart<'_, '_, T>, quotient: Q) {
    let StepPart {
        mut part,
        param,
        grads,
        lr,
        streaming,
        ..
    } = work;
    let mut acc = [0f32; BLOCK];
    // One block of stored outputs (means, updated values), written to the output buffers whole.
    let mut stored_means = [T::default(); BLOCK];
    let mut stored = [T::default(); BLOCK];
    let len = part.mean.len();
    let mut at = 0;
    while at < len {
        let n = BLOCK.min(len - at);
        let first = part.first + at;
        // The sum starts from +0, in rank order; a missing gradient adds nothing.
        let acc = &mut acc[..n];
        acc.fill(0.0);
        for g in grads.iter().flatten() {
            add_block(acc, g, first);
        }
        let (means, stored) = (&mut stored_means[..n], &mut stored[..n]);
        let p0 = &param[first..first + n];
        // The mean and the updated value, computed once, then written to the mean and to every
        // copy.
        let done = T::update_fast(acc, p0, means, stored, quotient.quotient(), lr);
        let rest = acc[done..].iter().zip(&p0[done..]);
        for ((out_mean, out), (&a, &p)) in
            means[done..].iter_mut().zip(&mut stored[done..]).zip(rest)
        {
            let (element, mean) = T::round(quotient.of(a));
            *out_mean = element;
            *out = T::round(p.widen() - lr * mean).0;
        }
        store_elements(&mut part.mean[at..at + n], means, streaming);
        for copy in part.updated.iter_mut() {
            store_elements(&mut copy[at..at + n], stored, streaming);
        }
        at += n;
    }
    store_fence(streaming);
}

/// The step over host tensors (see the module docs): per parameter, the mean gradient and
/// `copies` buffers of the updated parameter (one when the replicas share it). `ranks` is the
/// divisor (the number of ranks); every entry of `grads` has the parameter's length.
pub(crate) fn host_step(
    threads: usize,
    params: &[HostStepParam<'_>],
    ranks: usize,
    lr: f32,
    copies: usize,
) -> Vec<HostStepResult> {
    params
        .iter()
        .map(|p| {
            let grads = &p.grads;
            macro_rules! go {
                ($values:expr, $variant:ident) => {{
                    let (mean, updated) = step_param(threads, $values, grads, ranks, lr, copies);
                    HostStepResult {
                        mean: HostData::$variant(mean),
                        updated: updated.into_iter().map(HostData::$variant).collect(),
                    }
                }};
            }
            match p.param {
                HostData::Float32(v) => go!(v, Float32),
                HostData::Float16(v) => go!(v, Float16),
                HostData::BFloat16(v) => go!(v, BFloat16),
                HostData::Float64(v) => go!(v, Float64),
            }
        })
        .collect()
}
