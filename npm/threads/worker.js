// One worker thread of distopt's CPU fallback (the threaded build, `distopt/threads`): started
// by init(), it instantiates the module on the page's shared memory, says 'ready', and then
// serves the module's thread pool for good (it never returns to its event loop).
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
    serveAsWorker();
  },
  { once: true },
);
