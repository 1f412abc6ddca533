//! The JavaScript face of distopt, compiled for `wasm32` only and published as the npm package
//! `distopt` (see `npm/` and `docs/javascript.md`).
//!
//! This layer is thin: it converts JS values to the library's types, validates what JS can get
//! wrong that Rust's types rule out (integers, indices, array shapes), calls the library, and
//! converts back. No algorithm lives here. Every failure becomes a thrown JS `Error` whose
//! `name` is the Python exception class (`ValueError`, `TypeError`, `RuntimeError`,
//! `IndexError`, `ZeroDivisionError`) and whose `message` is the library's message; nothing
//! traps.
//!
//! Objects that JS may use while an asynchronous read of them is in flight (replicas,
//! optimizers) live in `Rc<RefCell<…>>`: a call that would need an object that a pending read
//! still holds is a `RuntimeError`, never a panic.

// The bindings exist for wasm32 only; on other targets this crate is empty.
#![cfg(target_arch = "wasm32")]
// The exports' failures are JS exceptions, documented (name and text) where JS users read them:
// npm/index.d.ts and docs/javascript.md, not in `# Errors` sections of rustdoc nobody sees.
#![allow(clippy::missing_errors_doc)]

mod averaging;
mod bench;
mod budget;
mod convert;
mod diloco;
mod handles;
mod join;
mod optim;
mod post_local_sgd;
mod replicas;
mod rpc;
mod threads;
mod train;
mod world;
mod zero;

use std::cell::RefCell;
use std::sync::Arc;

use js_sys::{Array, Object};
use wasm_bindgen::prelude::*;

use distopt::backend::{Backend, BackendChoice, BackendInfo, select_backend};
use distopt::error::{Error, RankErrors, Result};

pub use averaging::{HierarchicalModelAveragerJs, PeriodicModelAveragerJs};
pub use bench::StepBench;
pub use diloco::DiLoCoJs;
pub use join::{DistributedDataParallelJs, JoinJs};
pub use optim::{AdamJs, AdamWJs, SgdJs};
pub use post_local_sgd::{PostLocalSgdOptimizerJs, PostLocalSgdStateJs};
pub use replicas::ReplicasJs;
pub use rpc::{AutogradContextJs, DistributedOptimizerJs, RRefJs, RpcWorldJs};
#[cfg(target_feature = "atomics")]
pub use threads::panic_on_worker_for_test;
pub use threads::thread_workers;
pub use train::TrainerJs;
pub use world::WorldJs;
pub use zero::ZeroRedundancyOptimizerJs;

thread_local! {
    /// The backend chosen by the last `selectBackend` (new replicas are created on it).
    static BACKEND: RefCell<Option<Arc<dyn Backend>>> = const { RefCell::new(None) };
}

/// The current backend, or a `RuntimeError` before `init()` or once its GPU device is lost.
pub(crate) fn current_backend() -> Result<Arc<dyn Backend>> {
    let backend = BACKEND
        .with(|b| b.borrow().clone())
        .ok_or_else(|| Error::runtime("distopt is not initialized: await init() first"))?;
    if let Some(reason) = backend.lost() {
        return Err(distopt::backend::gpu::device_lost_error(&reason));
    }
    Ok(backend)
}

/// Test hook: destroys the current backend's GPU device, as a driver reset would (nothing on
/// the CPU backend). Later calls on objects made on it fail with a "device was lost"
/// `RuntimeError`; `init()` selects a backend anew.
#[wasm_bindgen(js_name = __distoptDestroyDeviceForTest)]
pub fn destroy_device_for_test() {
    if let Some(backend) = BACKEND.with(|b| b.borrow().clone()) {
        backend.destroy_device_for_test();
    }
}

/// Longest message a thrown error carries: a message that echoes a caller's huge value is cut
/// (its start and its end kept).
const MAX_MESSAGE_CHARS: usize = 1024;

/// A library error as a JS `Error` named after its Python class.
pub(crate) fn js_error(error: Error) -> JsValue {
    let message = error.message();
    let js = if message.chars().count() > MAX_MESSAGE_CHARS {
        let head: String = message.chars().take(MAX_MESSAGE_CHARS - 100).collect();
        let tail: String = {
            let rev: Vec<char> = message.chars().rev().take(60).collect();
            rev.into_iter().rev().collect()
        };
        js_sys::Error::new(&format!("{head} … (message cut) … {tail}"))
    } else {
        js_sys::Error::new(message)
    };
    js.set_name(error.kind().name());
    js.into()
}

