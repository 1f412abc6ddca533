// distopt: PyTorch's data-parallel optimizer family on WebGPU (or a CPU fallback), compiled
// from Rust to WebAssembly. This file loads the module, picks the backend, and puts a guard
// in front of every function and method of the wasm-bindgen glue in ./wasm/ (see index.d.ts
// for the API):
//
// * Arguments are read here, once, inside a guard, and handed to the module as plain data
//   (arrays, plain objects, fresh typed arrays): a getter or Proxy that throws, a revoked
//   Proxy, a detached ArrayBuffer or a cyclic object is a named `TypeError`/`ValueError`
//   saying which argument and where in it, and never reaches the module half-read (an
//   exception thrown through the module's Rust frames would leave the object "busy" for good).
// * The receiver is checked: a method called on an object of another class, on a Proxy of a
//   distopt object or on a freed object is a `TypeError`, not a read of another object's memory.
// * A call before `init()` is a `RuntimeError` saying to await `init()` first.
// * A single typed array too large for the module's memory budget is refused before it is
//   copied (a `RuntimeError` naming its size and the budget); the module checks the rest.
// * If the module ever traps (a bug), every later call says so instead of misbehaving.
//
// Float16Array inputs (where the runtime has them) are accepted as float16 data: a bare
// Float16Array is a 1-D float16 tensor, `{data: Float16Array}` is float16 unless `dtype` says
// otherwise. Returned float16 tensors keep their documented form (Uint16Array bit patterns).

// The build this copy wraps (flavor.js beside it: the single-threaded build's, or in threads/
// the threaded build's): its glue and its .wasm, the parameter names of every call of the module (generated
// at build time from wasm-bindgen's declarations by scripts/glue-params.mjs: they name arguments
// in messages), and its CPU worker threads.
import { glue, PARAMS, threadedBuild, spawnThreadWorker, wasmUrl } from './flavor.js';

const loadModule = glue.default;

const isNode =
  typeof process === 'object' &&
  process !== null &&
  typeof process.versions === 'object' &&
  process.versions !== null &&
  typeof process.versions.node === 'string';

// ---------------------------------------------------------------------------------------------
// State of the module

let initialized = false;
/** The trap that made the module unusable, if any. */
let trapped = null;

function namedError(name, message, cause) {
  const error = cause === undefined ? new Error(message) : new Error(message, { cause });
  error.name = name;
  return error;
}

function checkUsable(what) {
  if (trapped !== null) {
    throw namedError(
      'RuntimeError',
      `${what}: distopt's WebAssembly module trapped earlier (${trapped.message}) and cannot be used any more: load the package again in a new page, worker or process`,
      trapped,
    );
  }
  if (!initialized) {
    throw namedError('RuntimeError', `${what}: distopt is not initialized: call (and await) init() first`);
  }
}

// ---------------------------------------------------------------------------------------------
// Reading arguments

/** Largest single typed array an argument may hold (the module's budget is 2 GiB in all). */
const MAX_INPUT_BYTES = 2 ** 31 - 1;
/**
 * Bytes the module needs at the least for each element of a plain array it is given (a number
 * becomes a float64): the arrays of one call, summed, are refused by their lengths against the
 * budget before any is iterated, so that a huge (say sparse) array is an error at once, not a
 * minutes-long copy.
 */
const ARRAY_ELEMENT_BYTES = 8;
/**
 * The internal methods by which distopt's objects hand themselves over to the module
 * (`__distoptWorld`, …): an object that is not one made by distopt but carries one of them as
 * its own property is refused, never taken for the object it came from.
 */
const INTERNAL_FIELDS = {
  __distoptWorld: 'a World',
  __distoptReplicas: 'a Replicas',
  __distoptOptimizer: 'an SGD, Adam or AdamW',
  __distoptAverager: 'a PeriodicModelAverager or HierarchicalModelAverager',
  __distoptZero: 'a ZeroRedundancyOptimizer',
  __distoptDdp: 'a DistributedDataParallel',
  __distoptRpcWorld: 'an RpcWorld',
  __distoptRRef: 'an RRef',
  __distoptContext: 'an AutogradContext',
};
const MAX_DEPTH = 64;
const ECHO_CHARS = 64;

