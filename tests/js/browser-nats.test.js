// Ranks in Chromium pages over a real nats-server's WebSocket listener (the server on PATH;
// .ci/run installs it). Each page runs its rank in a Worker (nats-rank-worker.js) through the
// package's port (`distopt/nats`, its worker bundled with nats.js for browsers):
//   - golden replays with one rank per page, the pages split over two browsers (several pages
//     of one browser, and two browsers): every case passes on every rank, and each rank's
//     parameters after every step equal that rank's in the simulated world bit for bit;
//   - one run mixing all three: `distopt train --world` (native) as rank 0, a Node process as
//     rank 1 and a page as rank 2 print the simulated run's numbers bit for bit;
//   - ranks driven from pages' main threads (`distopt/worker`, every call awaited): the pages
//     answer while their ranks train, and the run is the simulated one bit for bit;
//   - a page closed mid-run under DiLoCo, and a new page joining in its place: the run goes
//     on, the newcomer is healed, and all three pages end equal to the simulated replay of the
//     membership bit for bit; and a page whose rank stops before each of several sync points
//     in turn, then closes, is dropped exactly there;
//   - Streaming DiLoCo: a page closed while a fragment is in flight (the mean applied on every
//     surviving page or on none), and churn: four pages, one closed and one joining in its
//     place every few seconds, all ending on the simulated replay of their membership.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { NO_WEBGPU_FLAGS, launch } from './chromium.js';
import { NETWORKED_KINDS, runCases } from './golden-runner.js';
import {
  GOLDEN,
  HERE,
  PACKAGE,
  EXTRA_CASES,
  TORCH_CASES,
  TORCHFT_CASES,
  bitDigests,
  buildDistoptCli,
  goldenFiles,
  importPackage,
  runProcess,
  simulatedReplay,
} from './helpers.js';
import { startServer } from './nats-server.js';

const sleep = (s) => new Promise((resolve) => setTimeout(resolve, s * 1000));

/** The kinds a rank replays. */
const KINDS = NETWORKED_KINDS;

let nats;
let http;
let baseUrl;
let browsers = [];
let api;

before(async () => {
  assert.ok(fs.existsSync(path.join(PACKAGE, 'nats/worker.browser.js')), `build the package first: ${PACKAGE}`);
  nats = await startServer(['-js'], { websocket: true });
  ({ server: http, url: baseUrl } = await serve({
    port: 0,
    mounts: [
      ['/pkg/', PACKAGE],
      ['/golden/', GOLDEN],
      ['/torch-cases/', TORCH_CASES],
      ['/torchft-cases/', TORCHFT_CASES],
      ...(EXTRA_CASES ? [['/extra-cases/', EXTRA_CASES]] : []),
      ['/tests/', HERE],
    ].sort((a, b) => b[0].length - a[0].length),
  }));
  // Two browsers, each a context of its own; the ranks run on the CPU backend.
  browsers = [await launch(NO_WEBGPU_FLAGS), await launch(NO_WEBGPU_FLAGS)];
  api = await importPackage();
  await api.default({ backend: 'cpu' });
});

after(async () => {
  for (const b of browsers) await b.close();
  http?.close();
  nats?.stop();
});

/** A page of browser `which` ready to start a rank; its errors are collected. */
async function rankPage(which, errors) {
  const page = await browsers[which].newPage();
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(new URL('/tests/browser/nats-rank.html', baseUrl).href);
  await page.waitForFunction(() => window.ready === true);
  return page;
}

const files = goldenFiles().filter((f) => KINDS.includes(f.kind));
const sizes = [...new Set(files.map((f) => f.case.input.world_size))].sort((a, b) => a - b);

