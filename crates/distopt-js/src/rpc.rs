//! `RpcWorld`, `RRef`, `AutogradContext` and `DistributedOptimizer`: the RPC framework and
//! `torch.distributed.optim.DistributedOptimizer`. In WebAssembly every call runs on the
//! caller's thread when it is made, and the workers compute on the CPU backend.

use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Array, Object, Promise};
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{array, get, optional_string, set, tensor_from_js, tensor_to_js};
use super::handles::Registry;
use super::optim::options;
use distopt::backend::CpuBackend;
use distopt::error::{Error, Result};
use distopt::rpc::{
    AutogradContext, ContextId, DistributedOptimizer, LocalOptimizerKind, RRef, RpcWorld,
};

/// What the registry tracks: the world shared with its RRefs and optimizers.
pub(crate) struct RpcWorldHandle(Arc<RpcWorld>);

/// An RRef with the world it belongs to.
pub(crate) struct RRefHandle {
    world: Rc<RpcWorldHandle>,
    rref: RRef,
}

/// What the registry tracks of an `AutogradContext`: its id.
pub(crate) struct ContextHandle(ContextId);

thread_local! {
    static RPC_WORLDS: Registry<RpcWorldHandle> = const { Registry::new() };
    static RREFS: Registry<RRefHandle> = const { Registry::new() };
    static CONTEXTS: Registry<ContextHandle> = const { Registry::new() };
}

fn rpc_world_of(value: &JsValue) -> Result<Rc<RpcWorldHandle>> {
    RPC_WORLDS.with(|r| r.resolve(value, "__distoptRpcWorldId", "rpcWorld must be an RpcWorld"))
}

/// The RRef behind a JS `RRef` argument, checked to belong to `world`.
fn rref_of(value: &JsValue, world: &Rc<RpcWorldHandle>, what: &str) -> Result<RRef> {
    let handle =
        RREFS.with(|r| r.resolve(value, "__distoptRRefId", &format!("{what} must be an RRef")))?;
    if !Rc::ptr_eq(&handle.world, world) {
        return Err(Error::value(format!("{what} belongs to another RpcWorld")));
    }
    Ok(handle.rref.clone())
}

/// A context id: a number (a non-negative integer), or a genuine `AutogradContext` (its id);
/// a plain object with an `id` is a `TypeError`, as any other value.
fn context_id(value: &JsValue) -> Result<ContextId> {
    if let Some(number) = value.as_f64() {
        return Ok(super::convert::count(number, "contextId")? as ContextId);
    }
    if value.is_object() {
        if let Ok(context) = CONTEXTS.with(|r| r.resolve(value, "__distoptContextId", "")) {
            return Ok(context.0);
        }
    }
    Err(Error::type_error(format!(
        "contextId must be a context id (a non-negative integer) or an AutogradContext, got {}",
        super::convert::describe(value)
    )))
}

/// Runs `f` (which creates a `DistributedOptimizer`) keeping only the warnings the driver
/// process would see. Natively each worker warns on its own thread; in WebAssembly its calls
/// run on the caller's thread, so the workers' copies of the functional-optimizer deprecation
/// warning are dropped here: one copy remains when the driver owns a parameter, as in
/// PyTorch.
fn without_worker_warnings<T>(driver_owns: bool, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let before = distopt::warnings::recorded_records().len();
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Off);
    let result = f();
    let mut all = distopt::warnings::take_records();
    let later = all.split_off(before.min(all.len()));
    // Put the earlier warnings back without printing them again.
    distopt::warnings::restore(all);
    log::set_max_level(level);
    let mut functional_kept = !driver_owns;
    for w in later {
        // `rpc::distributed_optimizer::FUNCTIONAL_WARNING` (not exported).
        if w.message
            .starts_with("`TorchScript` support for functional optimizers is deprecated")
        {
            if functional_kept {
                continue;
            }
            functional_kept = true;
        }
        distopt::warnings::emit(w);
    }
    result
}

