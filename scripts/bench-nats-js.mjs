#!/usr/bin/env node
// The all-reduce of JavaScript ranks over NATS, against its peers in the same run:
//
//   node scripts/bench-nats-js.mjs [--ranks 2,4] [--elements 4194304] [--repeats 10] [--rounds 3]
//
// For each world size W and round, on one nats-server on loopback (started here, stopped at the
// end), W Node processes each time, in turn:
//   - distopt, JS ranks: the all-reduce-mean of `elements` float32 per rank through
//     `World.joinNats` over the package's port (DistributedDataParallel's gradient all-reduce,
//     the package built by scripts/build-npm.sh in target/npm/package);
//   - raw nats.js: the same bytes in the same pattern (each rank's shards to their owners, each
//     owner's shard back to every rank) published by nats.js on each process's main thread,
//     with no port, frames, seals or arithmetic: the floor for a JavaScript process;
//   - distopt, native ranks: `distopt bench comm --world` (target/release/distopt, built with
//     `cargo build --release -p distopt-cli` when missing), which times its own all-reduce-mean
//     and raw NATS pub/sub of the same bytes alternately.
// Each figure is the slowest process's median; the table gives every round.
//
//   node scripts/bench-nats-js.mjs --trainer 400 [--ranks 3] [--rounds 3] [--period 8]
//                                  [--fragments F --delay D]
//
// times a DiLoCo run instead (the demo's task, a sync every `period` steps, 400 steps after a
// first evaluation): W Node processes of the package's `Trainer` over `World.joinNats` against
// W native `distopt train --world` processes of the same flags, in milliseconds per step of
// the slowest process (each step's report gathers every rank's loss, and each sync point is
// the agreement, the all-reduce of the pseudo-gradients and the vote). With F fragments
// (Streaming DiLoCo) and a delay D, each round runs delay 0 (every sync point waited for in
// its step) and delay D (`fragment_sync_delay`: the sync point in flight for D inner steps).
//
//   node scripts/bench-nats-js.mjs --diloco 480 [--ranks 3] [--rounds 3] [--period 32]
//                                  [--delay 8] [--work-us 500] [--elements 65536]
//
// times Streaming DiLoCo's overlap in JavaScript ranks, the library's way (the `DiLoCo` class
// over `World.joinNats`, no per-step report): W Node processes, each inner step `work-us` of
// busy work (the model's compute) and an SGD step on two parameters of `elements` float32,
// two fragments syncing every `period` steps. Three rows, in milliseconds per inner step of
// the slowest process: no communication (a period longer than the run), syncs blocking (delay
// 0: each sync point waited for in its step) and syncs in flight (`fragmentSyncDelay` D).
//
//   node scripts/bench-nats-js.mjs --recovery 2000 [--ranks 3] [--repeats 3] [--period 8]
//                                  [--kill-after 3] [--bound 5]
//
// times an elastic run's recovery in JavaScript ranks, as `distopt bench recovery` does for
// native ones: W Node processes of the demo's Trainer under DiLoCo, rank W-1 SIGKILLed after
// `kill-after` seconds and a Node process joining in its place (`World.joinNats` with `join`,
// `trainer.admit()`). From rank 0's view (the wall-clock time after the step in which it saw
// each membership change): the rank's death to the survivors' first sync without it, the rank
// leaving to the joiner healed, and the joiner's start to it healed, against the target of one
// failure bound (`bound` seconds) plus one sync period. Median of `repeats` runs.
//
// Any mode takes `--latency MS`: the ranks then reach the server through a proxy on loopback
// that holds every chunk MS milliseconds each way, as a server across a network would.
//
// Needs nats-server on PATH and tests/js's dependencies (nats.js), as the test suite does.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { startServer } from '../tests/js/nats-server.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const PACKAGE = process.env.DISTOPT_PACKAGE_DIR || path.join(ROOT, 'target/npm/package');
const NATS_JS = path.join(ROOT, 'tests/js/node_modules/@nats-io/transport-node/lib/mod.js');

const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

// ---------------------------------------------------------------------------------------------
// One rank (a child process): times its work and prints {rank, ms: [...]}.

/** The package on its CPU backend and this process's rank of `run`: {api, port, world}. */
async function joinRun({ url, run, ranks }, options = {}) {
  const api = await import(pathToFileURL(path.join(PACKAGE, 'index.js')).href);
  const { openPort } = await import(pathToFileURL(path.join(PACKAGE, 'nats/port.js')).href);
  await api.default({ backend: 'cpu' });
  const port = await openPort({ servers: url });
  return { api, port, world: api.World.joinNats(port, { run, ranks, ...options }) };
}

