// The browser bench page (www/bench.html) in Chromium: distopt against TensorFlow.js on the same
// tensors. This checks that the page runs every comparison, checks both answers before timing
// and reports what it measured; it never asserts a speed (the figures are printed, and
// scripts/bench-browser.sh runs the page at full size for docs/performance.md).
//
// Small by default (R = 4, N = 2^14, 2 timed steps) so that tests/run-js stays fast;
// DISTOPT_BENCH_R, DISTOPT_BENCH_LOG2N, DISTOPT_BENCH_REPEATS and DISTOPT_BENCH_VARIANTS
// (the step's TF.js formulations, 'mean,addN,add') override it.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { CHROMIUM_FLAGS, launch } from './chromium.js';
import { HERE, PACKAGE, ROOT } from './helpers.js';

const RANKS = Number(process.env.DISTOPT_BENCH_R ?? 4);
const LOG2N = Number(process.env.DISTOPT_BENCH_LOG2N ?? 14);
const REPEATS = Number(process.env.DISTOPT_BENCH_REPEATS ?? 2);
const VARIANTS = (process.env.DISTOPT_BENCH_VARIANTS ?? 'mean,addN,add').split(',');
const TFJS = path.join(HERE, 'node_modules/@tensorflow');

let server;
let baseUrl;
let context;

before(async () => {
  assert.ok(fs.existsSync(path.join(PACKAGE, 'index.js')), `build the package first: ${PACKAGE}`);
  assert.ok(fs.existsSync(path.join(TFJS, 'tfjs/dist/tf.min.js')), `install the test dependencies first: ${TFJS}`);
  ({ server, url: baseUrl } = await serve({
    port: 0,
    mounts: [
      ['/pkg/', PACKAGE],
      ['/vendor/tfjs/', TFJS],
      ['/', path.join(ROOT, 'www')],
    ].sort((a, b) => b[0].length - a[0].length),
  }));
  context = await launch(CHROMIUM_FLAGS);
});

after(async () => {
  await context?.close();
  server?.close();
});

/** Opens the bench page (not started) and runs it; returns {report, errors}. */
async function runPage(url) {
  const page = await context.newPage();
  const errors = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(new URL(url, baseUrl).href);
  await page.waitForFunction(() => window.benchReady === true, null, { timeout: 60_000 });
  const report = await page.evaluate(
    (o) => window.runBench(o),
    { ranks: RANKS, log2n: LOG2N, repeats: REPEATS, variants: VARIANTS },
  );
  const table = await page.locator('#results tbody tr').allInnerTexts();
  await page.close();
  return { report, errors, table };
}

function print(report) {
  const e = report.env;
  console.log(
    `browser bench: R=${e.ranks} N=${e.elements} float32, TF.js ${e.tfjsVersion}, cross-origin isolated ${e.crossOriginIsolated}, ` +
      `TF.js wasm threads ${e.tfjsWasmThreads}, distopt CPU threads ${e.distoptCpuThreads}, ${e.hardwareConcurrency} cores, WebGPU ${e.webgpu} (${e.distoptAdapter ?? '-'})`,
  );
  for (const r of report.rows) {
    const verdict = r.error
      ? `ERROR ${r.error}`
      : r.peerError
        ? `peer failed: ${r.peerError}`
        : r.peerOk === false
          ? `peer WRONG, max error ${r.peerMaxError.toPrecision(3)} (tolerance ${r.tolerance})`
          : `distopt/TF.js speed ${r.speedup?.toFixed(2)}×`;
    console.log(
      `  ${r.work}${r.variant ? ` [${r.variant}]` : ''}: distopt ${r.distoptBackend} ${r.distoptMs?.toFixed(1)} ms ` +
        `(${r.distoptGbps?.toFixed(2)} GB/s, max error ${r.distoptMaxError?.toPrecision(3)}) vs TF.js ${r.peer} ` +
        `${r.peerMs?.toFixed(1) ?? '-'} ms (${r.peerGbps?.toFixed(2) ?? '-'} GB/s): ${verdict}`,
    );
  }
  console.log(`BENCH_JSON ${JSON.stringify(report)}`);
}

test('the bench page compares distopt with TF.js on both backends, checking answers first', async () => {
  const { report, errors, table } = await runPage('/bench.html?run=0');
  print(report);
  assert.deepEqual(errors, [], 'no console errors');
  assert.equal(report.env.crossOriginIsolated, true, 'the server sends COOP/COEP: the page is cross-origin isolated');
  assert.equal(report.env.webgpu, true, 'this Chromium offers WebGPU (SwiftShader)');
  // The isolated page loads distopt/threads where the package has it: one thread per core.
  const threaded = fs.existsSync(path.join(PACKAGE, 'threads/index.js'));
  assert.equal(report.env.distoptCpuThreads, threaded ? Math.min(report.env.hardwareConcurrency, 16) : 1);
  const pairs = report.rows.map((r) => `${r.work}${r.variant ? `/${r.variant}` : ''} ${r.distoptBackend}-${r.peer}`);
  const expected = (d, p) => [...VARIANTS.map((v) => `step/${v} ${d}-${p}`), `adam ${d}-${p}`];
  assert.deepEqual(pairs, [...expected('gpu', 'webgpu'), ...expected('cpu', 'wasm')]);
  assert.equal(table.length, report.rows.length, 'every comparison is shown in the page');
  for (const r of report.rows) {
    const name = `${r.work} ${r.distoptBackend}`;
    assert.equal(r.error, undefined, `${name}: ${r.error}`);
    // distopt's own answer is checked against the float64 reference too.
    assert.ok(r.distoptOk, `${name}: distopt's answer is off by ${r.distoptMaxError}`);
    assert.equal(r.distoptTimes.length, REPEATS);
    assert.ok(r.distoptMs > 0 && r.distoptGbps > 0);
    // The peer: either a checked answer with times, or a wrong answer and no ratio.
    assert.equal(r.peerError, undefined, `${name}: TF.js ${r.peer} failed: ${r.peerError}`);
    assert.ok(Number.isFinite(r.peerMaxError) || r.peerMaxError === Infinity, `${name}: the peer's answer was checked`);
    assert.equal(r.peerTimes.length, REPEATS);
    if (r.peerOk) assert.ok(r.speedup > 0, `${name}: a right peer gets a ratio`);
    else assert.equal(r.speedup, null, `${name}: a wrong peer gets no ratio`);
  }
  // The CPU pair has a right peer here (TF.js wasm computes in float32 like distopt).
  assert.ok(report.rows.filter((r) => r.peer === 'wasm').every((r) => r.peerOk), 'TF.js wasm answers right');
});
