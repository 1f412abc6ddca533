// The NATS worker of the synchronous port (./port.js): a worker thread (Node's worker_threads,
// or a module Web Worker in a browser) that runs nats.js on its own event loop, serves the
// rank's requests one at a time, in order, and writes each answer into the shared answer area
// (its layout is described at the top of port.js), then wakes the rank with Atomics.notify.
// It never blocks: waiting (pump, watchNext) is a timer or a delivery on this event loop.
//
// Before the connection: it says 'ready' once it listens; {op: 'connect'} is answered by
// postMessage ({sab, maxPayload} or {error}); every later answer goes through the area.
//
// The worker's entry points give it its transport and its thread's messaging: worker-node.js
// (TCP, worker_threads) and worker-browser.js (WebSocket, a Web Worker). scripts/build-npm.sh
// bundles each with nats.js into the package (nats/worker.node.js, nats/worker.browser.js), so
// the package has no dependencies to install.
import { Kvm } from '@nats-io/kv';

const BODY = 32;
const SEQ = 0;
const STATUS = 1;
const HEAD = 2;
const BROKEN = 3;
const UPDATES = 4;
const SERVED = 5;
/** Room kept for the JSON header of one pumped delivery: `[sid,{"$b":i}],` plus its length word. */
const PER_DELIVERY = 40;
/** The longest setTimeout delay. */
const MAX_DELAY = 0x7fffffff;

let post;
/** The client's connect (transport-node's, or nats-core's wsconnect). */
let connect;
let nc = null;
let ctl = null;
let bytes = null;
let view = null;
let closing = false;
let closedReason = null;

/** Deliveries for pump, oldest first: [sid, payload]; sid 0 is a refusal's text. */
const deliveries = [];
/** sid → Subscription. */
const subscriptions = new Map();
/** hid → {frames, timer}. */
const heartbeats = new Map();
/** bucket name → KV. */
const buckets = new Map();
/** wid → {iterator, updates: [{key, value}], ended}. */
const watches = new Map();
/** ticket → the answer of a started request ({value} or {error}), until `result` takes it. */
const started = new Map();
/** The first error of a request that had no answer (publish, subscribe, a beat): thrown by flush. */
let deferredError = null;

// Waiting for the next delivery or watch update, with a timeout.
const waiters = new Set();
function wake() {
  for (const done of [...waiters]) done();
}
function nextEvent(ms) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      waiters.delete(done);
      resolve();
    };
    const timer = setTimeout(done, Math.min(MAX_DELAY, Math.max(0, ms)));
    waiters.add(done);
  });
}
/** Waits until `ready()` or `timeoutMs` passed. */
async function waitUntil(ready, timeoutMs) {
  const end = Date.now() + (Number(timeoutMs) || 0);
  while (!ready() && Date.now() < end) await nextEvent(end - Date.now());
}

const encoder = new TextEncoder();
const message = (error) => String(error?.message ?? error);
function deferError(error) {
  deferredError ??= message(error);
}

/**
 * Writes an answer (status 0: `value`, JSON with Uint8Arrays as blobs; status 1: an error's
 * text) into the area and wakes the rank.
 */
function answer(seq, status, value) {
  const blobs = [];
  // The holder's own value: a Buffer's toJSON() has already replaced it in `v`.
  const json = JSON.stringify(value ?? null, function (key, v) {
    const raw = this[key];
    if (raw instanceof Uint8Array) {
      blobs.push(raw);
      return { $b: blobs.length - 1 };
    }
    return v;
  });
  const head = encoder.encode(json);
  const size = BODY + head.length + blobs.reduce((n, b) => n + 4 + b.length, 0);
  if (size > bytes.length) {
    return answer(seq, 1, `the answer (${size} bytes) does not fit the port's area (${bytes.length})`);
  }
  bytes.set(head, BODY);
  let offset = BODY + head.length;
  for (const blob of blobs) {
    view.setUint32(offset, blob.length, true);
    bytes.set(blob, offset + 4);
    offset += 4 + blob.length;
  }
  Atomics.store(ctl, STATUS, status);
  Atomics.store(ctl, HEAD, head.length);
  Atomics.store(ctl, SEQ, seq);
  Atomics.notify(ctl, SEQ);
}

/** Marks the port broken for good (an error nothing caught) and wakes the rank. */
function broken(error) {
  if (!ctl) return;
  const head = encoder.encode(JSON.stringify(message(error)));
  if (BODY + head.length <= bytes.length) {
    bytes.set(head, BODY);
    Atomics.store(ctl, HEAD, head.length);
  }
  Atomics.store(ctl, BROKEN, 1);
  Atomics.notify(ctl, SEQ);
}