/** `repeats` all-reduces of DistributedDataParallel. */
async function distoptRank({ url, run, ranks, elements, repeats }) {
  const { api, port, world } = await joinRun({ url, run, ranks });
  const { Replicas, DistributedDataParallel } = api;
  const model = Replicas.replicate(1, [new Float32Array(elements)]);
  const ddp = new DistributedDataParallel(world, model);
  const grads = Float32Array.from({ length: elements }, (_, i) => (i % 251) * (world.rank + 1));
  const ms = [];
  for (let i = 0; i < repeats + 2; i++) {
    model.setGrads(0, [grads]);
    const start = performance.now();
    ddp.synchronizeGradients();
    if (i >= 2) ms.push(performance.now() - start);
  }
  // The mean is right: element i is (i % 251) times the mean of 1..W.
  const [got] = (await model.grads())[0];
  const scale = (ranks + 1) / 2;
  for (const i of [0, 1, 250, elements - 1]) {
    if (Math.abs(got.data[i] - (i % 251) * scale) > 1e-4 * Math.max(1, (i % 251) * scale)) {
      throw new Error(`element ${i} averaged to ${got.data[i]}, expected ${(i % 251) * scale}`);
    }
  }
  const rank = world.rank;
  ddp.free();
  model.free();
  world.free();
  port.close();
  return { rank, ms };
}

/** `steps` steps of the demo's Trainer under (Streaming) DiLoCo. */
async function trainerRank({ url, run, ranks, steps, period, fragments, delay }) {
  const { api, port, world } = await joinRun({ url, run, ranks });
  const trainer = new api.Trainer({ ranks, algorithm: 'diloco', period, fragments, fragmentSyncDelay: delay, world });
  await trainer.evaluate();
  const start = performance.now();
  while (trainer.steps < steps) await trainer.step();
  const ms = (performance.now() - start) / steps;
  const { lossPerRank } = await trainer.evaluate();
  const rank = world.rank;
  trainer.free();
  world.free();
  port.close();
  return { rank, ms: [ms], lossPerRank: Array.from(lossPerRank) };
}

/**
 * `steps` steps of the demo's Trainer under DiLoCo as rank `rank` (with `join`, joining the
 * running run in that rank's place), noting when each membership change was first seen.
 */
async function recoveryRank({ url, run, ranks, rank, join, steps, period, bound }) {
  const { api, port, world } = await joinRun({ url, run, ranks }, { rank, join, failureBound: bound });
  const trainer = new api.Trainer({ ranks, algorithm: 'diloco', period, world });
  if (join) await trainer.admit();
  await trainer.evaluate();
  const changes = [];
  // Each step's time: their median is a step's time outside the stall at the rank's death.
  const ms = [];
  while (trainer.steps < steps) {
    const start = performance.now();
    await trainer.step();
    ms.push(performance.now() - start);
    const seen = world.membershipChanges;
    for (const change of seen.slice(changes.length)) changes.push({ ...change, at: Date.now() });
  }
  trainer.free();
  world.free();
  port.close();
  return { rank, ms, changes };
}

/** `steps` inner steps of the DiLoCo class, each `workUs` of busy work first. */
async function dilocoRank({ url, run, ranks, steps, period, delay, workUs, elements }) {
  const { api, port, world } = await joinRun({ url, run, ranks });
  const params = [new Float32Array(elements).fill(1), new Float32Array(elements).fill(2)];
  const replicas = api.Replicas.replicate(1, params);
  const inner = new api.SGD(replicas, { lr: 0.01 });
  const outer = new api.SGD(replicas, { lr: 0.7, momentum: 0.9, nesterov: true });
  const diloco = new api.DiLoCo(inner, outer, period, world, { fragments: [[0], [1]], fragmentSyncDelay: delay });
  const grads = params.map(() => Float32Array.from({ length: elements }, (_, i) => ((i % 7) - 3) * (world.rank + 1) * 1e-3));
  const busy = () => {
    const end = performance.now() + workUs / 1000;
    while (performance.now() < end);
  };
  const step = () => {
    busy();
    replicas.setGrads(0, grads);
    diloco.step();
  };
  for (let i = 0; i < period; i++) step();
  const start = performance.now();
  for (let i = 0; i < steps; i++) step();
  const ms = (performance.now() - start) / steps;
  const rank = world.rank;
  diloco.free();
  inner.free();
  outer.free();
  replicas.free();
  world.free();
  port.close();
  return { rank, ms: [ms] };
}

