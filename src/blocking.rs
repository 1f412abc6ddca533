//! Blocking on the library's futures, for native callers: every asynchronous call (a step
//! that reads results back, a state dict, a readback) has one form, `async`, and a caller that
//! wants to wait for it writes `.block_on()` (or [`block_on`]) instead of calling a second,
//! blocking twin of it.
//!
//! ```
//! use std::sync::Arc;
//! use distopt::{BlockOn, CpuBackend, Tensor, sgd_step};
//! let backend = Arc::new(CpuBackend::new());
//! let params = vec![vec![Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap()]];
//! let grads = vec![vec![Some(Tensor::from_f32(&[2], vec![2.0, 4.0]).unwrap())]];
//! let out = sgd_step(backend.as_ref(), &params, &grads, 0.5).block_on().unwrap();
//! assert_eq!(out.updated_replicas[0][0].values_f64().unwrap(), vec![0.0, 0.0]);
//! ```
//!
//! Natively only: on wasm32 a future must be awaited (the browser's main thread cannot block).

use std::future::Future;

/// Runs `future` to completion on the calling thread (a GPU readback waits for the device).
pub fn block_on<F: Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// `future.block_on()`: [`block_on`] as a method of every future.
pub trait BlockOn: Future + Sized {
    /// Runs the future to completion on the calling thread.
    fn block_on(self) -> Self::Output {
        block_on(self)
    }
}

impl<F: Future> BlockOn for F {}
