// What the threaded build of distopt (`distopt/threads`) wraps: the glue of the module built
// with WebAssembly atomics and shared memory, the same parameter names, and the worker threads
// that serve its CPU fallback's pool (threads/worker.js).
import * as glue from '../wasm-threads/distopt_wasm.js';

export { glue };
export { default as PARAMS } from '../wasm-threads/params.js';

/** Where this build's .wasm is (the `new URL(…, import.meta.url)` form bundlers follow). */
export function wasmUrl() {
  return new URL('../wasm-threads/distopt_wasm_bg.wasm', import.meta.url);
}

/** Whether this build's CPU fallback can run worker threads. */
export const threadedBuild = true;

/**
 * A new worker thread of the CPU fallback, running threads/worker.js (the `new Worker(new
 * URL(…, import.meta.url))` form bundlers follow).
 */
export function spawnThreadWorker(options) {
  return new Worker(new URL('./worker.js', import.meta.url), options);
}
