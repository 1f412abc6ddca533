// The synchronous port to NATS: the rank's side. A WebAssembly rank runs synchronous Rust that
// calls synchronous JavaScript, so it cannot await nats.js. The NATS client runs instead in a
// worker thread with its own event loop (worker.js, bundled with nats.js as worker.node.js and
// worker.browser.js); this side posts each request to it with
// postMessage and, for a call that answers, blocks on Atomics.wait until the worker has written
// the answer into a SharedArrayBuffer and called Atomics.notify. Blocking is allowed in Node
// (main thread included) and in any Web Worker, not on a browser page's main thread.
//
// The answer area (one SharedArrayBuffer, written by the worker, read here):
//
//   Int32 word 0  SEQ     the sequence number of the last answer written (Atomics.store/notify)
//   Int32 word 1  STATUS  0: ok, 1: error (the header is then the error's message, a string)
//   Int32 word 2  HEAD    the byte length of the JSON header
//   Int32 word 3  BROKEN  nonzero once the worker failed for good (every waiting call throws)
//   Int32 word 4  UPDATES how many KV watch updates (or ends) the worker has received so far,
//                 any watch (Atomics.add): watchReady asks the worker only when it moved
//   Int32 word 5  SERVED  the ticket of the last started request the worker has served (its
//                 answer kept until `result` takes it)
//   Int32 words 6-7       unused
//   byte 32 on    the JSON header (UTF-8), then the blobs it names, each a little-endian
//                 Uint32 length and that many bytes; a blob stands in the JSON as {"$b": i}
//                 (the i-th blob after the header)
//
// Every answering request carries a fresh sequence number and this side waits until SEQ is that
// number, so a late answer to another call is never read as this one's. The worker serves the
// requests one at a time, in order, and writes nothing unasked, so the area stays still from
// the moment SEQ names this call until this side posts its next request.

/** Byte offset of the answer's body (after the eight Int32 control words). */
const BODY = 32;
const SEQ = 0;
const STATUS = 1;
const HEAD = 2;
const BROKEN = 3;
const UPDATES = 4;
const SERVED = 5;
/** The requests {@link Port#start} may start. */
const STARTABLE = new Set(['kvGet', 'kvEntry', 'kvPut', 'kvCreate']);

const isNode = typeof process !== 'undefined' && !!process.versions?.node;
/** Node's worker_threads, named through a variable so that bundlers leave it out of browser builds. */
const NODE_WORKERS = 'node:worker_threads';

/**
 * Starts the NATS worker and connects it.
 *
 * @param {object} options
 * @param {string | string[]} options.servers `nats://host:port` in Node (TCP), `ws://host:port`
 *   in a browser (WebSocket).
 * @param {string} [options.token]
 * @param {string} [options.user]
 * @param {string} [options.pass]
 * @param {string} [options.name] the connection's name, as the server reports it.
 * @param {string} [options.inboxPrefix]
 * @param {string} [options.run] with `secret`: the run whose user this connection is, on a
 *   server with a user per run (`natsServerConfig`, `distopt nats-config`): the user is the run,
 *   the password its secret, and the replies come to the run's own inbox.
 * @param {string} [options.secret] the run's secret.
 * @returns {Promise<Port>} once connected; rejects with an Error naming the server and the
 *   client's reason when it cannot connect.
 */
export async function openPort({ servers, token, user, pass, name, inboxPrefix, run, secret } = {}) {
  if (secret !== undefined) {
    if (typeof run !== 'string' || typeof secret !== 'string') {
      throw new TypeError('openPort: a run\'s secret comes with the run\'s name: {run, secret}, both strings');
    }
    // The user a server with a user per run admits for it (distopt::comm::run_permissions).
    [user, pass, inboxPrefix] = [run, secret, `_INBOX.distopt.${run}`];
  }
  if (typeof SharedArrayBuffer === 'undefined') {
    throw new Error('openPort: SharedArrayBuffer is unavailable (a browser page must be cross-origin isolated)');
  }
  try {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 1, 0);
  } catch {
    throw new Error("openPort: this thread cannot block (Atomics.wait); run the rank in a Worker, not on the page's main thread");
  }
  const options = { servers, token, user, pass, name, inboxPrefix, noEcho: true };
  for (const key of Object.keys(options)) {
    if (options[key] === undefined) delete options[key];
  }
  const worker = await startWorker();
  const reply = await new Promise((resolve) => {
    worker.onReply(resolve);
    worker.post({ op: 'connect', options });
  });
  if (reply.error !== undefined) {
    worker.terminate();
    throw new Error(`openPort: cannot connect to ${[servers].flat().join(', ')}: ${reply.error}`);
  }
  return new Port(worker, reply.sab, reply.maxPayload);
}