const TypedArray = Object.getPrototypeOf(Uint8Array);
const taGetter = (key) => Object.getOwnPropertyDescriptor(TypedArray.prototype, key).get;
const taTag = taGetter(Symbol.toStringTag);
const taLength = taGetter('length');
const taBuffer = taGetter('buffer');
const taByteLength = taGetter('byteLength');
const taByteOffset = taGetter('byteOffset');
const INTRINSIC_ARRAYS = {
  Int8Array,
  Uint8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
};
if (typeof globalThis.Float16Array === 'function') INTRINSIC_ARRAYS.Float16Array = globalThis.Float16Array;

/** A short, safe description of a value (never runs the caller's code). */
function describe(value) {
  if (value === null) return 'null';
  switch (typeof value) {
    case 'undefined':
      return 'undefined';
    case 'string':
      return value.length > ECHO_CHARS
        ? `a string (${JSON.stringify(value.slice(0, ECHO_CHARS))}… ${value.length} characters)`
        : `a string (${JSON.stringify(value)})`;
    case 'number':
    case 'boolean':
      return `a ${typeof value} (${String(value)})`;
    case 'bigint':
      return 'a bigint';
    case 'symbol':
      return 'a symbol';
    case 'function':
      return 'a function';
    default:
      return 'an object';
  }
}

function errorText(e) {
  if (e !== null && (typeof e === 'object' || typeof e === 'function')) {
    let name = 'Error';
    let message = '';
    try {
      name = String(e.name);
      message = String(e.message);
    } catch {
      // An error whose own getters throw: keep the generic text.
    }
    if (message.length > 200) message = `${message.slice(0, 200)}…`;
    return `${name}: ${message}`;
  }
  return describe(e);
}

class ReadError extends Error {}

/** Throws the error for a read of `path` that threw `e`. */
function readFailed(path, e) {
  if (e instanceof ReadError) throw e;
  const error = new ReadError(`${path} could not be read: reading it threw ${errorText(e)}`, { cause: e });
  error.name = 'TypeError';
  throw error;
}

function readError(name, message) {
  const error = new ReadError(message);
  error.name = name;
  return error;
}

/**
 * The one record of which objects are distopt's: every instance the module made (a
 * constructor, or a value a call returned or a promise resolved to), by class. Only these
 * pass as receivers and arguments; a Proxy or a copy of one is not one. `free()` moves an
 * object to `freed`.
 */
const genuine = new WeakMap();
/** Objects of `genuine` that were freed. */
const freed = new WeakSet();
/** The exported classes, filled in below. */
const classes = [];

function distoptClassOf(value) {
  for (const cls of classes) {
    let is = false;
    try {
      is = value instanceof cls;
    } catch {
      return null;
    }
    if (is) return cls;
  }
  return null;
}

/** The intrinsic typed-array class name of a genuine typed array, else undefined. */
function typedArrayTag(value) {
  try {
    return taTag.call(value);
  } catch {
    return undefined;
  }
}

function isDetached(buffer) {
  try {
    // Constructing a view over a detached buffer throws; over a live one it cannot.
    new Uint8Array(buffer, 0, 0);
    return false;
  } catch {
    return true;
  }
}

/** A fresh intrinsic copy of a genuine typed array (or the array itself when it is plain). */
function copyTypedArray(value, tag, path) {
  const buffer = taBuffer.call(value);
  if (isDetached(buffer)) {
    throw readError('TypeError', `${path} is a ${tag} whose ArrayBuffer is detached (transferred or freed): its data is gone`);
  }
  const bytes = taByteLength.call(value);
  if (bytes > MAX_INPUT_BYTES) {
    throw readError(
      'RuntimeError',
      `out of memory: ${path} is a ${tag} of ${bytes} bytes, more than the ${MAX_INPUT_BYTES} bytes one input may hold (the module's memory budget is 2 GiB, a 32-bit WebAssembly module holds at most 4 GiB)`,
    );
  }
  const Intrinsic = INTRINSIC_ARRAYS[tag];
  if (tag === 'Float16Array') {
    // The bit patterns, as distopt's float16 data is given.
    const bits = new Uint16Array(buffer, taByteOffset.call(value), taLength.call(value));
    return { float16: new Uint16Array(bits) };
  }
  // A plain intrinsic typed array is passed as it is; one with its own properties or another
  // prototype (which the module's reads could run) is copied into a fresh one.
  if (Object.getPrototypeOf(value) === Intrinsic.prototype && Object.getOwnPropertyDescriptor(value, 'length') === undefined) {
    return value;
  }
  try {
    return new Intrinsic(value);
  } catch (e) {
    throw readError('RuntimeError', `out of memory: ${path} (${bytes} bytes) could not be copied: ${errorText(e)}`);
  }
}