async function connectTo(options) {
  nc = await connect(options);
  const maxPayload = nc.info?.max_payload ?? 1024 * 1024;
  const sab = new SharedArrayBuffer(BODY + 2 * maxPayload + 1024 * 1024);
  ctl = new Int32Array(sab, 0, BODY / 4);
  bytes = new Uint8Array(sab);
  view = new DataView(sab);
  listenForRefusals(nc);
  nc.closed().then((error) => {
    closedReason = error ? message(error) : 'the connection is closed';
    wake();
  });
  return { sab, maxPayload };
}

/** Queues the server's permission errors as refusals (sid 0). */
async function listenForRefusals(connection) {
  for await (const s of connection.status()) {
    if (s.type !== 'error' || !s.error) continue;
    const text = message(s.error);
    if (s.error.name === 'PermissionViolationError' || /permissions? violation/i.test(text)) {
      deliveries.push([0, encoder.encode(text)]);
      wake();
    }
  }
}

function bucket(name) {
  const kv = buckets.get(name);
  if (!kv) throw new Error(`KV bucket "${name}" is not open (kvOpen first)`);
  return kv;
}

async function kvOpen(name, create) {
  const kvm = new Kvm(nc);
  let kv;
  if (create) {
    try {
      kv = await kvm.create(name, { history: 1, storage: 'memory' });
    } catch (error) {
      // Another process may have created it meanwhile: open it then.
      try {
        kv = await kvm.open(name);
        await kv.status();
      } catch {
        throw error;
      }
    }
  } else {
    kv = await kvm.open(name);
    await kv.status(); // open() binds without asking: this fails when the bucket is missing
  }
  buckets.set(name, kv);
}

async function kvWatch(wid, name, pattern) {
  watches.get(wid)?.iterator.stop();
  const iterator = await bucket(name).watch({ key: pattern, include: 'updates' });
  const watch = { iterator, updates: [], ended: false };
  watches.set(wid, watch);
  (async () => {
    try {
      for await (const e of iterator) {
        watch.updates.push({ key: e.key, value: e.operation === 'PUT' ? e.value : null });
        Atomics.add(ctl, UPDATES, 1);
        wake();
      }
    } catch {
      // The watch failed: it has ended.
    }
    watch.ended = true;
    Atomics.add(ctl, UPDATES, 1);
    wake();
  })();
}

function heartbeat(hid, subject, periodMs) {
  const beat = heartbeats.get(hid) ?? { frames: [], timer: null };
  heartbeats.set(hid, beat);
  clearInterval(beat.timer);
  beat.timer = setInterval(() => {
    const frame = beat.frames.shift();
    if (!frame) return;
    try {
      nc.publish(subject, frame);
      nc.flush().catch(deferError);
    } catch (error) {
      deferError(error);
    }
  }, Math.min(MAX_DELAY, Math.max(1, Number(periodMs) || 1)));
}

/** Takes the deliveries that fit one answer, oldest first (at least one when any is queued). */
function takeDeliveries() {
  let room = bytes.length - BODY - 64;
  let n = 0;
  while (n < deliveries.length) {
    const cost = deliveries[n][1].length + PER_DELIVERY;
    if (cost > room && n > 0) break;
    room -= cost;
    n += 1;
  }
  return deliveries.splice(0, n);
}