fn worker_name(value: &JsValue, what: &str) -> Result<String> {
    optional_string(value, what)?
        .ok_or_else(|| Error::type_error(format!("{what} must be a worker name (a string)")))
}

/// Named workers in this process, `"driver"` (the caller) among them, each owning tensors
/// referenced by `RRef`s. The workers always compute on the CPU backend: in WebAssembly a
/// call runs inline on the caller's thread and cannot wait for a GPU readback.
#[wasm_bindgen(js_name = RpcWorld)]
pub struct RpcWorldJs {
    inner: Rc<RpcWorldHandle>,
    id: u32,
}

#[wasm_bindgen(js_class = RpcWorld)]
impl RpcWorldJs {
    /// A world of the driver plus the named workers (distinct names).
    #[wasm_bindgen(constructor)]
    pub fn new(worker_names: JsValue) -> JsResult<RpcWorldJs> {
        let names = js(array(&worker_names, "workerNames"))?
            .iter()
            .enumerate()
            .map(|(k, v)| worker_name(&v, &format!("workerNames[{k}]")))
            .collect::<Result<Vec<String>>>();
        let names = js(names)?;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let backend: Arc<dyn distopt::Backend> = Arc::new(CpuBackend::new());
        #[allow(clippy::arc_with_non_send_sync)]
        let world = Arc::new(js(RpcWorld::new(&refs, backend))?);
        let inner = Rc::new(RpcWorldHandle(world));
        let id = RPC_WORLDS.with(|r| r.register(&inner));
        Ok(RpcWorldJs { inner, id })
    }

    /// Identifies the world to the functions it is passed to (internal).
    #[wasm_bindgen(getter, js_name = __distoptRpcWorldId)]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Every worker's name, `"driver"` first.
    #[wasm_bindgen(getter, js_name = workerNames)]
    pub fn worker_names(&self) -> Vec<String> {
        self.inner.0.worker_names().to_vec()
    }

    /// `rpc.remote(worker, lambda: tensor)`: stores `tensor` on `worker`; returns its RRef.
    pub fn remote(&self, worker: JsValue, tensor: JsValue) -> JsResult<RRefJs> {
        let worker = js(worker_name(&worker, "worker"))?;
        let tensor = js(tensor_from_js(&tensor, "tensor"))?;
        let rref = js(self.inner.0.remote(&worker, tensor))?;
        let handle = Rc::new(RRefHandle {
            world: self.inner.clone(),
            rref,
        });
        let id = RREFS.with(|r| r.register(&handle));
        Ok(RRefJs { handle, id })
    }

    /// `dist_autograd.context()`: a new context; `release()` (or `free()`) ends it.
    pub fn context(&self) -> AutogradContextJs {
        let context = self.inner.0.context();
        let handle = Rc::new(ContextHandle(context.id()));
        let handle_id = CONTEXTS.with(|r| r.register(&handle));
        AutogradContextJs {
            id: context.id(),
            context: Some(context),
            handle,
            handle_id,
        }
    }

