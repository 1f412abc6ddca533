//! `RpcWorld`, `RRef`, `AutogradContext` and `DistributedOptimizer`: the RPC framework and
//! `torch.distributed.optim.DistributedOptimizer`. In WebAssembly every call runs on the
//! caller's thread when it is made, and the workers compute on the CPU backend.

use std::rc::Rc;
use std::sync::Arc;

use js_sys::Promise;
use serde::{Deserialize, Serialize};
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{array, optional_string, or_undefined, tensor_from_js, tensor_to_js};
use super::handles;
use super::optim::options;
use super::settings::{options_naming, read_js};
use super::typings::{OptimizerClassArg, OptimizerOptionsArg, StringArg, TensorInputArg};
use distopt::backend::CpuBackend;
use distopt::error::{Error, Result};
use distopt::rpc::{
    AutogradContext, ContextId, DistributedOptimizer, LocalOptimizerKind, RRef, RpcWorld,
};

#[wasm_bindgen]
extern "C" {
    /// An `RpcWorld` made by distopt.
    #[wasm_bindgen(typescript_type = "RpcWorld")]
    pub type RpcWorldArg;

    /// An `RRef` made by distopt.
    #[wasm_bindgen(typescript_type = "RRef")]
    pub type RRefArg;

    /// A list of `RRef`s.
    #[wasm_bindgen(typescript_type = "readonly RRef[]")]
    pub type RRefListArg;

    /// A context id or the `AutogradContext` itself.
    #[wasm_bindgen(typescript_type = "number | AutogradContext")]
    pub type ContextIdArg;

    /// The names of an `RpcWorld`'s workers.
    #[wasm_bindgen(typescript_type = "readonly string[]")]
    pub type WorkerNamesArg;

    /// What `DistributedOptimizer` runs on each owner.
    #[wasm_bindgen(typescript_type = "DistributedOptimizerSettings")]
    pub type DistributedOptimizerSettingsArg;
}

#[wasm_bindgen(typescript_custom_section)]
const OPTIMIZER_CLASS: &'static str = r#"
/**
 * A local optimizer class where ZeRO and `DistributedOptimizer` take one (as PyTorch takes
 * `torch.optim.Adam`); its name (`'SGD'`, `'Adam'`, `'AdamW'`) is accepted too.
 */
export type OptimizerClass = typeof SGD | typeof Adam | typeof AdamW;
"#;

/// The world shared with its RRefs and optimizers.
pub(crate) struct RpcWorldHandle(Arc<RpcWorld>);

/// An RRef with the world it belongs to.
pub(crate) struct RRefHandle {
    world: Rc<RpcWorldHandle>,
    rref: RRef,
}

/// What an `AutogradContext` hands over: its id.
pub(crate) struct ContextHandle(ContextId);

fn rpc_world_of(value: &JsValue) -> Result<Rc<RpcWorldHandle>> {
    handles::resolve(value, "__distoptRpcWorld", "rpcWorld must be an RpcWorld")
}

