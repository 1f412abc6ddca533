// What the single-threaded build of distopt wraps: its wasm-bindgen glue, the parameter names
// of the glue's calls (scripts/glue-params.mjs), and no CPU worker threads. The threaded build
// (`distopt/threads`) has its own copy of this file in threads/, beside the same index.js.
import * as glue from './wasm/distopt_wasm.js';

export { glue };
export { default as PARAMS } from './wasm/params.js';

/** Where this build's .wasm is (the `new URL(…, import.meta.url)` form bundlers follow). */
export function wasmUrl() {
  return new URL('./wasm/distopt_wasm_bg.wasm', import.meta.url);
}

/** Whether this build's CPU fallback can run worker threads. */
export const threadedBuild = false;

/** A new worker thread of the CPU fallback: this build has none. */
export function spawnThreadWorker() {
  return null;
}
