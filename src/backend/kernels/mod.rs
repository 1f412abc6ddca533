//! The per-parameter tables the optimizer and averaging kernels read, shared by both backends,
//! and the plain-Rust reference implementations of those kernels, one file per kernel: `sgd`,
//! `adam`, `average`, `scaled_sum`, `lerp`, `convert`. Each has its twins under the
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
//! narrower format directly. The multiply-adds PyTorch rounds once are fused multiply-adds
//! (`Real::mul_add`, `fma_f32` in `arith.rs`): `add(alpha=)` (`vec::fmadd` in ATen's
//! vectorized loop, contracted alike in its scalar remainder), `lerp_` and `addcmul_`
//! (measured against torch 2.15, float32 and float64, body and tail; `addcdiv_` rounds its
//! product and its quotient).
//! PyTorch's single-tensor `add(alpha=)` on float16/bfloat16 rounds its scalar to the format
//! and is one fused multiply-add rounded once in its vector body, but rounds its product to
//! the format before the sum in its scalar tail (`Half` arithmetic): `add_scaled_at`, the tail
//! from `SgdScalars::half_tail_from` on.
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
//! * the multiply-adds are fused multiply-adds, as in the single-tensor arithmetic: Adam's
//!   lerp (`vec::fmadd(coeff, grad - exp_avg, base)`, with `coeff = w` and `base = exp_avg`
//!   when `|w| < 0.5`, else `coeff = w - 1` and `base = grad`, `w = 1 - beta1`), Adam's L2 term
//!   `grad + param * weight_decay`, the second moment's `exp_avg_sq * beta2 + (1 - beta2) * g *
//!   g` as `fma((1 - beta2) * g, g, exp_avg_sq * beta2)`, and SGD's weight decay, momentum
//!   (`fma(grad, 1 - dampening, buf * momentum)`), Nesterov term and `param - lr * grad`. Some
//!   are explicit `vec::fmadd`s; the others are contracted by the compiler PyTorch's wheels are
//!   built with (GCC contracts `a * b + c` by default), in the vector body and the scalar tail
//!   alike. Measured against torch 2.x on an AVX-512 host (float16, bfloat16, float32; sizes 31
//!   to 4099, beta1 0.3 to 0.9): bit for bit.
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
//! AMSGrad's running maximum under `fused=True` follows the kernel's two loops: its vector body
//! takes `maximum` (a NaN second moment makes the maximum NaN, as `torch.maximum` does on the
//! other paths), its scalar remainder `std::max(max_exp_avg_sq, exp_avg_sq)`, which keeps the
//! old maximum where the new second moment is NaN. The remainder is the last `numel % V`
//! elements of each parameter, `V` one 256-bit vector's elements (AVX2 and Arm hosts; an
//! AVX-512 host's remainder, `numel % 2V`, ends with it): `AdamScalars::remainder_from`.
//!
//! So the fused and the single-tensor arithmetic are the same for float32 and float64, and
//! differ for float16 and bfloat16 in the rounding of every intermediate. (PyTorch's own fused
//! SGD rounds `param + grad * -lr` twice in its vector body, a last-bit difference on
//! float32/float64 that distopt does not model.)

mod adam;
mod arith;
mod average;
mod convert;
mod lerp;
mod scaled_sum;
mod sgd;
mod slices;
mod tables;

pub(crate) use adam::check_adam_arenas;
pub use adam::{AdamArenas, adam_reference};
pub(in crate::backend) use adam::{adam_rank, adam_rank_slices};
pub(crate) use arith::{Real, fma_f32, maximum, std_max};
use arith::{add_scaled, add_scaled_at, rounding_format};
pub(crate) use average::check_average_args;
pub use average::{AverageArgs, MeanOrder, average_reference};
pub(in crate::backend) use average::{Groups, average_group, group_slices};
pub(crate) use convert::check_convert;
pub use convert::{ConvertArgs, convert_reference};
pub use lerp::{LerpArgs, lerp_reference};
pub(crate) use lerp::{check_lerp, lerp_coefficient};
// The communicators' all-reduce check.
#[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
pub(crate) use scaled_sum::check_scaled_sum;
pub use scaled_sum::{ScaledSumArgs, scaled_sum_reference};
pub(crate) use sgd::check_sgd_arenas;
pub use sgd::{SgdArgs, sgd_reference};
pub(in crate::backend) use sgd::{sgd_rank, sgd_rank_slices};
use slices::{optional_rank_slices, rank_slices, rank_slices_mut};
pub(crate) use tables::Chunking;
pub use tables::{AdamScalars, ParamStarts, SgdScalars, remainder_from, vector_tail_from};
use tables::{check_flags, check_same_layout, check_table};
// Host access to an arena's words, for the reference kernels (and the CPU backend).
use crate::backend::Arena;
pub(crate) use crate::backend::{host_words, host_words_mut};
