//! The JavaScript face of distopt, compiled for `wasm32` only and published as the npm package
//! `distopt` (see `npm/` and `docs/javascript.md`).
//!
//! This layer is thin: it converts JS values to the library's types, validates what JS can get
//! wrong that Rust's types rule out (integers, indices, array shapes), calls the library, and
//! converts back. No algorithm lives here. Every failure becomes a thrown JS `Error` whose
//! `name` is the Python exception class (`ValueError`, `TypeError`, `RuntimeError`,
//! `IndexError`, `ZeroDivisionError`, `AssertionError`) and whose `message` is the library's
//! message; nothing traps.
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
mod boundary;
mod budget;
mod convert;
mod diloco;
mod handles;
mod join;
// A networked rank blocks its one thread on the port: not in the threaded build.
#[cfg(not(target_feature = "atomics"))]
mod nats;
mod nats_config;
mod optim;
mod post_local_sgd;
mod replicas;
mod rpc;
mod session;
mod settings;
mod slot;
mod threads;
mod train;
mod trainer_settings;
mod typings;
mod world;
mod wrapper;
mod zero;

use js_sys::{Array, Object};
use serde::Serialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use boundary::{JsResult, js, js_error, promise_now};
use distopt::error::Error;
use session::current_backend;

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
#[wasm_bindgen(start, skip_typescript)]
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

/// What `sgdStep` resolves to.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    /// `meanGradients[j]`: the mean of the ranks' gradients of parameter j, in its dtype.
    #[serde(with = "serde_wasm_bindgen::preserve")]
    #[tsify(type = "Tensor[]")]
    mean_gradients: JsValue,
    /// `updatedReplicas[r][j]`: rank r's copy of updated parameter j (all ranks identical).
    #[serde(with = "serde_wasm_bindgen::preserve")]
    #[tsify(type = "Tensor[][]")]
    updated_replicas: JsValue,
}

/// One synchronous data-parallel SGD step over R ranks: for each parameter j the float32 mean
/// of the ranks' gradients (a `null` gradient counts as zero; R still divides), then
/// `θ − lr·ḡ` on rank 0's copy, given to every rank. The inputs are read when it is called: a
/// typed array changed afterwards does not change the answer.
///
/// @param parameterReplicas - `[rank][param]`
/// @param gradientReplicas - `[rank][param]`, `null` for a missing gradient
/// @param learningRate - rounded to float32; may be negative or 0
/// @throws ValueError for an empty world, mismatched counts, shapes or non-float dtypes
///   (checked in the reference order)
#[wasm_bindgen(js_name = sgdStep, unchecked_return_type = "Promise<StepResult>")]
pub fn sgd_step(
    #[wasm_bindgen(js_name = parameterReplicas)] parameter_replicas: typings::PerRankTensorsArg,
    #[wasm_bindgen(js_name = gradientReplicas)]
    gradient_replicas: typings::PerRankOptionalTensorsArg,
    #[wasm_bindgen(js_name = learningRate)] learning_rate: typings::NumberArg,
) -> js_sys::Promise {
    let (parameter_replicas, gradient_replicas, learning_rate) = (
        JsValue::from(parameter_replicas),
        JsValue::from(gradient_replicas),
        JsValue::from(learning_rate),
    );
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
    typings::to_js(&StepResult {
        mean_gradients: means.into(),
        updated_replicas: replicas.into(),
    })
}

/// Removes and returns the warnings emitted so far (PyTorch's warning texts), oldest first.
/// Each warning is also printed with `console.warn` when it is emitted.
#[wasm_bindgen(js_name = takeWarnings)]
pub fn take_warnings() -> Vec<String> {
    distopt::warnings::take()
}

/// A warning as PyTorch reports it.
#[derive(Serialize, Tsify)]
#[tsify(missing_as_null)]
pub struct WarningRecord {
    message: String,
    /// `"warnings"`: Python's `warnings.warn`; `"logging"`: a `logger.warning` record.
    #[tsify(type = "'warnings' | 'logging'")]
    channel: &'static str,
    /// The warning class (`"UserWarning"`, `"DeprecationWarning"`) or the logging level
    /// (`"WARNING"`).
    category: String,
    /// The ranks that emitted it (PyTorch warns on each rank), or `null` when it is not tied
    /// to ranks.
    ranks: Option<Vec<usize>>,
}

/// The warnings recorded since the last `takeWarnings()`, without removing them.
#[wasm_bindgen(js_name = recordedWarnings, unchecked_return_type = "WarningRecord[]")]
pub fn recorded_warnings() -> JsResult<JsValue> {
    let records: Vec<WarningRecord> = distopt::warnings::recorded_records()
        .into_iter()
        .map(|w| WarningRecord {
            message: w.message,
            channel: w.channel.name(),
            category: w.category,
            ranks: w.ranks,
        })
        .collect();
    typings::to_js(&records)
}

/// A tensor's values as numbers (float16/bfloat16 bit patterns decoded exactly).
#[wasm_bindgen(js_name = tensorValues)]
pub fn tensor_values(tensor: typings::TensorInputArg) -> JsResult<js_sys::Float64Array> {
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
/// distopt returns tensors: float16 and bfloat16 data as Uint16Array bit patterns. (Declared
/// in npm/supplement.d.ts, where its result's type follows `dtype`.)
#[wasm_bindgen(js_name = tensor, skip_typescript)]
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
