// Ranks that die, over a real nats-server, with every rank a Node process
// (tests/js/nats-trainer.mjs: the package's Trainer over `World.joinNats`), SIGKILLed as a tab
// or a process dies:
//   - synchronous SGD fails fast: every survivor's pending collective fails with the
//     RuntimeError naming the dead rank within the failure bound (5 s) and a little;
//   - DiLoCo goes on: the survivors drop the dead rank at the next sync point and finish, on
//     identical replicas, which equal bit for bit the simulated world's replaying the
//     membership the run reported (`distopt train --membership`);
//   - DiLoCo and post-local SGD (periodic averaging) take a new Node process in the dead rank's
//     place (`join: true`, `trainer.admit()`): healed from a live rank, it finishes with the
//     survivors, all three equal bit for bit to the simulated replay of that membership.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { HERE, importPackage, importPort, simulatedReplay as replay } from './helpers.js';
import { startServer } from './nats-server.js';

const BOUND_S = 5;

let server;

before(async () => {
  server = await startServer(['-js']);
});

after(() => server?.stop());

/**
 * Starts rank `rank` of `run` (`ranks` ranks, 3 by default; with `join`, as a process joining the
 * running run in that rank's place; with `leaveBefore`, a rank that dies before that step; with
 * `fragments` and `delay`, Streaming DiLoCo; `bound`: the failure bound in seconds); resolves
 * {code, report, err, exitAt} when it exits. With `steps` 'told', it trains until `finish(N)`:
 * `progress()` is its steps so far (0 before it trains).
 */
function startRank(run, rank, algorithm, steps, { join = false, ranks = 3, period = 8, leaveBefore, saying, fragments, delay, bound } = {}) {
  const optional = { DISTOPT_LEAVE_BEFORE: leaveBefore, DISTOPT_LEAVE_SAYING: saying, DISTOPT_FRAGMENTS: fragments, DISTOPT_FRAGMENT_SYNC_DELAY: delay, DISTOPT_FAILURE_BOUND: bound };
  const child = spawn(process.execPath, [path.join(HERE, 'nats-trainer.mjs')], {
    env: {
      ...process.env,
      DISTOPT_URL: server.url,
      DISTOPT_RUN: run,
      DISTOPT_RANKS: String(ranks),
      DISTOPT_RANK: String(rank),
      DISTOPT_ALGORITHM: algorithm,
      DISTOPT_PERIOD: String(period),
      DISTOPT_STEPS: String(steps),
      ...(join ? { DISTOPT_JOIN: '1' } : {}),
      ...Object.fromEntries(Object.entries(optional).filter(([, v]) => v !== undefined).map(([k, v]) => [k, String(v)])),
    },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 240_000);
  const exited = new Promise((resolve) =>
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      let report = null;
      try {
        report = JSON.parse(out.trim().split('\n').pop());
      } catch {
        // none printed
      }
      resolve({ code: code ?? signal, report, out, err, exitAt: Date.now() });
    }),
  );
  const progress = () => Number([...err.matchAll(/progress (\d+)/g)].at(-1)?.[1] ?? 0);
  const finish = (n) => child.stdin.write(`finish ${n}\n`);
  return { child, exited, progress, finish };
}

/** Waits until all three ranks have joined and trained a while (their stdout is quiet until the end). */
const settle = () => new Promise((resolve) => setTimeout(resolve, 4000));

const sleep = (s) => new Promise((resolve) => setTimeout(resolve, s * 1000));

/** Resident memory of process `pid` in bytes (Linux's /proc), or null where unreadable. */
function residentBytes(pid) {
  try {
    const kib = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return kib ? Number(kib[1]) * 1024 : null;
  } catch {
    return null;
  }
}

