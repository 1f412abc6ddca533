//! The CPU fallback's worker threads in the threaded build (`atomics`): the npm package's
//! `distopt/threads` entry starts Web Workers that load this same module on the same shared
//! memory and serve `distopt::backend::cpu::pool::GLOBAL`. The single-threaded build has no
//! `serveAsWorker`; there `threadStartData` is `null` and `threadWorkers` 0.

use wasm_bindgen::prelude::*;

/// How many workers serve the CPU fallback's pool (0 outside the threaded build).
#[wasm_bindgen(js_name = threadWorkers, skip_typescript)]
pub fn thread_workers() -> usize {
    distopt::backend::cpu::pool::GLOBAL.workers()
}

/// `[module, memory]`: what a worker passes to `initSync` to share this instance's memory;
/// `null` in the single-threaded build (whose memory cannot be shared).
#[wasm_bindgen(js_name = threadStartData, skip_typescript)]
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
#[wasm_bindgen(js_name = serveAsWorker, skip_typescript)]
pub fn serve_as_worker() {
    distopt::backend::cpu::pool::GLOBAL.serve()
}

/// Test hook of the threaded build (`tests/js/browser-threads.test.js`): runs one batch on the
/// CPU pool in which the part a worker runs panics, as a bug in a kernel would, and returns
/// what the call then says: the `RuntimeError` that reports the panic. That worker is gone
/// afterwards (a later `init()` starts another); the module and the other workers carry on.
/// A `RuntimeError` at once when no worker serves the pool.
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = __distoptPanicOnWorkerForTest, skip_typescript)]
pub fn panic_on_worker_for_test() -> super::boundary::JsResult<()> {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};

    thread_local! {
        static CALLER: Cell<bool> = const { Cell::new(false) };
    }
    let pool = &distopt::backend::cpu::pool::GLOBAL;
    if pool.workers() == 0 {
        return Err(super::boundary::js_error(distopt::error::Error::runtime(
            "no worker thread serves the CPU pool",
        )));
    }
    let started = AtomicBool::new(false);
    let deadline = js_sys::Date::now() + 10_000.0;
    CALLER.with(|c| c.set(true));
    // Two parts: the caller's waits (at most 10 s) until a worker has taken the other one,
    // which panics there; should both go to workers, only the first panics.
    pool.run(2, &|_| {
        if CALLER.with(Cell::get) {
            while !started.load(Ordering::Acquire) && js_sys::Date::now() < deadline {
                std::hint::spin_loop();
            }
        } else if !started.swap(true, Ordering::AcqRel) {
            // The first part a worker takes (both may go to workers): one worker only.
            panic!("distopt test: a deliberate panic on a CPU worker thread");
        }
    });
    CALLER.with(|c| c.set(false));
    super::boundary::js(Ok(()))
}