const abByteLength = Object.getOwnPropertyDescriptor(ArrayBuffer.prototype, 'byteLength').get;
const sabByteLength =
  typeof SharedArrayBuffer === 'function'
    ? Object.getOwnPropertyDescriptor(SharedArrayBuffer.prototype, 'byteLength').get
    : undefined;

/** A fresh copy of a genuine ArrayBuffer or SharedArrayBuffer, else undefined. */
function arrayBufferCopy(value, path) {
  let bytes;
  let shared = false;
  try {
    bytes = abByteLength.call(value);
  } catch {
    if (sabByteLength === undefined) return undefined;
    try {
      bytes = sabByteLength.call(value);
      shared = true;
    } catch {
      return undefined;
    }
  }
  if (!shared && isDetached(value)) {
    throw readError('TypeError', `${path} is an ArrayBuffer that is detached (transferred or freed): its data is gone`);
  }
  if (bytes > MAX_INPUT_BYTES) {
    throw readError('RuntimeError', `out of memory: ${path} is an ArrayBuffer of ${bytes} bytes, more than the ${MAX_INPUT_BYTES} bytes one input may hold`);
  }
  const copy = new ArrayBuffer(bytes);
  // A view of the caller's buffer reads it through its internal slots (no species lookup).
  new Uint8Array(copy).set(new Uint8Array(value));
  return copy;
}

/**
 * `value` as plain data: the caller's getters, proxies and typed arrays are read here, once,
 * and any failure names `path`. `seen.elements` counts the plain arrays' elements so far over
 * the call's arguments (see ARRAY_ELEMENT_BYTES).
 */
/** Whether `value` is a port of distopt/nats (its class marks its prototype). */
function isPort(value) {
  try {
    return Object.getPrototypeOf(value)?.[Symbol.for('distopt.port')] === true;
  } catch {
    return false;
  }
}