/// The RRef behind a JS `RRef` argument, checked to belong to `world`.
fn rref_of(value: &JsValue, world: &Rc<RpcWorldHandle>, what: &str) -> Result<RRef> {
    let handle: Rc<RRefHandle> =
        handles::resolve(value, "__distoptRRef", &format!("{what} must be an RRef"))?;
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
        if let Ok(context) = handles::resolve::<ContextHandle>(value, "__distoptContext", "") {
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

/// Named workers in this process plus `"driver"` (the caller), each owning tensors referenced
/// by `RRef`s, with distributed autograd contexts that collect gradients per remote tensor.
///
/// In WebAssembly every call runs inline, on the caller's thread, when it is made, and the
/// workers always compute on the **CPU backend** whatever `init()` chose: a call cannot wait
/// for a GPU readback there. Worker names must be distinct strings (a ValueError otherwise);
/// calling an unknown worker is a RuntimeError.
#[wasm_bindgen(js_name = RpcWorld)]
pub struct RpcWorldJs {
    inner: Rc<RpcWorldHandle>,
}

#[wasm_bindgen(js_class = RpcWorld)]
impl RpcWorldJs {
    /// A world of the driver plus the named workers (distinct names).
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(js_name = workerNames)] worker_names: WorkerNamesArg,
    ) -> JsResult<RpcWorldJs> {
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
        Ok(RpcWorldJs { inner })
    }

    /// Hands the world to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptRpcWorld, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// Every worker's name, `"driver"` first.
    #[wasm_bindgen(getter, js_name = workerNames)]
    pub fn worker_names(&self) -> Vec<String> {
        self.inner.0.worker_names().to_vec()
    }

    /// `rpc.remote(worker, lambda: tensor)`: stores `tensor` on `worker`; returns its RRef.
    pub fn remote(&self, worker: StringArg, tensor: TensorInputArg) -> JsResult<RRefJs> {
        let worker = js(worker_name(&worker, "worker"))?;
        let tensor = js(tensor_from_js(&tensor, "tensor"))?;
        let rref = js(self.inner.0.remote(&worker, tensor))?;
        let handle = Rc::new(RRefHandle {
            world: self.inner.clone(),
            rref,
        });
        Ok(RRefJs { handle })
    }

    /// `dist_autograd.context()`: a new live context; `release()` (or `free()`) ends it.
    pub fn context(&self) -> AutogradContextJs {
        let context = self.inner.0.context();
        AutogradContextJs {
            id: context.id(),
            context: Some(context),
        }
    }

    /// Records `gradient` for `rref` in context `contextId` on its owner; contributions to one
    /// tensor accumulate. Rejects with a RuntimeError for a context that is not live.
    #[wasm_bindgen(js_name = recordGradient, unchecked_return_type = "Promise<void>")]
    pub fn record_gradient(
        &self,
        context: ContextIdArg,
        rref: RRefArg,
        gradient: TensorInputArg,
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

    /// `dist_autograd.get_gradients(contextId)` on worker `owner`: gradients by RRef id (a
    /// `Map`).
    #[wasm_bindgen(
        js_name = getGradients,
        unchecked_return_type = "Promise<Map<number, Tensor>>"
    )]
    pub fn get_gradients(&self, context: ContextIdArg, owner: StringArg) -> JsResult<Promise> {
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
    /// `torch.optim` path of `DistributedOptimizer`), or `null`.
    #[wasm_bindgen(js_name = gradOf, unchecked_return_type = "Promise<Tensor | null>")]
    pub fn grad_of(&self, rref: RRefArg) -> JsResult<Promise> {
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

    /// Stops worker `name`; later calls to it and its RRefs are RuntimeErrors.
    #[wasm_bindgen(js_name = shutdownWorker)]
    pub fn shutdown_worker(&self, name: StringArg) -> JsResult<()> {
        let name = js(worker_name(&name, "name"))?;
        js(self.inner.0.shutdown_worker(&name))
    }
}

/// A reference to a tensor owned by a worker of an `RpcWorld`.
#[wasm_bindgen(js_name = RRef)]
pub struct RRefJs {
    handle: Rc<RRefHandle>,
}

#[wasm_bindgen(js_class = RRef)]
impl RRefJs {
    /// Hands the RRef to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptRRef, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.handle.clone());
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

    /// A copy of the value, fetched from the owner.
    #[wasm_bindgen(js_name = toHere, unchecked_return_type = "Promise<Tensor>")]
    pub fn to_here(&self) -> Promise {
        let future = self.handle.rref.to_here(&self.handle.world.0);
        super::boundary::promise_now(async move {
            let tensor = js(future.await)?;
            js(tensor_to_js(&tensor))
        })
    }
}

/// A distributed autograd context (`dist_autograd.context()`).
#[wasm_bindgen(js_name = AutogradContext)]
pub struct AutogradContextJs {
    id: ContextId,
    context: Option<AutogradContext>,
}

#[wasm_bindgen(js_class = AutogradContext)]
impl AutogradContextJs {
    /// Hands the context's id to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptContext, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(Rc::new(ContextHandle(self.id)));
    }

    /// The context id (pass it to `recordGradient`, `getGradients`,
    /// `DistributedOptimizer.step`).
    #[wasm_bindgen(getter)]
    pub fn id(&self) -> f64 {
        self.id as f64
    }

    /// Whether the context is still live.
    #[wasm_bindgen(getter)]
    pub fn live(&self) -> bool {
        self.context.is_some()
    }

    /// Ends the context and drops its gradients (idempotent; `free()` does it too).
    pub fn release(&mut self) {
        self.context = None;
    }
}

