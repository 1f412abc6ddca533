//! `Replicas`: R ranks' copies of a model's parameters and their gradients, resident on the
//! backend.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::boundary::{JsResult, busy, js, js_error};
use super::convert::{
    count_arg, optional_tensor_from_js, optional_tensors_from_js, optional_tensors_to_js,
    param_arg, per_rank_tensors_from_js, rank_arg, tensor_from_js, tensor_to_js, tensors_from_js,
    tensors_to_js,
};
use super::handles;
use super::session::current_backend;
use super::typings::{
    IntegerArg, OptionalTensorArg, OptionalTensorListArg, PerRankTensorsArg, TensorInputArg,
    TensorListArg, WorldArg,
};
use super::world::world_of;
use distopt::error::Result;
use distopt::replicas::Replicas;
use distopt::tensor::Tensor;

/// Replicas shared by the JS object and the optimizers made over it.
pub(crate) type SharedReplicas = Rc<RefCell<Replicas>>;

/// Borrows shared replicas for a change, or reports them busy.
pub(crate) fn borrow_mut(replicas: &SharedReplicas) -> Result<std::cell::RefMut<'_, Replicas>> {
    replicas.try_borrow_mut().map_err(|_| busy("replicas"))
}

/// Borrows shared replicas for a read, or reports them busy.
pub(crate) fn borrow(replicas: &SharedReplicas) -> Result<std::cell::Ref<'_, Replicas>> {
    replicas.try_borrow().map_err(|_| busy("replicas"))
}

/// Refuses replicas whose arenas would pass the module's memory budget (`budget`), before
/// trying: a 32-bit WebAssembly module holds at most 4 GiB, and an allocation that fails there
/// aborts instead of reporting.
fn check_size(ranks: usize, params: &[Tensor]) -> Result<()> {
    let per_rank: u64 = params
        .iter()
        .map(|p| {
            let padded = p.numel().div_ceil(distopt::backend::PARAM_ALIGN_ELEMENTS)
                * distopt::backend::PARAM_ALIGN_ELEMENTS;
            padded as u64 * p.dtype().storage().element_bytes() as u64
        })
        .sum();
    let total = per_rank.saturating_mul(ranks as u64).saturating_mul(2);
    super::budget::check(
        &format!("{ranks} replicas of these parameters (their parameters and gradients)"),
        total,
    )
}

/// R ranks' copies of a model's parameters, and their gradients, resident on the backend chosen
/// by `init()` (every parameter of one dtype, for every rank, in one arena). Reads are
/// asynchronous; a change made while a read of the same replicas is pending throws a
/// `RuntimeError` ("busy").
#[wasm_bindgen(js_name = Replicas)]
pub struct ReplicasJs {
    inner: SharedReplicas,
}

/// The replicas behind a JS `Replicas` argument.
pub(crate) fn replicas_of(value: &JsValue) -> Result<SharedReplicas> {
    handles::resolve(
        value,
        "__distoptReplicas",
        "replicas must be a Replicas object",
    )
}

impl ReplicasJs {
    fn wrap(replicas: Replicas) -> ReplicasJs {
        ReplicasJs {
            inner: Rc::new(RefCell::new(replicas)),
        }
    }
}

