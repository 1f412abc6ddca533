//! The compute layer: a small [`Backend`] trait of fused elementwise kernels over flat replica
//! arenas, with a wgpu implementation ([`gpu`]) and a plain-Rust one ([`cpu`]) that is both the
//! reference the GPU is tested against and the fallback where no adapter exists.//!
//! This file only declares and re-exports: the [`Arena`] (`arena.rs`), the [`Backend`] trait
//! (`interface.rs`), the argument checks every backend shares (`checks.rs`), the backend
//! choice (`select.rs`), the plain-Rust reference kernels (`kernels/`) and the two backends.

mod arena;
mod checks;
pub mod cpu;
pub mod gpu;
mod info;
mod interface;
pub mod kernels;
pub(crate) mod oneshot;
mod platform;
pub(crate) mod quotient;
mod select;

pub use arena::{Arena, CopyRegion, PARAM_ALIGN_ELEMENTS, layout_params};
pub(crate) use arena::{ArenaStorage, host_words, host_words_mut};
pub(crate) use checks::{
    check_copy_regions, check_param_table, check_same_format, check_step_arenas,
};
pub use cpu::CpuBackend;
pub use cpu::{host_step, roofline};
pub use gpu::GpuBackend;
pub use info::{BackendInfo, BackendKind};
pub use interface::Backend;
pub use platform::{BoxFuture, MaybeSend, MaybeSendSync};
pub use select::{BackendChoice, Selection, select_backend};