function plain(value, path, depth, stack, seen = { elements: 0 }) {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return value;
  if (typeof value === 'function') {
    // A class or function is passed by name only (an optimizer class: `SGD`, `Adam`, …): a
    // fresh function of the same name, so that the module never calls or inspects the caller's.
    let name = '';
    try {
      const own = Object.getOwnPropertyDescriptor(value, 'name');
      if (own && typeof own.value === 'string') name = own.value;
    } catch (e) {
      readFailed(`${path}.name`, e);
    }
    const stand = function () {};
    Object.defineProperty(stand, 'name', { value: name });
    return stand;
  }
  if (depth > MAX_DEPTH) throw readError('ValueError', `${path}: nested too deeply (or cyclic)`);
  if (stack.has(value)) throw readError('ValueError', `${path} is cyclic (it contains itself)`);
  // A NATS port (distopt/nats) is the caller's connection, not data: `World.joinNats` calls it.
  if (depth === 0 && isPort(value)) return value;
  const cls = distoptClassOf(value);
  if (cls !== null) {
    if (genuine.get(value) !== cls) {
      throw readError('TypeError', `${path} is not a ${cls.name} made by distopt (a Proxy or a copy of one is not accepted)`);
    }
    if (freed.has(value)) throw readError('TypeError', `${path} is a ${cls.name} that was freed (free() was called)`);
    return value;
  }
  const tag = typedArrayTag(value);
  if (tag !== undefined) {
    const copy = copyTypedArray(value, tag, path);
    if (copy.float16 !== undefined) return { dtype: 'float16', shape: [copy.float16.length], data: copy.float16 };
    return copy;
  }
  if (ArrayBuffer.isView(value)) return new DataView(new ArrayBuffer(0));
  const buffer = arrayBufferCopy(value, path);
  if (buffer !== undefined) return buffer;
  stack.add(value);
  try {
    let isArray;
    try {
      isArray = Array.isArray(value);
    } catch (e) {
      readFailed(path, e);
    }
    if (isArray) {
      let length;
      try {
        length = value.length;
      } catch (e) {
        readFailed(`${path}.length`, e);
      }
      if (typeof length !== 'number' || !(length >= 0)) {
        throw readError('TypeError', `${path} is an array-like whose length is ${describe(length)}`);
      }
      seen.elements += length;
      if (seen.elements * ARRAY_ELEMENT_BYTES > MAX_INPUT_BYTES) {
        throw readError(
          'RuntimeError',
          `out of memory: ${path} is an array of ${length} elements, at least ${length * ARRAY_ELEMENT_BYTES} bytes once copied into the module${seen.elements > length ? ` (${seen.elements} elements with the call's other arrays)` : ''}: more than the ${MAX_INPUT_BYTES} bytes the arguments of one call may hold (the module's memory budget is 2 GiB, a 32-bit WebAssembly module holds at most 4 GiB)`,
        );
      }
      const out = new Array(length);
      for (let i = 0; i < length; i++) {
        let item;
        try {
          item = value[i];
        } catch (e) {
          readFailed(`${path}[${i}]`, e);
        }
        out[i] = plain(item, `${path}[${i}]`, depth + 1, stack, seen);
      }
      return out;
    }
    let isMap = false;
    try {
      isMap = value instanceof Map;
    } catch (e) {
      readFailed(path, e);
    }
    if (isMap) {
      // A Map's entries, read through the intrinsic iterator.
      const out = new Map();
      let entries;
      try {
        entries = Array.from(Map.prototype.entries.call(value));
      } catch (e) {
        readFailed(path, e);
      }
      for (const [k, v] of entries) {
        out.set(plain(k, `${path} key`, depth + 1, stack, seen), plain(v, `${path}.get(${describe(k)})`, depth + 1, stack, seen));
      }
      return out;
    }
    if (value instanceof Date) return Object.create(null);
    let keys;
    try {
      keys = Object.keys(value);
    } catch (e) {
      readFailed(path, e);
    }
    // Without a prototype: nothing the caller put on Object.prototype is read through it.
    const out = Object.create(null);
    let float16Data = false;
    for (const key of keys) {
      if (Object.hasOwn(INTERNAL_FIELDS, key)) {
        throw readError(
          'TypeError',
          `${path} is not ${INTERNAL_FIELDS[key]} made by distopt: a plain object carrying distopt's internal field ${key} is not accepted`,
        );
      }
      let item;
      const at = /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key.slice(0, ECHO_CHARS))}]`;
      try {
        item = value[key];
      } catch (e) {
        readFailed(at, e);
      }
      if (key === 'data' && typedArrayTag(item) === 'Float16Array') float16Data = true;
      Object.defineProperty(out, key, {
        value: plain(item, at, depth + 1, stack, seen),
        enumerable: true,
        configurable: true,
        writable: true,
      });
    }
    if (float16Data) {
      // `{data: Float16Array}`: float16 bits unless `dtype` asks for another dtype, then values.
      const bits = out.data.data;
      if (out.dtype === undefined || out.dtype === null || out.dtype === 'float16') {
        out.dtype = 'float16';
        out.data = bits;
      } else {
        out.data = Float32Array.from(new globalThis.Float16Array(bits.buffer, bits.byteOffset, bits.length));
      }
    }
    return out;
  } finally {
    stack.delete(value);
  }
}

/** The parameter names of `member` of class `cls` (`''`: a function of the module). */
function parameterNames(cls, member) {
  return PARAMS[cls]?.[member] ?? [];
}

/** Every argument as plain data; a failure is thrown as the named error it is. */
function plainArguments(args, names, what) {
  const out = new Array(args.length);
  const seen = { elements: 0 };
  for (let i = 0; i < args.length; i++) {
    const name = names[i] || `argument ${i + 1}`;
    try {
      out[i] = plain(args[i], name, 0, new Set(), seen);
    } catch (e) {
      if (e instanceof ReadError) {
        const error = namedError(e.name, `${what}: ${e.message}`, e.cause);
        throw error;
      }
      throw e;
    }
  }
  return out;
}

/**
 * Records `value`, a value the module returned, as distopt's own when it is an instance of
 * one of its classes; a promise records what it resolves to.
 */
function adopt(value) {
  if (value === null || typeof value !== 'object') return value;
  if (value instanceof Promise) return value.then(adopt);
  const cls = distoptClassOf(value);
  if (cls !== null && !genuine.has(value)) genuine.set(value, cls);
  return value;
}

/**
 * Runs a call into the module and records the objects it returns (see `adopt`); a trap marks
 * the module unusable and is reported by name.
 */
function enter(what, call) {
  try {
    return adopt(call());
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError) {
      trapped = e;
      throw namedError(
        'RuntimeError',
        `${what}: distopt's WebAssembly module trapped (${e.message}); it cannot be used any more (a bug: please report it)`,
        e,
      );
    }
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------
// Guarding the glue