/**
 * The worker, the same shape in Node and in a browser: post(message, transfer), onReply(fn)
 * (the next message it sends), terminate(). Resolves once the worker listens.
 */
async function startWorker() {
  let worker;
  let on;
  if (isNode) {
    const { Worker } = await import(/* webpackIgnore: true */ /* @vite-ignore */ NODE_WORKERS);
    // The worker bundled with nats.js for Node (scripts/build-npm.sh).
    worker = new Worker(new URL('./worker.node.js', import.meta.url));
    on = (fn) => {
      const onMessage = (data) => done(data);
      const onError = (error) => done({ error: String(error?.message ?? error) });
      const done = (data) => {
        worker.off('message', onMessage);
        worker.off('error', onError);
        fn(data);
      };
      worker.on('message', onMessage);
      worker.on('error', onError);
    };
  } else {
    // The worker bundled with nats.js (scripts/build-npm.sh): a page needs no bundler for it.
    worker = new Worker(new URL('./worker.browser.js', import.meta.url), { type: 'module' });
    on = (fn) => {
      worker.onmessage = ({ data }) => {
        worker.onmessage = null;
        worker.onerror = null;
        fn(data);
      };
      worker.onerror = (event) => {
        worker.onmessage = null;
        worker.onerror = null;
        fn({ error: `the NATS worker failed to start: ${event.message ?? 'error'}` });
      };
    };
  }
  const handle = {
    post: (message, transfer = []) => worker.postMessage(message, transfer),
    onReply: on,
    terminate: () => void worker.terminate(),
  };
  const ready = await new Promise((resolve) => on(resolve));
  if (ready !== 'ready') {
    handle.terminate();
    throw new Error(`openPort: ${ready?.error ?? 'the NATS worker did not start'}`);
  }
  return handle;
}

/** A copy of `bytes` in a fresh (unshared, transferable) buffer. */
function copyOf(bytes) {
  if (!(bytes instanceof Uint8Array)) throw new TypeError('expected a Uint8Array');
  return new Uint8Array(bytes);
}

/**
 * The synchronous port: one NATS connection served by a worker thread. Every method is
 * synchronous; those that answer block the calling thread until the worker answers, and throw
 * an Error with the client's text when the call failed. Made by {@link openPort}.
 */
export class Port {
  /**
   * Marks a port for the package's argument layer (index.js), which passes it to
   * `World.joinNats` as it is instead of copying it as data.
   */
  static {
    Object.defineProperty(Port.prototype, Symbol.for('distopt.port'), { value: true });
  }

  #worker;
  #sab;
  #ctl;
  #bytes;
  #view;
  #seq = 0;
  #ticket = 0;
  #closed = false;
  #sleeper = new Int32Array(new SharedArrayBuffer(4));
  /** wid → the UPDATES count read before the worker last answered that the watch had none. */
  #quiet = new Map();

  /** @hideconstructor */
  constructor(worker, sab, maxPayload) {
    this.#worker = worker;
    this.#sab = sab;
    this.#ctl = new Int32Array(sab, 0, BODY / 4);
    this.#bytes = new Uint8Array(sab);
    this.#view = new DataView(sab);
    /** The server's max_payload (bytes): the largest message it accepts. */
    this.maxPayload = maxPayload;
  }

  /** Posts a request that has no answer. */
  #send(message, transfer) {
    if (this.#closed) throw new Error('the NATS port is closed');
    this.#worker.post(message, transfer);
  }

