// The hand-written part of distopt's typings: what a generator cannot express (generic and
// template-literal types, the union of tensor forms, the error type, `init()`, which index.js
// defines). scripts/typings.mjs appends it to the declarations wasm-bindgen generates from the
// Rust bindings (crates/distopt-js: their rustdoc and types) to make the package's
// index.d.ts; tests/js/typings-drift.test.js fails when this file declares a name the
// generated part declares too, or a function the module does not export.
//
// distopt is PyTorch's data-parallel optimizer family — the synchronous data-parallel SGD step,
// SGD / Adam / AdamW, PeriodicModelAverager, HierarchicalModelAverager, PostLocalSGDOptimizer,
// the post-local-SGD gradient hook, ZeroRedundancyOptimizer, and DistributedOptimizer over a
// small RPC framework — computed by WebGPU compute shaders (or a CPU fallback), with R
// data-parallel ranks simulated on one device.
//
// Every function and method that fails throws (or rejects with) a `DistoptError`: a JS `Error`
// whose `name` is the Python exception class and whose `message` is PyTorch's text.
//
// Arguments are read once, when the call is made: a getter or Proxy that throws, a revoked
// Proxy, a detached ArrayBuffer or a cyclic object is a `TypeError`/`ValueError` naming the
// argument (the caller's own exception is its `cause`), and the object called is left as it
// was. A method called on an object of another class, on a Proxy of one or on a freed object
// is a `TypeError`; a call before `init()` is a `RuntimeError`. Counts, ranks and indices must
// be integers (a string, boolean, array or `null` is a `TypeError`; an optional argument may
// be `null` or omitted), flags booleans. Memory the module would need beyond its budget (2 GiB of its
// 4 GiB, `distopt::budget`; one typed array input under 2 GiB) is a `RuntimeError` ("out of memory: …").
// While a read of a `Replicas` (`param`, `grad`, `params`, `grads`, `stateDict`) is pending,
// a change to it is refused ("busy" `RuntimeError`): the read resolves to the values at the
// time of the call.

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

// `Symbol.dispose` (TypeScript's lib `esnext.disposable`, declared here too so that the classes'
// `[Symbol.dispose]()` type-checks with older `lib` settings; at run time every class has it
// where the runtime defines `Symbol.dispose`).
declare global {
  interface SymbolConstructor {
    readonly dispose: unique symbol;
  }
}

/** The float dtypes distopt computes in. */
export type DType = 'float32' | 'float16' | 'bfloat16' | 'float64';

/** Names accepted for a dtype on input (PyTorch's, with or without `torch.`, and short forms). */
export type DTypeName =
  | DType
  | `torch.${DType}`
  | 'float'
  | 'half'
  | 'double'
  | 'bf16'
  | 'f16'
  | 'f32'
  | 'f64';

/** One element in a plain list: a number, or `"nan"`, `"inf"`, `"-inf"` as the golden JSON writes them. */
export type Element = number | 'nan' | 'inf' | '-inf' | 'NaN' | 'Infinity' | '-Infinity';

/** A nested list of numbers (a float32 tensor whose shape is the nesting), or a bare number (0-d). */
export type NestedNumbers = number | readonly NestedNumbers[];

/**
 * A tensor as distopt reads it: `data` is flat and row-major.
 *
 * - `Float32Array` or `Float64Array`: values (rounded to nearest even into `dtype`);
 * - `Uint16Array`: float16 or bfloat16 *bit patterns* (`dtype` is then required);
 * - `Float16Array` (where the runtime has it): float16 values (`dtype` defaults to `float16`;
 *   another dtype converts the values);
 * - any other typed array: values;
 * - a plain list of numbers and `"nan"`/`"inf"`/`"-inf"` strings: values.
 *
 * `dtype` defaults to the typed array's (`float64` for a Float64Array) or `float32`; `shape`
 * defaults to `[data.length]`.
 */
export interface TensorLike {
  dtype?: DTypeName;
  shape?: readonly number[];
  data: Float32Array | Float64Array | Uint16Array | ArrayBufferView | readonly Element[];
}

/**
 * A `Float16Array` (ES2025; typed structurally so that older TypeScript libs compile). Returned
 * float16 tensors still hold `Uint16Array` bit patterns (decode them with `tensorValues`).
 */
export type Float16ArrayLike = ArrayBufferView & { readonly [Symbol.toStringTag]: 'Float16Array'; readonly length: number };

/** Anything distopt accepts where a tensor goes (a bare Float16Array is a 1-D float16 tensor). */
export type TensorInput = TensorLike | Float32Array | Float64Array | Float16ArrayLike | NestedNumbers;

/** A float32 tensor as distopt returns it. */
export interface Float32Tensor {
  dtype: 'float32';
  shape: number[];
  data: Float32Array;
}

/** A float64 tensor as distopt returns it. */
export interface Float64Tensor {
  dtype: 'float64';
  shape: number[];
  data: Float64Array;
}

/** A float16 tensor as distopt returns it: `data` holds IEEE binary16 bit patterns. */
export interface Float16Tensor {
  dtype: 'float16';
  shape: number[];
  data: Uint16Array;
}

/** A bfloat16 tensor as distopt returns it: `data` holds bfloat16 bit patterns. */
export interface BFloat16Tensor {
  dtype: 'bfloat16';
  shape: number[];
  data: Uint16Array;
}

/** A tensor as distopt returns it: typed-array data, discriminated by `dtype`. */
export type Tensor = Float32Tensor | Float64Tensor | Float16Tensor | BFloat16Tensor;

/** A tensor's values as numbers (float16/bfloat16 bit patterns decoded exactly). */

