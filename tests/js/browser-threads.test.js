// The threaded build (`distopt/threads`) in Chromium: its CPU fallback runs on every core
// through Web Workers on shared memory, and answers exactly as the one-thread build does.
// Each kernel is deterministic per element, so splitting it across threads must not change a
// single bit: the test runs the same workload (sgdStep, SGD with Nesterov momentum, Adam,
// AdamW with amsgrad, periodic averaging) in both builds, at sizes that split, and compares
// digests of every answer. Skipped, saying why, when the package was built without nightly.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { CHROMIUM_FLAGS, launch } from './chromium.js';
import { HERE, PACKAGE, ROOT } from './helpers.js';

const THREADED = fs.existsSync(path.join(PACKAGE, 'threads/index.js'));
const skip = THREADED ? false : 'the package was built without distopt/threads (no nightly toolchain with rust-src)';

const servers = [];
let context;

async function start(isolation) {
  const { server, url } = await serve({
    port: 0,
    isolation,
    mounts: [
      ['/pkg/', PACKAGE],
      ['/tests/', HERE],
      ['/', path.join(ROOT, 'www')],
    ].sort((a, b) => b[0].length - a[0].length),
  });
  servers.push(server);
  return url;
}

before(async () => {
  context = await launch(CHROMIUM_FLAGS);
});

after(async () => {
  await context?.close();
  for (const server of servers) server.close();
});

async function open(base, build) {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  await page.goto(new URL(`/tests/browser/threads.html?build=${build}`, base).href);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 60_000 });
  return { page, errors };
}

test('the threaded CPU fallback uses every core and answers bit for bit as the one-thread build', { skip }, async () => {
  const base = await start(true);
  const ranks = 4;
  const n = 1 << 17;
  const results = {};
  for (const build of ['threads', 'plain']) {
    const { page, errors } = await open(base, build);
    const info = await page.evaluate(() => window.init({ backend: 'cpu' }));
    const cores = await page.evaluate(() => navigator.hardwareConcurrency);
    results[build] = await page.evaluate(([r, m]) => window.workload(r, m), [ranks, n]);
    results[build].info = info;
    results[build].cores = cores;
    await page.close();
    assert.deepEqual(errors, [], `${build}: no page errors`);
  }
  console.log(`threaded build: ${JSON.stringify(results.threads)}\nplain build: ${JSON.stringify(results.plain)}`);
  assert.equal(results.plain.threads, 1, 'the plain build runs on one thread');
  assert.equal(results.threads.threads, Math.min(results.threads.cores, 16), 'one thread per logical core');
  assert.equal(results.threads.info.threads, results.threads.threads, 'init() reports the threads');
  assert.ok(results.threads.cores > 1, 'this machine has more than one core, so the split is exercised');
  assert.deepEqual(results.threads.digests, results.plain.digests, 'same answers, bit for bit');
  assert.equal(Object.keys(results.plain.digests).length, 5);
});

test('threads: a whole number from 1 to 64 or "auto"; a page that is not isolated is told why', { skip }, async () => {
  const isolated = await start(true);
  {
    const { page } = await open(isolated, 'threads');
    const bad = await page.evaluate(() => window.init({ backend: 'cpu', threads: 0 }).then(() => null, (e) => `${e.name}: ${e.message}`));
    assert.match(bad, /^ValueError: init: threads must be 'auto' or a whole number from 1 to 64, got a number \(0\)/);
    const one = await page.evaluate(() => window.init({ backend: 'cpu', threads: 1 }));
    assert.equal(one.threads, 1);
    const two = await page.evaluate(() => window.init({ backend: 'cpu', threads: 2 }));
    assert.equal(two.threads, 2, 'a later init() adds workers');
    await page.close();
  }
  const open_ = await start(false);
  const { page } = await open(open_, 'threads');
  const message = await page.evaluate(() => window.init({ backend: 'cpu' }).then(() => null, (e) => `${e.name}: ${e.message}`));
  assert.match(message, /^RuntimeError: init: distopt\/threads needs shared memory, which this page lacks/);
  await page.close();
});

test('a panic on a worker thread is a RuntimeError of the call, and the module goes on', { skip }, async () => {
  // A bug in a kernel panics on a Web Worker serving the pool: the threaded build aborts on
  // panic, so the worker's instance traps, but the panic hook first hands its part back to the
  // pool (distopt::backend::cpu::pool::note_panic). The call that was waiting for it must fail
  // with a RuntimeError (not spin for ever), and the module must answer the next calls right.
  const base = await start(true);
  const { page, errors } = await open(base, 'threads');
  const threads = 4;
  const info = await page.evaluate((t) => window.init({ backend: 'cpu', threads: t }), threads);
  assert.equal(info.threads, threads);
  const before = await page.evaluate(() => window.workload(4, 1 << 17));
  const outcome = await page.evaluate(async () => {
    // The glue under /pkg/threads/index.js (the same module instance): its test hook runs a
    // batch whose part panics on a worker.
    const glue = await import('/pkg/wasm-threads/distopt_wasm.js');
    const t0 = performance.now();
    try {
      glue.__distoptPanicOnWorkerForTest();
      return { error: null, ms: performance.now() - t0 };
    } catch (e) {
      return { error: `${e.name}: ${e.message}`, ms: performance.now() - t0 };
    }
  });
  console.log(`worker panic: ${JSON.stringify(outcome)}`);
  assert.match(outcome.error ?? '', /^RuntimeError: a worker thread of distopt's CPU backend panicked \(a bug, please report it\): panicked at [^\n]*: distopt test: a deliberate panic on a CPU worker thread; the call's results are incomplete/);
  assert.ok(outcome.ms < 10_000, `reported after ${outcome.ms} ms`);
  // The worker that panicked left the pool; the module still answers, bit for bit as before,
  // on the threads left (the backend's parts are shared out among them).
  const serving = () => page.evaluate(async () => (await import('/pkg/wasm-threads/distopt_wasm.js')).threadWorkers());
  assert.equal(await serving(), threads - 2, 'the worker that panicked left the pool');
  const after = await page.evaluate(() => window.workload(4, 1 << 17));
  assert.deepEqual(after.digests, before.digests, 'the same answers after the panic');
  // The worker said it ended; a later init() starts another in its place.
  let again;
  for (let i = 0; i < 50; i++) {
    again = await page.evaluate((t) => window.init({ backend: 'cpu', threads: t }), threads);
    if (again.threads === threads) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.equal(again.threads, threads, 'init() replaced the lost worker');
  assert.equal(await serving(), threads - 1);
  const replaced = await page.evaluate(() => window.workload(4, 1 << 17));
  assert.deepEqual(replaced.digests, before.digests);
  await page.close();
  // The only errors are the panic's own report (from the worker, if the page sees its console).
  assert.deepEqual(errors.filter((e) => !/distopt panicked \(a bug, please report it\)/.test(e)), []);
});
