//! `torch.distributed.optim.DistributedOptimizer`: one local optimizer per worker that owns
//! parameters, stepped concurrently from the gradients of a distributed autograd context.

use std::sync::Arc;

use super::context::ContextId;
use super::worker::WorkerState;
use super::{RRef, RpcFuture, RpcWorld};
use crate::error::{Error, Result};
use crate::optim::{self, LocalOptimizer, OptimizerKind, OptionMap};
use crate::replicas::Replicas;

/// Which local optimizer each owner runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalOptimizerKind {
    /// The functional optimizer (PyTorch's default for SGD/Adam/AdamW with TorchScript on): a
    /// parameter without a gradient in the context is skipped; `param.grad` is never set.
    Functional,
    /// A plain `torch.optim` optimizer (`PYTORCH_JIT=0`, or a class without a functional
    /// form): gradients in the context are assigned to `param.grad`, which persists, so a
    /// parameter unused in a step is updated again with its previous gradient.
    TorchOptim,
}

/// The deprecation warning each owner emits when it creates a functional optimizer.
pub const FUNCTIONAL_WARNING: &str = "`TorchScript` support for functional optimizers is deprecated and will be removed in a future PyTorch release. Consider using the `torch.compile` optimizer instead.";

/// The local optimizer of one owner, living on that worker.
struct OwnerOptimizer {
    id: u64,
    kind: LocalOptimizerKind,
    params: Vec<u64>,
    replicas: Replicas,
    optim: Box<dyn LocalOptimizer>,
}

/// The local optimizers of every `DistributedOptimizer` over one worker: its table of them
/// ([`WorkerState::table`]).
#[derive(Default)]
struct OwnerOptimizers(Vec<OwnerOptimizer>);

impl OwnerOptimizer {
    fn step(&mut self, state_values: &mut WorkerState, context: ContextId) -> Result<()> {
        let gradients = state_values.gradients(context)?;
        let mut values = Vec::with_capacity(self.params.len());
        let mut grads = Vec::with_capacity(self.params.len());
        for &id in &self.params {
            values.push(state_values.value(id)?.clone());
            let grad = match self.kind {
                LocalOptimizerKind::Functional => gradients.get(&id).cloned(),
                LocalOptimizerKind::TorchOptim => {
                    if let Some(g) = gradients.get(&id) {
                        state_values.set_grad(id, g.clone());
                    }
                    state_values.grad(id).cloned()
                }
            };
            grads.push(grad);
        }
        self.replicas.set_params(0, &values)?;
        self.replicas.set_grads(0, &grads)?;
        self.optim.step(&mut self.replicas)?;
        let updated = read_params(&self.replicas)?;
        for (&id, value) in self.params.iter().zip(updated) {
            state_values.insert(id, value);
        }
        Ok(())
    }
}

fn read_params(replicas: &Replicas) -> Result<Vec<crate::Tensor>> {
    let future = replicas.all_params();
    #[cfg(not(target_arch = "wasm32"))]
    let mut all = pollster::block_on(future)?;
    #[cfg(target_arch = "wasm32")]
    let mut all = poll_ready(future)?;
    Ok(all.swap_remove(0))
}

/// Resolves a future that is ready at once (host arenas); on wasm32 nothing may block.
#[cfg(target_arch = "wasm32")]
fn poll_ready<T>(future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => result,
        Poll::Pending => Err(Error::runtime(
            "RPC workers in a browser need the CPU backend: a device readback cannot complete inside a call",
        )),
    }
}

/// One owner's local optimizer, as [`DistributedOptimizer::local_optimizers`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptimizerInfo {
    /// The owning worker.
    pub owner: String,
    /// Indices (into the constructor's parameter list) of the parameters it optimizes.
    pub param_indices: Vec<usize>,
}

/// `DistributedOptimizer(optimizer_class, params_rref, **options)`.
#[derive(Debug)]
pub struct DistributedOptimizer {
    world: Arc<RpcWorld>,
    kind: LocalOptimizerKind,
    owners: Vec<(LocalOptimizerInfo, u64)>,
}

