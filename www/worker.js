// The demo's training loop, off the main thread: a module worker that loads the npm package,
// owns the Trainer and steps it, posting each frame's reports (and an evaluation every
// EVALUATE_EVERY steps) to the page, which only draws. The page stays responsive however long
// a step takes.
//
// Page → worker: {type: 'init', backend} · {type: 'backend', choice} · {type: 'hierarchy',
//   period, ranks} · {type: 'new', id, settings, task: 'synthetic' | 'digits', steps} (the run
//   stops after `steps` steps) ·
//   {type: 'join', id, ws, run, secret, settings, task, steps}: this tab as a rank of run `run` over
//   the NATS server's WebSocket listener `ws`, as the run's user when it has a `secret` (the
//   other ranks are other tabs or devices) ·
//   {type: 'start' | 'pause', id} · {type: 'leave'}: the page is going, this tab leaves its run
// Worker → page: {type: 'ready', info, version} · {type: 'backend', info} · {type: 'hierarchy',
//   period, ranks, levels} · {type: 'joining', id, late} · {type: 'run', id, rank, leaving, …what
//   the trainer is} · {type: 'steps', id, reports, evaluation} · {type: 'membership', id, step,
//   left, joined, live}: ranks that left or joined the run at a sync point ·
//   {type: 'rejoining', id, message}: the run went on without this tab (it slept past the failure
//   bound), which joins again as a late rank · {type: 'stopped', id, done} ·
//   {type: 'error', id, name, message}

import { loadDistopt } from './load-distopt.js';

// The package's threaded build where this worker may use it (see load-distopt.js).
let init, Trainer, selectBackend, version, World;
const loaded = loadDistopt(new URL('./pkg/', import.meta.url)).then((distopt) => {
  ({ default: init, Trainer, selectBackend, version, World } = distopt);
});

/** Steps the run trains before it stops (the page's `steps`). */
let maxSteps = 1500;
const BATCH_MS = 30;
const EVALUATE_EVERY = 25;

let trainer = null;
/** This tab's rank of a run over NATS, and its port (a networked run only). */
let world = null;
let port = null;
/** Whether this tab joined a run already under way (taken in at its next sync point). */
let late = false;
/** The run this tab joined and how it connected, for a rejoin (a networked run only). */
let joinedRun = null;
/** The live ranks last seen (a networked run only). */
let live = null;
let runId = null;
let running = false;
let digits = null;
/** The step loop in flight (resolved when it has stopped). */
let looping = Promise.resolve();

function post(message) {
  self.postMessage(message);
}

function fail(id, error) {
  running = false;
  post({ type: 'error', id, name: (error && error.name) || 'Error', message: String((error && error.message) || error) });
}

/** The UCI digits, fetched and parsed once. */
async function loadDigits() {
  if (!digits) {
    const response = await fetch(new URL('./data/digits.bin', import.meta.url));
    if (!response.ok) throw new Error(`could not load data/digits.bin: HTTP ${response.status}`);
    digits = Trainer.parseDigits(await response.arrayBuffer());
  }
  return digits;
}

function evaluation(e) {
  return {
    step: trainer.steps,
    accuracy: e.meanModelAccuracy,
    loss: e.meanModelLoss,
    heldOut: e.heldOut,
    samples: e.samples,
  };
}

async function newRun({ id, settings, task, steps }) {
  running = false;
  runId = id;
  maxSteps = steps ?? maxSteps;
  await looping;
  if (trainer) trainer.free();
  trainer = null;
  const s = { ...settings };
  if (task === 'digits') {
    const data = await loadDigits();
    s.task = { dataset: data, heterogeneity: settings.task.heterogeneity };
  }
  if (runId !== id) return;
  if (world) s.world = world;
  trainer = new Trainer(s);
  // A tab that joined a run under way is taken in at its next sync point, and healed there
  // from a live rank: its parameters, DiLoCo's state and the step count.
  if (late) await trainer.admit();
  live = world ? world.live : null;
  const ranks = trainer.ranks;
  post({
    type: 'run',
    id,
    rank: world ? world.rank : null,
    ranks,
    description: trainer.description,
    taskName: trainer.taskName,
    taskDescription: trainer.taskDescription,
    heldOut: trainer.heldOut,
    classCounts: Array.from({ length: ranks }, (_, r) => Array.from(trainer.classCounts(r))),
    stateBytes: trainer.optimizerStateBytesPerRank(),
    evaluation: evaluation(await trainer.evaluate()),
    // What this rank says as its page goes (the page sends it: this thread may be blocked).
    leaving: world ? world.leavingMessage() : null,
  });
}

/** distopt/nats's `openPort` (a networked run only). */
async function openPort(options) {
  const nats = await import(new URL('./pkg/nats/port.js', import.meta.url).href);
  return nats.openPort(options);
}

/**
 * This tab joins run `run` as one of its ranks: a port to the server (distopt/nats), the rank
 * (waiting until every rank has joined: other tabs opening the invitation), then the trainer
 * over that world.
 */