/// The errors of a call every rank made, as one JS `Error`: the lowest rank's name and
/// message, and `rankErrors`, every raising rank's `{rank, name, message}`.
pub(crate) fn js_rank_errors(errors: RankErrors) -> JsValue {
    let list = Array::new();
    for (rank, error) in errors.iter() {
        let entry = Object::new();
        convert::set(&entry, "rank", rank as f64);
        convert::set(&entry, "name", error.kind().name());
        convert::set(&entry, "message", error.message());
        list.push(&entry);
    }
    let js = js_error(errors.first().clone());
    let _ = js_sys::Reflect::set(&js, &JsValue::from_str("rankErrors"), &list);
    js
}

/// Converts a library result whose failure is per rank for JS (a CPU worker's panic during
/// the call first, as [`js`]).
pub(crate) fn js_ranks<T>(result: std::result::Result<T, RankErrors>) -> JsResult<T> {
    worker_panic()?;
    result.map_err(js_rank_errors)
}

/// `Result` at the JS boundary: the error is a thrown JS value.
pub(crate) type JsResult<T> = std::result::Result<T, JsValue>;

/// Converts a library result for JS. A part of a CPU kernel that panicked on a worker thread
/// of the threaded build (`distopt::backend::cpu::pool`) while the call ran makes the call a
/// `RuntimeError` whatever it returned: its answer is incomplete.
pub(crate) fn js<T>(result: Result<T>) -> JsResult<T> {
    worker_panic()?;
    result.map_err(js_error)
}

/// The `RuntimeError` for a part that panicked on one of the CPU pool's worker threads since
/// the last check (the worker is gone; the module and the other workers carry on).
fn worker_panic() -> JsResult<()> {
    match distopt::backend::cpu::pool::GLOBAL.take_panic() {
        None => Ok(()),
        Some(panic) => Err(js_error(Error::runtime(format!(
            "a worker thread of distopt's CPU backend panicked (a bug, please report it): {}; the call's results are incomplete, and the other threads carry on",
            panic.message().replace('\n', " ")
        )))),
    }
}

/// A promise of `future`'s result whose work starts now: the future is polled once before
/// this returns, so that it takes its borrows and reads (or changes) the data as of the call,
/// in call order with the synchronous calls that follow; what it still awaits (a GPU
/// readback) settles the promise later, the borrows held until then (a change meanwhile is
/// refused as busy). A failure at once is a rejected promise.
pub(crate) fn promise_now<F>(future: F) -> js_sys::Promise
where
    F: std::future::Future<Output = JsResult<JsValue>> + 'static,
{
    use std::task::{Context, Poll, Waker};
    let mut future = Box::pin(future);
    // The futures polled later re-register the executor's waker (`oneshot`, `JsFuture`).
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(value)) => js_sys::Promise::resolve(&value),
        Poll::Ready(Err(error)) => js_sys::Promise::reject(&error),
        Poll::Pending => wasm_bindgen_futures::future_to_promise(future),
    }
}

/// The error for an object that a pending asynchronous call still holds.
pub(crate) fn busy(what: &str) -> Error {
    Error::runtime(format!(
        "the {what} is busy: an earlier asynchronous call on it (a read, a step, a state_dict) has not finished; await it first"
    ))
}

// `catch`: a `console.warn` that throws (a test set-up turning warnings into failures) must
// not unwind through Rust frames, which would leave every borrowed object busy for good.
#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(catch, js_namespace = console, js_name = warn)]
    fn console_warn_js(message: &str) -> JsResult<()>;
    #[wasm_bindgen(catch, js_namespace = console, js_name = error)]
    fn console_error_js(message: &str) -> JsResult<()>;
}

/// `console.warn(message)`; an exception it throws is dropped (the warning is still recorded
/// for `takeWarnings()`).
fn console_warn(message: &str) {
    let _ = console_warn_js(message);
}

/// `console.error(message)`; an exception it throws is dropped.
fn console_error(message: &str) {
    let _ = console_error_js(message);
}

/// Forwards distopt's own warnings (PyTorch's `UserWarning`s) and errors to the console.
struct ConsoleLogger;

impl log::Log for ConsoleLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn && metadata.target().starts_with("distopt")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let message = format!("distopt: {}", record.args());
            if record.level() == log::Level::Error {
                console_error(&message);
            } else {
                console_warn(&message);
            }
        }
    }

    fn flush(&self) {}
}

static LOGGER: ConsoleLogger = ConsoleLogger;

