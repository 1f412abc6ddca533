//! The backend the module's objects are made on: the one `selectBackend` (run by `init()`)
//! chose, and its description for JS.

use std::cell::RefCell;
use std::sync::Arc;

use js_sys::Object;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert;
use distopt::backend::{Backend, BackendChoice, BackendInfo, select_backend};
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
#[wasm_bindgen(js_name = __distoptDestroyDeviceForTest)]
pub fn destroy_device_for_test() {
    if let Some(backend) = BACKEND.with(|b| b.borrow().clone()) {
        backend.destroy_device_for_test();
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