test('synchronous SGD: a killed Node rank fails both survivors with the named error within the bound', async () => {
  const ranks = [0, 1, 2].map((r) => startRank('faults-sync', r, 'sync', 1e9));
  await settle();
  ranks[2].child.kill('SIGKILL');
  const killedAt = Date.now();
  const [a, b, killed] = await Promise.all(ranks.map((r) => r.exited));
  assert.equal(killed.code, 'SIGKILL');
  for (const s of [a, b]) {
    assert.equal(s.code, 1, `a survivor exits 1: ${s.out}\n${s.err}`);
    assert.equal(s.report?.error?.name, 'RuntimeError', s.out);
    assert.match(s.report.error.message, /rank 2 is gone: nothing heard from it for/);
    const after = (s.report.at - killedAt) / 1000;
    assert.ok(after >= BOUND_S - 0.5 && after <= BOUND_S + 3, `failed ${after.toFixed(1)} s after the kill (bound ${BOUND_S} s)`);
  }
  console.log(
    `sync: both Node survivors failed naming rank 2, ${((a.report.at - killedAt) / 1000).toFixed(1)} s and ${((b.report.at - killedAt) / 1000).toFixed(1)} s after the kill (bound ${BOUND_S} s)`,
  );
});

test('DiLoCo: the survivors of a killed Node rank finish on identical replicas', async () => {
  const steps = 6000;
  const ranks = [0, 1, 2].map((r) => startRank('faults-diloco', r, 'diloco', steps));
  await settle();
  ranks[2].child.kill('SIGKILL');
  const [a, b, killed] = await Promise.all(ranks.map((r) => r.exited));
  assert.equal(killed.code, 'SIGKILL', 'rank 2 was still training when killed (raise the steps)');
  for (const s of [a, b]) {
    assert.equal(s.code, 0, `a survivor finishes: ${s.out}\n${s.err}`);
    assert.equal(s.report.steps, steps);
    assert.deepEqual(s.report.live, [true, true, false], 'rank 2 left at a sync point');
  }
  assert.equal(a.report.meanModelLoss, b.report.meanModelLoss, 'the survivors hold the same mean model');
  assert.deepEqual(a.report.lossPerRank.slice(0, 2), b.report.lossPerRank.slice(0, 2));
  assert.equal(a.report.lossPerRank[0], a.report.lossPerRank[1], 'DiLoCo leaves the survivors on the same replica');
  // The simulated world replaying the membership the run agreed on: the survivors' replicas.
  assert.deepEqual(a.report.membershipChanges, b.report.membershipChanges, 'both survivors report one membership');
  const simulated = (await replay({ algorithm: 'diloco', steps }, a.report.membershipChanges)).replica_loss_per_rank;
  assert.deepEqual(a.report.lossPerRank.slice(0, 2), simulated.slice(0, 2), 'the survivors equal the simulated replay bit for bit');
  const left = a.report.membershipChanges[0];
  console.log(
    `diloco: rank 2 killed, out from sync point ${left.syncPoint}; ranks 0 and 1 finished ${steps} steps on identical replicas, equal to the simulated replay of that membership bit for bit (replica loss ${a.report.lossPerRank[0]})`,
  );
});

/**
 * Three ranks of `algorithm` for `steps` steps. Rank 2 leaves: it dies before step `leaveBefore`
 * when given, else it is SIGKILLed once the run has settled. Once the survivors have dropped it
 * (the failure bound `bound` and a sync point), a new process asks for rank 2. All three
 * finish with every rank live, the survivors report one membership that drops rank 2 and takes
 * the joiner back, and every process holds the simulated replay's replicas bit for bit.
 * Resolves {left, back, replicas}: the changes that dropped rank 2 and took it back.
 */