impl DistributedOptimizer {
    /// Groups `params` by owner (in order of first appearance) and creates, on every owner,
    /// one local optimizer of class `name` (`"SGD"`, `"Adam"`, `"AdamW"`) with `options`.
    ///
    /// # Errors
    /// A `ValueError` for an unknown class; from an owner, a `RuntimeError` when it is unknown or
    /// shut down or does not own a referenced tensor, a `ValueError` when one is device-resident,
    /// and the local optimizer's constructor errors ([`optim::build`]: a `TypeError` for an unknown
    /// keyword, a `ValueError` for an invalid hyper-parameter). The first owner's error in owner
    /// order is returned; owners that succeeded keep their local optimizer.
    pub fn new(
        world: Arc<RpcWorld>,
        name: &str,
        params: &[RRef],
        options: &OptionMap,
        kind: LocalOptimizerKind,
    ) -> Result<DistributedOptimizer> {
        let class: OptimizerKind = name.parse()?;
        if kind == LocalOptimizerKind::TorchOptim {
            // A `logger.warning` in PyTorch.
            crate::warnings::emit(crate::warnings::Warning::logged(format!(
                "Creating the optimizer <class '{}'> without a functional optimizer, this might result in slow computation time in multithreading environment(i.e. Distributed Model Parallel training on CPU) due to the Python's Global Interpreter Lock (GIL). Please file an issue if you need a functional optimizer for this optimizer. ",
                class.class_path()
            )));
        }
        let mut owners: Vec<LocalOptimizerInfo> = Vec::new();
        for (i, rref) in params.iter().enumerate() {
            match owners.iter_mut().find(|o| o.owner == rref.owner) {
                Some(o) => o.param_indices.push(i),
                None => owners.push(LocalOptimizerInfo {
                    owner: rref.owner.clone(),
                    param_indices: vec![i],
                }),
            }
        }
        let mut created = Vec::with_capacity(owners.len());
        let mut futures = Vec::new();
        for info in &owners {
            let ids: Vec<u64> = info.param_indices.iter().map(|&i| params[i].id).collect();
            let options = options.clone();
            // Unique in the world: two DistributedOptimizers over one owner never share one.
            let optimizer_id = world.new_id();
            let driver_thread = info.owner == super::DRIVER;
            if driver_thread && kind == LocalOptimizerKind::Functional {
                // Each owner warns in its own process; the driver's shows in the driver.
                crate::warnings::emit(crate::warnings::Warning::of_class(
                    FUNCTIONAL_WARNING,
                    "DeprecationWarning",
                ));
            }
            futures.push(world.rpc_async(&info.owner, move |state| {
                if kind == LocalOptimizerKind::Functional {
                    crate::warnings::emit(crate::warnings::Warning::of_class(
                        FUNCTIONAL_WARNING,
                        "DeprecationWarning",
                    ));
                }
                let values: Vec<crate::Tensor> = ids
                    .iter()
                    .map(|&id| state.value(id).cloned())
                    .collect::<Result<_>>()?;
                let replicas = Replicas::replicate(state.backend().clone(), 1, &values)?;
                let optim = optim::build(
                    class,
                    &replicas,
                    vec![((0..ids.len()).collect(), OptionMap::new())],
                    &options,
                )?;
                state.table::<OwnerOptimizers>().0.push(OwnerOptimizer {
                    id: optimizer_id,
                    kind,
                    params: ids,
                    replicas,
                    optim,
                });
                Ok(())
            }));
            created.push((info.clone(), optimizer_id));
        }
        let results: Vec<Result<()>> = futures.into_iter().map(|f| f.now_or_wait()).collect();
        if let Some(error) = results.iter().find_map(|r| r.as_ref().err().cloned()) {
            // Nothing is left behind: the owners that built their optimizer drop it again.
            for ((info, id), result) in created.iter().zip(&results) {
                if result.is_ok() {
                    let id = *id;
                    let _ = world
                        .rpc_async(&info.owner, move |state| {
                            state.table::<OwnerOptimizers>().0.retain(|o| o.id != id);
                            Ok(())
                        })
                        .now_or_wait();
                }
            }
            return Err(error);
        }
        Ok(DistributedOptimizer {
            world,
            kind,
            owners: created,
        })
    }

    /// Whether the owners run functional optimizers.
    pub fn is_functional_optim(&self) -> bool {
        self.kind == LocalOptimizerKind::Functional
    }

    /// One entry per owner, in order of first appearance.
    pub fn local_optimizers(&self) -> Vec<LocalOptimizerInfo> {
        self.owners.iter().map(|(info, _)| info.clone()).collect()
    }

    /// `step(context_id)`: validates the context, starts every owner's step, then waits for
    /// all of them; the first owner's error (in owner order) is returned.
    ///
    /// # Errors
    /// A `RuntimeError` when `context` is not a live context (before any owner steps); from an
    /// owner, a `RuntimeError` when it is unknown or shut down, no longer owns a parameter, or its
    /// local optimizer is gone, a `ValueError` or `TypeError` when a parameter's value no longer
    /// fits its replica (shape, dtype, a device-resident tensor), and the local optimizer's errors
    /// ([`LocalOptimizer::step`]).
    pub async fn step(&self, context: ContextId) -> Result<()> {
        self.world.contexts.check(context)?;
        // Every owner's update is issued before any is awaited: they run concurrently.
        let futures: Vec<RpcFuture<()>> = self
            .owners
            .iter()
            .map(|(info, id)| {
                let id = *id;
                self.world.rpc_async(&info.owner, move |state| {
                    let optimizers = &mut state.table::<OwnerOptimizers>().0;
                    let position = optimizers
                        .iter()
                        .position(|o| o.id == id)
                        .ok_or_else(|| Error::runtime("the local optimizer is gone"))?;
                    let mut optimizer = optimizers.remove(position);
                    let result = optimizer.step(state, context);
                    state
                        .table::<OwnerOptimizers>()
                        .0
                        .insert(position, optimizer);
                    result
                })
            })
            .collect();
        let mut first_error = None;
        for future in futures {
            if let Err(err) = future.await {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
