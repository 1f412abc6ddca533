// `distopt/worker`: the package in a worker of its own, every call awaited. A rank of a run over
// NATS blocks its thread while a collective waits for the other ranks (the port's
// Atomics.wait), which a browser page's main thread may not do; the same is true of any long
// step on a thread that draws a page. `inWorker()` loads the package in a Worker (Node's
// worker_threads in Node) and returns the module as a remote: the same classes, functions and
// options as `import('distopt')`, each call a message to the worker answered by a promise.
//
//   const distopt = await inWorker({ backend: 'cpu' });
//   const port = await distopt.openPort({ servers: 'ws://127.0.0.1:4223' });
//   const world = await distopt.World.joinNats(port, { run: 'demo', ranks: 2 });
//   const trainer = await new distopt.Trainer({ ranks: 2, algorithm: 'diloco', world });
//   await trainer.step();                      // the page's thread never blocks
//   console.log(await trainer.steps);          // a getter is awaited too
//
// What crosses: data (numbers, strings, arrays, plain objects, typed arrays: copied by the
// structured clone, so a call sees its arguments as of the call) and distopt's objects, which
// stay in the worker and are handled here through proxies (a proxy given as an argument is the
// object it stands for). A function cannot cross, and is a TypeError naming the argument.
// Errors are rethrown here with the worker's name and text. Calls reach the worker in the
// order they were made, and it serves them one at a time.
//
// Messages (this side → the worker), each answered by {id, ok, value} or {id, ok: false, error}:
//   {id, op: 'init', options}                    await init(options)
//   {id, op: 'get', target, path}                an object's (or the module's) property
//   {id, op: 'call', target, path, args}         a method or function
//   {id, op: 'construct', target, path, args}    new
//   {id, op: 'set', target, path, value}         an assignment
//   {id, op: 'free', target}                     free() and forget
//   {op: 'release', target}                      forget (this side's proxy was collected)
// `target` names an object the worker holds (0: the module); a held object crosses as
// {[REF]: id, cls}.

/** The key that marks a held object in a message (host.js uses it too). */
export const REF = '__distoptRemote';
const isNode = typeof process !== 'undefined' && !!process.versions?.node;
/** Node's worker_threads, named through a variable so that bundlers leave it out of browser builds. */
const NODE_WORKERS = 'node:worker_threads';
const MAX_DEPTH = 64;
const INTRINSIC_ERRORS = { TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError };

/**
 * `value` from a message, each held object's mark ({[REF]: id, cls}) replaced by
 * `resolve(id, cls)`: the other side's objects put back, on either side (host.js: the objects
 * themselves; here: their proxies).
 */
export function decodeRefs(value, resolve) {
  if (value === null || typeof value !== 'object' || ArrayBuffer.isView(value)) return value;
  if (Array.isArray(value)) return value.map((v) => decodeRefs(v, resolve));
  if (Object.getPrototypeOf(value) !== Object.prototype) return value;
  if (typeof value[REF] === 'number') return resolve(value[REF], value.cls);
  const out = {};
  for (const key of Object.keys(value)) out[key] = decodeRefs(value[key], resolve);
  return out;
}

/**
 * Loads distopt in a worker and initializes it with `options` (those of `init()`).
 *
 * @param {object} [options] `init()`'s options (`backend`, …), sent to the worker.
 * @returns {Promise<object>} the module as a remote (see the file's header); rejects with
 *   `init()`'s error when the worker cannot initialize it.
 */
export async function inWorker(options = {}) {
  const client = new Client(await spawn());
  try {
    await client.request({ op: 'init', options }, 'init');
  } catch (error) {
    client.terminate();
    throw error;
  }
  return client.module();
}

/**
 * The worker, the same shape in Node and in a browser. Resolves once it listens (it says
 * 'ready').
 */