  /**
   * Posts a request and blocks until its answer; returns it (its blobs views of the answer
   * area with `views`) or throws its error.
   */
  #call(message, transfer, views = false) {
    if (this.#closed) throw new Error('the NATS port is closed');
    this.#seq = this.#seq >= 0x7fffffff ? 1 : this.#seq + 1;
    const seq = this.#seq;
    this.#worker.post({ ...message, seq }, transfer);
    for (;;) {
      const seen = Atomics.load(this.#ctl, SEQ);
      if (seen === seq) break;
      if (Atomics.load(this.#ctl, BROKEN) !== 0) {
        throw new Error(`the NATS worker failed: ${this.#read()}`);
      }
      Atomics.wait(this.#ctl, SEQ, seen);
    }
    const failed = Atomics.load(this.#ctl, STATUS) !== 0;
    const value = this.#read(views && !failed);
    if (failed) throw new Error(String(value));
    return value;
  }

  /**
   * Decodes the answer area: the JSON header with its blobs put back as Uint8Arrays (copies;
   * with `views`, views of the area itself, valid until the next call that answers).
   */
  #read(views = false) {
    const headLength = Atomics.load(this.#ctl, HEAD);
    const head = new TextDecoder().decode(this.#bytes.slice(BODY, BODY + headLength));
    let offset = BODY + headLength;
    const blobs = [];
    return JSON.parse(head, (key, value) => {
      if (value !== null && typeof value === 'object' && typeof value.$b === 'number') {
        while (blobs.length <= value.$b) {
          const length = this.#view.getUint32(offset, true);
          const blob = views ? this.#bytes.subarray(offset + 4, offset + 4 + length) : this.#bytes.slice(offset + 4, offset + 4 + length);
          blobs.push(blob);
          offset += 4 + length;
        }
        return blobs[value.$b];
      }
      return value;
    });
  }

  /**
   * Publishes `data` on `subject`: queued to the worker (a copy), no wait. Its errors surface
   * at the next {@link Port#flush}.
   * @param {string} subject
   * @param {Uint8Array} data
   */
  publish(subject, data) {
    const copy = copyOf(data);
    this.#send({ op: 'publish', subject, data: copy }, [copy.buffer]);
  }

  /** Blocks until the server has seen everything sent before (the client's flush); throws the
   * first error of an earlier queued request, if any. */
  flush() {
    this.#call({ op: 'flush' });
  }

  /**
   * Subscribes to `subject`; its messages come out of {@link Port#pump} with `sid`. Queued: in
   * place on the server once a later flush() returns.
   * @param {number} sid a positive integer (0 marks refusals)
   * @param {string} subject
   */
  subscribe(sid, subject) {
    if (!Number.isInteger(sid) || sid <= 0) throw new RangeError(`subscribe: sid must be a positive integer, not ${sid}`);
    this.#send({ op: 'subscribe', sid, subject });
  }

  /** Ends subscription `sid` (queued). @param {number} sid */
  unsubscribe(sid) {
    this.#send({ op: 'unsubscribe', sid });
  }

  /**
   * The deliveries received so far, oldest first, as many as fit the answer area (the rest wait
   * for the next pump). When none is queued, waits up to `timeoutMs` for the first.
   * sid 0 is a refusal: its payload is the UTF-8 text of a server error (a permissions violation).
   * @param {number} timeoutMs
   * @returns {Array<[number, Uint8Array]>} `[]` on timeout
   */
  pump(timeoutMs) {
    return this.#call({ op: 'pump', timeoutMs });
  }

  /**
   * {@link Port#pump} whose payloads are views of the port's answer area, not copies: each is
   * valid until the port's next call that answers (a rank copies it into its own memory at once).
   * @param {number} timeoutMs
   * @returns {Array<[number, Uint8Array]>}
   */
  pumpViews(timeoutMs) {
    return this.#call({ op: 'pump', timeoutMs }, undefined, true);
  }

  /**
   * Starts heartbeat `hid`: every `periodMs` it publishes the next frame of its queue on
   * `subject` (then flushes), and skips the tick when the queue is empty.
   * @param {number} hid
   * @param {string} subject
   * @param {number} periodMs
   */
  heartbeat(hid, subject, periodMs) {
    this.#send({ op: 'heartbeat', hid, subject, periodMs });
  }

  /**
   * Appends frames (copies) to heartbeat `hid`'s queue.
   * @param {number} hid
   * @param {Uint8Array[]} frames
   */
  beats(hid, frames) {
    const copies = Array.from(frames, copyOf);
    this.#send({ op: 'beats', hid, frames: copies }, copies.map((c) => c.buffer));
  }

  /** The frames still queued for heartbeat `hid` (blocks). @param {number} hid @returns {number} */
  beatsLeft(hid) {
    return this.#call({ op: 'beatsLeft', hid });
  }

  /** Stops heartbeat `hid` and drops its queue (queued). @param {number} hid */
  stopHeartbeat(hid) {
    this.#send({ op: 'stopHeartbeat', hid });
  }

  /**
   * Opens JetStream KV bucket `bucket`; with `create`, creates it when missing (history 1,
   * memory storage). Throws with the reason when it cannot.
   * @param {string} bucket
   * @param {boolean} create
   */
  kvOpen(bucket, create) {
    this.#call({ op: 'kvOpen', bucket, create: !!create });
  }

  /**
   * The value of `key`, or null (never put, or its last revision deleted or purged).
   * @param {string} bucket
   * @param {string} key
   * @returns {Uint8Array | null}
   */
  kvGet(bucket, key) {
    return this.#call({ op: 'kvGet', bucket, key });
  }

  /**
   * The last revision of `key`, or null when it was never put; `deleted` when that revision is
   * a DEL or PURGE (its value then empty).
   * @param {string} bucket
   * @param {string} key
   * @returns {{value: Uint8Array, deleted: boolean} | null}
   */
  kvEntry(bucket, key) {
    return this.#call({ op: 'kvEntry', bucket, key });
  }

  /** Puts `value` under `key`. @param {string} bucket @param {string} key @param {Uint8Array} value */
  kvPut(bucket, key, value) {
    const copy = copyOf(value);
    this.#call({ op: 'kvPut', bucket, key, value: copy }, [copy.buffer]);
  }

  /**
   * Creates `key` with `value`, atomically on the server: throws when the key has a value.
   * @param {string} bucket @param {string} key @param {Uint8Array} value
   */
  kvCreate(bucket, key, value) {
    const copy = copyOf(value);
    this.#call({ op: 'kvCreate', bucket, key, value: copy }, [copy.buffer]);
  }

  /** Deletes `key` (a DEL revision). @param {string} bucket @param {string} key */
  kvDelete(bucket, key) {
    this.#call({ op: 'kvDelete', bucket, key });
  }

  /**
   * Deletes `key`, a key no longer needed, without waiting: queued (this port's later calls
   * see it done), and its failure ignored.
   * @param {string} bucket @param {string} key
   */
  kvDiscard(bucket, key) {
    this.#send({ op: 'kvDiscard', bucket, key });
  }

  /**
   * Starts watch `wid` on the keys of `bucket` matching `pattern`: updates only, from now on.
   * Blocks until the watch is in place.
   * @param {number} wid @param {string} bucket @param {string} pattern
   */
  kvWatch(wid, bucket, pattern) {
    this.#call({ op: 'kvWatch', wid, bucket, pattern });
  }

  /**
   * The next update of watch `wid`, waiting up to `timeoutMs`: `{key, value}` (value null for
   * a delete or purge), 'quiet' when none came in time, 'ended' when the watch stopped or failed.
   * @param {number} wid @param {number} timeoutMs
   * @returns {{key: string, value: Uint8Array | null} | 'quiet' | 'ended'}
   */
  watchNext(wid, timeoutMs) {
    return this.#call({ op: 'watchNext', wid, timeoutMs });
  }

  /**
   * An update of watch `wid` already received, without waiting, or null.
   * @param {number} wid
   * @returns {{key: string, value: Uint8Array | null} | null}
   */
  watchReady(wid) {
    // No update (of any watch) since the worker last said this one had none: none, without
    // a round trip to the worker.
    const updates = Atomics.load(this.#ctl, UPDATES);
    if (this.#quiet.get(wid) === updates) return null;
    const update = this.#call({ op: 'watchReady', wid });
    if (update === null) this.#quiet.set(wid, updates);
    else this.#quiet.delete(wid);
    return update;
  }

  /** Stops watch `wid` (queued). @param {number} wid */
  unwatch(wid) {
    this.#quiet.delete(wid);
    this.#send({ op: 'unwatch', wid });
  }

  /**
   * Starts key-value call `op` (`'kvGet'`, `'kvEntry'`, `'kvPut'` or `'kvCreate'`, with the
   * arguments of that method; `value` a copy) without waiting for it: the worker serves it in
   * order with every other request and keeps its answer. {@link Port#served} says whether it
   * has been served; {@link Port#result} takes the answer (waiting for it when it has not);
   * {@link Port#forget} drops an answer nobody will take.
   * @param {string} op @param {string} bucket @param {string} key @param {Uint8Array} [value]
   * @returns {number} the call's ticket
   */
  start(op, bucket, key, value) {
    if (!STARTABLE.has(op)) throw new TypeError(`start: ${op} is not a key-value call that can be started`);
    this.#ticket = this.#ticket >= 0x7fffffff ? 1 : this.#ticket + 1;
    const ticket = this.#ticket;
    const copy = value === undefined ? undefined : copyOf(value);
    this.#send({ op, bucket, key, value: copy, ticket }, copy ? [copy.buffer] : []);
    return ticket;
  }

  /** Whether started call `ticket` has been served (no wait). @param {number} ticket @returns {boolean} */
  served(ticket) {
    return Atomics.load(this.#ctl, SERVED) >= ticket;
  }

  /**
   * The answer of started call `ticket` (blocks until it is served), or throws its error.
   * @param {number} ticket
   */
  result(ticket) {
    return this.#call({ op: 'result', of: ticket });
  }

  /** Drops the answer of started call `ticket`, which nobody will take (queued). @param {number} ticket */
  forget(ticket) {
    this.#send({ op: 'forget', of: ticket });
  }

  /** Blocks the calling thread for `ms` milliseconds. @param {number} ms */
  sleep(ms) {
    Atomics.wait(this.#sleeper, 0, 0, Math.max(0, Number(ms) || 0));
  }

  /** Drains and closes the connection (blocks), then ends the worker. Idempotent. */
  close() {
    if (this.#closed) return;
    try {
      this.#call({ op: 'close' });
    } finally {
      this.#closed = true;
      this.#worker.terminate();
    }
  }
}
