// Type definitions for distopt (hand-written; checked by tests/js/types with `tsc --noEmit`, and
// against the declarations wasm-bindgen generates for the module by tests/js/typings-drift.test.js:
// the same classes, members, parameter counts and promises).
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
// be integers (a string, boolean, array or `null` is a `TypeError`, unless `null` is
// documented), flags booleans. Memory the module would need beyond its budget (2 GiB of its
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
export function tensorValues(tensor: TensorInput): Float64Array;

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
export type ErrorName = 'ValueError' | 'TypeError' | 'RuntimeError' | 'IndexError' | 'ZeroDivisionError';

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

/**
 * Removes and returns the warnings emitted so far (PyTorch's warning texts), oldest first.
 * Each warning is also printed with `console.warn` when it is emitted.
 */
export function takeWarnings(): string[];

/** A warning as PyTorch reports it. */
export interface WarningRecord {
  message: string;
  /** `"warnings"`: Python's `warnings.warn`; `"logging"`: a `logger.warning` record. */
  channel: 'warnings' | 'logging';
  /** The warning class (`"UserWarning"`, `"DeprecationWarning"`) or the logging level (`"WARNING"`). */
  category: string;
  /** The ranks that emitted it (PyTorch warns on each rank), or `null` when it is not tied to ranks. */
  ranks: number[] | null;
}

/** The warnings recorded since the last `takeWarnings()`, without removing them. */
export function recordedWarnings(): WarningRecord[];

// ---------------------------------------------------------------------------------------------
// Initialization and backends
// ---------------------------------------------------------------------------------------------

/**
 * `'auto'`: a hardware WebGPU adapter when there is one, else the CPU fallback (also when
 * WebGPU offers only a software adapter such as SwiftShader, which is slower than the CPU
 * backend); `'gpu'`: any WebGPU adapter (an error without one); `'cpu'`: the CPU backend.
 */
export type BackendChoice = 'auto' | 'gpu' | 'cpu';

/** What a backend runs on. */
export interface BackendInfo {
  /** `'gpu'` (WebGPU) or `'cpu'` (plain Rust compiled to WebAssembly, one thread). */
  kind: 'gpu' | 'cpu';
  /** The adapter's name (or the CPU backend's). */
  name: string;
  /** `'BrowserWebGpu'` for WebGPU, `'host'` for the CPU backend. */
  api: string;
  /** `'Cpu'` for a software (fallback) adapter or the CPU backend, else `'Other'`. */
  deviceType: string;
  driver: string;
  /** Largest storage binding distopt uses (bytes); larger arenas are processed in chunks. */
  maxBindingBytes: number;
  maxBufferBytes: number;
  maxWorkgroupsPerDimension: number;
  mappablePrimaryBuffers: boolean;
  /** Threads the CPU backend splits its work across (1 for a GPU adapter). */
  threads: number;
}

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

/** Switches the backend that new objects are created on (existing ones keep theirs). */
export function selectBackend(choice?: BackendChoice): Promise<BackendSelection>;

/** The current backend, or `null` before `init()`. */
export function backendInfo(): BackendInfo | null;

/** The version of the distopt crate the module was built from. */
export function version(): string;

// ---------------------------------------------------------------------------------------------
// The synchronous data-parallel SGD step
// ---------------------------------------------------------------------------------------------

export interface StepResult {
  /** `meanGradients[j]`: the mean of the ranks' gradients of parameter j, in its dtype. */
  meanGradients: Tensor[];
  /** `updatedReplicas[r][j]`: rank r's copy of updated parameter j (all ranks identical). */
  updatedReplicas: Tensor[][];
}

/**
 * One synchronous data-parallel SGD step over R ranks: for each parameter j the float32 mean
 * of the ranks' gradients (a `null` gradient counts as zero; R still divides), then
 * `θ − lr·ḡ` on rank 0's copy, given to every rank.
 *
 * @param parameterReplicas `[rank][param]`
 * @param gradientReplicas `[rank][param]`, `null` for a missing gradient
 * @param learningRate rounded to float32; may be negative or 0
 * @throws ValueError for an empty world, mismatched counts, shapes or non-float dtypes
 *   (checked in the reference order)
 */
export function sgdStep(
  parameterReplicas: readonly (readonly TensorInput[])[],
  gradientReplicas: readonly (readonly (TensorInput | null)[])[],
  learningRate: number | 'nan' | 'inf' | '-inf',
): Promise<StepResult>;

// ---------------------------------------------------------------------------------------------
// The simulated world
// ---------------------------------------------------------------------------------------------

/** Bytes the collectives would have sent over a network, per rank. */
export interface CommStats {
  /** All-reduce bytes by group size (a ring all-reduce of B bytes over g ranks sends 2(g−1)/g·B per rank). */
  allReduceBytesByGroupSize: Record<string, number>;
  /** Broadcast bytes received per non-root rank. */
  broadcastBytes: number;
  /** Gather bytes received by the destination rank. */
  gatherBytes: number;
  /** Number of collective calls. */
  collectives: number;
  /** All of the above, in bytes. */
  totalBytes: number;
}