for (const size of sizes) {
  test(`golden replays with one rank per Chromium page (two browsers), W = ${size}`, async () => {
    const mine = files.filter((f) => f.case.input.world_size === size);
    const simulated = bitDigests();
    const reference = await runCases(api, mine.map((f) => f.case), { observe: simulated.observe });
    assert.deepEqual(reference.filter((r) => !r.ok), [], 'the simulated world passes them');
    const errors = [];
    const pages = await Promise.all(Array.from({ length: size }, (_, k) => rankPage(k % 2, errors)));
    const start = Date.now();
    const task = { mode: 'golden', url: nats.wsUrl, run: `pages-${size}`, ranks: size, files: mine.map((f) => f.file) };
    try {
      const reports = await Promise.all(pages.map((page) => page.evaluate((t) => window.startRank(t), task)));
      assert.deepEqual(reports.filter((r) => r.error), [], 'no rank failed');
      assert.deepEqual(
        reports.map((r) => r.rank).sort((a, b) => a - b),
        Array.from({ length: size }, (_, r) => r),
        'each page holds its own rank',
      );
      for (const r of reports) {
        assert.deepEqual(r.failed, [], `rank ${r.rank}: every case passes`);
        assert.equal(r.passed, mine.length);
        assert.match(r.digest, /^[0-9a-f]{64}$/);
        assert.equal(r.digest, simulated.digest(r.rank), `rank ${r.rank}: its parameters after every step are the simulated world's, bit for bit`);
      }
      assert.deepEqual(errors, []);
      console.log(
        `W = ${size}: ${mine.length} cases passed in each of ${size} Chromium pages over two browsers, every rank bit-identical to the simulated world (${((Date.now() - start) / 1000).toFixed(1)} s)`,
      );
    } finally {
      await Promise.all(pages.map((p) => p.close()));
    }
  });
}

test('one run of a native process, a Node process and a Chromium page prints the simulated run', async () => {
  const distopt = buildDistoptCli();
  const [ranks, steps, period, algorithm] = [3, 40, 4, 'diloco'];
  const flags = ['train', '--algorithm', algorithm, '--steps', String(steps), '--period', String(period), '--backend', 'cpu', '--json', '--ranks', String(ranks)];
  const simulated = await runProcess(distopt, flags);
  assert.equal(simulated.code, 0, simulated.err);
  const errors = [];
  const page = await rankPage(0, errors);
  const run = 'all-three';
  const start = Date.now();
  try {
    const [native, node, browser] = await Promise.all([
      runProcess(distopt, [...flags, '--world', nats.url, '--run', run, '--rank', '0']),
      runProcess(process.execPath, [path.join(HERE, 'nats-trainer.mjs')], {
        DISTOPT_URL: nats.url,
        DISTOPT_RUN: run,
        DISTOPT_RANKS: String(ranks),
        DISTOPT_RANK: '1',
        DISTOPT_ALGORITHM: algorithm,
        DISTOPT_PERIOD: String(period),
        DISTOPT_STEPS: String(steps),
      }),
      page.evaluate((t) => window.startRank(t), { mode: 'trainer', url: nats.wsUrl, run, ranks, rank: 2, algorithm, period, steps }),
    ]);
    assert.equal(native.code, 0, `the native rank: ${native.err}`);
    assert.equal(node.code, 0, `the Node rank: ${node.out}\n${node.err}`);
    assert.equal(browser.error, undefined, `the page's rank: ${browser.error}`);
    assert.deepEqual([JSON.parse(node.out.trim().split('\n').pop()).rank, browser.rank, browser.steps], [1, 2, steps]);
    const a = JSON.parse(simulated.out).results[0];
    const b = JSON.parse(native.out).results[0];
    const keys = ['mean_loss_per_step', 'divergence_per_step', 'replica_loss_per_rank', 'all_reduce_bytes_by_group_size'];
    const differ = keys.filter((key) => JSON.stringify(b[key]) !== JSON.stringify(a[key]));
    assert.deepEqual(differ, [], 'the mixed run prints the simulated run');
    assert.deepEqual(errors, []);
    console.log(
      `${algorithm}: a native process, a Node process and a Chromium page as ranks 0, 1, 2 printed the simulated run's numbers bit for bit (${steps} steps, ${((Date.now() - start) / 1000).toFixed(1)} s)`,
    );
  } finally {
    await page.close();
  }
});

