//! The CPU fallback's worker threads in the threaded build (`atomics`): the npm package's
//! `distopt/threads` entry starts Web Workers that load this same module on the same shared
//! memory and serve `distopt::backend::cpu::pool::GLOBAL`. The single-threaded build has no
//! `serveAsWorker`; there `threadStartData` is `null` and `threadWorkers` 0.

use wasm_bindgen::prelude::*;

/// How many workers serve the CPU fallback's pool (0 outside the threaded build).
#[wasm_bindgen(js_name = threadWorkers)]
pub fn thread_workers() -> usize {
    distopt::backend::cpu::pool::GLOBAL.workers()
}

/// `[module, memory]`: what a worker passes to `initSync` to share this instance's memory;
/// `null` in the single-threaded build (whose memory cannot be shared).
#[wasm_bindgen(js_name = threadStartData)]
pub fn thread_start_data() -> JsValue {
    #[cfg(target_feature = "atomics")]
    {
        js_sys::Array::of2(&wasm_bindgen::module(), &wasm_bindgen::memory()).into()
    }
    #[cfg(not(target_feature = "atomics"))]
    {
        JsValue::NULL
    }
}

/// Serves the pool on the calling worker, for good (it never returns).
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = serveAsWorker)]
pub fn serve_as_worker() {
    distopt::backend::cpu::pool::GLOBAL.serve()
}