/// Runs when the module is instantiated: a panic (a bug) is reported on the console before
/// the module traps, and warnings go to the console. A panic on a worker thread of the
/// threaded build's CPU pool is first handed to the pool (`pool::note_panic`), so that the
/// call that was waiting for that worker's part returns a `RuntimeError` instead of spinning
/// forever; the worker then traps alone.
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        distopt::backend::cpu::pool::note_panic(info);
        console_error(&format!(
            "distopt panicked (a bug, please report it): {info}"
        ));
    }));
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// The JS form of a backend's description.
pub(crate) fn backend_info_to_js(info: &BackendInfo) -> Object {
    let obj = Object::new();
    let kind = match info.kind {
        distopt::backend::BackendKind::Gpu => "gpu",
        distopt::backend::BackendKind::Cpu => "cpu",
    };
    convert::set(&obj, "kind", kind);
    convert::set(&obj, "name", info.name.as_str());
    convert::set(&obj, "api", info.api.as_str());
    convert::set(&obj, "deviceType", info.device_type.as_str());
    convert::set(&obj, "driver", info.driver.as_str());
    convert::set(&obj, "maxBindingBytes", info.max_binding_bytes as f64);
    convert::set(&obj, "maxBufferBytes", info.max_buffer_bytes as f64);
    convert::set(
        &obj,
        "maxWorkgroupsPerDimension",
        f64::from(info.max_workgroups_per_dimension),
    );
    convert::set(
        &obj,
        "mappablePrimaryBuffers",
        info.mappable_primary_buffers,
    );
    convert::set(&obj, "threads", info.threads as f64);
    obj
}

/// Picks the backend new objects run on and returns `{kind, name, api, …, reason}`.
///
/// `"auto"` (the default) is the library's choice (`select_backend`): a hardware WebGPU
/// adapter when the environment has one; the CPU backend when WebGPU is unavailable (in a
/// browser, WebGPU is checked before the GPU is touched) or offers only a software (fallback)
/// adapter, which is slower than the CPU backend on the same cores. `"gpu"` takes any WebGPU
/// adapter and fails with a `RuntimeError` when there is none; `"cpu"` is the plain-Rust
/// backend. Objects made earlier keep the backend they were made on.
#[wasm_bindgen(js_name = selectBackend)]
pub async fn select_backend_js(choice: JsValue) -> JsResult<JsValue> {
    let choice = js(convert::optional_string(&choice, "backend"))?.unwrap_or_else(|| "auto".into());
    let choice = js(BackendChoice::parse(&choice))?;
    let selection = js(select_backend(choice).await)?;
    let info = backend_info_to_js(selection.backend.info());
    convert::set(&info, "reason", selection.reason.as_str());
    BACKEND.with(|b| *b.borrow_mut() = Some(selection.backend));
    Ok(info.into())
}

/// The current backend's description (as `selectBackend` returns it, without `reason`), or
/// `null` before `init()`.
#[wasm_bindgen(js_name = backendInfo)]
pub fn backend_info() -> JsValue {
    match current_backend() {
        Ok(backend) => backend_info_to_js(backend.info()).into(),
        Err(_) => JsValue::NULL,
    }
}

/// One synchronous data-parallel SGD step: the mean of the ranks' gradients (a missing,
/// `null`, gradient counts as zero) and every rank's updated parameters.
///
/// Resolves to `{meanGradients, updatedReplicas}` (`meanGradients[j]`,
/// `updatedReplicas[r][j]`); rejects with the step's `ValueError`s, checked in the reference
/// order. The inputs are read when it is called: a typed array changed afterwards does not
/// change the answer.
#[wasm_bindgen(js_name = sgdStep)]
pub fn sgd_step(
    parameter_replicas: JsValue,
    gradient_replicas: JsValue,
    learning_rate: JsValue,
) -> js_sys::Promise {
    promise_now(async move {
        sgd_step_now(&parameter_replicas, &gradient_replicas, &learning_rate).await
    })
}