async function rawRank({ url, run, ranks, rank, elements, repeats }) {
  const { connect } = await import(pathToFileURL(NATS_JS).href);
  const nc = await connect({ servers: url, noEcho: true });
  const bytes = elements * 4;
  const payload = new Uint8Array(bytes);
  const chunk = nc.info.max_payload;
  const shard = (k) => [Math.floor((k * bytes) / ranks), Math.floor(((k + 1) * bytes) / ranks)];
  let received = 0;
  let wake = () => {};
  const arrived = (want) =>
    new Promise((resolve) => {
      const check = () => {
        if (received >= want) {
          received -= want;
          wake = () => {};
          resolve();
        } else wake = check;
      };
      check();
    });
  const sub = nc.subscribe(`raw.${run}.${rank}`, { callback: (_, m) => ((received += m.data.length), wake()) });
  // Barrier `gen`: every other rank has published `gen` on the barrier subject.
  const heard = new Map();
  let onHeard = () => {};
  const barrier = nc.subscribe(`raw.${run}.barrier`, {
    callback: (_, m) => {
      const gen = Number(new TextDecoder().decode(m.data));
      heard.set(gen, (heard.get(gen) ?? 0) + 1);
      onHeard();
    },
  });
  await nc.flush();
  // Every rank's subscriptions are in place before anyone publishes: the driver says go once
  // every process said it subscribed.
  console.log('subscribed');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  const sync = async (gen) => {
    nc.publish(`raw.${run}.barrier`, new TextEncoder().encode(String(gen)));
    await new Promise((resolve) => {
      onHeard = () => (heard.get(gen) ?? 0) >= ranks - 1 && resolve();
      onHeard();
    });
  };
  const publish = async (to, [from, end]) => {
    for (let at = from; at < end; at += chunk) nc.publish(`raw.${run}.${to}`, payload.subarray(at, Math.min(at + chunk, end)));
    await nc.flush();
  };
  const ms = [];
  for (let i = 0; i < repeats + 2; i++) {
    await sync(i + 1);
    const start = performance.now();
    const [a, b] = shard(rank);
    for (let k = 0; k < ranks; k++) if (k !== rank) await publish(k, shard(k));
    await arrived((b - a) * (ranks - 1));
    for (let k = 0; k < ranks; k++) if (k !== rank) await publish(k, [a, b]);
    await arrived(bytes - (b - a));
    if (i >= 2) ms.push(performance.now() - start);
  }
  sub.unsubscribe();
  barrier.unsubscribe();
  await nc.drain();
  return { rank, ms };
}

// ---------------------------------------------------------------------------------------------
// The driver.

/** A rank's process: {subscribed (a promise: it said so), go(), result (a promise)}. */
function child(task) {
  const proc = spawn(process.execPath, [fileURLToPath(import.meta.url), '--child', JSON.stringify(task)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  let said = () => {};
  const subscribed = new Promise((resolve) => (said = resolve));
  proc.stdout.on('data', (d) => {
    out += d;
    if (out.includes('subscribed\n')) said();
  });
  const result = new Promise((resolve, reject) =>
    proc.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop())) : reject(new Error(`a ${task.mode} rank exited ${code}: ${out}`)))),
  );
  return { subscribed, go: () => proc.stdin.end('go\n'), result, proc };
}

/** W child processes of `task` (rank K its `rank`): their results, and the slowest one's median (ms). */
async function children(task, ranks) {
  const procs = Array.from({ length: ranks }, (_, rank) => child({ ...task, ranks, rank }));
  if (task.mode === 'raw') {
    await Promise.all(procs.map((p) => p.subscribed));
    procs.forEach((p) => p.go());
  }
  const results = await Promise.all(procs.map((p) => p.result));
  return { results, slowest: Math.max(...results.map((r) => median(r.ms))) };
}

/** W processes of `mode`; the slowest one's median (ms). */
async function jsRow(mode, url, ranks, elements, repeats, tag) {
  return (await children({ mode, url, run: `bench-${mode}-${tag}`, elements, repeats }, ranks)).slowest;
}