async function leaveAndJoin(run, { algorithm, steps, leaveBefore, bound = BOUND_S }) {
  const ranks = [0, 1, 2].map((r) => startRank(run, r, algorithm, steps, { bound, leaveBefore: r === 2 ? leaveBefore : undefined }));
  if (leaveBefore === undefined) {
    await settle();
    ranks[2].child.kill('SIGKILL');
  }
  const killed = await ranks[2].exited;
  assert.equal(killed.code, 'SIGKILL', `rank 2 was still training when it left (raise the steps): ${killed.out}\n${killed.err}`);
  await sleep(bound + 1);
  const joiner = startRank(run, 2, algorithm, steps, { join: true, bound });
  const [a, b, c] = await Promise.all([ranks[0].exited, ranks[1].exited, joiner.exited]);
  for (const [who, s] of [['rank 0', a], ['rank 1', b], ['the joiner', c]]) {
    assert.equal(s.code, 0, `${who} finishes: ${s.out}\n${s.err}`);
    assert.equal(s.report.steps, steps);
    assert.deepEqual(s.report.live, [true, true, true], `${who}: all three live at the end`);
  }
  assert.equal(c.report.rank, 2, 'the joiner took rank 2');
  const changes = a.report.membershipChanges;
  assert.deepEqual(b.report.membershipChanges, changes, 'the survivors report one membership');
  const left = changes.find((m) => !m.live.includes(2));
  const back = changes.find((m) => m.joining.includes(2));
  assert.ok(left && back, `rank 2 left and came back: ${JSON.stringify(changes)}`);
  // Every process evaluates the same replicas; they equal the simulated replay, bit for bit.
  const simulated = await replay({ algorithm, steps }, changes);
  for (const s of [a, b, c]) {
    assert.deepEqual(s.report.lossPerRank, simulated.replica_loss_per_rank, `rank ${s.report.rank}: the simulated replay's replicas, bit for bit`);
  }
  return { left, back, replicas: c.report.lossPerRank };
}

/**
 * The two survivors of a DiLoCo run of three whose rank 2 said it left at `since` (ms; `left`
 * names how in messages): both finished `steps` steps without it, well within the failure
 * `bound` (the survivors did not wait for its silence), on one membership, their replicas the
 * simulated replay's bit for bit. Resolves the seconds they took after `since` and the
 * membership changes.
 */
async function survivedRank2([a, b], { steps, bound, since, left }) {
  for (const s of [a, b]) {
    assert.equal(s.code, 0, `a survivor finishes: ${s.out}\n${s.err}`);
    assert.equal(s.report.steps, steps);
    assert.deepEqual(s.report.live, [true, true, false]);
  }
  const after = (Math.max(a.exitAt, b.exitAt) - since) / 1000;
  assert.ok(after < bound / 2, `the survivors finished ${after.toFixed(1)} s after ${left}: they waited for the ${bound} s bound`);
  const changes = a.report.membershipChanges;
  assert.deepEqual(b.report.membershipChanges, changes, 'both survivors report one membership');
  const simulated = await replay({ algorithm: 'diloco', steps }, changes);
  for (const s of [a, b]) {
    assert.deepEqual(s.report.lossPerRank.slice(0, 2), simulated.replica_loss_per_rank.slice(0, 2), `rank ${s.report.rank}: the simulated replay's replicas, bit for bit`);
  }
  return { after, changes };
}

test('a Node rank that calls world.leave() is out of the next sync point at once, not after the failure bound', async () => {
  // A bound of 30 s: without the leaving frame the survivors would wait that long.
  const [steps, leaveBefore, bound] = [600, 100, 30];
  const ranks = [0, 1, 2].map((r) =>
    startRank('faults-leave', r, 'diloco', steps, { bound, ...(r === 2 ? { leaveBefore, saying: 1 } : {}) }),
  );
  const [a, b, gone] = await Promise.all(ranks.map((r) => r.exited));
  assert.equal(gone.code, 0, `rank 2 left saying so: ${gone.out}\n${gone.err}`);
  const { after, changes } = await survivedRank2([a, b], { steps, bound, since: gone.exitAt, left: 'rank 2 left' });
  console.log(
    `a DiLoCo Node rank left saying so before step ${leaveBefore}: out from sync point ${changes[0].syncPoint}; the survivors finished ${steps} steps ${after.toFixed(1)} s after it (failure bound ${bound} s), equal to the replay`,
  );
});