async fn sgd_step_now(
    parameter_replicas: &JsValue,
    gradient_replicas: &JsValue,
    learning_rate: &JsValue,
) -> JsResult<JsValue> {
    let request = js(convert::step_request(
        parameter_replicas,
        gradient_replicas,
        learning_rate,
    ))?;
    let backend = js(current_backend())?;
    // The inputs, now copied into the module, count against its budget until the step is
    // done; the outputs (the means and at most one buffer per rank, as large as the
    // parameters) must fit what is left.
    let bytes = |t: &distopt::Tensor| t.numel() as u64 * t.dtype().size_bytes() as u64;
    let param_bytes: u64 = request.parameter_replicas.iter().flatten().map(bytes).sum();
    let grad_bytes: u64 = request
        .gradient_replicas
        .iter()
        .flatten()
        .flatten()
        .map(bytes)
        .sum();
    let _inputs = js(budget::reserve(
        "sgdStep's inputs (copied into the module)",
        param_bytes + grad_bytes,
    ))?;
    let ranks = request.parameter_replicas.len().max(1) as u64;
    js(budget::check(
        "sgdStep (its means and updated replicas)",
        param_bytes + param_bytes / ranks,
    ))?;
    let output = js(distopt::step::sgd_step(
        backend.as_ref(),
        &request.parameter_replicas,
        &request.gradient_replicas,
        request.learning_rate,
    )
    .await)?;
    let means = Array::new();
    for tensor in &output.mean_gradients {
        means.push(&js(convert::tensor_to_js_async(tensor).await)?);
    }
    let replicas = Array::new();
    for rank in &output.updated_replicas {
        let row = Array::new();
        for tensor in rank {
            row.push(&js(convert::tensor_to_js_async(tensor).await)?);
        }
        replicas.push(&row);
    }
    let result = Object::new();
    convert::set(&result, "meanGradients", means);
    convert::set(&result, "updatedReplicas", replicas);
    Ok(result.into())
}

/// Removes and returns the warnings distopt emitted so far (PyTorch's `UserWarning` texts),
/// oldest first. Each is also printed with `console.warn` when it is emitted.
#[wasm_bindgen(js_name = takeWarnings)]
pub fn take_warnings() -> Vec<String> {
    distopt::warnings::take()
}

/// The warnings recorded since the last `takeWarnings()`, without removing them, with how
/// PyTorch reports each: `[{message, channel, category, ranks}]`, `channel` `"warnings"`
/// (`warnings.warn`, `category` its class, such as `"UserWarning"`) or `"logging"` (a
/// `logger.warning` record, `category` `"WARNING"`), `ranks` the ranks that emitted it (`null`
/// when it is not tied to ranks).
#[wasm_bindgen(js_name = recordedWarnings)]
pub fn recorded_warnings() -> Array {
    distopt::warnings::recorded_records()
        .into_iter()
        .map(|w| {
            let obj = Object::new();
            convert::set(&obj, "message", w.message.as_str());
            convert::set(&obj, "channel", w.channel.name());
            convert::set(&obj, "category", w.category.as_str());
            let ranks: JsValue = match &w.ranks {
                Some(ranks) => ranks
                    .iter()
                    .map(|&r| JsValue::from_f64(r as f64))
                    .collect::<Array>()
                    .into(),
                None => JsValue::NULL,
            };
            convert::set(&obj, "ranks", ranks);
            JsValue::from(obj)
        })
        .collect()
}

/// A tensor's values as numbers (float16 and bfloat16 bit patterns decoded exactly).
#[wasm_bindgen(js_name = tensorValues)]
pub fn tensor_values(tensor: JsValue) -> JsResult<js_sys::Float64Array> {
    let tensor = js(convert::tensor_from_js(&tensor, "tensor"))?;
    js(budget::check_elements(
        "tensorValues (the values as float64)",
        tensor.numel(),
        8,
    ))?;
    let values = js(tensor.values_f64())?;
    Ok(js_sys::Float64Array::from(values.as_slice()))
}

/// A tensor of `dtype` and `shape` from numbers (each rounded to nearest even), in the form
/// distopt returns tensors: float16 and bfloat16 data as Uint16Array bit patterns.
#[wasm_bindgen(js_name = tensor)]
pub fn make_tensor(dtype: JsValue, shape: JsValue, values: JsValue) -> JsResult<JsValue> {
    let dtype = js(convert::optional_string(&dtype, "dtype"))?
        .ok_or_else(|| js_error(Error::type_error("tensor() needs a dtype")))?;
    if shape.is_undefined() || shape.is_null() {
        return Err(js_error(Error::type_error("tensor() needs a shape")));
    }
    js(convert::array(&shape, "shape"))?;
    let obj = Object::new();
    convert::set(&obj, "dtype", dtype.as_str());
    convert::set(&obj, "shape", shape);
    convert::set(&obj, "data", values);
    let tensor = js(convert::tensor_from_js(&obj, "tensor"))?;
    js(convert::tensor_to_js(&tensor))
}

/// The version of the distopt crate this module was built from.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").into()
}
