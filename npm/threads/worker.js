// One worker thread of distopt's CPU fallback (the threaded build, `distopt/threads`): started
// by init(), it instantiates the module on the page's shared memory, says 'ready', and then
// serves the module's thread pool for good (it never returns to its event loop).
//
// Unless a part of a kernel panics here (a bug): the module's panic hook hands the part back
// to the pool first, so the waiting call fails with a RuntimeError instead of spinning, and
// then this thread's instance traps. The worker says so ({exited}) and ends; init() can start
// another.
import { initSync, serveAsWorker } from '../wasm-threads/distopt_wasm.js';

self.addEventListener(
  'message',
  ({ data }) => {
    try {
      initSync({ module: data.module, memory: data.memory });
    } catch (error) {
      self.postMessage({ error: String(error?.message ?? error) });
      return;
    }
    self.postMessage('ready');
    try {
      serveAsWorker();
    } catch (error) {
      self.postMessage({ exited: String(error?.message ?? error) });
      self.close();
    }
  },
  { once: true },
);