/** A world of R ranks simulated on one device, counting what its collectives send. */
export class World {
  /** @throws ValueError for `size < 1`; TypeError for a non-integer. */
  constructor(size: number);
  /** Ranks in the world. */
  readonly size: number;
  /** Bytes sent so far, per rank, by kind of collective. */
  stats(): CommStats;
  /** Clears the statistics. */
  resetStats(): void;
  /**
   * The ranks of the contiguous group of `groupSize` ranks (`new_subgroups`) that `rank`
   * belongs to (the whole world by default).
   */
  groupOf(rank: number, groupSize?: number | null): number[];
  /** Releases the world's memory (objects made with it keep what they need). */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// Model replicas
// ---------------------------------------------------------------------------------------------

/**
 * R ranks' copies of a model's parameters, and their gradients, resident on the backend chosen
 * by `init()`. Reads are asynchronous; a change made while a read of the same replicas is
 * pending throws a `RuntimeError` ("busy").
 */
export class Replicas {
  /** Each rank's own parameters: `perRank[r][j]` (same count, shapes and dtypes on every rank). */
  constructor(perRank: readonly (readonly TensorInput[])[]);
  /** `ranks` identical replicas of `params`. */
  static replicate(ranks: number, params: readonly TensorInput[]): Replicas;
  /** Number of ranks. */
  readonly ranks: number;
  /** Number of parameters per rank. */
  readonly length: number;
  /** Bytes of one rank's parameters. */
  readonly bytesPerRank: number;
  /** The backend the replicas live on. */
  readonly backend: BackendInfo;
  /** Parameter j's shape. */
  shape(j: number): number[];
  /** Parameter j's dtype. */
  dtype(j: number): DType;
  /** Parameter j's element count. */
  numel(j: number): number;
  /** Overwrites every parameter of rank `rank` (shapes and dtypes must match). */
  setParams(rank: number, params: readonly TensorInput[]): void;
  /** Overwrites parameter j of rank `rank`. */
  setParam(rank: number, j: number, value: TensorInput): void;
  /** Sets every gradient of rank `rank`; `null` means no gradient (`p.grad = None`). */
  setGrads(rank: number, grads: readonly (TensorInput | null)[]): void;
  /** Sets gradient j of rank `rank` (`null` removes it). */
  setGrad(rank: number, j: number, grad: TensorInput | null): void;
  /** `zero_grad(set_to_none=True)` on every rank. */
  zeroGrad(): void;
  /** Whether rank `rank` has a gradient for parameter j. */
  hasGrad(rank: number, j: number): boolean;
  /** Copies rank `root`'s parameters (default 0) to every rank, as DDP does at construction. */
  broadcastParams(world: World, root?: number): void;
  /** Parameter j of rank `rank`, read back. */
  param(rank: number, j: number): Promise<Tensor>;
  /** Gradient j of rank `rank`, or `null`. */
  grad(rank: number, j: number): Promise<Tensor | null>;
  /** Every parameter of every rank: `[rank][param]`. */
  params(): Promise<Tensor[][]>;
  /** Every gradient of every rank: `[rank][param]`, `null` where absent. */
  grads(): Promise<(Tensor | null)[][]>;
  /** Releases the replicas' memory (optimizers made over them keep them alive). */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// Local optimizers
// ---------------------------------------------------------------------------------------------

/** `torch.optim.SGD`'s keyword arguments (PyTorch's names and defaults). */
export interface SGDOptions {
  /** Learning rate (default 1e-3). */
  lr?: number;
  /** Momentum factor (default 0). */
  momentum?: number;
  /** Dampening for momentum (default 0). */
  dampening?: number;
  /** L2 penalty (default 0). */
  weight_decay?: number;
  /** Nesterov momentum (default false; needs momentum > 0 and no dampening). */
  nesterov?: boolean;
  /** Maximize the objective (default false). */
  maximize?: boolean;
  /** Accepted and recorded in the state dict, as PyTorch does. */
  foreach?: boolean | null;
  differentiable?: boolean;
  /**
   * PyTorch's fused update (default null, which is false): a float16/bfloat16 parameter's
   * update is computed in float32 and rounded once per stored tensor, as PyTorch's fused
   * kernel does. With `foreach: true` or `differentiable: true` it is PyTorch's `RuntimeError`.
   */
  fused?: boolean | null;
}

/** `torch.optim.Adam` / `AdamW`'s keyword arguments. */
export interface AdamOptions {
  /** Learning rate (default 1e-3). */
  lr?: number;
  /** Running-average coefficients (default [0.9, 0.999]). */
  betas?: readonly [number, number];
  /** Added to the denominator (default 1e-8). */
  eps?: number;
  /** Adam: L2 penalty (default 0); AdamW: decoupled weight decay (default 1e-2). */
  weight_decay?: number;
  /** AMSGrad (default false). */
  amsgrad?: boolean;
  /** Maximize the objective (default false). */
  maximize?: boolean;
  foreach?: boolean | null;
  capturable?: boolean;
  differentiable?: boolean;
  /** PyTorch's fused update: as in `SgdOptions.fused`. */
  fused?: boolean | null;
  decoupled_weight_decay?: boolean;
}

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

/** What SGD, Adam and AdamW share: a `torch.optim` optimizer over every rank of a `Replicas`. */
declare abstract class LocalOptimizer<O> {
  /** `"SGD"`, `"Adam"` or `"AdamW"`. */
  readonly name: 'SGD' | 'Adam' | 'AdamW';
  /**
   * One step on every rank: each parameter with a gradient on a rank is updated from it; the
   * others are skipped. Throws a RuntimeError once the optimizer belongs to a
   * PostLocalSGDOptimizer (step that instead).
   */
  step(): void;
  /** `zero_grad(set_to_none=True)` on every rank. */
  zeroGrad(): void;
  /** The parameter indices of each parameter group. */
  paramGroups(): number[][];
  /** Adds a parameter group with its own options. */
  addParamGroup(group: ParamGroup<O>): void;
  /** Rank `rank`'s `state_dict()`. */
  stateDict(rank: number): Promise<StateDict>;
  /** `load_state_dict(stateDict)` on rank `rank`. */
  loadStateDict(rank: number, stateDict: StateDictInput): void;
  /** Releases the optimizer's memory. */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** `torch.optim.SGD` on every rank of `replicas`. */
export class SGD extends LocalOptimizer<SGDOptions> {
  /**
   * @param options PyTorch's keyword arguments; an unknown one is a TypeError, an invalid
   *   value PyTorch's ValueError (e.g. `Invalid learning rate: -1.0`).
   * @param paramGroups `[{params: [j, …], …options}]`; default: one group of every parameter.
   */
  constructor(replicas: Replicas, options?: SGDOptions | null, paramGroups?: readonly ParamGroup<SGDOptions>[] | null);
  readonly name: 'SGD';
}

/** `torch.optim.Adam` on every rank of `replicas`. */
export class Adam extends LocalOptimizer<AdamOptions> {
  constructor(replicas: Replicas, options?: AdamOptions | null, paramGroups?: readonly ParamGroup<AdamOptions>[] | null);
  readonly name: 'Adam';
}

/** `torch.optim.AdamW` (decoupled weight decay) on every rank of `replicas`. */
export class AdamW extends LocalOptimizer<AdamOptions> {
  constructor(replicas: Replicas, options?: AdamOptions | null, paramGroups?: readonly ParamGroup<AdamOptions>[] | null);
  readonly name: 'AdamW';
}

/** Any of the local optimizers. */
export type AnyLocalOptimizer = SGD | Adam | AdamW;

// ---------------------------------------------------------------------------------------------
// Model averaging
// ---------------------------------------------------------------------------------------------

/**
 * `PeriodicModelAverager(period, warmup_steps)`: call number s averages the parameters that
 * have a gradient iff `s >= warmupSteps` and `(s − warmupSteps) % period == 0`.
 */
export class PeriodicModelAverager {
  /**
   * @param period default 1 (warns, as PyTorch does)
   * @param warmupSteps default 0; checked before `period`
   * @param groupSize average within contiguous groups of this many ranks (default: the world)
   */
  constructor(period: number | undefined, warmupSteps: number | undefined, world: World, groupSize?: number | null);
  readonly period: number;
  readonly warmupSteps: number;
  /** Calls of `averageParameters` so far. */
  step: number;
  /**
   * Averages (if the schedule says so) the parameters in `params` (default all) that have a
   * gradient on rank 0, and advances the counter. Returns the group size used, or `null`.
   * @throws ValueError `torch.cat(): expected a non-empty list of Tensors` when averaging is
   *   due and no parameter has a gradient
   */
  averageParameters(replicas: Replicas, params?: readonly number[] | null): number | null;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/**
 * `HierarchicalModelAverager(period_group_size_dict, warmup_steps)`: call s averages iff
 * `s >= warmupSteps` and some period divides s; the periods are searched from the last
 * inserted to the first, and the first match picks the group size.
 */
export class HierarchicalModelAverager {
  /**
   * @param periodGroupSizeDict `[[period, groupSize], …]` or a `Map`, in insertion order (a
   *   plain object would lose it); the last group size must be the world size
   * @param warmupSteps default 0, checked after the dict (as PyTorch does)
   */
  constructor(
    periodGroupSizeDict: ReadonlyArray<readonly [number, number]> | ReadonlyMap<number, number>,
    warmupSteps: number | undefined,
    world: World,
  );
  /** Calls of `averageParameters` so far. */
  step: number;
  /** As `PeriodicModelAverager.averageParameters`. */
  averageParameters(replicas: Replicas, params?: readonly number[] | null): number | null;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** Either averager. */
export type ModelAverager = PeriodicModelAverager | HierarchicalModelAverager;

// ---------------------------------------------------------------------------------------------
// Post-local SGD
// ---------------------------------------------------------------------------------------------

/**
 * `PostLocalSGDOptimizer(optim, averager)`: the local step on every rank, then model averaging
 * over the optimizer's parameters. `optim` and `averager` move into it: they still report
 * their state (`stateDict`, `paramGroups`, `step`), but step only through this object.
 */
export class PostLocalSGDOptimizer {
  constructor(optim: AnyLocalOptimizer, averager: ModelAverager);
  /** The local step, then averaging if due. Returns the averaging group size, or `null`. */
  step(): number | null;
  /** `zero_grad()` on every rank. */
  zeroGrad(): void;
  /** The averager's step counter. */
  readonly averagerStep: number;
  /** Rank `rank`'s state dict: the optimizer's plus `step`, the averager's counter. */
  stateDict(rank: number): Promise<StateDict & { step: number }>;
  /** Loads rank `rank`'s state; without `step` it warns and sets the counter to 0. */
  loadStateDict(rank: number, stateDict: StateDictInput): void;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/**
 * `PostLocalSGDState` + `post_localSGD_hook`: the gradients are all-reduced (mean) over the
 * world for the first `startLocalSGDIter` iterations, then within subgroups of `subgroupSize`
 * ranks (or not at all when `postLocalGradientAllreduce` is false).
 */
export class PostLocalSGDState {
  /**
   * @param subgroupSize `null`: the whole world
   * @param postLocalGradientAllreduce default true
   */
  constructor(
    world: World,
    subgroupSize: number | null | undefined,
    startLocalSGDIter: number,
    postLocalGradientAllreduce?: boolean,
  );
  /** Iterations seen (PyTorch stops counting once local SGD starts). */
  readonly iter: number;
  /** The hook, after every rank's backward pass: averages the gradients in place. Returns the group size, or `null`. */
  synchronizeGradients(replicas: Replicas): number | null;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** A `DiLoCo` state dict (one rank's). */
export interface DiLoCoStateDict {
  /** The inner optimizer's `state_dict()`. */
  inner_optimizer: StateDict;
  /** The outer optimizer's `state_dict()`. */
  outer_optimizer: StateDict;
  /** Inner steps since the start of the period (plain DiLoCo: since the last sync). */
  local_step: number;
  /** The parameters at their fragment's last sync, one tensor per parameter. */
  original_parameters: Tensor[];
  /**
   * The fragment in flight (inside a `fragmentSyncDelay` window): its index and its
   * all-reduced pseudo-gradients (one tensor per parameter of the fragment, in its order), or `null`.
   */
  pending: { fragment: number; pseudo_gradients: Tensor[] } | null;
}

/** A `DiLoCo` state dict as `loadStateDict` accepts it (tensors in any `TensorInput` form). */
export interface DiLoCoStateDictInput {
  inner_optimizer: StateDictInput;
  outer_optimizer: StateDictInput;
  local_step: number;
  original_parameters: readonly TensorInput[];
  /** Required (non-null) exactly when `local_step` lies in a fragment's delay window; missing reads as `null`. */
  pending?: { fragment: number; pseudo_gradients: readonly TensorInput[] } | null;
}

/**
 * DiLoCo (torchft's): `inner` steps every rank; every `syncEvery` inner steps the ranks'
 * pseudo-gradients (parameters at the last sync minus the current ones, in each parameter's
 * dtype) are averaged over `world`, the parameters return to the last sync's, and `outer` steps
 * with that gradient. Both optimizers must be built over the same `Replicas` (one rank per rank
 * of `world`); they move into the DiLoCo (their objects still report their state, but step
 * only through it).
 */
/** `DiLoCo` options. */
export interface DiLoCoOptions {
  /**
   * Send the pseudo-gradients in bfloat16 or float16 (OpenDiLoCo's compressed all-reduce):
   * each rank's pseudo-gradient rounded to it, averaged in it (every quotient and addition
   * rounded), converted back to each parameter's dtype. Default `'none'`.
   */
  compress?: 'none' | 'bf16' | 'f16';
  /**
   * Streaming DiLoCo (torchft's `model_fragments`): the parameters split into fragments (lists of
   * parameter indices, each parameter in exactly one, at most `syncEvery` of them). With `F`
   * fragments, fragment `f`'s outer step comes after local step `(f+1)·syncEvery/F` of every
   * period (torchft's schedule). Default: one fragment of every parameter (plain DiLoCo).
   */
  fragments?: readonly (readonly number[])[];
  /**
   * torchft's `fragment_sync_delay`: a fragment's pseudo-gradient all-reduce starts this many
   * inner steps before its outer step (the inner steps in between still update it). A
   * non-negative integer below `syncEvery / F` (rounded down). Default 0.
   */
  fragmentSyncDelay?: number;
  /**
   * torchft's `fragment_update_alpha` in `[0, 1]`: after an outer step the fragment's parameters
   * become `global.lerp(local, alpha)` (0: the outer step's result; 1: the local parameters, the
   * outer step only moving the saved copy). Default 0. torchft's `should_quantize` is not
   * supported (a ValueError): `compress` is distopt's own 16-bit wire format.
   */
  fragmentUpdateAlpha?: number;
}

export class DiLoCo {
  /**
   * A ValueError when `syncEvery < 1`, the replicas' ranks differ from the world's,
   * `options.compress` is not a known format, `options.fragments` is not a partition of the
   * parameters (an IndexError for an index out of range), `fragmentSyncDelay` or
   * `fragmentUpdateAlpha` is out of range, or `shouldQuantize` is given; a TypeError for an
   * unknown option or a value of the wrong type.
   */
  constructor(
    inner: AnyLocalOptimizer,
    outer: AnyLocalOptimizer,
    syncEvery: number,
    world: World,
    options?: DiLoCoOptions,
  );
  /** The pseudo-gradients' wire precision. */
  readonly compress: 'none' | 'bf16' | 'f16';
  /** One inner step on every rank, then a sync when due. Returns whether an outer step was applied. */
  step(): boolean;
  /** `step()`, returning the fragments whose outer step was applied. */
  stepFragments(): number[];
  /** The fragments' parameter indices. */
  readonly fragments: number[][];
  /** torchft's `fragment_sync_delay`. */
  readonly fragmentSyncDelay: number;
  /** torchft's `fragment_update_alpha`. */
  readonly fragmentUpdateAlpha: number;
  /** The fragment whose all-reduce has started and whose outer step waits, or `null`. */
  readonly pendingFragment: number | null;
  /** The outer step now for every fragment (one in flight is applied first), and a new period. */
  sync(): void;
  /** `zero_grad(set_to_none=True)` on every rank. */
  zeroGrad(): void;
  /** Inner steps since the start of the period (plain DiLoCo: since the last sync). */
  readonly localStep: number;
  /** Inner steps between syncs. */
  readonly syncEvery: number;
  /** Rank `rank`'s state: both optimizers, the local step counter, the last sync's parameters. */
  stateDict(rank: number): Promise<DiLoCoStateDict>;
  /** Loads rank `rank`'s state saved by `stateDict` (the model's parameters are restored apart). */
  loadStateDict(rank: number, stateDict: DiLoCoStateDictInput): void;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// ZeRO: optimizer state sharded over the ranks
// ---------------------------------------------------------------------------------------------

/** `ZeroRedundancyOptimizer`'s own construction options. */
export interface ZeroOptions {
  /** Pack each rank's parameters into one flat bucket, broadcast as one transfer (default false). */
  parametersAsBucketView?: boolean;
  /**
   * Overlap the optimizer with DDP's backward (default false). Without DDP the optimizer never
   * finishes initializing, as in PyTorch: `step()` only warns, the partition getters are `null`,
   * and the state-dict methods throw a RuntimeError.
   */
  overlapWithDdp?: boolean;
}

/**
 * A tensor given to `ZeroRedundancyOptimizer` that is not one of the replicas' parameters (a
 * replica parameter is its index): PyTorch's checks see it with its dtype, device, layout and
 * leaf-ness, and reject it as PyTorch does (a meta or sparse tensor, a non-leaf tensor, a dtype
 * unlike the others); one that passes the checks is a ValueError, it has no data to optimize.
 */
export interface TensorDescription {
  dtype: DTypeName;
  shape?: readonly number[];
  device?: 'cpu' | 'meta';
  layout?: 'strided' | 'sparse_coo';
  leaf?: boolean;
}

/** An item of ZeRO's `params`: a replica parameter index or a tensor description. */
export type ZeroParam = number | TensorDescription;

/** A ZeRO parameter group: its parameters and its options (without `params`: PyTorch's ValueError). */
export type ZeroParamGroup<O> = O & { params?: readonly ZeroParam[] };

/**
 * `torch.distributed.optim.ZeroRedundancyOptimizer` over a simulated `World`: the parameters are
 * assigned to ranks by PyTorch's sorted-greedy partition; each rank's local optimizer (`SGD`,
 * `Adam` or `AdamW`) keeps state only for the parameters it owns and updates them from that
 * rank's own gradients; the owners then broadcast the updated parameters to every rank.
 *
 * Global parameter indices (`rankOfParam`, `paramsPerRank`, state dict keys) number the groups'
 * parameters in order, group after group.
 */
export class ZeroRedundancyOptimizer<N extends 'SGD' | 'Adam' | 'AdamW' = 'SGD' | 'Adam' | 'AdamW'> {
  /**
   * @param world one rank per replica (a ValueError otherwise).
   * @param params PyTorch's `params` argument: `null` (every parameter in one group), a list of
   *   parameter indices (and tensor descriptions), or parameter groups `[{params: [j, …],
   *   …options}]`, checked as PyTorch checks it (an empty list is a ValueError; a list mixing
   *   parameters and groups, or holding other values, a TypeError; a number or a lone tensor
   *   description instead of a list a TypeError; an index out of range an IndexError). A
   *   failure is every rank's (`rankErrors`).
   * @param optimizer the local optimizer class, as PyTorch takes it: `SGD`, `Adam`, `AdamW`
   *   (the classes this package exports) or their names (from plain JS, another name gets
   *   PyTorch's error, for example for `'NAdam'` or `'_FunctionalSGD'`).
   * @param options its keyword arguments (the defaults of every group).
   */
  constructor(
    world: World,
    replicas: Replicas,
    params:
      | readonly ZeroParam[]
      | readonly ZeroParamGroup<N extends 'SGD' ? SGDOptions : AdamOptions>[]
      | ZeroParam
      | null,
    optimizer: N | OptimizerClass,
    options?: (N extends 'SGD' ? SGDOptions : AdamOptions) | null,
    zeroOptions?: ZeroOptions | null,
  );
  /** The local optimizer class. */
  readonly optimizer: N;
  /**
   * One step: each rank updates what it owns from its own gradients, then the owners broadcast.
   * In a `Join`, the ranks that joined run ZeRO's join hook (the same step, with the gradients
   * they still hold). A failure carries every rank's error (`rankErrors`).
   */
  step(): void;
  /** `zero_grad(set_to_none=True)` on every rank. */
  zeroGrad(): void;
  /** Sets `requires_grad` of parameter j (replica index); warns at the next step. */
  setRequiresGrad(j: number, requiresGrad: boolean): void;
  /** The replica indices of each parameter group. */
  paramGroups(): number[][];
  /**
   * Adds a parameter group (replica indices not yet optimized); the partition is recomputed,
   * earlier parameters keep their ranks and state.
   */
  addParamGroup(group: ParamGroup<N extends 'SGD' ? SGDOptions : AdamOptions>): Promise<void>;
  /** Gathers every rank's shard of the state on rank `to` (default 0; outside the world: nowhere). */
  consolidateStateDict(to?: number): Promise<void>;
  /**
   * `state_dict()` as seen on rank `rank`: a promise of the consolidated state dict in a plain
   * optimizer's layout (a promise, as every optimizer's `stateDict` is). Rejects with a
   * RuntimeError unless it was consolidated to `rank`; an invalid `rank` throws.
   */
  stateDict(rank: number): Promise<StateDict>;
  /** `load_state_dict` on every rank: each keeps the state of what it owns (any saved world size). */
  loadStateDict(stateDict: StateDictInput): void;
  /** The owner of each parameter (global index), or `null` before initialization. */
  readonly rankOfParam: number[] | null;
  /** The global indices each rank owns, in its local optimizer's order, or `null`. */
  readonly paramsPerRank: number[][] | null;
  /** `paramsPerRank` split by parameter group: `[rank][group]`, or `null`. */
  readonly paramsPerRankPerGroup: number[][][] | null;
  /** Elements each rank owns, or `null`. */
  readonly numelPerRank: number[] | null;
  /**
   * Per rank: its local optimizer's parameter groups (`zero.optim.param_groups` read on that
   * rank), each as the global indices of its parameters; `null` before initialization.
   */
  localOptimizerParamGroups(): number[][][] | null;
  /** The owner of each replica parameter (by replica index), or `null` for one not optimized. */
  rankOfReplicaParam(): (number | null)[];
  /** Per rank: how many parameters have optimizer state. */
  localStateSizes(): number[];
  /** Per rank: bytes of optimizer state allocated (its shard only). */
  stateBytesPerRank(): number[];
  /** Releases the optimizer's memory. */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// DistributedDataParallel and Join (uneven inputs)
// ---------------------------------------------------------------------------------------------

/**
 * `torch.nn.parallel.DistributedDataParallel`'s gradient synchronization over a simulated
 * `World`, the model held by a `Replicas` (one replica per rank). The constructor broadcasts
 * rank 0's parameters to every rank, as DDP's does.
 */
export class DistributedDataParallel {
  constructor(world: World, replicas: Replicas);
  /**
   * The backward pass's gradient all-reduce, once every rank's local gradients are set: every
   * rank with inputs gets `Σ_r fl32(G_r · fl32(1/D))` over the ranks with inputs (a missing
   * gradient counts as zeros), `D` the world size, or, in a `Join` with
   * `divideByInitialWorldSize: false` of which DDP is the first joinable, the number of ranks
   * with inputs. Ranks that joined contribute zeros and keep their own gradients.
   */
  synchronizeGradients(): void;
  /** Releases the module. */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** `Join`'s options (PyTorch's keyword arguments and their defaults). */
export interface JoinOptions {
  /** Uneven-input detection (default true); off, uneven inputs are a RuntimeError. */
  enable?: boolean;
  /**
   * Raise on every rank as soon as one runs out of inputs (default false): `RuntimeError`
   * `Rank r exhausted all inputs.` on the ranks that did, `Detected at least one rank that
   * exhausted inputs. Throwing across all ranks.` on the others, each in `rankErrors`.
   */
  throwOnEarlyTermination?: boolean;
  /** DDP's join hook keyword (default true): divide by the initial world size, not the active ranks. */
  divideByInitialWorldSize?: boolean;
}

/**
 * `torch.distributed.algorithms.Join` over `DistributedDataParallel` and
 * `ZeroRedundancyOptimizer` objects sharing one `Replicas`, run in lock-step: every global
 * iteration starts with `iteration(hasInput)`; the joinables' calls that follow
 * (`ddp.synchronizeGradients()`, `zero.step()`) make one collective for all ranks, in which
 * the ranks that joined run their join hooks (DDP's shadows the all-reduce with zeros, ZeRO's
 * steps with the gradients the rank still holds); `exit()` ends the context and runs the
 * post-hooks (DDP broadcasts the final model from the last rank to join). Put DDP first, as
 * PyTorch requires.
 */
export class Join {
  /** A ValueError without joinables (`The join context manager requires at least one joinable`). */
  constructor(joinables: readonly (DistributedDataParallel | ZeroRedundancyOptimizer)[], options?: JoinOptions | null);
  /** The start of a global iteration: `hasInput[r]` is whether rank r still has an input (a rank without one joins for good). */
  iteration(hasInput: readonly boolean[]): void;
  /** The end of the `with` block: the post-hooks. */
  exit(): void;
  /** Per rank: whether it has joined. */
  readonly joined: boolean[];
  /** Per rank: shadow iterations it ran since it joined. */
  shadowIterations(): number[];
  /** Releases the context. */
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// RPC and DistributedOptimizer
// ---------------------------------------------------------------------------------------------

/**
 * Named workers in this process plus `"driver"` (the caller), each owning tensors referenced by
 * `RRef`s, with distributed autograd contexts that collect gradients per remote tensor.
 *
 * In WebAssembly every call runs inline, on the caller's thread, when it is made, and the workers
 * always compute on the **CPU backend** whatever `init()` chose: a call cannot wait for a GPU
 * readback there. Worker names must be distinct strings (a ValueError otherwise); calling an
 * unknown worker is a RuntimeError.
 */
export class RpcWorld {
  constructor(workerNames: readonly string[]);
  /** Every worker's name, `"driver"` first. */
  readonly workerNames: string[];
  /** `rpc.remote(worker, lambda: tensor)`: stores `tensor` on `worker`. */
  remote(worker: string, tensor: TensorInput): RRef;
  /** `dist_autograd.context()`: a new live context. */
  context(): AutogradContext;
  /**
   * Records `gradient` for `rref` in context `contextId` on its owner; contributions to one
   * tensor accumulate. Rejects with a RuntimeError for a context that is not live.
   */
  recordGradient(contextId: number | AutogradContext, rref: RRef, gradient: TensorInput): Promise<void>;
  /** `dist_autograd.get_gradients(contextId)` on worker `owner`: gradients by RRef id. */
  getGradients(contextId: number | AutogradContext, owner: string): Promise<Map<number, Tensor>>;
  /** The `.grad` attribute of the tensor behind `rref` (set by the `torch.optim` path), or `null`. */
  gradOf(rref: RRef): Promise<Tensor | null>;
  /** Stops worker `name`; later calls to it and its RRefs are RuntimeErrors. */
  shutdownWorker(name: string): void;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** A reference to a tensor owned by a worker of an `RpcWorld`. */
export class RRef {
  private constructor();
  /** The owning worker's name. */
  readonly owner: string;
  /** The reference's id, unique in its world (the keys of `getGradients`). */
  readonly id: number;
  /** A copy of the value, fetched from the owner. */
  toHere(): Promise<Tensor>;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** A distributed autograd context (`dist_autograd.context()`). */
export class AutogradContext {
  private constructor();
  /** The context id (pass it to `recordGradient`, `getGradients`, `DistributedOptimizer.step`). */
  readonly id: number;
  /** Whether the context is still live. */
  readonly live: boolean;
  /** Ends the context and drops its gradients (idempotent; `free()` does it too). */
  release(): void;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

/** What `DistributedOptimizer` runs on each owner. */
export interface DistributedOptimizerSettings {
  /**
   * `true` (default, PyTorch's with TorchScript on): functional optimizers, which skip a
   * parameter without a gradient in the context. `false`: the `torch.optim` path, where the
   * context's gradients are assigned to `param.grad` and persist across steps.
   */
  functional?: boolean;
}

/** One owner's local optimizer. */
export interface LocalOptimizerInfo {
  /** The owning worker. */
  owner: string;
  /** Indices (into the constructor's `rrefs`) of the parameters it optimizes. */
  paramIndices: number[];
}

/**
 * A local optimizer class where ZeRO and `DistributedOptimizer` take one (as PyTorch takes
 * `torch.optim.Adam`); its name (`'SGD'`, `'Adam'`, `'AdamW'`) is accepted too.
 */
export type OptimizerClass = typeof SGD | typeof Adam | typeof AdamW;

/**
 * `torch.distributed.optim.DistributedOptimizer`: one local optimizer per worker that owns
 * parameters (in order of first appearance), stepped from a distributed autograd context's
 * gradients. No communication between owners, no averaging.
 */
export class DistributedOptimizer<N extends 'SGD' | 'Adam' | 'AdamW' = 'SGD' | 'Adam' | 'AdamW'> {
  /**
   * @throws ValueError for an unknown optimizer class or an RRef of another world; TypeError for
   *   something that is not an RRef; PyTorch's errors for invalid options.
   */
  constructor(
    rpcWorld: RpcWorld,
    optimizer: N | OptimizerClass,
    rrefs: readonly RRef[],
    options?: (N extends 'SGD' ? SGDOptions : AdamOptions) | null,
    settings?: DistributedOptimizerSettings | null,
  );
  /** Whether the owners run functional optimizers. */
  readonly isFunctionalOptim: boolean;
  /** One entry per owner. */
  localOptimizers(): LocalOptimizerInfo[];
  /** One step on every owner; rejects with the first owner's error (RuntimeError for a dead context). */
  step(contextId: number | AutogradContext): Promise<void>;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// A synthetic training run (the demo's engine)
// ---------------------------------------------------------------------------------------------

/** The synthetic classification task: Gaussian clusters, one skewed shard per rank. */
export interface TaskSettings {
  /** Input features (default 32). */
  features?: number;
  /** Hidden units of the two-layer perceptron (default 32). */
  hidden?: number;
  /** Classes (default 4). */
  classes?: number;
  /** Samples in all shards together (default 4096). */
  samples?: number;
  /** 0: IID shards … 1: every shard one class (default 0.8). */
  heterogeneity?: number;
  /** Seed of the data and the initial parameters (default 0). */
  seed?: number;
}

/**
 * A labelled data set for `task.dataset`: `labels.length` samples of `features.length /
 * labels.length` values each (row-major), labels in `0..classes`. `Trainer.parseDigits`
 * returns one.
 */
export interface DatasetInput {
  features: Float32Array | Float64Array | Uint8Array | ArrayLike<number>;
  labels: Uint8Array | Uint16Array | Int32Array | ArrayLike<number>;
  classes: number;
  /** Shown in `taskName` (default `'dataset'`). */
  name?: string;
  /** Values per sample; checked against `features.length / labels.length` when given. */
  featureCount?: number;
}

/** What `Trainer.parseDigits` reads from `www/data/digits.bin`. */
export interface Digits extends DatasetInput {
  name: 'digits';
  /** 1,797 × 64 pixels scaled to [0, 1]. */
  features: Float32Array;
  /** 1,797 labels, 0..9. */
  labels: Uint8Array;
  classes: 10;
  featureCount: 64;
}

/**
 * A real data set, split into a held-out test set and one non-IID training shard per rank (a
 * `heterogeneity` share of the samples sorted by label, the rest placed at random, cut into R
 * contiguous shards).
 */
export interface DatasetTaskSettings {
  dataset: DatasetInput;
  /** Hidden units of the two-layer perceptron (default 32). */
  hidden?: number;
  /** Share of the samples held out for `evaluate()`, in [0, 1) (default 0.2). */
  testFraction?: number;
  /** 0: IID shards … 1: shards sorted by label (default 0.9). */
  heterogeneity?: number;
  /** Seed of the split and the initial parameters (default 0). */
  seed?: number;
}

export interface TrainerSettings {
  /** R, the number of ranks (and shards). */
  ranks: number;
  /**
   * Synchronous SGD (default), post-local SGD with periodic or hierarchical averaging, ZeRO
   * (synchronous SGD whose momentum is sharded over the ranks by a ZeroRedundancyOptimizer), or
   * DiLoCo (local SGD steps, and every `period` steps the mean pseudo-gradient applied by an
   * outer SGD with lr 0.7 and Nesterov momentum 0.9).
   */
  algorithm?: 'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco';
  /**
   * Averaging period; for `hierarchical`, the world-level period of the default hierarchy; for
   * `diloco`, the inner steps between syncs (`sync_every`) (default 8).
   */
  period?: number;
  /** `diloco`: fragments of Streaming DiLoCo, syncing staggered (default 1: plain DiLoCo; at most `period`). */
  fragments?: number;
  /**
   * `diloco`: torchft's `fragment_sync_delay`, inner steps between a fragment's all-reduce and
   * its outer step (default 0; smaller than `period / fragments`). Another algorithm: ValueError.
   */
  fragmentSyncDelay?: number;
  /**
   * `diloco`: torchft's `fragment_update_alpha`, the weight of the local parameters mixed with
   * the outer step's result (default 0, in [0, 1]). Another algorithm: ValueError.
   */
  fragmentUpdateAlpha?: number;
  /** `diloco`: the pseudo-gradients' wire format (default `'none'`: each parameter's own dtype). */
  compress?: 'none' | 'bf16' | 'f16';
  /** Warm-up steps of synchronous SGD before local SGD (default 20, as the command line's `--warmup`). */
  warmup?: number;
  /** `hierarchical`: `[[period, groupSize], …]` (default `Trainer.defaultHierarchy(period, ranks)`). */
  levels?: ReadonlyArray<readonly [number, number]>;
  /** `hierarchical`: all-reduce the gradients within groups of this size after warm-up. */
  subgroupSize?: number | null;
  /** SGD learning rate (default 0.05). */
  lr?: number;
  /** SGD momentum (default 0.9). */
  momentum?: number;
  /** Samples per rank per step (default 32). */
  batchSize?: number;
  /** Seed of the mini-batch sampling (default 0). */
  seed?: number;
  /** The synthetic task (default), or a real data set with a held-out split. */
  task?: TaskSettings | DatasetTaskSettings;
}

/** What one `Trainer.step()` did. */
export interface StepReport {
  /** Steps completed, this one included. */
  step: number;
  /** Each rank's mini-batch loss. */
  lossPerRank: Float64Array;
  meanLoss: number;
  /** The largest L2 distance of a replica from the mean of the replicas (0 when identical). */
  divergence: number;
  /** Bytes each rank has sent so far (cumulative). */
  bytesCommunicatedPerRank: number;
  /** Group size the gradients were all-reduced over this step, or `null`. */
  gradientsReduced: number | null;
  /** Group size the parameters were averaged over this step, or `null`. */
  averaged: number | null;
  /**
   * Bytes of optimizer state (momentum) each rank holds after the step: the whole model's for
   * a local SGD, the rank's shard for ZeRO.
   */
  optimizerStateBytesPerRank: number[];
}

/** The replicas' quality on the evaluation samples: a data set's held-out split, or every shard of the synthetic task. */
export interface Evaluation {
  /** Loss of the mean of the replicas' parameters. */
  meanModelLoss: number;
  /** Accuracy of the mean of the replicas' parameters. */
  meanModelAccuracy: number;
  /** Each replica's own loss. */
  lossPerRank: Float64Array;
  /** Whether the samples are held out (no rank trains on them). */
  heldOut: boolean;
  /** Samples measured. */
  samples: number;
}

/**
 * R simulated ranks training a two-layer perceptron on a synthetic task or a real data set
 * (`task.dataset`, e.g. the digits from `Trainer.parseDigits`), one step at a time, through
 * distopt's replicas, gradient hook, SGD and averagers.
 */
export class Trainer {
  constructor(settings: TrainerSettings);
  /**
   * Reads the UCI hand-written digits file (`www/data/digits.bin` of the repository: CC BY 4.0,
   * E. Alpaydin and C. Kaynak) into a data set for `task.dataset`.
   */
  static parseDigits(bytes: ArrayBuffer | Uint8Array): Digits;
  /** `'synthetic'` or the data set's name. */
  readonly taskName: string;
  /** The data, its split and the model, in words. */
  readonly taskDescription: string;
  /** Whether `evaluate()` measures held-out samples. */
  readonly heldOut: boolean;
  /** The default hierarchy for `ranks` ranks with world-level period `period`. */
  static defaultHierarchy(period: number, ranks: number): Array<[number, number]>;
  readonly ranks: number;
  readonly algorithm: 'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco';
  /** The algorithm in words, with its settings. */
  readonly description: string;
  /** Steps completed. */
  readonly steps: number;
  /** Scalar parameters of one replica. */
  readonly numParams: number;
  /** How many samples of each class rank `rank`'s shard holds. */
  classCounts(rank: number): number[];
  /** Bytes sent so far, per rank, by kind. */
  commStats(): CommStats;
  /** Bytes of optimizer state each rank holds now. */
  optimizerStateBytesPerRank(): number[];
  /** One step on every rank. */
  step(): Promise<StepReport>;
  /** The loss of every replica and of their mean (and its accuracy) on the evaluation samples. */
  evaluate(): Promise<Evaluation>;
  /** Every rank's parameters. */
  params(): Promise<Tensor[][]>;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}

// ---------------------------------------------------------------------------------------------
// Benchmark
// ---------------------------------------------------------------------------------------------

/**
 * The data-parallel SGD step resident on the current backend (R ranks of N elements), for
 * timing: each `run()` is one fused step and a wait for the device.
 */
/** Resolves when the current backend has finished the work queued so far (to time `step()`). */
export function synchronize(): Promise<void>;

export class StepBench {
  /** Fills the arenas and waits for the device (dtype default `'float32'`). */
  static create(ranks: number, elements: number, dtype?: 'float32' | 'float16' | 'bfloat16'): Promise<StepBench>;
  /** One step, resolved when the device has finished it. */
  run(): Promise<void>;
  /**
   * Rank `rank`'s parameters or gradients read back (float32 benches only), to hand a peer
   * the same tensors and check its answer.
   */
  read(which: 'params' | 'grads', rank: number): Promise<Float32Array>;
  /** Bytes one step moves: (2R + 2)·N·element size. */
  readonly bytes: number;
  readonly ranks: number;
  readonly elements: number;
  readonly dtype: DType;
  readonly backend: BackendInfo;
  free(): void;
  /** `free()`, for `using x = new …` (explicit resource management). */
  [Symbol.dispose](): void;
}
