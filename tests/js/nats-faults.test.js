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
import path from 'node:path';

import { HERE, buildDistoptCli, membershipSchedule as schedule, runProcess } from './helpers.js';
import { startServer } from './nats-server.js';

const BOUND_S = 5;

let server;

before(async () => {
  server = await startServer(['-js']);
});

after(() => server?.stop());

/**
 * Starts rank `rank` of `run` (3 ranks; with `join`, as a process joining the running run in
 * that rank's place); resolves {code, report, err, exitAt} when it exits.
 */
function startRank(run, rank, algorithm, steps, join = false) {
  const child = spawn(process.execPath, [path.join(HERE, 'nats-trainer.mjs')], {
    env: {
      ...process.env,
      DISTOPT_URL: server.url,
      DISTOPT_RUN: run,
      DISTOPT_RANKS: '3',
      DISTOPT_RANK: String(rank),
      DISTOPT_ALGORITHM: algorithm,
      DISTOPT_PERIOD: '8',
      DISTOPT_STEPS: String(steps),
      ...(join ? { DISTOPT_JOIN: '1' } : {}),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
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
  return { child, exited };
}

/** Waits until all three ranks have joined and trained a while (their stdout is quiet until the end). */
const settle = () => new Promise((resolve) => setTimeout(resolve, 4000));

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
  const replayed = schedule(a.report.membershipChanges, 3);
  const flags = ['train', '--algorithm', 'diloco', '--period', '8', '--steps', String(steps), '--backend', 'cpu', '--json', '--ranks', '3'];
  const replay = await runProcess(buildDistoptCli(), [...flags, '--membership', replayed]);
  assert.equal(replay.code, 0, replay.err);
  const simulated = JSON.parse(replay.out).results[0].replica_loss_per_rank;
  assert.deepEqual(a.report.lossPerRank.slice(0, 2), simulated.slice(0, 2), 'the survivors equal the simulated replay bit for bit');
  const left = a.report.membershipChanges[0];
  console.log(
    `diloco: rank 2 killed, out from sync point ${left.syncPoint}; ranks 0 and 1 finished ${steps} steps on identical replicas, equal to the simulated replay of that membership bit for bit (replica loss ${a.report.lossPerRank[0]})`,
  );
});

for (const algorithm of ['diloco', 'periodic']) {
  test(`${algorithm}: a Node process joins in a killed rank's place, is healed, and all three equal the simulated replay`, async () => {
    const steps = 8000;
    const run = `faults-join-${algorithm}`;
    const ranks = [0, 1, 2].map((r) => startRank(run, r, algorithm, steps));
    await settle();
    ranks[2].child.kill('SIGKILL');
    const killed = await ranks[2].exited;
    assert.equal(killed.code, 'SIGKILL', 'rank 2 was still training when killed (raise the steps)');
    // Once the survivors have dropped it (the failure bound and a sync point), a new process
    // asks for rank 2.
    await new Promise((resolve) => setTimeout(resolve, (BOUND_S + 1) * 1000));
    const joiner = startRank(run, 2, algorithm, steps, true);
    const [a, b, c] = await Promise.all([ranks[0].exited, ranks[1].exited, joiner.exited]);
    for (const [who, s] of [['rank 0', a], ['rank 1', b], ['the joiner', c]]) {
      assert.equal(s.code, 0, `${who} finishes: ${s.out}\n${s.err}`);
      assert.equal(s.report.steps, steps);
      assert.deepEqual(s.report.live, [true, true, true], `${who}: all three live at the end`);
    }
    assert.equal(c.report.rank, 2, 'the joiner took rank 2');
    const changes = a.report.membershipChanges;
    assert.deepEqual(b.report.membershipChanges, changes, 'the survivors report one membership');
    assert.ok(changes.some((m) => !m.live.includes(2)) && changes.some((m) => m.joining.includes(2)), `rank 2 left and came back: ${JSON.stringify(changes)}`);
    // Every process evaluates the same replicas; they equal the simulated replay, bit for bit.
    const replayed = schedule(changes, 3);
    const flags = ['train', '--algorithm', algorithm, '--period', '8', '--steps', String(steps), '--backend', 'cpu', '--json', '--ranks', '3'];
    const replay = await runProcess(buildDistoptCli(), [...flags, '--membership', replayed]);
    assert.equal(replay.code, 0, replay.err);
    const simulated = JSON.parse(replay.out).results[0];
    for (const s of [a, b, c]) {
      assert.deepEqual(s.report.lossPerRank, simulated.replica_loss_per_rank, `rank ${s.report.rank}: the simulated replay's replicas, bit for bit`);
    }
    const left = changes.find((m) => !m.live.includes(2));
    const back = changes.find((m) => m.joining.includes(2));
    console.log(
      `${algorithm}: rank 2 killed, out from sync point ${left.syncPoint}; a new Node process joined, was healed and taken in after sync point ${back.syncPoint}; all three finished ${steps} steps equal to the simulated replay bit for bit (replica losses ${c.report.lossPerRank.join(', ')})`,
    );
  });
}