test("a rank's leaving message, published from another connection after it died, takes it out as leave() does", async () => {
  // As a browser tab's page says its worker's last word: the rank hands over its
  // `leavingMessage()` when it has joined and later dies without a word (SIGKILL); the test
  // publishes the message from a connection of its own. A bound of 30 s: without it the
  // survivors would wait that long.
  const api = await importPackage();
  await api.default({ backend: 'cpu' });
  assert.equal(new api.World(2).leavingMessage(), null, 'a simulated world has nothing to say');
  const [steps, leaveBefore, bound] = [600, 100, 30];
  const ranks = [0, 1, 2].map((r) =>
    startRank('faults-leave-elsewhere', r, 'diloco', steps, { bound, ...(r === 2 ? { leaveBefore, saying: 'elsewhere' } : {}) }),
  );
  const gone = await ranks[2].exited;
  assert.equal(gone.code, 'SIGKILL', `rank 2 died without a word: ${gone.out}\n${gone.err}`);
  const said = JSON.parse(/^leaving (.*)$/m.exec(gone.err)?.[1] ?? 'null');
  assert.ok(said, `rank 2 handed over its leaving message: ${gone.err}`);
  assert.equal(said.subject, 'distopt.faults-leave-elsewhere.all', "the run's common subject");
  assert.ok(said.frames.length >= 1);
  const { openPort } = await importPort();
  const port = await openPort({ servers: server.url, name: 'the test, saying rank 2 left' });
  for (const frame of said.frames) port.publish(said.subject, Buffer.from(frame, 'base64'));
  port.flush();
  const saidAt = Date.now();
  const survivors = await Promise.all(ranks.slice(0, 2).map((r) => r.exited));
  port.close();
  const { after, changes } = await survivedRank2(survivors, { steps, bound, since: saidAt, left: "rank 2's leaving message" });
  console.log(
    `a DiLoCo Node rank killed before step ${leaveBefore}, its leaving message published by the test: out from sync point ${changes[0].syncPoint}; the survivors finished ${steps} steps ${after.toFixed(1)} s after the message (failure bound ${bound} s), equal to the replay`,
  );
});

for (const algorithm of ['diloco', 'periodic']) {
  test(`${algorithm}: a Node process joins in a killed rank's place, is healed, and all three equal the simulated replay`, async () => {
    const steps = 8000;
    const { left, back, replicas } = await leaveAndJoin(`faults-join-${algorithm}`, { algorithm, steps });
    console.log(
      `${algorithm}: rank 2 killed, out from sync point ${left.syncPoint}; a new Node process joined, was healed and taken in after sync point ${back.syncPoint}; all three finished ${steps} steps equal to the simulated replay bit for bit (replica losses ${replicas.join(', ')})`,
    );
  });
}

// (algorithm, T, K): rank 2 dies before step T, so that sync point K is the first it misses.
// DiLoCo syncs at the end of step 8(K + 1) - 1; post-local SGD, after its 20 warm-up steps of
// synchronous SGD, at step 20 + 8K.
const EACH_SYNC_POINT = [
  ['diloco', 7, 0],
  ['diloco', 12, 1],
  ['diloco', 23, 2],
  ['diloco', 31, 3],
  ['periodic', 20, 0],
  ['periodic', 25, 1],
  ['periodic', 36, 2],
];

test('a Node rank that dies before each sync point in turn is dropped there, replaced by a joiner, and every run equals its replay', async () => {
  const lines = [];
  for (const [algorithm, leaveBefore, missed] of EACH_SYNC_POINT) {
    const { left, back } = await leaveAndJoin(`faults-point-${algorithm}-${leaveBefore}`, { algorithm, steps: 960, leaveBefore, bound: 3 });
    assert.equal(left.syncPoint, missed, `${algorithm}: rank 2 died before step ${leaveBefore}, so sync point ${missed} is the first without it`);
    assert.deepEqual(left.live, [0, 1]);
    lines.push(`${algorithm} died before step ${leaveBefore}: out from sync point ${left.syncPoint}, joiner in after ${back.syncPoint}`);
  }
  console.log(`each sync point in turn (3 Node ranks, 960 steps, bound 3 s), all equal to their replay bit for bit:\n  ${lines.join('\n  ')}`);
});