async function spawn() {
  const url = new URL('./host.js', import.meta.url);
  let channel;
  if (isNode) {
    const { Worker } = await import(/* webpackIgnore: true */ /* @vite-ignore */ NODE_WORKERS);
    const worker = new Worker(url);
    channel = {
      post: (message) => worker.postMessage(message),
      listen: (onMessage, onEnd) => {
        worker.on('message', onMessage);
        worker.on('error', (error) => onEnd(String(error?.message ?? error)));
        worker.on('exit', (code) => onEnd(`it exited (code ${code})`));
      },
      // A worker with nothing asked of it does not keep the process alive.
      hold: (busy) => (busy ? worker.ref() : worker.unref()),
      terminate: () => void worker.terminate(),
    };
  } else {
    const worker = new Worker(url, { type: 'module' });
    channel = {
      post: (message) => worker.postMessage(message),
      listen: (onMessage, onEnd) => {
        worker.onmessage = ({ data }) => onMessage(data);
        worker.onerror = (event) => {
          event.preventDefault?.();
          onEnd(event.message ?? 'it failed');
        };
      },
      hold: () => {},
      terminate: () => worker.terminate(),
    };
  }
  await new Promise((resolve, reject) => {
    channel.listen(
      (data) => (data === 'ready' ? resolve() : reject(new Error(`inWorker: the worker said ${JSON.stringify(data)}`))),
      (reason) => reject(new Error(`inWorker: the worker running distopt did not start: ${reason}`)),
    );
  });
  return channel;
}

function failure(name, message) {
  const Intrinsic = INTRINSIC_ERRORS[name];
  const error = Intrinsic ? new Intrinsic(message) : new Error(message);
  if (!Intrinsic) error.name = name;
  return error;
}

/** One worker's side here: its pending calls and the proxies of the objects it holds. */
class Client {
  #channel;
  #next = 1;
  #pending = new Map();
  /** The error every call rejects with once the worker is gone. */
  #ended = null;
  /** An assignment that could not be sent: the next call's failure. */
  #failedSet = null;
  /** proxy → the id of the object it stands for. */
  #ids = new WeakMap();
  #collected;