#[wasm_bindgen(js_class = Replicas)]
impl ReplicasJs {
    /// Each rank's own parameters: `perRank[r][j]` (same count, shapes and dtypes on every
    /// rank).
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(js_name = perRank)] per_rank: PerRankTensorsArg,
    ) -> JsResult<ReplicasJs> {
        let per_rank = js(per_rank_tensors_from_js(&per_rank, "perRank"))?;
        if let Some(first) = per_rank.first() {
            js(check_size(per_rank.len(), first))?;
        }
        let backend = js(current_backend())?;
        Ok(ReplicasJs::wrap(js(Replicas::new(backend, &per_rank))?))
    }

    /// `ranks` identical replicas of `params`.
    pub fn replicate(ranks: IntegerArg, params: TensorListArg) -> JsResult<ReplicasJs> {
        let ranks = js(count_arg(&ranks, "ranks"))?;
        let params = js(tensors_from_js(&params, "params"))?;
        js(check_size(ranks, &params))?;
        let backend = js(current_backend())?;
        Ok(ReplicasJs::wrap(js(Replicas::replicate(
            backend, ranks, &params,
        ))?))
    }

    /// Hands the replicas to the call they are passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptReplicas, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// Number of ranks.
    #[wasm_bindgen(getter)]
    pub fn ranks(&self) -> JsResult<f64> {
        Ok(js(borrow(&self.inner))?.ranks() as f64)
    }

    /// Number of parameters per rank.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> JsResult<f64> {
        Ok(js(borrow(&self.inner))?.len() as f64)
    }

    /// Bytes of one rank's parameters.
    #[wasm_bindgen(getter, js_name = bytesPerRank)]
    pub fn bytes_per_rank(&self) -> JsResult<f64> {
        Ok(js(borrow(&self.inner))?.bytes_per_rank() as f64)
    }

    /// The backend the replicas live on (as `backendInfo()` describes it).
    #[wasm_bindgen(getter, unchecked_return_type = "BackendInfo")]
    pub fn backend(&self) -> JsResult<JsValue> {
        let replicas = js(borrow(&self.inner))?;
        super::session::backend_info_to_js(replicas.backend().info())
    }

    /// Parameter `j`'s shape.
    #[wasm_bindgen(unchecked_return_type = "number[]")]
    pub fn shape(&self, j: IntegerArg) -> JsResult<Vec<f64>> {
        let replicas = js(borrow(&self.inner))?;
        let j = js(param_arg(&j, replicas.len()))?;
        Ok(replicas.shape(j).iter().map(|&d| d as f64).collect())
    }

    /// Parameter `j`'s dtype.
    #[wasm_bindgen(unchecked_return_type = "DType")]
    pub fn dtype(&self, j: IntegerArg) -> JsResult<String> {
        let replicas = js(borrow(&self.inner))?;
        let j = js(param_arg(&j, replicas.len()))?;
        Ok(replicas.dtype(j).name().into())
    }

    /// Parameter `j`'s element count.
    pub fn numel(&self, j: IntegerArg) -> JsResult<f64> {
        let replicas = js(borrow(&self.inner))?;
        let j = js(param_arg(&j, replicas.len()))?;
        Ok(replicas.numel(j) as f64)
    }

    /// Overwrites every parameter of rank `rank` (shapes and dtypes must match).
    #[wasm_bindgen(js_name = setParams)]
    pub fn set_params(&self, rank: IntegerArg, params: TensorListArg) -> JsResult<()> {
        let mut replicas = js(borrow_mut(&self.inner))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        let params = js(tensors_from_js(&params, "params"))?;
        js(replicas.set_params(rank, &params))
    }

    /// Overwrites parameter `j` of rank `rank`.
    #[wasm_bindgen(js_name = setParam)]
    pub fn set_param(
        &self,
        rank: IntegerArg,
        j: IntegerArg,
        value: TensorInputArg,
    ) -> JsResult<()> {
        let mut replicas = js(borrow_mut(&self.inner))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        let j = js(param_arg(&j, replicas.len()))?;
        let value = js(tensor_from_js(&value, "value"))?;
        js(replicas.set_param(rank, j, &value))
    }

    /// Sets every gradient of rank `rank` (`null`: no gradient, as `p.grad = None`).
    #[wasm_bindgen(js_name = setGrads)]
    pub fn set_grads(&self, rank: IntegerArg, grads: OptionalTensorListArg) -> JsResult<()> {
        let mut replicas = js(borrow_mut(&self.inner))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        let grads = js(optional_tensors_from_js(&grads, "grads"))?;
        js(replicas.set_grads(rank, &grads))
    }

    /// Sets gradient `j` of rank `rank` (`null` removes it).
    #[wasm_bindgen(js_name = setGrad)]
    pub fn set_grad(
        &self,
        rank: IntegerArg,
        j: IntegerArg,
        grad: OptionalTensorArg,
    ) -> JsResult<()> {
        let mut replicas = js(borrow_mut(&self.inner))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        let j = js(param_arg(&j, replicas.len()))?;
        let grad = js(optional_tensor_from_js(&grad, "grad"))?;
        // Host-only work behind an async signature: it completes at once.
        js(super::convert::now(replicas.set_grad(rank, j, grad.as_ref())).and_then(|r| r))
    }

    /// `zero_grad(set_to_none=True)` on every rank.
    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) -> JsResult<()> {
        js(borrow_mut(&self.inner))?.zero_grad();
        Ok(())
    }

    /// Whether rank `rank` has a gradient for parameter `j`.
    #[wasm_bindgen(js_name = hasGrad)]
    pub fn has_grad(&self, rank: IntegerArg, j: IntegerArg) -> JsResult<bool> {
        let replicas = js(borrow(&self.inner))?;
        let rank = js(rank_arg(&rank, replicas.ranks()))?;
        let j = js(param_arg(&j, replicas.len()))?;
        Ok(replicas.has_grad(rank, j))
    }

    /// Copies rank `root`'s parameters (default 0) to every rank over `world`, as
    /// `DistributedDataParallel` does at construction.
    #[wasm_bindgen(js_name = broadcastParams)]
    pub fn broadcast_params(
        &self,
        world: WorldArg,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] root: JsValue,
    ) -> JsResult<()> {
        let world = js(world_of(&world))?;
        let mut replicas = js(borrow_mut(&self.inner))?;
        if world.local_ranks().len() != replicas.ranks() {
            return Err(js_error(distopt::error::Error::value(format!(
                "broadcastParams: the world has {} ranks but the replicas hold {}",
                world.local_ranks().len(),
                replicas.ranks()
            ))));
        }
        // Omitted: rank 0. `null` is no rank (a `TypeError`, as any other non-integer).
        let root = if root.is_undefined() {
            0
        } else {
            js(rank_arg(&root, replicas.ranks()))?
        };
        js(replicas.broadcast_params(world.as_ref(), root))
    }

    /// Parameter `j` of rank `rank`, read back.
    ///
    /// The replicas are held for reading from this call until the promise settles: a change
    /// made meanwhile (`setParam`, a step, …) is refused with a "busy" `RuntimeError`, so the
    /// promise resolves to the value the parameter had when `param` was called.
    #[wasm_bindgen(unchecked_return_type = "Promise<Tensor>")]
    pub fn param(&self, rank: IntegerArg, j: IntegerArg) -> JsResult<Promise> {
        let (rank, j) = self.rank_and_param(&rank, &j)?;
        let held = js(ReadGuard::new(&self.inner))?;
        Ok(future_to_promise(async move {
            let tensor = js(held.get().param(rank, j).await)?;
            drop(held);
            js(tensor_to_js(&tensor))
        }))
    }

    /// Gradient `j` of rank `rank`, read back, or `null` when it has none
    /// (held for reading until it settles, as `param`).
    #[wasm_bindgen(unchecked_return_type = "Promise<Tensor | null>")]
    pub fn grad(&self, rank: IntegerArg, j: IntegerArg) -> JsResult<Promise> {
        let (rank, j) = self.rank_and_param(&rank, &j)?;
        let held = js(ReadGuard::new(&self.inner))?;
        Ok(future_to_promise(async move {
            let grad = js(held.get().grad(rank, j).await)?;
            drop(held);
            match grad {
                Some(t) => js(tensor_to_js(&t)),
                None => Ok(JsValue::NULL),
            }
        }))
    }

    /// Every parameter of every rank (`[rank][param]`), one readback per arena (held for
    /// reading until it settles, as `param`).
    #[wasm_bindgen(unchecked_return_type = "Promise<Tensor[][]>")]
    pub fn params(&self) -> JsResult<Promise> {
        let held = js(ReadGuard::new(&self.inner))?;
        Ok(future_to_promise(async move {
            let all = js(held.get().all_params().await)?;
            drop(held);
            let out = Array::new();
            for rank in &all {
                out.push(&js(tensors_to_js(rank))?.into());
            }
            Ok(out.into())
        }))
    }

    /// Every gradient of every rank (`[rank][param]`, `null` where absent; held for reading
    /// until it settles, as `param`).
    #[wasm_bindgen(unchecked_return_type = "Promise<(Tensor | null)[][]>")]
    pub fn grads(&self) -> JsResult<Promise> {
        let held = js(ReadGuard::new(&self.inner))?;
        Ok(future_to_promise(async move {
            let all = js(held.get().all_grads().await)?;
            drop(held);
            let out = Array::new();
            for rank in &all {
                out.push(&js(optional_tensors_to_js(rank))?.into());
            }
            Ok(out.into())
        }))
    }
}

