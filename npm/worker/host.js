// The worker's side of `distopt/worker` (remote.js starts it): the package, loaded here, and
// the objects it made for the other side, held by id until that side's proxy is collected.
// Requests are served one at a time, in the order they came, so a call that blocks this thread
// (a rank's collective waiting on the port) or awaits (a GPU readback) finishes before the next
// begins. The message shapes are remote.js's.

import init, * as distopt from '../index.js';
import { openPort } from '../nats/port.js';
import { REF, decodeRefs } from './remote.js';

const isNode = typeof process !== 'undefined' && !!process.versions?.node;
/** Node's worker_threads, named through a variable so that bundlers leave it out of browser builds. */
const NODE_WORKERS = 'node:worker_threads';

const exported = { ...distopt, openPort };
delete exported.default;
/** id → an object the other side holds a proxy of (0: the module). */
const held = new Map([[0, exported]]);
let nextId = 1;

/** `value` as a message may carry it: anything but data is held here and sent as its id. */
function encode(value) {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return value;
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return value;
  if (Array.isArray(value)) return value.map(encode);
  const proto = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) {
    const out = {};
    for (const key of Object.keys(value)) out[key] = encode(value[key]);
    return out;
  }
  const id = nextId++;
  held.set(id, value);
  return { [REF]: id, cls: typeof value === 'function' ? value.name : value.constructor?.name };
}

/** What the other side sent, its ids put back as the objects they stand for. */
function decode(value) {
  return decodeRefs(value, heldObject);
}

function heldObject(id) {
  if (!held.has(id)) {
    const error = new Error('this object was freed (free() was called): it cannot be used any more');
    error.name = 'TypeError';
    throw error;
  }
  return held.get(id);
}

/** The object that `path` (all but its last key) leads to from held object `target`, and that key. */
function receiver(target, path) {
  let object = heldObject(target);
  for (const key of path.slice(0, -1)) object = object[key];
  return [object, path[path.length - 1]];
}

async function serve({ op, target, path, args, value, options }) {
  switch (op) {
    case 'init':
      return init(options);
    case 'get': {
      if (path.length === 0) return heldObject(target);
      const [object, key] = receiver(target, path);
      return object[key];
    }
    case 'call': {
      if (path.length === 0) throw new TypeError('a distopt object is not a function');
      const [object, key] = receiver(target, path);
      const method = object[key];
      if (typeof method !== 'function') throw new TypeError(`${key} is not a function`);
      return method.apply(object, decode(args));
    }
    case 'construct': {
      let Class = heldObject(target);
      if (path.length > 0) {
        const [object, key] = receiver(target, path);
        Class = object[key];
      }
      if (typeof Class !== 'function') throw new TypeError(`${path.join('.') || 'this object'} is not a constructor`);
      return new Class(...decode(args));
    }
    case 'set': {
      const [object, key] = receiver(target, path);
      object[key] = decode(value);
      return undefined;
    }
    case 'free': {
      const object = heldObject(target);
      if (typeof object.free === 'function') object.free();
      else if (typeof object.close === 'function') object.close(); // a port
      // Still held: a later call on it is the package's own "was freed" error.
      return undefined;
    }
    default:
      throw new TypeError(`unknown request ${op}`);
  }
}

let post;
let queue = Promise.resolve();
/** The failure of a deferred request, reported as the next answered request's. */
let deferredFailure = null;
function onRequest(message) {
  if (message.op === 'release') {
    if (message.target !== 0) held.delete(message.target);
    return;
  }
  queue = queue.then(async () => {
    try {
      // A deferred request (an assignment, a `using` block's free) that failed fails this one.
      if (!message.deferred && deferredFailure !== null) throw deferredFailure;
      const value = encode(await serve(message));
      if (!message.deferred) post({ id: message.id, ok: true, value });
    } catch (error) {
      if (message.deferred) deferredFailure ??= error;
      else post({ id: message.id, ok: false, error: { name: error?.name ?? 'Error', message: String(error?.message ?? error) } });
    } finally {
      if (!message.deferred) deferredFailure = null;
    }
  });
}

if (isNode) {
  const { parentPort } = await import(/* webpackIgnore: true */ /* @vite-ignore */ NODE_WORKERS);
  post = (message) => parentPort.postMessage(message);
  parentPort.on('message', onRequest);
} else {
  post = (message) => self.postMessage(message);
  self.onmessage = ({ data }) => onRequest(data);
}
post('ready');