async function joinRun({ id, ws, run, secret, settings, task, steps }) {
  running = false;
  runId = id;
  await looping;
  post({ type: 'joining', id, late: false });
  const user = secret ? { run, secret } : {};
  joinedRun = { run, settings, task, steps, connect: { servers: ws, name: `distopt demo tab (run ${run})`, ...user } };
  port = await openPort(joinedRun.connect);
  try {
    world = World.joinNats(port, { run, ranks: settings.ranks, joinTimeout: 600 });
  } catch (error) {
    if (!/already has its \d+ ranks/.test(error.message)) throw error;
    // Every rank is taken: join the run under way as a rank that leaves (or has left).
    post({ type: 'joining', id, late: true });
    late = true;
    world = World.joinNats(port, { run, ranks: settings.ranks, join: true, joinTimeout: 600 });
  }
  await newRun({ id, settings, task, steps });
}

/** Whether `error` says the run went on without this rank: it was suspended (a phone that
 * put the tab to sleep, a laptop closed) past the failure bound, and its peers are past it. */
function leftBehind(error) {
  return world !== null && /went on without this rank/.test(String(error?.message));
}

/**
 * The run went on without this tab: it joins again as a late rank (the rank it had, now free,
 * or another that left), taken in at the run's next sync point and healed there from a live
 * rank — as a tab opening the invitation late does.
 */
async function rejoin({ id }) {
  if (id !== runId || !joinedRun) return;
  // Freeing the world says this process leaves (the others counted it gone already). A fresh
  // connection: the server may have dropped the old one while the tab slept.
  trainer.free();
  trainer = null;
  world.free();
  world = null;
  port.close();
  port = await openPort(joinedRun.connect);
  late = true;
  world = World.joinNats(port, { run: joinedRun.run, ranks: joinedRun.settings.ranks, join: true, joinTimeout: 600 });
  await newRun({ id, settings: joinedRun.settings, task: joinedRun.task, steps: joinedRun.steps });
}

/** Tells the page which ranks left or joined at the last sync point, when that changed. */
function membership(id, step) {
  const now = world.live;
  const left = now.flatMap((l, r) => (!l && live[r] ? [r] : []));
  const joined = now.flatMap((l, r) => (l && !live[r] ? [r] : []));
  live = now;
  if (left.length || joined.length) post({ type: 'membership', id, step, left, joined, live: now });
}

async function loop(id) {
  try {
    while (running && runId === id) {
      const start = performance.now();
      const reports = [];
      let evaluated = null;
      do {
        const r = await trainer.step();
        if (world) membership(id, r.step);
        reports.push({
          step: r.step,
          lossPerRank: Array.from(r.lossPerRank),
          meanLoss: r.meanLoss,
          divergence: r.divergence,
          bytesCommunicatedPerRank: r.bytesCommunicatedPerRank,
          gradientsReduced: r.gradientsReduced,
          averaged: r.averaged,
          optimizerStateBytesPerRank: r.optimizerStateBytesPerRank,
        });
        if (r.step % EVALUATE_EVERY === 0 || r.step >= maxSteps) {
          evaluated = evaluation(await trainer.evaluate());
          break;
        }
      } while (running && runId === id && performance.now() - start < BATCH_MS);
      if (runId !== id) return;
      post({ type: 'steps', id, reports, evaluation: evaluated });
      if (trainer.steps >= maxSteps) {
        running = false;
        post({ type: 'stopped', id, done: true });
        return;
      }
      // Let the page's messages (pause, a new run) in.
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  } catch (error) {
    if (runId === id && leftBehind(error)) {
      post({ type: 'rejoining', id, message: error.message });
      enqueue({ type: 'rejoin', id });
      return;
    }
    fail(id, error);
  }
}

const queue = [];
let busy = false;

/** Messages are handled one at a time, in order (a new run waits for the step in flight). */
async function handle(message) {
  await loaded;
  switch (message.type) {
    case 'init': {
      const info = await init({ backend: message.backend });
      post({ type: 'ready', info: plain(info), version: version() });
      break;
    }
    case 'backend': {
      running = false;
      await looping;
      try {
        post({ type: 'backend', info: plain(await selectBackend(message.choice)) });
      } catch (error) {
        fail(null, error);
      }
      break;
    }
    case 'hierarchy':
      post({ ...message, levels: Trainer.defaultHierarchy(message.period, message.ranks) });
      break;
    case 'new':
    case 'join':
    case 'rejoin':
      try {
        await { new: newRun, join: joinRun, rejoin }[message.type](message);
      } catch (error) {
        fail(message.id, error);
      }
      break;
    case 'start':
      if (message.id === runId && trainer && !running) {
        running = true;
        looping = loop(runId);
      }
      break;
    case 'pause':
      running = false;
      post({ type: 'stopped', id: runId, done: false });
      break;
    default:
      break;
  }
}

function plain(value) {
  return JSON.parse(JSON.stringify(value));
}

/** This tab leaves its run (the page is going): the world says so to the other ranks. */
function leave() {
  running = false;
  runId = null;
  try {
    world?.leave();
  } catch {
    // The page is going: nothing is left to tell.
  }
}

/** Handles `message` after those before it. */
async function enqueue(message) {
  queue.push(message);
  if (busy) return;
  busy = true;
  while (queue.length) {
    try {
      await handle(queue.shift());
    } catch (error) {
      fail(null, error);
    }
  }
  busy = false;
}

self.onmessage = (event) => {
  // Pause takes effect at once (the loop checks `running` between steps); so does leaving,
  // which cannot wait for the queue: the page is going.
  if (event.data.type === 'pause') running = false;
  if (event.data.type === 'leave') return leave();
  enqueue(event.data);
};
