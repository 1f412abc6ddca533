//! # distopt
//!
//! PyTorch's data-parallel optimizer family — starting with the synchronous data-parallel SGD
//! step — computed by WGSL compute shaders on whatever GPU wgpu finds, or by a plain-Rust
//! backend on the host's cores. R data-parallel ranks (replicas of a model's parameters) are
//! simulated on one device, their parameters kept in *replica arenas*: all parameters of one
//! dtype, for all ranks, in one flat buffer, so every kernel is one dispatch.
//!
//! The core API is `async` (browser readback is asynchronous), with one form per operation;
//! native callers wait for a call with `.block_on()` ([`BlockOn`], [`block_on`]).
//!
//! ```
//! use distopt::BlockOn;
//! use distopt::{BackendChoice, Tensor, select_backend, sgd_step};
//! let backend = select_backend(BackendChoice::Cpu).block_on().unwrap().backend;
//! let params = vec![vec![Tensor::from_f32(&[2], vec![1.0, -1.0]).unwrap()]; 2];
//! let grads = vec![
//!     vec![Some(Tensor::from_f32(&[2], vec![2.0, 4.0]).unwrap())],
//!     vec![Some(Tensor::from_f32(&[2], vec![0.0, 0.0]).unwrap())],
//! ];
//! let out = sgd_step(backend.as_ref(), &params, &grads, 0.5).block_on().unwrap();
//! assert_eq!(out.mean_gradients[0].values_f64().unwrap(), vec![1.0, 2.0]);
//! assert_eq!(out.updated_replicas[0][0].values_f64().unwrap(), vec![0.5, -2.0]);
//! ```

// On wasm32 the backend handles are `!Send` by design (see `backend::MaybeSendSync`); the
// `Arc`s that share them natively are then merely reference counts.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
// The threaded WebAssembly build (nightly only, as `atomics` needs a rebuilt std) sleeps its
// idle workers with `memory.atomic.wait32` (`backend::cpu::pool`).
#![cfg_attr(
    all(target_arch = "wasm32", target_feature = "atomics"),
    feature(stdarch_wasm_atomic_wait)
)]

pub mod averaging;
pub mod backend;
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod blocking;
pub mod budget;
pub mod comm;
pub mod ddp;
pub mod diloco;
pub mod dtype;
pub mod error;
pub mod host_data;
pub mod join;
pub mod json;
pub mod optim;
pub mod post_local_sgd;
pub mod pyfmt;
pub mod recycle;
pub mod replicas;
pub mod rng;
pub mod rpc;
pub mod step;
pub mod tensor;
pub mod train;
pub(crate) mod transfer;
pub mod warnings;
pub mod zero;

pub use backend::{
    Arena, Backend, BackendChoice, BackendInfo, BackendKind, CpuBackend, GpuBackend, Selection,
    select_backend,
};
#[cfg(not(target_arch = "wasm32"))]
pub use blocking::{BlockOn, block_on};
pub use dtype::{DType, StorageFormat};
pub use error::{Error, ErrorKind, RankErrors, Result};
pub use host_data::HostData;
pub use step::{ReplicaOutputs, StepOutput, sgd_step, sgd_step_in, sgd_step_with, to_device};
pub use tensor::{Storage, Tensor};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
