//! How the CPU backend's optimizer kernels read and write each storage format in place
//! ([`Storage`]: float32 as it is, float16 and bfloat16 widened on load and rounded after every
//! tensor operation, or once on store under `fused=True`), the segment rows of a part's words,
//! and the element operations SGD (`sgd.rs`) and Adam (`adam.rs`) share.
//!
//! The kernels compute exactly what the reference kernels in `backend/kernels/` compute,
//! operation by operation (the same IEEE float32 operations in the same order, each PyTorch
//! tensor operation's result rounded to the storage format), so the two agree bit for bit; the
//! reference stays the readable twin every backend is tested against. float32 runs on the
//! arena's words in place; float16 and bfloat16 run the same loops over the arena's 16-bit
//! elements in place: each element is widened to float32 as it is loaded, every tensor
//! operation's result is rounded to the format, and the rounded value is stored back, in one
//! pass.

use super::half::{BFloat16, Binary16, HalfFormat};
use super::parts::Segment;
use crate::backend::kernels::fma_f32;
use crate::dtype::StorageFormat;

// The packed 16-bit arenas are read as `u16` slices: element `2k` is the low half of word `k`.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "16-bit arenas are read as u16 slices"
);

/// How the element loops read and write one storage format, and round a tensor operation's
/// float32 result to it. Every loop computes in float32.
pub(super) trait Storage: Copy {
    /// One element as the arena stores it.
    type Elem: bytemuck::Pod;
    /// `add(alpha=)` in the format's own arithmetic (c10's `Half`/`BFloat16`: the 16-bit
    /// formats' single-tensor path), not one fused multiply-add (see [`add_scaled`]).
    const HALF_ADD: bool = false;
    /// The arithmetic of PyTorch's vector body, where it differs from its scalar tail's (the
    /// 16-bit single-tensor `add(alpha=)`: [`add_scaled`]); the same arithmetic otherwise.
    type Vector: Storage<Elem = Self::Elem>;
    /// This storage's [`Vector`](Self::Vector) arithmetic.
    fn vector(self) -> Self::Vector;
    /// A tensor operation's float32 result rounded to the format.
    fn r(self, x: f32) -> f32;
    /// An element, widened to float32 (exact).
    fn load(self, e: Self::Elem) -> f32;
    /// A value already rounded by [`r`](Self::r), as the arena stores it (exact).
    fn store(self, x: f32) -> Self::Elem;
}

/// A computation over one storage arithmetic, run by [`with_storage`] with the [`Storage`] a
/// format and PyTorch's `fused` choose.
pub(super) trait OnStorage {
    fn run<S: Storage>(self, st: S);
}

/// Runs `f` with the arithmetic of a `format` arena: float32 as it is, float16 and bfloat16
/// rounded after every tensor operation, or under `fused` computed in float32 and rounded once
/// when stored. float64 arenas run the reference kernels, never this.
#[inline(always)]
pub(super) fn with_storage(format: StorageFormat, fused: bool, f: impl OnStorage) {
    use std::marker::PhantomData as M;
    match (format, fused) {
        (StorageFormat::F32, _) => f.run(Exact),
        (StorageFormat::F16, false) => f.run(To::<Binary16>(M)),
        (StorageFormat::BF16, false) => f.run(To::<BFloat16>(M)),
        (StorageFormat::F16, true) => f.run(Opmath::<Binary16>(M)),
        (StorageFormat::BF16, true) => f.run(Opmath::<BFloat16>(M)),
        (StorageFormat::F64, _) => unreachable!("float64 runs the reference"),
    }
}

/// float32 storage: every result is already rounded, so PyTorch's single-tensor and
/// `fused=True` arithmetic are the same.
#[derive(Clone, Copy)]
pub(super) struct Exact;
impl Storage for Exact {
    type Elem = f32;
    type Vector = Exact;
    #[inline(always)]
    fn vector(self) -> Exact {
        self
    }
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, e: f32) -> f32 {
        e
    }
    #[inline(always)]
    fn store(self, x: f32) -> f32 {
        x
    }
}