function guardFunction(name, fn, { async = false } = {}) {
  const names = parameterNames('', name);
  const guarded = {
    [name](...args) {
      try {
        checkUsable(name);
        const plainArgs = plainArguments(args, names, name);
        return enter(name, () => fn.apply(undefined, plainArgs));
      } catch (e) {
        if (async) return Promise.reject(e);
        throw e;
      }
    },
  }[name];
  return guarded;
}

function checkReceiver(cls, self, what) {
  if (genuine.get(self) !== cls) {
    const other = distoptClassOf(self);
    const got =
      other !== null && other !== cls
        ? `a ${other.name}`
        : other === cls
          ? `a Proxy or copy of a ${cls.name}`
          : describe(self);
    throw namedError('TypeError', `${what} must be called on a ${cls.name}, not on ${got}`);
  }
  if (freed.has(self)) {
    throw namedError('TypeError', `${what}: this ${cls.name} was freed (free() was called): it cannot be used any more`);
  }
}

function guardMethod(cls, key, fn, names) {
  const what = `${cls.name}.${key}`;
  return {
    [key](...args) {
      checkUsable(what);
      checkReceiver(cls, this, what);
      const plainArgs = plainArguments(args, names, what);
      return enter(what, () => fn.apply(this, plainArgs));
    },
  }[key];
}

function guardClass(cls) {
  classes.push(cls);
  const proto = cls.prototype;
  for (const key of Object.getOwnPropertyNames(proto)) {
    // wasm-bindgen's own members (`__destroy_into_raw`) stay as they are; distopt's internal
    // methods (`__distoptWorld`, …) are guarded like every method.
    if (key === 'constructor' || (key.startsWith('__') && !key.startsWith('__distopt'))) continue;
    const desc = Object.getOwnPropertyDescriptor(proto, key);
    if (key === 'free') {
      const free = desc.value;
      desc.value = function free_() {
        if (genuine.get(this) === cls && freed.has(this)) return; // freeing twice is harmless
        checkUsable(`${cls.name}.free`);
        checkReceiver(cls, this, `${cls.name}.free`);
        free.call(this);
        freed.add(this);
      };
      Object.defineProperty(proto, key, desc);
      continue;
    }
    if (typeof desc.value === 'function') desc.value = guardMethod(cls, key, desc.value, parameterNames(cls.name, key));
    if (typeof desc.get === 'function') desc.get = guardMethod(cls, key, desc.get, []);
    // A setter's one argument is named after the property (`averager.step = …`: "step").
    if (typeof desc.set === 'function') desc.set = guardMethod(cls, key, desc.set, [key]);
    Object.defineProperty(proto, key, desc);
  }
  if (typeof Symbol.dispose === 'symbol' && typeof proto[Symbol.dispose] === 'function') {
    proto[Symbol.dispose] = proto.free;
  }
  for (const key of Object.getOwnPropertyNames(cls)) {
    const desc = Object.getOwnPropertyDescriptor(cls, key);
    if (typeof desc.value !== 'function') continue;
    if (!key.startsWith('__')) {
      const fn = desc.value;
      const what = `${cls.name}.${key}`;
      const names = parameterNames(cls.name, `static ${key}`);
      const returnsPromise = key === 'create';
      desc.value = {
        [key](...args) {
          try {
            checkUsable(what);
            const plainArgs = plainArguments(args, names, what);
            return enter(what, () => fn.apply(cls, plainArgs));
          } catch (e) {
            if (returnsPromise) return Promise.reject(e);
            throw e;
          }
        },
      }[key];
    }
    Object.defineProperty(cls, key, desc);
  }
  const names = parameterNames(cls.name, 'new');
  return new Proxy(cls, {
    construct(target, args, newTarget) {
      const what = `new ${cls.name}`;
      checkUsable(what);
      const plainArgs = plainArguments(args, names, what);
      const object = enter(what, () => Reflect.construct(target, plainArgs, newTarget));
      genuine.set(object, cls);
      return object;
    },
    apply() {
      throw namedError('TypeError', `Class constructor ${cls.name} cannot be invoked without 'new'`);
    },
  });
}

