// distopt: PyTorch's data-parallel optimizer family on WebGPU (or a CPU fallback), compiled
// from Rust to WebAssembly. This file loads the module and picks the backend; everything
// else is the wasm-bindgen glue in ./wasm/ (see index.d.ts for the API).

import loadModule, { selectBackend } from './wasm/distopt_wasm.js';

export {
  Adam,
  AdamW,
  AutogradContext,
  DistributedDataParallel,
  DiLoCo,
  DistributedOptimizer,
  HierarchicalModelAverager,
  Join,
  PeriodicModelAverager,
  PostLocalSGDOptimizer,
  PostLocalSGDState,
  RRef,
  Replicas,
  RpcWorld,
  SGD,
  StepBench,
  Trainer,
  World,
  ZeroRedundancyOptimizer,
  backendInfo,
  recordedWarnings,
  selectBackend,
  sgdStep,
  takeWarnings,
  tensor,
  tensorValues,
  version,
} from './wasm/distopt_wasm.js';

const isNode =
  typeof process === 'object' &&
  process !== null &&
  typeof process.versions === 'object' &&
  process.versions !== null &&
  typeof process.versions.node === 'string';

/** Node's fetch cannot read file: URLs, so there the module's bytes are read from disk. */
async function defaultSource() {
  if (!isNode) return undefined;
  const url = new URL('./wasm/distopt_wasm_bg.wasm', import.meta.url);
  if (url.protocol !== 'file:') return undefined;
  const fs = 'node:fs/promises';
  const { readFile } = await import(/* webpackIgnore: true */ /* @vite-ignore */ fs);
  return readFile(url);
}

/**
 * The `wasm` option of init(), as wasm-bindgen's loader takes it. Accepted: a URL or a URL
 * string (fetched; in Node a `file:` URL or a path is read from disk, as Node's fetch cannot
 * read files), bytes (`ArrayBuffer`, a typed array or `DataView`), a `Response` or a promise of
 * one (`fetch(url)`), a `Request`, or a compiled `WebAssembly.Module`. `undefined`: the `.wasm`
 * next to this file. Anything else is a TypeError naming what was given.
 */
async function resolveWasmSource(wasm) {
  if (wasm === undefined || wasm === null) return defaultSource();
  if (typeof wasm === 'string' || wasm instanceof URL) {
    if (isNode) {
      const nodeUrl = 'node:url';
      const { pathToFileURL } = await import(/* webpackIgnore: true */ /* @vite-ignore */ nodeUrl);
      let url;
      try {
        url = new URL(wasm);
      } catch {
        url = pathToFileURL(String(wasm));
      }
      if (url.protocol === 'file:') {
        const fs = 'node:fs/promises';
        const { readFile } = await import(/* webpackIgnore: true */ /* @vite-ignore */ fs);
        return readFile(url);
      }
      return url;
    }
    return wasm;
  }
  if (
    wasm instanceof ArrayBuffer ||
    ArrayBuffer.isView(wasm) ||
    wasm instanceof WebAssembly.Module ||
    (typeof Response === 'function' && wasm instanceof Response) ||
    (typeof Request === 'function' && wasm instanceof Request) ||
    typeof wasm.then === 'function'
  ) {
    return wasm;
  }
  const got = Object.prototype.toString.call(wasm).slice(8, -1);
  const error = new TypeError(
    `init: wasm must be a URL, a URL string, bytes (ArrayBuffer or a typed array), a Response, a Request or a WebAssembly.Module, got ${got}`,
  );
  error.name = 'TypeError';
  throw error;
}

/** What the browser says about its WebGPU adapter (vendor, architecture, description). */
async function webgpuAdapterInfo() {
  const gpu = globalThis.navigator && globalThis.navigator.gpu;
  if (!gpu) return undefined;
  try {
    const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
    if (!adapter) return undefined;
    const info = adapter.info || (adapter.requestAdapterInfo ? await adapter.requestAdapterInfo() : {});
    return {
      vendor: info.vendor || '',
      architecture: info.architecture || '',
      device: info.device || '',
      description: info.description || '',
      isFallbackAdapter: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
    };
  } catch {
    return undefined;
  }
}

/**
 * Loads the WebAssembly module (once) and picks the backend: by default a hardware WebGPU
 * adapter when the environment has one, else the CPU fallback (also when WebGPU offers only a
 * software adapter, which is slower than the CPU backend). Resolves to a description of the
 * backend in use, with `reason` saying why it was chosen, and `adapterInfo` describing the
 * browser's WebGPU adapter when there is one.
 *
 * `wasm` says where the module comes from (see resolveWasmSource): by default the `.wasm` next
 * to this file, found through `import.meta.url` (bundlers rewrite that to their asset).
 * The module loads once: a later init() only picks the backend again.
 *
 * @param {{backend?: 'auto' | 'gpu' | 'cpu', wasm?: any}} [options]
 */
export default async function init(options = {}) {
  const { backend = 'auto', wasm } = options || {};
  const source = await resolveWasmSource(wasm);
  await loadModule(source === undefined ? undefined : { module_or_path: source });
  const info = await selectBackend(backend);
  const adapterInfo = await webgpuAdapterInfo();
  if (adapterInfo) {
    info.adapterInfo = adapterInfo;
    if (info.kind === 'gpu' && !info.name) {
      info.name =
        adapterInfo.description ||
        [adapterInfo.vendor, adapterInfo.architecture].filter(Boolean).join(' ') ||
        'WebGPU adapter';
    }
  }
  return info;
}

export { init };