  constructor(channel) {
    this.#channel = channel;
    this.#collected = new FinalizationRegistry((target) => {
      if (this.#ended === null) this.#channel.post({ op: 'release', target });
    });
    channel.listen(
      (answer) => this.#answer(answer),
      (reason) => this.#end(failure('RuntimeError', `the worker running distopt ended: ${reason}`)),
    );
    channel.hold(false);
  }

  /** Sends `message` and resolves with the worker's answer (decoded), or rejects with its error. */
  request(message, what) {
    if (this.#ended !== null) return Promise.reject(this.#ended);
    if (this.#failedSet !== null) {
      const error = this.#failedSet;
      this.#failedSet = null;
      return Promise.reject(error);
    }
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      try {
        this.#channel.post({ ...message, id });
      } catch (error) {
        // The structured clone refused an argument (a symbol, a class it cannot copy, …).
        reject(failure('TypeError', `${what}: an argument cannot be sent to the worker running distopt: ${error?.message ?? error}`));
        return;
      }
      this.#pending.set(id, { resolve, reject });
      if (this.#pending.size === 1) this.#channel.hold(true);
    });
  }

  /**
   * Sends `message` with no answer awaited (an assignment, a `using` block's free): the worker
   * serves it in its turn, and a failure of it is the answer to the next call.
   */
  #send(message) {
    if (this.#ended !== null) return;
    try {
      this.#channel.post({ ...message, deferred: true });
    } catch (error) {
      this.#failedSet ??= failure('TypeError', `a value cannot be sent to the worker running distopt: ${error?.message ?? error}`);
    }
  }

  #answer({ id, ok, value, error }) {
    const pending = this.#pending.get(id);
    if (pending === undefined) return;
    this.#pending.delete(id);
    if (this.#pending.size === 0) this.#channel.hold(false);
    if (ok) pending.resolve(this.#decode(value));
    else pending.reject(failure(error.name, error.message));
  }

  #end(error) {
    if (this.#ended !== null) return;
    this.#ended = error;
    for (const { reject } of this.#pending.values()) reject(error);
    this.#pending.clear();
    this.#channel.hold(false);
  }

  terminate() {
    this.#end(failure('RuntimeError', 'the worker running distopt was terminated (terminate() was called)'));
    this.#channel.terminate();
  }

  module() {
    return this.#proxy(0, [], '');
  }

  /** What the worker sent, its held objects made proxies. */
  #decode(value) {
    return decodeRefs(value, (id, cls) => this.#proxy(id, [], cls ?? 'object'));
  }

  /** `value` as a message may carry it: proxies become their ids. */
  #encode(value, where, what, depth = 0) {
    if (value === null || (typeof value !== 'object' && typeof value !== 'function')) {
      if (typeof value === 'symbol') throw failure('TypeError', `${what}: ${where} is a symbol, which cannot be sent to the worker running distopt`);
      return value;
    }
    const id = this.#ids.get(value);
    if (id !== undefined) return { [REF]: id };
    if (typeof value === 'function') {
      throw failure('TypeError', `${what}: ${where} is a function: only data and distopt's objects can be sent to the worker running distopt`);
    }
    if (depth > MAX_DEPTH) throw failure('ValueError', `${what}: ${where} is nested more than ${MAX_DEPTH} levels deep (a cycle?)`);
    if (ArrayBuffer.isView(value)) return value;
    if (Array.isArray(value)) return value.map((v, i) => this.#encode(v, `${where}[${i}]`, what, depth + 1));
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return value; // the structured clone decides
    const out = {};
    for (const key of Object.keys(value)) out[key] = this.#encode(value[key], `${where}.${key}`, what, depth + 1);
    return out;
  }

  #arguments(args, what) {
    return args.map((arg, i) => this.#encode(arg, `argument ${i + 1}`, what));
  }

  /**
   * The proxy of `path` from held object `target`: awaited, the property's value; called or
   * constructed, the call in the worker; with an empty path, the object itself (not thenable).
   */
  #proxy(target, path, cls) {
    const client = this;
    const what = [cls, ...path].filter(Boolean).join('.') || 'distopt';
    const call = (op, args) => {
      try {
        return client.request({ op, target, path, args: client.#arguments(args, op === 'construct' ? `new ${what}` : what) }, what);
      } catch (error) {
        return Promise.reject(error);
      }
    };
    const proxy = new Proxy(function remote() {}, {
      get(_, key) {
        if (key === 'then') {
          if (path.length === 0) return undefined;
          return (resolve, reject) => client.request({ op: 'get', target, path }, what).then(resolve, reject);
        }
        if (path.length === 0 && target !== 0) {
          if (key === 'free' || key === Symbol.asyncDispose) return () => client.#free(target, cls);
          // `using`: nothing awaits the answer; a failure is the next call's.
          if (key === Symbol.dispose) return () => client.#send({ op: 'free', target });
        }
        if (path.length === 0 && target === 0 && key === 'terminate') return () => client.terminate();
        if (typeof key === 'symbol') return undefined;
        return client.#proxy(target, [...path, key], cls);
      },
      set(_, key, value) {
        if (typeof key === 'symbol') return false;
        const where = [what, key].join('.');
        let encoded;
        try {
          encoded = client.#encode(value, key, where);
        } catch (error) {
          client.#failedSet ??= error;
          return true;
        }
        client.#send({ op: 'set', target, path: [...path, key], value: encoded });
        return true;
      },
      apply: (_, __, args) => call('call', args),
      construct: (_, args) => call('construct', args),
    });
    if (path.length === 0) {
      this.#ids.set(proxy, target);
      if (target !== 0) this.#collected.register(proxy, target, proxy);
    }
    return proxy;
  }

  #free(target, cls) {
    return this.request({ op: 'free', target }, `${cls}.free`);
  }
}
