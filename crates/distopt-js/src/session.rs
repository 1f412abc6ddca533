//! The backend the module's objects are made on: the one `selectBackend` (run by `init()`)
//! chose, and its description for JS.

use std::cell::RefCell;
use std::sync::Arc;

use serde::Serialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert;
use super::typings::to_js;
use distopt::backend::{Backend, BackendChoice, BackendInfo as LibBackendInfo, select_backend};
use distopt::error::{Error, Result};

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
#[wasm_bindgen(js_name = __distoptDestroyDeviceForTest, skip_typescript)]
pub fn destroy_device_for_test() {
    if let Some(backend) = BACKEND.with(|b| b.borrow().clone()) {
        backend.destroy_device_for_test();
    }
}

/// What a backend runs on.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct BackendInfo {
    /// `'gpu'` (WebGPU) or `'cpu'` (plain Rust compiled to WebAssembly).
    #[tsify(type = "'gpu' | 'cpu'")]
    kind: &'static str,
    /// The adapter's name (or the CPU backend's).
    name: String,
    /// `'BrowserWebGpu'` for WebGPU, `'host'` for the CPU backend.
    api: String,
    /// `'Cpu'` for a software (fallback) adapter or the CPU backend, else `'Other'`.
    device_type: String,
    /// The driver's description, where the adapter reports one.
    driver: String,
    /// Largest storage binding distopt uses (bytes); larger arenas are processed in chunks.
    max_binding_bytes: f64,
    /// Largest buffer the device allows (bytes; the CPU backend's is 2⁶⁴ − 1, as a float).
    max_buffer_bytes: f64,
    /// Largest workgroup count of one dispatch dimension.
    max_workgroups_per_dimension: u32,
    /// Whether the device maps its primary buffers directly (no staging copy).
    mappable_primary_buffers: bool,
    /// Threads the CPU backend splits its work across (1 for a GPU adapter).
    threads: usize,
}

impl BackendInfo {
    /// The record of a backend's description.
    pub(crate) fn new(info: &LibBackendInfo) -> BackendInfo {
        BackendInfo {
            kind: match info.kind {
                distopt::backend::BackendKind::Gpu => "gpu",
                distopt::backend::BackendKind::Cpu => "cpu",
            },
            name: info.name.clone(),
            api: info.api.clone(),
            device_type: info.device_type.clone(),
            driver: info.driver.clone(),
            max_binding_bytes: info.max_binding_bytes as f64,
            max_buffer_bytes: info.max_buffer_bytes as f64,
            max_workgroups_per_dimension: info.max_workgroups_per_dimension,
            mappable_primary_buffers: info.mappable_primary_buffers,
            threads: info.threads,
        }
    }
}

/// What `selectBackend` resolves to: the backend's description and why it was chosen
/// (declared as `BackendSelection` in npm/supplement.d.ts, which adds `init()`'s `adapterInfo`).
#[derive(Serialize)]
struct Selection {
    #[serde(flatten)]
    info: BackendInfo,
    reason: String,
}

/// The JS form of a backend's description.
pub(crate) fn backend_info_to_js(info: &LibBackendInfo) -> JsResult<JsValue> {
    to_js(&BackendInfo::new(info))
}

/// Picks the backend new objects run on and returns `{kind, name, api, …, reason}`.
///
/// `"auto"` (the default) is the library's choice (`select_backend`): a hardware WebGPU
/// adapter when the environment has one; the CPU backend when WebGPU is unavailable (in a
/// browser, WebGPU is checked before the GPU is touched) or offers only a software (fallback)
/// adapter, which is slower than the CPU backend on the same cores. `"gpu"` takes any WebGPU
/// adapter and fails with a `RuntimeError` when there is none; `"cpu"` is the plain-Rust
/// backend. Objects made earlier keep the backend they were made on (existing ones keep
/// theirs).
#[wasm_bindgen(js_name = selectBackend, unchecked_return_type = "Promise<BackendSelection>")]
pub async fn select_backend_js(choice: Option<BackendChoiceArg>) -> JsResult<JsValue> {
    let choice = convert::or_undefined(choice);
    let choice = js(convert::optional_string(&choice, "backend"))?.unwrap_or_else(|| "auto".into());
    let choice = js(BackendChoice::parse(&choice))?;
    let selection = js(select_backend(choice).await)?;
    let info = to_js(&Selection {
        info: BackendInfo::new(selection.backend.info()),
        reason: selection.reason.clone(),
    })?;
    BACKEND.with(|b| *b.borrow_mut() = Some(selection.backend));
    Ok(info)
}

/// The current backend's description (as `selectBackend` returns it, without `reason`), or
/// `null` before `init()`.
#[wasm_bindgen(js_name = backendInfo, unchecked_return_type = "BackendInfo | null")]
pub fn backend_info() -> JsResult<JsValue> {
    match current_backend() {
        Ok(backend) => backend_info_to_js(backend.info()),
        Err(_) => Ok(JsValue::NULL),
    }
}

#[wasm_bindgen]
extern "C" {
    /// Which backend `selectBackend` picks (`BackendChoice`, npm/supplement.d.ts).
    #[wasm_bindgen(typescript_type = "BackendChoice")]
    pub type BackendChoiceArg;
}