test("ranks driven from pages' main threads (distopt/worker): the pages stay responsive, the run is the simulated one", async () => {
  const [ranks, steps, period, algorithm] = [2, 60, 4, 'diloco'];
  const simulated = new api.Trainer({ ranks, algorithm, period });
  while (simulated.steps < steps) await simulated.step();
  const expected = await simulated.evaluate();
  simulated.free();
  const errors = [];
  const pages = [];
  for (const which of [0, 1]) {
    const page = await browsers[which].newPage();
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(new URL('/tests/browser/nats-main.html', baseUrl).href);
    await page.waitForFunction(() => window.ready === true);
    pages.push(page);
  }
  const start = Date.now();
  try {
    const running = pages.map((page, rank) =>
      page.evaluate((t) => window.runRank(t), { url: nats.wsUrl, run: 'main-threads', ranks, rank, algorithm, period, steps }),
    );
    let done = false;
    Promise.allSettled(running).then(() => (done = true));
    // Each page's main thread answers while its rank trains: the steps it has seen so far.
    const seen = [new Set(), new Set()];
    while (!done) {
      await Promise.all(pages.map(async (page, k) => seen[k].add(await page.evaluate(() => window.progress))));
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const reports = await Promise.all(running);
    assert.deepEqual(reports.filter((r) => r.error), [], 'no rank failed');
    assert.deepEqual(reports.map((r) => [r.rank, r.steps]), [[0, steps], [1, steps]]);
    for (const r of reports) {
      assert.equal(r.meanModelLoss, expected.meanModelLoss, `rank ${r.rank}: the simulated run's mean model loss, bit for bit`);
      assert.deepEqual(r.lossPerRank, Array.from(expected.lossPerRank));
    }
    for (const [k, steps_] of seen.entries()) {
      const middle = [...steps_].filter((s) => s > 0 && s < steps);
      assert.ok(middle.length >= 2, `page ${k} answered while its rank trained (steps seen: ${[...steps_].sort((a, b) => a - b)})`);
    }
    assert.deepEqual(errors, []);
    console.log(
      `${algorithm}: 2 ranks driven from 2 pages' main threads (two browsers) trained ${steps} steps in ${((Date.now() - start) / 1000).toFixed(1)} s, the simulated run's numbers bit for bit; the pages answered ${seen[0].size} and ${seen[1].size} distinct progress reads meanwhile`,
    );
  } finally {
    await Promise.all(pages.map((p) => p.close()));
  }
});

/**
 * Three pages train `algorithm` for `steps` steps; rank 2's page closes (before step
 * `leaveBefore` when given, its rank stopped there; else about 4 s in). Once the survivors have
 * dropped it (the failure bound `bound` and a sync point), a new page joins in its place. All
 * three pages finish with every rank live, the survivors report one membership that drops
 * rank 2 and takes the joiner back, and every page holds the simulated replay's replicas bit for
 * bit. Resolves {left, back}: the changes that dropped rank 2 and took it back.
 */
async function closeAndJoin(run, { algorithm, steps, period = 8, leaveBefore, bound = 5 }) {
  const ranks = 3;
  const errors = [];
  const pages = await Promise.all([0, 1, 0].map((which) => rankPage(which, errors)));
  const task = (rank, extra = {}) => ({ mode: 'trainer', url: nats.wsUrl, run, ranks, rank, algorithm, period, steps, failureBound: bound, ...extra });
  let joiner;
  try {
    const running = pages.map((page, rank) =>
      page.evaluate((t) => window.startRank(t), task(rank, rank === 2 ? { leaveBefore } : {})).catch((e) => ({ error: e.message })),
    );
    if (leaveBefore === undefined) {
      await new Promise((resolve) => setTimeout(resolve, 4000));
    } else {
      const stopped = await running[2];
      assert.equal(stopped.stopped, leaveBefore, `rank 2 stopped before step ${leaveBefore}: ${JSON.stringify(stopped)}`);
    }
    await pages[2].close();
    await new Promise((resolve) => setTimeout(resolve, (bound + 1) * 1000));
    joiner = await rankPage(1, errors);
    const [a, b, c] = await Promise.all([running[0], running[1], joiner.evaluate((t) => window.startRank(t), task(2, { join: true }))]);
    for (const [who, r] of [['rank 0', a], ['rank 1', b], ['the joiner', c]]) {
      assert.equal(r.error, undefined, `${who}: ${r.error}`);
      assert.equal(r.steps, steps);
      assert.deepEqual(r.live, [true, true, true], `${who}: all three live at the end`);
    }
    assert.equal(c.rank, 2, 'the joiner took rank 2');
    const changes = a.membershipChanges;
    assert.deepEqual(b.membershipChanges, changes, 'the survivors report one membership');
    const left = changes.find((m) => !m.live.includes(2));
    const back = changes.find((m) => m.joining.includes(2));
    assert.ok(left && back, `rank 2 left and came back: ${JSON.stringify(changes)}`);
    const simulated = await simulatedReplay({ algorithm, steps, ranks, period }, changes);
    for (const r of [a, b, c]) {
      assert.deepEqual(r.lossPerRank, simulated.replica_loss_per_rank, `rank ${r.rank}: the simulated replay's replicas, bit for bit`);
    }
    assert.deepEqual(errors, []);
    return { left, back };
  } finally {
    await Promise.all([...pages.slice(0, 2), joiner].filter(Boolean).map((p) => p.close()));
  }
}

test('DiLoCo: a closed page is replaced by a page that joins; all three equal the simulated replay', async () => {
  // Long enough that the newcomer joins well before the end (about 10 s in, near step 300).
  const start = Date.now();
  const steps = 1200;
  const { left, back } = await closeAndJoin('pages-join', { algorithm: 'diloco', steps });
  console.log(
    `diloco: rank 2's page closed, out from sync point ${left.syncPoint}; a new page joined, was healed and taken in after sync point ${back.syncPoint}; all three pages finished ${steps} steps equal to the simulated replay bit for bit (${((Date.now() - start) / 1000).toFixed(1)} s)`,
  );
});

test('a page whose rank stops before each sync point in turn is dropped there when it closes, and a joining page takes its place', async () => {
  // (algorithm, T, K): rank 2 stops before step T, so that sync point K is the first it misses
  // (DiLoCo syncs at the end of step 8(K + 1) - 1, post-local SGD at step 20 + 8K).
  const lines = [];
  for (const [algorithm, leaveBefore, missed] of [['diloco', 7, 0], ['diloco', 12, 1], ['diloco', 23, 2], ['periodic', 25, 1]]) {
    const { left, back } = await closeAndJoin(`pages-point-${algorithm}-${leaveBefore}`, { algorithm, steps: 960, leaveBefore, bound: 3 });
    assert.equal(left.syncPoint, missed, `${algorithm}: rank 2 stopped before step ${leaveBefore}, so sync point ${missed} is the first without it`);
    assert.deepEqual(left.live, [0, 1]);
    lines.push(`${algorithm} stopped before step ${leaveBefore}: out from sync point ${left.syncPoint}, joining page in after ${back.syncPoint}`);
  }
  console.log(`each sync point in turn (3 Chromium pages, 960 steps, bound 3 s), all equal to their replay bit for bit:\n  ${lines.join('\n  ')}`);
});

/** `rank`'s trainer task of `run` for a page (`mode: 'trainer'`; `settings` as the worker takes them). */
const trainerTask = (run, rank, settings) => ({ mode: 'trainer', url: nats.wsUrl, run, rank, ranks: 3, period: 8, ...settings });

test('Streaming DiLoCo: a page closed while a fragment is in flight leaves the mean applied on every surviving page or on none', async () => {
  // Two fragments, each all-reduce in flight for 2 of the 4 steps between sync points (as
  // nats-faults.test.js does with Node processes).
  const settings = { algorithm: 'diloco', steps: 240, fragments: 2, delay: 2, failureBound: 3 };
  const lines = [];
  for (const leaveBefore of [5, 6, 7]) {
    const run = `pages-flight-${leaveBefore}`;
    const errors = [];
    const pages = await Promise.all([0, 1, 0].map((which) => rankPage(which, errors)));
    try {
      const running = pages.map((page, rank) =>
        page
          .evaluate((t) => window.startRank(t), trainerTask(run, rank, { ...settings, ...(rank === 2 ? { leaveBefore } : {}) }))
          .catch((e) => ({ error: e.message })),
      );
      const stopped = await running[2];
      assert.equal(stopped.stopped, leaveBefore, `rank 2 stopped before step ${leaveBefore}: ${JSON.stringify(stopped)}`);
      await pages[2].close();
      const survivors = await Promise.all(running.slice(0, 2));
      for (const r of survivors) {
        assert.equal(r.error, undefined, `a surviving page: ${r.error}`);
        assert.equal(r.steps, settings.steps);
        assert.deepEqual(r.live, [true, true, false]);
      }
      const [a, b] = survivors;
      assert.deepEqual(b.membershipChanges, a.membershipChanges, 'both survivors report one membership');
      const simulated = await simulatedReplay(settings, a.membershipChanges);
      for (const r of survivors) {
        assert.deepEqual(r.lossPerRank.slice(0, 2), simulated.replica_loss_per_rank.slice(0, 2), `rank ${r.rank}: the simulated replay's replicas, bit for bit`);
      }
      assert.deepEqual(errors, []);
      lines.push(`stopped before step ${leaveBefore}: out from sync point ${a.membershipChanges[0].syncPoint}`);
    } finally {
      await Promise.all(pages.slice(0, 2).map((p) => p.close()));
    }
  }
  console.log(`streaming in flight (3 Chromium pages, F = 2, delay 2), both survivors equal to the replay bit for bit:\n  ${lines.join('\n  ')}`);
});

test('churn: four Streaming DiLoCo pages, one closed and one joining every few seconds, finish on the replay of their membership', async () => {
  // The pages train until told where to stop (`finishAt`), 200 steps after the last join: the
  // schedule's sleeps never outlast the run, on a machine of any speed.
  const settings = { algorithm: 'diloco', ranks: 4, steps: 1_000_000, fragments: 2, delay: 3, failureBound: 3 };
  const run = 'pages-churn';
  const errors = [];
  const start = Date.now();
  /** A page of browser `rank % 2` running `rank` (joining with `join`): {page, running}. */
  const open = async (rank, join = false) => {
    const page = await rankPage(rank % 2, errors);
    const running = page.evaluate((t) => window.startRank(t), trainerTask(run, rank, { ...settings, join })).catch((e) => ({ error: e.message }));
    return { page, running };
  };
  const holders = await Promise.all([0, 1, 2, 3].map((r) => open(r)));
  const closed = [];
  try {
    await sleep(4);
    for (const rank of [2, 0, 3, 2]) {
      closed.push(holders[rank]);
      await holders[rank].page.close();
      await sleep(settings.failureBound + 1);
      holders[rank] = await open(rank, true);
      await sleep(4);
    }
    // Every page training (the last joiner admitted), then all told to stop 200 steps on.
    const steps = () => Promise.all(holders.map((h) => h.page.evaluate(() => window.rankSteps)));
    const deadline = Date.now() + 120_000;
    while ((await steps()).some((n) => n === 0) && Date.now() < deadline) await sleep(0.2);
    const at = Math.max(...(await steps())) + 200;
    await Promise.all(holders.map((h) => h.page.evaluate((n) => window.finishAt(n), at)));
    const ends = await Promise.all(holders.map((h) => h.running));
    for (const r of ends) {
      assert.equal(r.error, undefined, `every page not closed finishes: ${r.error}`);
      assert.equal(r.steps, at, 'every page stops where it was told');
      assert.deepEqual(r.live, [true, true, true, true]);
    }
    const changes = ends[1].membershipChanges;
    assert.equal(changes.filter((m) => m.joining.length > 0).length, 4, `four joins: ${JSON.stringify(changes)}`);
    const simulated = await simulatedReplay({ ...settings, steps: at }, changes);
    for (const r of ends) {
      assert.deepEqual(r.lossPerRank, simulated.replica_loss_per_rank, `rank ${r.rank}: the simulated replay's replicas, bit for bit`);
    }
    assert.deepEqual(errors, []);
    console.log(
      `churn: 4 Chromium pages of Streaming DiLoCo, ranks 2, 0, 3 and 2 closed and replaced over ${changes.at(-1).syncPoint + 1} sync points; every page finished equal to the replay bit for bit (${((Date.now() - start) / 1000).toFixed(1)} s)`,
    );
  } finally {
    await Promise.all(holders.map((h) => h.page.close()));
  }
});