/// A 16-bit storage format, read and written in place: decoded on load, rounded after every
/// tensor operation, encoded on store. `add(alpha=)` as PyTorch's scalar tail computes it
/// (`TAIL`: the product rounded before the sum), or as its vector body (one multiply-add,
/// rounded once).
#[derive(Clone, Copy)]
pub(super) struct To<H, const TAIL: bool = true>(pub(super) std::marker::PhantomData<H>);
impl<H: HalfFormat + Copy, const TAIL: bool> Storage for To<H, TAIL> {
    type Elem = u16;
    const HALF_ADD: bool = TAIL;
    type Vector = To<H, false>;
    #[inline(always)]
    fn vector(self) -> To<H, false> {
        To(std::marker::PhantomData)
    }
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        H::round(x)
    }
    #[inline(always)]
    fn load(self, e: u16) -> f32 {
        H::decode(u32::from(e))
    }
    #[inline(always)]
    fn store(self, x: f32) -> u16 {
        H::encode_rounded(x) as u16
    }
}

/// A 16-bit storage format under PyTorch's `fused=True`: decoded on load, computed in float32
/// without rounding (its multiply-adds fused), rounded to the format once, as it is stored.
#[derive(Clone, Copy)]
pub(super) struct Opmath<H>(pub(super) std::marker::PhantomData<H>);
impl<H: HalfFormat + Copy> Storage for Opmath<H> {
    type Elem = u16;
    type Vector = Self;
    #[inline(always)]
    fn vector(self) -> Self {
        self
    }
    #[inline(always)]
    fn r(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, e: u16) -> f32 {
        H::decode_operand(u32::from(e))
    }
    #[inline(always)]
    fn store(self, x: f32) -> u16 {
        H::encode(x) as u16
    }
}

/// A part's words of an optional arena (AMSGrad's maxima, SGD's momentum buffers) where the
/// segment's `used` flag says the kernel touches them, else no words (read by [`rows_mut`] as
/// an absent arena).
#[inline(always)]
pub(super) fn used_or_empty<'a>(words: &'a mut Option<&mut [u32]>, used: bool) -> &'a mut [u32] {
    match words {
        Some(words) if used => words,
        _ => &mut [],
    }
}

/// A segment's elements of a part's words, as the format's elements (empty for an absent
/// arena).
#[inline(always)]
pub(super) fn rows_mut<'a, T: bytemuck::Pod>(words: &'a mut [u32], seg: &Segment) -> &'a mut [T] {
    if words.is_empty() {
        &mut []
    } else {
        &mut bytemuck::cast_slice_mut::<u32, T>(words)[seg.first..seg.first + seg.len]
    }
}

/// A segment's elements of a part's (read-only) words.
#[inline(always)]
pub(super) fn rows<'a, T: bytemuck::Pod>(words: &'a [u32], seg: &Segment) -> &'a [T] {
    &bytemuck::cast_slice::<u32, T>(words)[seg.first..seg.first + seg.len]
}

/// `-g` when maximizing: a sign flip, as `-grad` is.
#[inline(always)]
pub(super) fn signed(g: f32, flip: u32) -> f32 {
    f32::from_bits(g.to_bits() ^ flip)
}

/// PyTorch's `x.add(y, alpha=alpha)` on one element, `alpha` already rounded to the format
/// (the reference's `kernels::add_scaled_at`): one fused multiply-add, rounded once, or in
/// the scalar tail of the 16-bit formats' single-tensor arithmetic ([`Storage::HALF_ADD`])
/// the product and the sum each rounded to the format.
#[inline(always)]
pub(super) fn add_scaled<S: Storage>(rnd: S, x: f32, alpha: f32, y: f32) -> f32 {
    if S::HALF_ADD {
        rnd.r(x + rnd.r(alpha * y))
    } else {
        rnd.r(fma_f32(alpha, y, x))
    }
}