export const Adam = guardClass(glue.Adam);
export const AdamW = guardClass(glue.AdamW);
export const AutogradContext = guardClass(glue.AutogradContext);
export const DistributedDataParallel = guardClass(glue.DistributedDataParallel);
export const DiLoCo = guardClass(glue.DiLoCo);
export const DistributedOptimizer = guardClass(glue.DistributedOptimizer);
export const HierarchicalModelAverager = guardClass(glue.HierarchicalModelAverager);
export const Join = guardClass(glue.Join);
export const PeriodicModelAverager = guardClass(glue.PeriodicModelAverager);
export const PostLocalSGDOptimizer = guardClass(glue.PostLocalSGDOptimizer);
export const PostLocalSGDState = guardClass(glue.PostLocalSGDState);
export const RRef = guardClass(glue.RRef);
export const Replicas = guardClass(glue.Replicas);
export const RpcWorld = guardClass(glue.RpcWorld);
export const SGD = guardClass(glue.SGD);
export const StepBench = guardClass(glue.StepBench);
export const Trainer = guardClass(glue.Trainer);
export const World = guardClass(glue.World);
export const ZeroRedundancyOptimizer = guardClass(glue.ZeroRedundancyOptimizer);

/** The current backend's description, or `null` before `init()`. */
export function backendInfo() {
  if (!initialized || trapped !== null) return null;
  return enter('backendInfo', () => glue.backendInfo());
}
export const natsServerConfig = guardFunction('natsServerConfig', glue.natsServerConfig);
export const recordedWarnings = guardFunction('recordedWarnings', glue.recordedWarnings);
export const selectBackend = guardFunction('selectBackend', glue.selectBackend, { async: true });
export const sgdStep = guardFunction('sgdStep', glue.sgdStep, { async: true });
export const synchronize = guardFunction('synchronize', glue.synchronize, { async: true });
export const takeWarnings = guardFunction('takeWarnings', glue.takeWarnings);
export const tensor = guardFunction('tensor', glue.tensor);
export const tensorValues = guardFunction('tensorValues', glue.tensorValues);
export const version = guardFunction('version', glue.version);

// ---------------------------------------------------------------------------------------------
// Loading