    /// Records `gradient` for `rref` in context `contextId` on its owner (contributions to
    /// one parameter accumulate): a promise.
    #[wasm_bindgen(js_name = recordGradient)]
    pub fn record_gradient(
        &self,
        context: JsValue,
        rref: JsValue,
        gradient: JsValue,
    ) -> JsResult<Promise> {
        let context = js(context_id(&context))?;
        let rref = js(rref_of(&rref, &self.inner, "rref"))?;
        let gradient = js(tensor_from_js(&gradient, "gradient"))?;
        let future = self.inner.0.record_gradient(context, &rref, gradient);
        Ok(super::boundary::promise_now(async move {
            js(future.await)?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// `dist_autograd.get_gradients(contextId)` on worker `owner`: a promise of a `Map` from
    /// RRef id to gradient.
    #[wasm_bindgen(js_name = getGradients)]
    pub fn get_gradients(&self, context: JsValue, owner: JsValue) -> JsResult<Promise> {
        let context = js(context_id(&context))?;
        let owner = js(worker_name(&owner, "owner"))?;
        let future = self.inner.0.get_gradients(context, &owner);
        Ok(super::boundary::promise_now(async move {
            let gradients = js(future.await)?;
            let mut ids: Vec<&u64> = gradients.keys().collect();
            ids.sort();
            let map = js_sys::Map::new();
            for id in ids {
                map.set(
                    &JsValue::from_f64(*id as f64),
                    &js(tensor_to_js(&gradients[id]))?,
                );
            }
            Ok(map.into())
        }))
    }

    /// The `.grad` attribute of the tensor behind `rref` on its owner (set by the
    /// `torch.optim` path of `DistributedOptimizer`): a promise of a tensor or `null`.
    #[wasm_bindgen(js_name = gradOf)]
    pub fn grad_of(&self, rref: JsValue) -> JsResult<Promise> {
        let rref = js(rref_of(&rref, &self.inner, "rref"))?;
        let id = rref.id();
        let future = self
            .inner
            .0
            .rpc_async(rref.owner(), move |state| Ok(state.grad(id).cloned()));
        Ok(super::boundary::promise_now(async move {
            match js(future.await)? {
                Some(t) => js(tensor_to_js(&t)),
                None => Ok(JsValue::NULL),
            }
        }))
    }

    /// Stops worker `name`; later calls to it and its RRefs fail with a `RuntimeError`.
    #[wasm_bindgen(js_name = shutdownWorker)]
    pub fn shutdown_worker(&self, name: JsValue) -> JsResult<()> {
        let name = js(worker_name(&name, "name"))?;
        js(self.inner.0.shutdown_worker(&name))
    }
}

/// A reference to a tensor owned by a worker of an `RpcWorld`.
#[wasm_bindgen(js_name = RRef)]
pub struct RRefJs {
    handle: Rc<RRefHandle>,
    id: u32,
}

#[wasm_bindgen(js_class = RRef)]
impl RRefJs {
    /// Identifies the RRef to the functions it is passed to (internal).
    #[wasm_bindgen(getter, js_name = __distoptRRefId)]
    pub fn handle_id(&self) -> u32 {
        self.id
    }

    /// The owning worker's name.
    #[wasm_bindgen(getter)]
    pub fn owner(&self) -> String {
        self.handle.rref.owner().into()
    }

    /// The reference's id, unique in its world (the keys of `getGradients`).
    #[wasm_bindgen(getter)]
    pub fn id(&self) -> f64 {
        self.handle.rref.id() as f64
    }

    /// A copy of the value, fetched from the owner: a promise of a tensor.
    #[wasm_bindgen(js_name = toHere)]
    pub fn to_here(&self) -> Promise {
        let future = self.handle.rref.to_here(&self.handle.world.0);
        super::boundary::promise_now(async move {
            let tensor = js(future.await)?;
            js(tensor_to_js(&tensor))
        })
    }
}

/// A distributed autograd context (`dist_autograd.context()`); `release()` ends it and
/// drops the gradients recorded in it.
#[wasm_bindgen(js_name = AutogradContext)]
pub struct AutogradContextJs {
    id: ContextId,
    context: Option<AutogradContext>,
    /// Keeps the registry's entry alive while the JS object lives.
    #[allow(dead_code)]
    handle: Rc<ContextHandle>,
    handle_id: u32,
}

#[wasm_bindgen(js_class = AutogradContext)]
impl AutogradContextJs {
    /// Identifies the context to the functions it is passed to (internal).
    #[wasm_bindgen(getter, js_name = __distoptContextId)]
    pub fn handle_id(&self) -> u32 {
        self.handle_id
    }

    /// The context id.
    #[wasm_bindgen(getter)]
    pub fn id(&self) -> f64 {
        self.id as f64
    }

    /// Whether the context is still live.
    #[wasm_bindgen(getter)]
    pub fn live(&self) -> bool {
        self.context.is_some()
    }

    /// Ends the context (idempotent).
    pub fn release(&mut self) {
        self.context = None;
    }
}

/// `torch.distributed.optim.DistributedOptimizer`: one local optimizer per worker that owns
/// parameters, stepped from the gradients of a distributed autograd context.
#[wasm_bindgen(js_name = DistributedOptimizer)]
pub struct DistributedOptimizerJs {
    inner: Rc<DistributedOptimizer>,
}

#[wasm_bindgen(js_class = DistributedOptimizer)]
impl DistributedOptimizerJs {
    /// Groups `rrefs` by owner and creates on each owner a local optimizer of class
    /// `optimizer` (`"SGD"`, `"Adam"`, `"AdamW"`) with `options`. `{functional}` (default
    /// `true`): the functional optimizers (a parameter without a gradient in the context is
    /// skipped) or the `torch.optim` path (gradients persist in `param.grad`).
    #[wasm_bindgen(constructor)]
    pub fn new(
        rpc_world: JsValue,
        optimizer: JsValue,
        rrefs: JsValue,
        options_value: JsValue,
        settings: JsValue,
    ) -> JsResult<DistributedOptimizerJs> {
        js(Self::build(
            &rpc_world,
            &optimizer,
            &rrefs,
            &options_value,
            &settings,
        ))
    }

    fn build(
        rpc_world: &JsValue,
        optimizer: &JsValue,
        rrefs: &JsValue,
        options_value: &JsValue,
        settings: &JsValue,
    ) -> Result<DistributedOptimizerJs> {
        let world = rpc_world_of(rpc_world)?;
        let name = super::optim::optimizer_class(optimizer, "optimizer")?
            .ok_or_else(|| Error::type_error("optimizer must be \"SGD\", \"Adam\" or \"AdamW\""))?;
        let params = array(rrefs, "rrefs")?
            .iter()
            .enumerate()
            .map(|(i, v)| rref_of(&v, &world, &format!("rrefs[{i}]")))
            .collect::<Result<Vec<RRef>>>()?;
        let options = options(options_value)?;
        let functional = if settings.is_undefined() || settings.is_null() {
            true
        } else if settings.is_object() && !Array::is_array(settings) {
            let flag = get(settings, "functional");
            if flag.is_undefined() || flag.is_null() {
                true
            } else {
                flag.as_bool()
                    .ok_or_else(|| Error::type_error("settings.functional must be a boolean"))?
            }
        } else {
            return Err(Error::type_error(
                "settings must be an object {functional: boolean}",
            ));
        };
        let kind = if functional {
            LocalOptimizerKind::Functional
        } else {
            LocalOptimizerKind::TorchOptim
        };
        let driver_owns = params.iter().any(|p| p.owner() == distopt::rpc::DRIVER);
        let inner = without_worker_warnings(driver_owns, || {
            DistributedOptimizer::new(world.0.clone(), &name, &params, &options, kind)
        })?;
        Ok(DistributedOptimizerJs {
            inner: Rc::new(inner),
        })
    }

    /// Whether the owners run functional optimizers.
    #[wasm_bindgen(getter, js_name = isFunctionalOptim)]
    pub fn is_functional_optim(&self) -> bool {
        self.inner.is_functional_optim()
    }

    /// One entry per owner, in order of first appearance: `{owner, paramIndices}`.
    #[wasm_bindgen(js_name = localOptimizers)]
    pub fn local_optimizers(&self) -> Array {
        self.inner
            .local_optimizers()
            .into_iter()
            .map(|info| {
                let obj = Object::new();
                set(&obj, "owner", info.owner.as_str());
                let indices: Array = info
                    .param_indices
                    .iter()
                    .map(|&i| JsValue::from_f64(i as f64))
                    .collect();
                set(&obj, "paramIndices", indices);
                JsValue::from(obj)
            })
            .collect()
    }

    /// `step(contextId)`: every owner updates its parameters from the context's gradients;
    /// a promise (rejected with the first owner's error).
    pub fn step(&self, context: JsValue) -> JsResult<Promise> {
        let context = js(context_id(&context))?;
        let inner = self.inner.clone();
        Ok(super::boundary::promise_now(async move {
            js(inner.step(context).await)?;
            Ok(JsValue::UNDEFINED)
        }))
    }
}
