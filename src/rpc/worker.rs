//! One worker: the tensors it owns, its gradient contexts, the objects that calls leave on it
//! (the local optimizers of `DistributedOptimizer`, …), and the queue of calls it runs (a thread
//! natively; the caller's thread on wasm32).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::context::{ContextId, Contexts};
use crate::backend::oneshot;
use crate::backend::{Backend, MaybeSend};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What a worker holds; calls run with exclusive access to it.
pub struct WorkerState {
    name: String,
    backend: Arc<dyn Backend>,
    contexts: Arc<Contexts>,
    values: HashMap<u64, Tensor>,
    /// `param.grad` of owned tensors (set by the `torch.optim` path of DistributedOptimizer).
    grad_attr: HashMap<u64, Tensor>,
    context_gradients: HashMap<ContextId, HashMap<u64, Tensor>>,
    /// The objects calls keep on this worker, one table per type (see [`WorkerState::table`]).
    tables: HashMap<TypeId, Table>,
}

/// One table of [`WorkerState::table`]: whatever type its user keeps there.
#[cfg(not(target_arch = "wasm32"))]
type Table = Box<dyn Any + Send>;
#[cfg(target_arch = "wasm32")]
type Table = Box<dyn Any>;

impl WorkerState {
    /// This worker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend this worker computes on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The value of owned tensor `id`.
    ///
    /// # Errors
    /// A `RuntimeError` when this worker owns no tensor with that id.
    pub fn value(&self, id: u64) -> Result<&Tensor> {
        self.values.get(&id).ok_or_else(|| {
            Error::runtime(format!(
                "worker {} owns no tensor with RRef id {id}",
                self.name
            ))
        })
    }

    /// Stores (or replaces) owned tensor `id`.
    pub fn insert(&mut self, id: u64, value: Tensor) {
        self.values.insert(id, value);
    }

    /// `param.grad` of owned tensor `id`.
    pub fn grad(&self, id: u64) -> Option<&Tensor> {
        self.grad_attr.get(&id)
    }

    pub(crate) fn set_grad(&mut self, id: u64, grad: Tensor) {
        self.grad_attr.insert(id, grad);
    }

    /// The table of type `T` that calls keep on this worker (created empty on first use): the
    /// worker holds objects of kinds it does not know (a `DistributedOptimizer`'s local
    /// optimizers live in one), each kind in a table of its own type.
    pub(crate) fn table<T: Any + Default + MaybeSend>(&mut self) -> &mut T {
        self.tables
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .downcast_mut()
            .expect("a table is stored under its own type")
    }

    /// Adds `gradient` to the gradient of tensor `id` in context `context`.
    ///
    /// # Errors
    /// A `RuntimeError` when `context` is not a live context or this worker owns no tensor `id`, or
    /// when `gradient` differs from the tensor in dtype; a `ValueError` when it differs in shape;
    /// when a gradient is already recorded, a `RuntimeError` if either is device-resident (the sum
    /// is taken on the host) or the sum does not fit the memory budget.
    pub fn accumulate_gradient(
        &mut self,
        context: ContextId,
        id: u64,
        gradient: Tensor,
    ) -> Result<()> {
        self.contexts.check(context)?;
        let value = self.value(id)?;
        let mismatch = || {
            format!(
                "gradient of {} {:?} for a {} {:?} tensor",
                gradient.dtype(),
                gradient.shape(),
                value.dtype(),
                value.shape()
            )
        };
        if value.dtype() != gradient.dtype() {
            // A gradient of another dtype than its tensor: `RuntimeError`, as `param.grad = grad`
            // (the library's dtype rule, see `Replicas`).
            return Err(Error::runtime(format!(
                "assigned grad has data of a different type: {}",
                mismatch()
            )));
        }
        if value.shape() != gradient.shape() {
            return Err(Error::value(mismatch()));
        }
        let contexts = self.contexts.clone();
        self.context_gradients
            .retain(|&c, _| c == context || contexts.check(c).is_ok());
        let entry = self.context_gradients.entry(context).or_default();
        let sum = match entry.remove(&id) {
            None => gradient,
            Some(previous) => {
                let (a, b) = (previous.values_f64()?, gradient.values_f64()?);
                let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
                Tensor::from_f64(previous.dtype(), previous.shape(), &sum)?
            }
        };
        entry.insert(id, sum);
        Ok(())
    }