test('Streaming DiLoCo: a Node rank that dies while a fragment is in flight leaves the mean applied on every survivor or on none', async () => {
  // Two fragments, each all-reduce in flight for 2 of the 4 steps between sync points.
  const settings = { algorithm: 'diloco', steps: 240, fragments: 2, delay: 2 };
  const lines = [];
  for (const leaveBefore of [5, 6, 7]) {
    const run = `faults-flight-${leaveBefore}`;
    const ranks = [0, 1, 2].map((r) => startRank(run, r, 'diloco', settings.steps, { ...settings, bound: 3, leaveBefore: r === 2 ? leaveBefore : undefined }));
    const [a, b, gone] = await Promise.all(ranks.map((r) => r.exited));
    assert.equal(gone.code, 'SIGKILL', gone.err);
    for (const s of [a, b]) {
      assert.equal(s.code, 0, `a survivor finishes: ${s.out}\n${s.err}`);
      assert.deepEqual(s.report.live, [true, true, false]);
    }
    assert.deepEqual(a.report.membershipChanges, b.report.membershipChanges, 'both survivors report one membership');
    const simulated = await replay(settings, a.report.membershipChanges);
    for (const s of [a, b]) {
      assert.deepEqual(s.report.lossPerRank.slice(0, 2), simulated.replica_loss_per_rank.slice(0, 2), `rank ${s.report.rank}: the simulated replay's replicas, bit for bit`);
    }
    lines.push(`died before step ${leaveBefore}: out from sync point ${a.report.membershipChanges[0].syncPoint}`);
  }
  console.log(`streaming in flight (3 Node ranks, F = 2, delay 2), both survivors equal to the replay bit for bit:\n  ${lines.join('\n  ')}`);
});

test('churn: four Streaming DiLoCo Node ranks, one killed and one joining every few seconds, finish on the replay of their membership', async () => {
  // The ranks train until told where to stop, 200 steps after the last join: the schedule's
  // sleeps never outlast the run, on a machine of any speed.
  const settings = { algorithm: 'diloco', ranks: 4, steps: 'told', fragments: 2, delay: 3 };
  const bound = 3;
  const run = 'faults-churn';
  const start = (rank, join = false) => startRank(run, rank, 'diloco', settings.steps, { ...settings, bound, join });
  const holders = [0, 1, 2, 3].map((r) => start(r));
  const killed = [];
  const resident = [];
  await settle();
  for (const rank of [2, 0, 3, 2]) {
    resident.push(residentBytes(holders[1].child.pid));
    holders[rank].child.kill('SIGKILL');
    killed.push(holders[rank]);
    await sleep(bound + 1);
    holders[rank] = start(rank, true);
    await sleep(4);
  }
  resident.push(residentBytes(holders[1].child.pid));
  const deadline = Date.now() + 120_000;
  while (holders.some((h) => h.progress() === 0) && Date.now() < deadline) await sleep(0.2);
  const at = Math.max(...holders.map((h) => h.progress())) + 200;
  holders.forEach((h) => h.finish(at));
  for (const k of killed) assert.equal((await k.exited).code, 'SIGKILL', 'a killed rank was still training');
  const ends = await Promise.all(holders.map((h) => h.exited));
  for (const s of ends) {
    assert.equal(s.code, 0, `every rank not killed finishes: ${s.out}\n${s.err}`);
    assert.equal(s.report.steps, at);
    assert.deepEqual(s.report.live, [true, true, true, true]);
  }
  const changes = ends[1].report.membershipChanges;
  assert.equal(changes.filter((m) => m.joining.length > 0).length, 4, `four joins: ${JSON.stringify(changes)}`);
  const simulated = await replay({ ...settings, steps: at }, changes);
  for (const s of ends) {
    assert.deepEqual(s.report.lossPerRank, simulated.replica_loss_per_rank, `rank ${s.report.rank}: the simulated replay's replicas, bit for bit`);
  }
  const growth = resident.at(-1) - resident[0];
  assert.ok(growth < 64 * 2 ** 20, `rank 1's resident memory grew by ${(growth / 2 ** 20).toFixed(1)} MiB over four changes`);
  console.log(
    `churn: 4 Node ranks of Streaming DiLoCo, ranks 2, 0, 3 and 2 killed and replaced over ${changes.at(-1).syncPoint + 1} sync points; every rank finished equal to the replay bit for bit; rank 1's resident memory ${(resident[0] / 2 ** 20).toFixed(1)} → ${(resident.at(-1) / 2 ** 20).toFixed(1)} MiB`,
  );
});