/**
 * A tensor of `dtype` and `shape` from numbers, each rounded to nearest even, in the form
 * distopt returns tensors (float16/bfloat16 as Uint16Array bit patterns).
 */
export function tensor<D extends DType>(
  dtype: D,
  shape: readonly number[],
  values: ArrayLike<Element> | ArrayBufferView,
): Extract<Tensor, { dtype: D }>;

// ---------------------------------------------------------------------------------------------
// Errors and warnings
// ---------------------------------------------------------------------------------------------

/** The Python exception classes distopt's errors mirror. */
export type ErrorName = 'ValueError' | 'TypeError' | 'RuntimeError' | 'IndexError' | 'ZeroDivisionError' | 'AssertionError';

/** What distopt throws: `name` is the Python class, `message` PyTorch's text. */
export interface DistoptError extends Error {
  name: ErrorName;
  /**
   * Present when every rank made the call (a constructor or collective of
   * `ZeroRedundancyOptimizer`, `DistributedDataParallel`, `Join`): each raising rank's own
   * error (PyTorch raises on every rank separately, and a message may name the rank). `name`
   * and `message` are then the lowest raising rank's.
   */
  rankErrors?: RankError[];
}

/** One rank's error of a call every rank made. */
export interface RankError {
  rank: number;
  name: ErrorName;
  message: string;
}
// ---------------------------------------------------------------------------------------------
// Initialization and backends
// ---------------------------------------------------------------------------------------------

/**
 * `'auto'`: a hardware WebGPU adapter when there is one, else the CPU fallback (also when
 * WebGPU offers only a software adapter such as SwiftShader, which is slower than the CPU
 * backend); `'gpu'`: any WebGPU adapter (an error without one); `'cpu'`: the CPU backend.
 */
export type BackendChoice = 'auto' | 'gpu' | 'cpu';

/** What the browser reports about its WebGPU adapter (`GPUAdapterInfo`). */
export interface WebGpuAdapterInfo {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  isFallbackAdapter: boolean;
}

/** The backend `init()` / `selectBackend()` chose, and why. */
export interface BackendSelection extends BackendInfo {
  /** One sentence on why this backend was chosen (e.g. why WebGPU was not usable). */
  reason: string;
  /** The browser's description of its WebGPU adapter, when it has one (`init()` only). */
  adapterInfo?: WebGpuAdapterInfo;
}

/** Where the WebAssembly module comes from (default: next to this file; read from disk in Node). */
export type WasmSource =
  | string
  | URL
  | Request
  | Response
  | BufferSource
  | WebAssembly.Module
  | Promise<Response>;

export interface InitOptions {
  /** Which backend (default `'auto'`). `'gpu'` fails when WebGPU is unavailable. */
  backend?: BackendChoice;
  /**
   * Where the `.wasm` comes from (default: the file next to `index.js`, through
   * `import.meta.url`, which bundlers rewrite to their asset): a URL or URL string (fetched; in
   * Node a `file:` URL or a path is read from disk), its bytes (`ArrayBuffer`, `Uint8Array`), a
   * `Response` or `fetch(url)`'s promise, a `Request`, or a compiled `WebAssembly.Module`.
   * The module loads once: the first init() decides.
   */
  wasm?: WasmSource;
  /**
   * How many threads the CPU fallback uses, the calling one included (default `'auto'`: every
   * logical core, at most 16). Only the threaded build, `import init from 'distopt/threads'`,
   * starts them (as module Web Workers on shared memory, which needs a cross-origin isolated
   * page); the plain build validates the option and runs on one thread.
   */
  threads?: 'auto' | number;
}

/**
 * Loads the WebAssembly module (once) and picks the backend (`'auto'` by default: a hardware
 * WebGPU adapter, otherwise the CPU fallback). Call it (and await it) before anything else.
 */
export default function init(options?: InitOptions): Promise<BackendSelection>;
export { init };

// ---------------------------------------------------------------------------------------------
// Optimizer state and groups
// ---------------------------------------------------------------------------------------------

/** A parameter group: parameter indices plus options that override the optimizer's. */
export type ParamGroup<O> = O & { params: readonly number[] };

/** A state dict tensor entry, e.g. `momentum_buffer` or `exp_avg`. */
export type StateTensors = Record<string, Tensor>;

/** `optimizer.state_dict()` in PyTorch's layout (tensors with typed-array data). */
export interface StateDict {
  /** Per parameter (by its index in the groups' order, as a string): its state tensors. */
  state: Record<string, StateTensors>;
  /** Every group's options (complete, defaults filled in) and its parameter indices. */
  param_groups: Array<Record<string, unknown> & { params: number[] }>;
}

/** A state dict as `loadStateDict` accepts it (tensors in any `TensorInput` form). */
export interface StateDictInput {
  state?: Record<string, Record<string, TensorInput | number>>;
  param_groups: ReadonlyArray<Record<string, unknown> & { params: readonly number[] }>;
  /** PostLocalSGDOptimizer: the averager's step counter. */
  step?: number;
}

/** Any of the local optimizers. */
export type AnyLocalOptimizer = SGD | Adam | AdamW;

/** Either averager. */
export type ModelAverager = PeriodicModelAverager | HierarchicalModelAverager;


// ---------------------------------------------------------------------------------------------
// Ranks in other processes: a run over NATS (`World.joinNats`)
// ---------------------------------------------------------------------------------------------

/**
 * A connection to a NATS server whose calls block the calling thread until done (Node's main
 * thread, or any Worker): `await openPort({servers})` from `distopt/nats`. The NATS client
 * (nats.js) runs in a worker thread of its own. `World.joinNats` takes it.
 */
export interface Port {
  /** The server's largest message, in bytes. */
  readonly maxPayload: number;
  /** Closes the connection and stops its worker (idempotent). */
  close(): void;
}
