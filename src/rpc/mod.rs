//! A small RPC framework for [`DistributedOptimizer`]: named workers that own tensors,
//! remote references ([`RRef`]), `rpc_sync`/`rpc_async` calls that run a function on the owner,
//! and distributed autograd contexts that collect gradients per remote parameter.
//!
//! Natively every worker is a thread with a message queue, so calls to different workers run
//! concurrently. On wasm32 the same API runs each call on the caller's thread when it is made
//! (cooperatively: nothing blocks; workers there should use the CPU backend, whose results are
//! ready without waiting on a device).

mod context;
mod distributed_optimizer;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use context::{AutogradContext, ContextId};
pub use distributed_optimizer::{DistributedOptimizer, LocalOptimizerInfo, LocalOptimizerKind};
pub use worker::{RpcFuture, WorkerState};

use crate::backend::{Backend, MaybeSend};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use context::Contexts;
use worker::Worker;

/// A reference to a tensor owned by a worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RRef {
    owner: String,
    id: u64,
}

impl RRef {
    /// The name of the owning worker.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The reference's id, unique in its world.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A copy of the value, fetched from the owner.
    pub fn to_here(&self, world: &RpcWorld) -> RpcFuture<Tensor> {
        let id = self.id;
        world.rpc_async(&self.owner, move |state| state.value(id).cloned())
    }
}

/// Named workers in this process, the driver among them, sharing one backend.
///
/// ```
/// use std::sync::Arc;
/// use distopt::rpc::RpcWorld;
/// use distopt::{CpuBackend, Tensor};
/// let world = RpcWorld::new(&["worker0", "worker1"], Arc::new(CpuBackend::new())).unwrap();
/// let w = world.remote("worker1", Tensor::from_f32(&[2], vec![1.0, 2.0]).unwrap()).unwrap();
/// assert_eq!(w.owner(), "worker1");
/// let doubled = world
///     .rpc_sync("worker1", move |state| Ok(state.value(w.id())?.values_f64()?.iter().map(|x| 2.0 * x).sum::<f64>()))
///     .unwrap();
/// assert_eq!(doubled, 6.0);
/// assert!(world.rpc_sync("nobody", |_| Ok(())).is_err());
/// ```
pub struct RpcWorld {
    workers: Mutex<HashMap<String, Worker>>,
    order: Vec<String>,
    backend: Arc<dyn Backend>,
    contexts: Arc<Contexts>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for RpcWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcWorld")
            .field("workers", &self.order)
            .finish()
    }
}

/// The name of the calling process's own worker.
pub const DRIVER: &str = "driver";

impl RpcWorld {
    /// A world of the driver plus `workers`, each running on its own thread (natively).
    ///
    /// # Errors
    /// A `ValueError` when a name is used twice (`"driver"`, [`DRIVER`], included); a
    /// `RuntimeError` when a worker's thread cannot be started.
    pub fn new(workers: &[&str], backend: Arc<dyn Backend>) -> Result<RpcWorld> {
        let contexts = Arc::new(Contexts::default());
        let mut map = HashMap::new();
        let mut order = vec![DRIVER.to_string()];
        map.insert(
            DRIVER.to_string(),
            Worker::spawn(DRIVER, backend.clone(), contexts.clone())?,
        );
        for &name in workers {
            if map.contains_key(name) {
                return Err(Error::value(format!("worker name {name:?} is used twice")));
            }
            map.insert(
                name.to_string(),
                Worker::spawn(name, backend.clone(), contexts.clone())?,
            );
            order.push(name.to_string());
        }
        Ok(RpcWorld {
            workers: Mutex::new(map),
            order,
            backend,
            contexts,
            next_id: AtomicU64::new(1),
        })
    }

    /// Every worker's name, the driver first.
    pub fn worker_names(&self) -> &[String] {
        &self.order
    }

    /// The backend the workers compute on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Runs `f` on worker `to` and returns a future of its result. Calls to one worker run in
    /// the order they were made; calls to different workers run concurrently.
    pub fn rpc_async<T: MaybeSend + 'static>(
        &self,
        to: &str,
        f: impl FnOnce(&mut WorkerState) -> Result<T> + MaybeSend + 'static,
    ) -> RpcFuture<T> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        match workers.get(to) {
            Some(worker) => worker.submit(f),
            None if self.order.iter().any(|n| n == to) => {
                RpcFuture::ready(Err(Error::runtime(format!("worker {to} has shut down"))))
            }
            None => RpcFuture::ready(Err(Error::runtime(format!(
                "Unknown destination worker {to}"
            )))),
        }
    }

    /// Runs `f` on worker `to` and waits for its result (native only; use
    /// [`RpcWorld::rpc_async`] in a browser).
    ///
    /// # Errors
    /// A `RuntimeError` when `to` is not a worker of this world or has shut down, or when `f`
    /// panics; otherwise whatever `f` returns.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn rpc_sync<T: MaybeSend + 'static>(
        &self,
        to: &str,
        f: impl FnOnce(&mut WorkerState) -> Result<T> + MaybeSend + 'static,
    ) -> Result<T> {
        pollster::block_on(self.rpc_async(to, f))
    }

    /// A fresh id, unique within this world (tensors' RRefs and the owners' optimizers).
    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// `rpc.remote(to, lambda: value)`: stores `value` on worker `to` and returns a reference.
    ///
    /// # Errors
    /// A `RuntimeError` when `to` is not a worker of this world or has shut down.
    pub fn remote(&self, to: &str, value: Tensor) -> Result<RRef> {
        let id = self.new_id();
        let future = self.rpc_async(to, move |state| {
            state.insert(id, value);
            Ok(())
        });
        future.now_or_wait()?;
        Ok(RRef {
            owner: to.to_string(),
            id,
        })
    }

    /// Stops worker `name` (its queued calls finish first); later calls to it and its RRefs
    /// fail with a `RuntimeError`.
    ///
    /// # Errors
    /// A `RuntimeError` when `name` is not a running worker of this world (unknown, or shut down
    /// already).
    pub fn shutdown_worker(&self, name: &str) -> Result<()> {
        let worker = self
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
            .ok_or_else(|| Error::runtime(format!("Unknown destination worker {name}")))?;
        worker.join();
        Ok(())
    }

    /// `dist_autograd.context()`: a new context; it is released when the guard drops.
    pub fn context(&self) -> AutogradContext {
        self.contexts.create()
    }

    /// Records `gradient` for `param` in context `context` on the owner; several
    /// contributions to one parameter accumulate (as autograd accumulates them).
    pub fn record_gradient(
        &self,
        context: ContextId,
        param: &RRef,
        gradient: Tensor,
    ) -> RpcFuture<()> {
        let id = param.id;
        self.rpc_async(&param.owner, move |state| {
            state.accumulate_gradient(context, id, gradient)
        })
    }

    /// `dist_autograd.get_gradients(context_id)` on worker `owner`: the gradients of the
    /// tensors that worker owns, by RRef id.
    pub fn get_gradients(
        &self,
        context: ContextId,
        owner: &str,
    ) -> RpcFuture<HashMap<u64, Tensor>> {
        self.rpc_async(owner, move |state| state.gradients(context))
    }
}

impl Drop for RpcWorld {
    fn drop(&mut self) {
        let workers: Vec<Worker> = self
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, w)| w)
            .collect();
        for worker in workers {
            worker.join();
        }
    }
}