/** Node's fetch cannot read file: URLs, so there the module's bytes are read from disk. */
async function defaultSource() {
  if (!isNode) return undefined;
  const url = wasmUrl();
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

// ---------------------------------------------------------------------------------------------
// The CPU fallback's worker threads (the threaded build, `distopt/threads`)

/**
 * The `threads` option of init(): `'auto'` (every logical core, at most 16) or a whole number
 * of threads from 1 to 64, the calling thread included.
 */
function threadCount(threads) {
  if (threads === undefined || threads === null || threads === 'auto') {
    const cores = globalThis.navigator?.hardwareConcurrency;
    return Number.isInteger(cores) && cores > 0 ? Math.min(cores, 16) : 1;
  }
  if (typeof threads !== 'number' || !Number.isInteger(threads) || threads < 1 || threads > 64) {
    throw namedError(
      'ValueError',
      `init: threads must be 'auto' or a whole number from 1 to 64, got ${describe(threads)}`,
    );
  }
  return threads;
}

/** Worker threads started so far (they serve the module's pool until the page goes). */
const threadWorkers = [];

/** Drops a worker that has ended from the list. */
function forgetThreadWorker(worker) {
  const i = threadWorkers.indexOf(worker);
  if (i >= 0) threadWorkers.splice(i, 1);
}

/**
 * Starts worker threads until `threads - 1` serve the CPU fallback's pool (a later init()
 * adds workers, never removes any). Each is a module Web Worker that instantiates this
 * module on the same shared memory and then serves the pool for good. Resolves to the number
 * of threads the CPU backend will use, the calling one included.
 */
async function startThreads(threads) {
  if (!threadedBuild || typeof Worker !== 'function') return 1;
  const [module, memory] = glue.threadStartData();
  const starting = [];
  while (threadWorkers.length < threads - 1) {
    const worker = spawnThreadWorker({ type: 'module', name: `distopt CPU thread ${threadWorkers.length + 1}` });
    threadWorkers.push(worker);
    starting.push(
      new Promise((resolve, reject) => {
        worker.onmessage = ({ data }) => {
          if (data === 'ready') return resolve();
          // A worker that served the pool and ended (a panic there, which the call that ran
          // into it reported): it no longer counts, so a later init() starts another.
          if (data !== null && typeof data === 'object' && 'exited' in data) return forgetThreadWorker(worker);
          return reject(namedError('RuntimeError', `init: a distopt CPU thread failed to start: ${data?.error ?? data}`));
        };
        worker.onerror = (event) => {
          forgetThreadWorker(worker);
          reject(namedError('RuntimeError', `init: a distopt CPU thread failed to start: ${event.message ?? event}`));
        };
      }),
    );
    worker.postMessage({ module, memory });
  }
  await Promise.all(starting);
  // 'ready' comes just before a worker enters the pool: wait (briefly) until all have.
  const deadline = Date.now() + 10_000;
  while (glue.threadWorkers() < threadWorkers.length && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  return glue.threadWorkers() + 1;
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
 * `threads` (the threaded build, `distopt/threads`, only; the plain build runs the CPU
 * fallback on one thread and ignores it): how many threads the CPU fallback uses, the calling
 * one included; `'auto'` (the default) is every logical core, at most 16. The threaded build
 * needs shared memory: in a browser, a cross-origin isolated page (served with
 * `Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy: require-corp`).
 *
 * @param {{backend?: 'auto' | 'gpu' | 'cpu', wasm?: any, threads?: 'auto' | number}} [options]
 */
export default async function init(options = {}) {
  const [opts] = plainArguments([options], ['options'], 'init');
  if (opts !== undefined && opts !== null && (typeof opts !== 'object' || Array.isArray(opts))) {
    throw namedError('TypeError', `init: options must be an object, got ${describe(options)}`);
  }
  const { backend = 'auto', threads } = opts || {};
  const threadsWanted = threadCount(threads);
  if (threadedBuild && !initialized && globalThis.crossOriginIsolated === false) {
    throw namedError(
      'RuntimeError',
      "init: distopt/threads needs shared memory, which this page lacks: serve it cross-origin isolated (Cross-Origin-Opener-Policy: same-origin, Cross-Origin-Embedder-Policy: require-corp), or import 'distopt' (one thread) instead",
    );
  }
  // The module source is used as given (a URL, bytes, a Response or a WebAssembly.Module),
  // not as the plain copy.
  const wasm = options ? options.wasm : undefined;
  const source = await resolveWasmSource(wasm);
  await loadModule(source === undefined ? undefined : { module_or_path: source });
  initialized = true;
  await startThreads(threadsWanted);
  const info = await enter('init', () => glue.selectBackend(backend));
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