    /// The gradients recorded in `context` for the tensors this worker owns.
    ///
    /// # Errors
    /// A `RuntimeError` when `context` is not a live context.
    pub fn gradients(&self, context: ContextId) -> Result<HashMap<u64, Tensor>> {
        self.contexts.check(context)?;
        Ok(self
            .context_gradients
            .get(&context)
            .cloned()
            .unwrap_or_default())
    }
}

#[cfg(not(target_arch = "wasm32"))]
type Job = Box<dyn FnOnce(&mut WorkerState) + Send>;

/// The result of an RPC call, as a future.
pub struct RpcFuture<T> {
    inner: FutureState<T>,
}

enum FutureState<T> {
    Ready(Option<Result<T>>),
    // On wasm32 every call completes when it is made.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Waiting(oneshot::Receiver<Result<T>>),
}

impl<T> RpcFuture<T> {
    pub(crate) fn ready(result: Result<T>) -> Self {
        RpcFuture {
            inner: FutureState::Ready(Some(result)),
        }
    }

    /// Waits for the result (natively blocks; on wasm32 calls complete when made).
    ///
    /// # Errors
    /// The call's error (see [`RpcWorld::rpc_async`](super::RpcWorld::rpc_async)); on wasm32 also a
    /// `RuntimeError` when the call did not complete when it was made.
    pub fn now_or_wait(self) -> Result<T> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(self)
        }
        #[cfg(target_arch = "wasm32")]
        match self.inner {
            FutureState::Ready(result) => {
                result.unwrap_or_else(|| Err(Error::runtime("result already taken")))
            }
            FutureState::Waiting(_) => Err(Error::runtime("an RPC did not complete synchronously")),
        }
    }
}

// Nothing in an RpcFuture is pinned structurally: the value is only ever moved out.
impl<T> Unpin for RpcFuture<T> {}

impl<T> Future for RpcFuture<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        match &mut self.get_mut().inner {
            FutureState::Ready(result) => Poll::Ready(
                result
                    .take()
                    .unwrap_or_else(|| Err(Error::runtime("result already taken"))),
            ),
            FutureState::Waiting(receiver) => Pin::new(receiver).poll(cx),
        }
    }
}

pub(crate) struct Worker {
    #[cfg(not(target_arch = "wasm32"))]
    sender: std::sync::mpsc::Sender<Job>,
    #[cfg(not(target_arch = "wasm32"))]
    thread: std::thread::JoinHandle<()>,
    #[cfg(target_arch = "wasm32")]
    state: std::sync::Mutex<WorkerState>,
}

impl Worker {
    pub(crate) fn spawn(
        name: &str,
        backend: Arc<dyn Backend>,
        contexts: Arc<Contexts>,
    ) -> Result<Worker> {
        let mut state = WorkerState {
            name: name.to_string(),
            backend,
            contexts,
            values: HashMap::new(),
            grad_attr: HashMap::new(),
            context_gradients: HashMap::new(),
            tables: HashMap::new(),
        };
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (sender, receiver) = std::sync::mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("distopt-rpc-{name}"))
                .spawn(move || {
                    for job in receiver {
                        job(&mut state);
                    }
                })
                .map_err(|e| Error::runtime(format!("cannot start worker {name}: {e}")))?;
            Ok(Worker { sender, thread })
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = &mut state;
            Ok(Worker {
                state: std::sync::Mutex::new(state),
            })
        }
    }

    pub(crate) fn submit<T: MaybeSend + 'static>(
        &self,
        f: impl FnOnce(&mut WorkerState) -> Result<T> + MaybeSend + 'static,
    ) -> RpcFuture<T> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (sender, receiver) = oneshot::channel();
            let job: Job = Box::new(move |state| {
                // A panicking call must not take the worker down: report it to the caller.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(state)))
                    .unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(Error::runtime(format!(
                            "worker {} failed: {message}",
                            state.name
                        )))
                    });
                sender.send(result);
            });
            match self.sender.send(job) {
                Ok(()) => RpcFuture {
                    inner: FutureState::Waiting(receiver),
                },
                Err(_) => RpcFuture::ready(Err(Error::runtime("the worker has shut down"))),
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            RpcFuture::ready(f(&mut state))
        }
    }

    /// Finishes the queued calls and stops the worker.
    pub(crate) fn join(self) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            drop(self.sender);
            let _ = self.thread.join();
        }
    }
}