/// A shared borrow of replicas taken when a read is called and released when the read's
/// future finishes or is dropped: it owns a clone of the `Rc`, so the borrowed `RefCell`
/// outlives the borrow.
struct ReadGuard {
    // Declared first: dropped before `owner`.
    guard: Option<std::cell::Ref<'static, Replicas>>,
    owner: SharedReplicas,
}

impl ReadGuard {
    fn new(replicas: &SharedReplicas) -> Result<ReadGuard> {
        let owner = replicas.clone();
        let guard = borrow(&owner)?;
        // SAFETY: the `RefCell` lives in the `Rc` allocation that `owner` keeps alive for as
        // long as this guard exists, and `guard` is dropped before `owner` (field order and
        // `Drop` below), so the reference never outlives its referent.
        let guard: std::cell::Ref<'static, Replicas> = unsafe { std::mem::transmute(guard) };
        Ok(ReadGuard {
            guard: Some(guard),
            owner,
        })
    }

    fn get(&self) -> &Replicas {
        self.guard
            .as_ref()
            .expect("a read guard holds its borrow until dropped")
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.guard = None;
        let _ = &self.owner;
    }
}

impl ReplicasJs {
    fn rank_and_param(&self, rank: &JsValue, j: &JsValue) -> JsResult<(usize, usize)> {
        let replicas = js(borrow(&self.inner))?;
        Ok((
            js(rank_arg(rank, replicas.ranks()))?,
            js(param_arg(j, replicas.len()))?,
        ))
    }
}