/** The requests: each returns the answer's value (requests without a seq have none). */
const handlers = {
  publish: ({ subject, data }) => nc.publish(subject, data),
  flush: async () => {
    await nc.flush();
    const error = deferredError;
    deferredError = null;
    if (error !== null) throw new Error(error);
  },
  subscribe: ({ sid, subject }) => {
    subscriptions.get(sid)?.unsubscribe();
    const sub = nc.subscribe(subject, {
      // A refused subscription also comes as a status error (a refusal): nothing to do here.
      callback: (error, msg) => {
        if (error) return;
        deliveries.push([sid, msg.data]);
        wake();
      },
    });
    subscriptions.set(sid, sub);
  },
  unsubscribe: ({ sid }) => {
    subscriptions.get(sid)?.unsubscribe();
    subscriptions.delete(sid);
  },
  pump: async ({ timeoutMs }) => {
    await waitUntil(() => deliveries.length > 0 || closedReason !== null, timeoutMs);
    if (deliveries.length === 0 && closedReason !== null) throw new Error(closedReason);
    return takeDeliveries();
  },
  heartbeat: ({ hid, subject, periodMs }) => heartbeat(hid, subject, periodMs),
  beats: ({ hid, frames }) => {
    const beat = heartbeats.get(hid) ?? { frames: [], timer: null };
    heartbeats.set(hid, beat);
    beat.frames.push(...frames);
  },
  beatsLeft: ({ hid }) => heartbeats.get(hid)?.frames.length ?? 0,
  stopHeartbeat: ({ hid }) => {
    clearInterval(heartbeats.get(hid)?.timer);
    heartbeats.delete(hid);
  },
  kvOpen: ({ bucket: name, create }) => kvOpen(name, create),
  kvGet: async ({ bucket: name, key }) => {
    const e = await bucket(name).get(key);
    return e && e.operation === 'PUT' ? e.value : null;
  },
  kvEntry: async ({ bucket: name, key }) => {
    const e = await bucket(name).get(key);
    if (!e) return null;
    const deleted = e.operation !== 'PUT';
    return { value: deleted ? new Uint8Array(0) : e.value, deleted };
  },
  kvPut: async ({ bucket: name, key, value }) => void (await bucket(name).put(key, value)),
  kvCreate: async ({ bucket: name, key, value }) => void (await bucket(name).create(key, value)),
  kvDelete: async ({ bucket: name, key }) => void (await bucket(name).delete(key)),
  kvDiscard: async ({ bucket: name, key }) => {
    try {
      await bucket(name).delete(key);
    } catch {
      // A key no longer needed: its failure is nobody's concern.
    }
  },
  kvWatch: ({ wid, bucket: name, pattern }) => kvWatch(wid, name, pattern),
  watchNext: async ({ wid, timeoutMs }) => {
    const watch = watches.get(wid);
    if (!watch) return 'ended';
    await waitUntil(() => watch.updates.length > 0 || watch.ended, timeoutMs);
    if (watch.updates.length > 0) return watch.updates.shift();
    return watch.ended ? 'ended' : 'quiet';
  },
  watchReady: ({ wid }) => watches.get(wid)?.updates.shift() ?? null,
  unwatch: ({ wid }) => {
    watches.get(wid)?.iterator.stop();
    watches.delete(wid);
  },
  // `of`: the started call's ticket (a request's own `ticket` marks it as started).
  result: ({ of }) => {
    const answer = started.get(of);
    started.delete(of);
    if (answer === undefined) throw new Error(`no answer for started call ${of}`);
    if (answer.error !== undefined) throw new Error(answer.error);
    return answer.value;
  },
  forget: ({ of }) => void started.delete(of),
  close: async () => {
    closing = true;
    for (const { timer } of heartbeats.values()) clearInterval(timer);
    heartbeats.clear();
    for (const { iterator } of watches.values()) iterator.stop();
    watches.clear();
    try {
      await nc.drain();
    } catch {
      await nc.close().catch(() => {});
    }
  },
};

// The requests run one at a time, in arrival order.
const queue = [];
let running = false;
async function serve() {
  running = true;
  while (queue.length > 0) {
    const request = queue.shift();
    try {
      const value = await handlers[request.op](request);
      if (request.seq !== undefined) answer(request.seq, 0, value);
      else if (request.ticket !== undefined) started.set(request.ticket, { value });
    } catch (error) {
      if (request.seq !== undefined) answer(request.seq, 1, message(error));
      else if (request.ticket !== undefined) started.set(request.ticket, { error: message(error) });
      else deferError(error);
    }
    if (request.ticket !== undefined) Atomics.store(ctl, SERVED, request.ticket);
  }
  running = false;
}

function onMessage(request) {
  if (request.op === 'connect') {
    connectTo(request.options).then(post, (error) => post({ error: message(error) }));
    return;
  }
  if (closing && request.op !== 'close') return;
  if (!Object.hasOwn(handlers, request.op)) {
    if (request.seq !== undefined) answer(request.seq, 1, `unknown request ${request.op}`);
    return;
  }
  queue.push(request);
  if (!running) serve().catch(broken);
}

/**
 * Serves the port: `connector` is the client's connect, `host` the thread's messaging —
 * `host.post(message)` to the rank's side, `host.listen(onMessage, onFailure)` for its requests
 * and for errors nothing caught. Says 'ready' once it listens.
 */
export function serveWorker(connector, host) {
  connect = connector;
  post = host.post;
  host.listen(onMessage, broken);
  post('ready');
}
