//! Where the protocol's futures run. Natively: the world's own tokio runtime, on which the
//! client's tasks (subscriptions, heartbeats) run too. In wasm: the calling thread, polled
//! until ready — the link there answers every operation before its future is polled (the npm
//! package's port blocks the thread until the NATS client in its worker has answered), so a
//! future never waits on a wake-up that only another thread could give. (A sync point in
//! flight is polled between the caller's steps instead: `overlap.rs`.)

use std::future::Future;
use std::time::Duration;

use crate::error::Result;

/// Runs the protocol's futures to completion on the calling thread.
pub(super) struct Runtime {
    #[cfg(not(target_arch = "wasm32"))]
    tokio: tokio::runtime::Runtime,
}

impl Runtime {
    /// A runtime for run `run` (natively: one worker thread for the client's tasks).
    ///
    /// # Errors
    /// A `RuntimeError` when the operating system refuses the thread.
    pub(super) fn new(run: &str) -> Result<Runtime> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let tokio = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("distopt-nats")
                .enable_all()
                .build()
                .map_err(|e| {
                    crate::error::Error::runtime(format!(
                        "run '{run}': cannot start the NATS client's runtime: {e}"
                    ))
                })?;
            Ok(Runtime { tokio })
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = run;
            Ok(Runtime {})
        }
    }

    /// Runs `future` to completion.
    pub(super) fn block_on<F: Future>(&self, future: F) -> F::Output {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.tokio.block_on(future)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut future = std::pin::pin!(future);
            let mut context = std::task::Context::from_waker(std::task::Waker::noop());
            loop {
                if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
                    return output;
                }
            }
        }
    }

    /// Runs `future`, giving up after `limit` (natively; in wasm each of its operations is
    /// bounded by the link itself).
    pub(super) fn block_on_at_most(&self, limit: Duration, future: impl Future<Output = ()>) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.tokio.block_on(async {
                let _ = tokio::time::timeout(limit, future).await;
            });
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = limit;
            self.block_on(future);
        }
    }
}