/// What `DistributedOptimizer` runs on each owner.
#[derive(Deserialize, Tsify)]
pub struct DistributedOptimizerSettings {
    /// `true` (default, PyTorch's with TorchScript on): functional optimizers, which skip a
    /// parameter without a gradient in the context. `false`: the `torch.optim` path, where the
    /// context's gradients are assigned to `param.grad` and persist across steps.
    #[tsify(optional)]
    functional: Option<bool>,
}

/// `DistributedOptimizer`'s settings: whether the owners run functional optimizers.
fn functional(settings: &JsValue) -> Result<bool> {
    let s: Option<DistributedOptimizerSettings> = read_js(
        settings,
        "settings",
        "settings must be an object {functional: boolean}",
        &options_naming("DistributedOptimizer", |key| format!("settings.{key}")),
    )?;
    Ok(s.and_then(|s| s.functional).unwrap_or(true))
}

/// One owner's local optimizer.
#[derive(Serialize, Tsify)]
#[tsify(missing_as_null)]
#[serde(rename_all = "camelCase")]
pub struct LocalOptimizerInfo {
    /// The owning worker.
    owner: String,
    /// Indices (into the constructor's `rrefs`) of the parameters it optimizes.
    param_indices: Vec<usize>,
}

/// `torch.distributed.optim.DistributedOptimizer`: one local optimizer per worker that owns
/// parameters (in order of first appearance), stepped from a distributed autograd context's
/// gradients. No communication between owners, no averaging.
#[wasm_bindgen(js_name = DistributedOptimizer)]
pub struct DistributedOptimizerJs {
    inner: Rc<DistributedOptimizer>,
}

#[wasm_bindgen(js_class = DistributedOptimizer)]
impl DistributedOptimizerJs {
    /// Groups `rrefs` by owner and creates on each owner a local optimizer of class
    /// `optimizer` with `options`; `settings` chooses what the owners run.
    ///
    /// @throws ValueError for an unknown optimizer class or an RRef of another world; TypeError for
    ///   something that is not an RRef; PyTorch's errors for invalid options.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(js_name = rpcWorld)] rpc_world: RpcWorldArg,
        optimizer: OptimizerClassArg,
        rrefs: RRefListArg,
        #[wasm_bindgen(js_name = options)] options_value: Option<OptimizerOptionsArg>,
        settings: Option<DistributedOptimizerSettingsArg>,
    ) -> JsResult<DistributedOptimizerJs> {
        let options_value = or_undefined(options_value);
        let settings = or_undefined(settings);
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
        let functional = functional(settings)?;
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

    /// One entry per owner, in order of first appearance.
    #[wasm_bindgen(js_name = localOptimizers, unchecked_return_type = "LocalOptimizerInfo[]")]
    pub fn local_optimizers(&self) -> JsResult<JsValue> {
        let infos: Vec<LocalOptimizerInfo> = self
            .inner
            .local_optimizers()
            .into_iter()
            .map(|info| LocalOptimizerInfo {
                owner: info.owner,
                param_indices: info.param_indices,
            })
            .collect();
        super::typings::to_js(&infos)
    }

    /// One step on every owner, from the context's gradients; rejects with the first owner's
    /// error (RuntimeError for a dead context).
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn step(&self, context: ContextIdArg) -> JsResult<Promise> {
        let context = js(context_id(&context))?;
        let inner = self.inner.clone();
        Ok(super::boundary::promise_now(async move {
            js(inner.step(context).await)?;
            Ok(JsValue::UNDEFINED)
        }))
    }
}