/** `distopt ...flags` in W processes: the JSON report the one that prints gives. */
async function nativeRanks(distopt, ranks, flags) {
  const outs = await Promise.all(
    Array.from({ length: ranks }, () =>
      new Promise((resolve, reject) => {
        const proc = spawn(distopt, flags, { stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        proc.stdout.on('data', (d) => (out += d));
        proc.on('exit', (code) => (code === 0 ? resolve(out.trim()) : reject(new Error(`distopt ${flags[0]} exited ${code}`))));
      }),
    ),
  );
  return JSON.parse(outs.find((o) => o.startsWith('{')));
}

/** `distopt bench comm --world` in W processes: {distopt, raw} (ms, the first rank's JSON). */
async function nativeRow(distopt, url, ranks, elements, repeats, tag) {
  const flags = ['bench', 'comm', '--world', url, '--run', `bench-native-${tag}`, '--ranks', String(ranks)];
  flags.push('--elements', String(elements), '--repeats', String(repeats), '--backend', 'cpu', '--json');
  const report = await nativeRanks(distopt, ranks, flags);
  return { distopt: report.distopt_all_reduce_mean_ms, raw: report.raw_nats_ms };
}

/** W Node processes of `trainerRank`: the slowest one's ms per step, and the replicas' losses. */
async function trainerRow(url, ranks, run, tag) {
  const { results, slowest } = await children({ mode: 'trainer', url, ...run, run: `bench-trainer-${tag}` }, ranks);
  return { ms: slowest, losses: results[0].lossPerRank };
}

/** `distopt train --world` of the same run in W processes: ms per step and the replicas' losses. */
async function nativeTrainerRow(distopt, url, ranks, { steps, period, fragments, delay }, tag) {
  const flags = ['train', '--world', url, '--run', `bench-native-trainer-${tag}`, '--ranks', String(ranks), '--algorithm', 'diloco', '--period', String(period)];
  flags.push('--fragments', String(fragments), '--steps', String(steps), '--backend', 'cpu', '--json');
  if (delay > 0) flags.push('--fragment-sync-delay', String(delay));
  const result = (await nativeRanks(distopt, ranks, flags)).results[0];
  return { ms: result.ms_per_step, losses: result.replica_loss_per_rank };
}

/** The `--trainer` table: JS ranks against native ranks of one DiLoCo run, W = each of `sizes`. */
async function trainerTable(distopt, server, sizes, { steps, period, fragments, delay }, rounds) {
  const delays = delay > 0 ? [0, delay] : [0];
  console.log(
    `bench-nats-js: DiLoCo (sync every ${period} steps, ${fragments} fragment(s)), ${steps} steps of the demo's task, one nats-server on loopback, ms per step of the slowest process`,
  );
  console.log('| W | round | delay | JS ranks | native ranks | JS / native |');
  console.log('|---|---|---|---|---|---|');
  for (const ranks of sizes) {
    for (let round = 1; round <= rounds; round++) {
      for (const d of delays) {
        const tag = `${ranks}-${round}-${d}-${Date.now()}`;
        const run = { steps, period, fragments, delay: d };
        const js = await trainerRow(server.url, ranks, run, tag);
        const native = await nativeTrainerRow(distopt, server.url, ranks, run, tag);
        // The same run: JS and native ranks end on the same replicas, bit for bit.
        if (JSON.stringify(js.losses) !== JSON.stringify(native.losses)) {
          throw new Error(`the JS and native runs differ: ${js.losses} against ${native.losses}`);
        }
        console.log(`| ${ranks} | ${round} | ${d} | ${js.ms.toFixed(2)} ms | ${native.ms.toFixed(2)} ms | ${(js.ms / native.ms).toFixed(2)}× |`);
      }
    }
  }
}

/** The `--diloco` table: no communication, syncs blocking and syncs in flight, W = each of `sizes`. */
async function dilocoTable(server, sizes, { steps, period, delay, workUs, elements }, rounds) {
  console.log(
    `bench-nats-js: Streaming DiLoCo in JS ranks (2 fragments of ${elements} float32, a sync every ${period} steps, ${workUs} µs of work per inner step), ${steps} steps, ms per inner step of the slowest process`,
  );
  console.log('| W | round | no communication | syncs blocking | syncs in flight (delay ' + delay + ') |');
  console.log('|---|---|---|---|---|');
  for (const ranks of sizes) {
    for (let round = 1; round <= rounds; round++) {
      const row = [];
      // No sync point falls in the timed steps when the period outlasts the run.
      for (const [p, d] of [[steps * 4, 0], [period, 0], [period, delay]]) {
        const run = `bench-diloco-${ranks}-${round}-${p}-${d}-${Date.now()}`;
        row.push((await children({ mode: 'diloco', url: server.url, run, steps, period: p, delay: d, workUs, elements }, ranks)).slowest);
      }
      const [none, blocking, flight] = row;
      const f = (ms) => `${ms.toFixed(3)} ms`;
      console.log(`| ${ranks} | ${round} | ${f(none)} | ${f(blocking)} (${(blocking / none).toFixed(2)}×) | ${f(flight)} (**${(flight / none).toFixed(2)}×**) |`);
    }
  }
}

/**
 * The `--recovery` table: W Node ranks, rank W-1 killed after `killAfter` s and a joiner in its
 * place; each run's times from rank 0's view and their medians (seconds).
 */
async function recoveryTable(server, ranks, { steps, period, killAfter, bound, repeats }) {
  const victim = ranks - 1;
  console.log(
    `bench-nats-js: recovery of a DiLoCo run of ${ranks} Node ranks (the demo's task, a sync every ${period} steps, ${steps} steps), rank ${victim} SIGKILLed after ${killAfter} s and a joining Node process started in its place; failure bound ${bound} s; one nats-server on loopback`,
  );
  console.log('| run | sync period | death → survivors\' next sync | left → joiner healed | joiner start → healed |');
  console.log('|---|---|---|---|---|');
  const rows = [];
  for (let i = 1; i <= repeats; i++) {
    const task = { mode: 'recovery', url: server.url, run: `bench-recovery-${i}-${Date.now()}`, ranks, steps, period, bound };
    const procs = Array.from({ length: ranks }, (_, rank) => child({ ...task, rank }));
    await new Promise((resolve) => setTimeout(resolve, killAfter * 1000));
    procs[victim].proc.kill('SIGKILL');
    const killed = Date.now();
    procs[victim].result.catch(() => {});
    const joinStart = Date.now();
    const joiner = child({ ...task, rank: victim, join: true });
    const results = await Promise.all([...procs.filter((_, r) => r !== victim), joiner].map((p) => p.result));
    const zero = results.find((r) => r.rank === 0);
    const left = zero.changes.find((c) => !c.live.includes(victim));
    const admitted = zero.changes.find((c) => c.syncPoint >= left?.syncPoint && c.joining.includes(victim));
    if (!left || !admitted) throw new Error(`run ${task.run}: rank 0 saw no sync point without rank ${victim} and one taking it in: ${JSON.stringify(zero.changes)}`);
    const row = {
      period: (median(zero.ms) * period) / 1000,
      death: (left.at - killed) / 1000,
      left: (admitted.at - left.at) / 1000,
      join: (admitted.at - joinStart) / 1000,
    };
    rows.push(row);
    console.log(`| ${i} | ${row.period.toFixed(3)} s | ${row.death.toFixed(2)} s | ${row.left.toFixed(2)} s | ${row.join.toFixed(2)} s |`);
  }
  const m = (key) => median(rows.map((r) => r[key]));
  const target = bound + m('period');
  console.log(
    `| median | ${m('period').toFixed(3)} s | **${m('death').toFixed(2)} s (${(m('death') / target).toFixed(2)}× the target of ${target.toFixed(2)} s)** | ${m('left').toFixed(2)} s | ${m('join').toFixed(2)} s (${(m('join') / target).toFixed(2)}× the target) |`,
  );
}

/** The all-reduce table: JS ranks, raw nats.js and native ranks, W = each of `sizes`. */
async function allReduceTable(distopt, server, sizes, { elements, repeats }, rounds) {
  const mib = (elements * 4) / (1 << 20);
  console.log(`bench-nats-js: all-reduce-mean of ${elements} float32 (${mib.toFixed(1)} MiB) per rank, one nats-server on loopback, median of ${repeats}, slowest process`);
  console.log('| W | round | distopt, JS ranks | raw nats.js (JS floor) | JS / raw nats.js | distopt, native ranks | raw NATS (native) | JS / native distopt |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const ranks of sizes) {
    for (let round = 1; round <= rounds; round++) {
      const tag = `${ranks}-${round}-${Date.now()}`;
      const js = await jsRow('distopt', server.url, ranks, elements, repeats, tag);
      const raw = await jsRow('raw', server.url, ranks, elements, repeats, tag);
      const native = await nativeRow(distopt, server.url, ranks, elements, repeats, tag);
      const f = (ms) => `${ms.toFixed(1)} ms`;
      console.log(
        `| ${ranks} | ${round} | ${f(js)} | ${f(raw)} | ${(js / raw).toFixed(2)}× | ${f(native.distopt)} | ${f(native.raw)} | ${(js / native.distopt).toFixed(2)}× |`,
      );
    }
  }
}

/**
 * A TCP proxy on loopback to the server at `url` (`nats://host:port`) that holds every chunk
 * `ms` milliseconds in each direction, in order: {url, close()}.
 */
async function delayingProxy(url, ms) {
  const { hostname, port } = new URL(url.replace(/^nats:/, 'http:'));
  const proxy = net.createServer((client) => {
    const upstream = net.connect(Number(port), hostname);
    const pass = (from, to) => {
      from.on('data', (chunk) => setTimeout(() => to.destroyed || to.write(chunk), ms));
      from.on('close', () => setTimeout(() => to.destroy(), ms));
      from.on('error', () => {});
    };
    pass(client, upstream);
    pass(upstream, client);
  });
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return { url: `nats://127.0.0.1:${proxy.address().port}`, close: () => proxy.close() };
}

async function main() {
  const { values } = parseArgs({
    options: {
      ranks: { type: 'string' },
      elements: { type: 'string' },
      repeats: { type: 'string' },
      rounds: { type: 'string', default: '3' },
      trainer: { type: 'string' },
      diloco: { type: 'string' },
      'work-us': { type: 'string', default: '500' },
      period: { type: 'string' },
      fragments: { type: 'string' },
      delay: { type: 'string' },
      recovery: { type: 'string' },
      'kill-after': { type: 'string', default: '3' },
      bound: { type: 'string', default: '5' },
      latency: { type: 'string', default: '0' },
    },
  });
  const sizes = (values.ranks ?? (values.trainer === undefined && values.diloco === undefined && values.recovery === undefined ? '2,4' : '3')).split(',').map(Number);
  const [elements, repeats, rounds] = [values.elements ?? 1 << 22, values.repeats ?? 10, values.rounds].map(Number);
  if (!fs.existsSync(path.join(PACKAGE, 'nats/worker.node.js'))) throw new Error(`build the package first (scripts/build-npm.sh): ${PACKAGE}`);
  const distopt = path.join(process.env.CARGO_TARGET_DIR || path.join(ROOT, 'target'), 'release', 'distopt');
  execFileSync('cargo', ['build', '--release', '--quiet', '-p', 'distopt-cli', '--bin', 'distopt'], { cwd: ROOT, stdio: 'inherit' });
  const nats = await startServer(['-js']);
  const latency = Number(values.latency);
  const proxy = latency > 0 ? await delayingProxy(nats.url, latency) : null;
  if (proxy) console.log(`bench-nats-js: every rank reaches the server through a proxy holding each chunk ${latency} ms each way`);
  const server = { ...nats, url: proxy?.url ?? nats.url };
  try {
    if (values.recovery !== undefined) {
      const run = { steps: Number(values.recovery), period: Number(values.period ?? 8), killAfter: Number(values['kill-after']), bound: Number(values.bound) };
      await recoveryTable(server, sizes[0], { ...run, repeats: Number(values.repeats ?? 3) });
    } else if (values.diloco !== undefined) {
      const run = {
        steps: Number(values.diloco),
        period: Number(values.period ?? 32),
        delay: Number(values.delay ?? 8),
        workUs: Number(values['work-us']),
        elements: Number(values.elements ?? 1 << 16),
      };
      await dilocoTable(server, sizes, run, rounds);
    } else if (values.trainer !== undefined) {
      const run = { steps: Number(values.trainer), period: Number(values.period ?? 8), fragments: Number(values.fragments ?? 1), delay: Number(values.delay ?? 0) };
      await trainerTable(distopt, server, sizes, run, rounds);
    } else {
      await allReduceTable(distopt, server, sizes, { elements, repeats }, rounds);
    }
  } finally {
    proxy?.close();
    nats.stop();
  }
}

if (process.argv[2] === '--child') {
  const task = JSON.parse(process.argv[3]);
  const rank = { distopt: distoptRank, trainer: trainerRank, diloco: dilocoRank, raw: rawRank, recovery: recoveryRank }[task.mode];
  const result = await rank(task);
  console.log(JSON.stringify(result));
  process.exit(0);
} else {
  await main();
}
