// Chromium (Debian's, driven by playwright-core) on its WebGPU adapter: every golden case of
// the JS-facing kinds through the npm package, the demo driven like a person would, and the
// resident step's bandwidth. Run by tests/run-js after scripts/build-npm.sh.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { CHROMIUM_FLAGS, NO_WEBGPU_FLAGS, launch } from './chromium.js';
import { GOLDEN, HERE, PACKAGE, ROOT, EXTRA_CASES, TORCH_CASES, TORCHFT_CASES, checkGoldenCounts, goldenFiles, splitPending } from './helpers.js';

const SCREENSHOTS = path.join(ROOT, 'target/screenshots');
const files = goldenFiles();

let server;
let baseUrl;
let context;
const consoleErrors = [];

async function openPage(url, on = context) {
  const page = await on.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') consoleErrors.push(`${url}: ${m.text()}`);
  });
  page.on('pageerror', (e) => consoleErrors.push(`${url}: ${e.message}`));
  await page.goto(new URL(url, baseUrl).href);
  return page;
}

before(async () => {
  assert.ok(fs.existsSync(path.join(PACKAGE, 'index.js')), `build the package first: ${PACKAGE}`);
  ({ server, url: baseUrl } = await serve({
    port: 0,
    mounts: [
      ['/pkg/', PACKAGE],
      ['/golden/', GOLDEN],
      // Fetched as /golden/../torch-cases/<name>.json and /golden/../torchft-cases/<name>.json
      // (see goldenFiles).
      ['/torch-cases/', TORCH_CASES],
      ['/torchft-cases/', TORCHFT_CASES],
      ...(EXTRA_CASES ? [['/extra-cases/', EXTRA_CASES]] : []),
      ['/tests/', HERE],
      ['/', path.join(ROOT, 'www')],
    ].sort((a, b) => b[0].length - a[0].length),
  }));
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  context = await launch(CHROMIUM_FLAGS);
});

after(async () => {
  await context?.close();
  server?.close();
});

describe('Chromium WebGPU', () => {
  let page;
  let info;

  before(async () => {
    page = await openPage('/tests/browser/golden.html');
    await page.waitForFunction(() => window.ready === true);
    // 'gpu', not 'auto': a browser without WebGPU must fail here, not fall back quietly.
    info = await page.evaluate(() => window.initDistopt('gpu'));
    console.log(`Chromium WebGPU adapter: ${info.name} (${JSON.stringify(info.adapterInfo)}), api ${info.api}`);
  });

  test('init() finds the WebGPU adapter', () => {
    assert.equal(info.kind, 'gpu');
    assert.equal(info.api, 'BrowserWebGpu');
    assert.ok(info.name.length > 0, 'the adapter has a name');
    assert.ok(info.adapterInfo && info.adapterInfo.vendor, 'the browser describes its adapter');
  });

  test('every golden file, fetched by the page', async (t) => {
    // The page fetches each file by its file name and runs it; the counts per kind are then
    // checked against the files on disk, so a file that does not reach the page fails here.
    const { run, pending } = splitPending(files);
    const results = await page.evaluate((f) => window.runGolden(f), run.map((f) => f.file));
    const typed = await page.evaluate(
      (f) => window.runGolden(f, { typedInputs: true }),
      run.filter((f) => f.kind === 'dp_sgd_step').map((f) => f.file),
    );
    assert.deepEqual(
      results.map((r) => r.name),
      run.map((f) => f.case.name),
      'the page ran every file it was given, in order',
    );
    for (const r of results) {
      await t.test(`${r.kind}: ${r.name}`, () => assert.ok(r.ok, r.message));
    }
    for (const r of typed) {
      await t.test(`dp_sgd_step (typed-array inputs): ${r.name}`, () => assert.ok(r.ok, r.message));
    }
    for (const f of pending) {
      await t.test(`${f.kind}: ${f.case.name}`, { todo: `PENDING: no JS runner for ${f.kind} yet` }, () => {});
    }
    checkGoldenCounts('Chromium WebGPU', files, results, typed);
  });

  test('errors are JS Errors named after the Python class', async () => {
    const errors = await page.evaluate(async () => {
      const { sgdStep, World, Replicas, SGD } = window.distopt;
      const caught = async (f) => {
        try {
          await f();
          return null;
        } catch (e) {
          return { isError: e instanceof Error, name: e.name, message: e.message };
        }
      };
      return [
        await caught(() => sgdStep([], [], 0.1)),
        await caught(() => new World(0)),
        await caught(() => new World(2.5)),
        await caught(() => Replicas.replicate(2, [[1, 2]]).setGrads(5, [])),
        await caught(() => new SGD(Replicas.replicate(1, [[1]]), { lr: -1 })),
        await caught(() => new SGD(Replicas.replicate(1, [[1]]), { bogus: 1 })),
        await caught(() => sgdStep([[{ dtype: 'float16', shape: [2], data: new Float32Array(3) }]], [[null]], 1)),
      ];
    });
    const expected = [
      ['ValueError', 'no replicas'],
      ['ValueError', 'a world needs at least one rank'],
      ['TypeError', 'size must be an integer'],
      ['IndexError', 'rank 5 out of range for 2 ranks'],
      ['ValueError', 'Invalid learning rate: -1.0'],
      ['TypeError', "unexpected keyword argument 'bogus'"],
      ['ValueError', 'data has 3 values but shape [2] needs 2'],
    ];
    expected.forEach(([name, text], i) => {
      assert.ok(errors[i], `call ${i} should throw`);
      assert.ok(errors[i].isError, `call ${i} throws an Error`);
      assert.equal(errors[i].name, name, errors[i].message);
      assert.ok(errors[i].message.includes(text), `${errors[i].message} lacks ${text}`);
    });
  });

  test('resident step bandwidth, R = 8, N = 2^22 (float32)', async () => {
    const result = await page.evaluate(() => window.benchStep(8, 1 << 22, 7));
    console.log(
      `Chromium WebGPU bench: R=8 N=2^22 float32 on ${result.backend}: median ${result.ms.toFixed(1)} ms, ${result.gbps.toFixed(2)} GB/s (runs ${result.times.map((t) => t.toFixed(0)).join(', ')} ms)`,
    );
    assert.ok(result.gbps > 0);
    // The same step on the CPU fallback (WebAssembly, one thread), for comparison.
    await page.evaluate(() => window.distopt.selectBackend('cpu'));
    const cpu = await page.evaluate(() => window.benchStep(8, 1 << 22, 3));
    console.log(
      `Chromium CPU-fallback bench: R=8 N=2^22 float32: median ${cpu.ms.toFixed(1)} ms, ${cpu.gbps.toFixed(2)} GB/s`,
    );
    await page.evaluate(() => window.distopt.selectBackend('gpu'));
  });
});

describe('demo', () => {
  test('runs on the WebGPU adapter: plots update, the loss falls, post-local SGD and DiLoCo send less', async () => {
    const page = await openPage('/');
    await page.waitForFunction(() => window.demo && window.demo.ready === true, null, { timeout: 60_000 });
    // Auto: SwiftShader is a software adapter, so the CPU backend is chosen, and the page says why.
    const auto = await page.locator('#adapter').innerText();
    console.log(`demo adapter line (auto): ${auto.replace(/\s+/g, ' ')}`);
    assert.equal(await page.locator('#adapter').getAttribute('data-kind'), 'cpu');
    assert.match(auto, /software WebGPU adapter/);
    // The backend menu switches to the WebGPU adapter.
    await page.selectOption('#backend', 'gpu');
    await page.waitForFunction(() => document.getElementById('adapter').dataset.kind === 'gpu');
    const adapter = await page.locator('#adapter').innerText();
    console.log(`demo adapter line (WebGPU): ${adapter.replace(/\s+/g, ' ')}`);
    assert.match(adapter, /WebGPU/);
    // A synchronous run first, then post-local SGD with periodic averaging: the first run
    // stays on the plots for comparison.
    await page.selectOption('#algorithm', 'sync');
    await page.click('#start');
    await page.waitForFunction(() => window.demo.history.length >= 80, null, { timeout: 120_000 });
    const sync = await page.evaluate(() => window.demo.history);
    await page.selectOption('#algorithm', 'periodic');
    await page.waitForFunction(() => window.demo.ghosts.length === 1 && window.demo.history.length >= 80, null, {
      timeout: 120_000,
    });
    const history = await page.evaluate(() => window.demo.history);
    const mean = (h) => h.reduce((s, x) => s + x.meanLoss, 0) / h.length;
    const [first, last] = [mean(history.slice(0, 5)), mean(history.slice(-5))];
    const n = Math.min(sync.length, history.length) - 1;
    console.log(
      `demo: sync SGD ${sync.length} steps, loss ${mean(sync.slice(0, 5)).toFixed(3)} -> ${mean(sync.slice(-5)).toFixed(3)}, ` +
        `${sync[n].bytesCommunicatedPerRank} bytes/rank at step ${n + 1}; post-local SGD ${history.length} steps, loss ` +
        `${first.toFixed(3)} -> ${last.toFixed(3)}, ${history[n].bytesCommunicatedPerRank} bytes/rank at step ${n + 1}, ` +
        `max divergence ${Math.max(...history.map((h) => h.divergence)).toFixed(3)}`,
    );
    assert.ok(last < first * 0.8, `the loss should fall: ${first} -> ${last}`);
    assert.ok(sync.every((h) => h.divergence === 0), 'synchronous SGD keeps the replicas identical');
    assert.ok(history.some((h) => h.divergence > 0), 'post-local SGD lets the replicas drift');
    assert.ok(
      history[n].bytesCommunicatedPerRank < sync[n].bytesCommunicatedPerRank,
      'post-local SGD sends fewer bytes than synchronous SGD',
    );
    // DiLoCo last: synchronous SGD and post-local SGD stay on the plots and in the runs table.
    await page.selectOption('#algorithm', 'diloco');
    await page.waitForFunction(() => window.demo.ghosts.length === 2 && window.demo.history.length >= 100, null, {
      timeout: 120_000,
    });
    await page.click('#start'); // pause
    const diloco = await page.evaluate(() => window.demo.history);
    const period = Number(await page.locator('#period').inputValue());
    const m = Math.min(sync.length, diloco.length) - 1;
    const [dFirst, dLast] = [mean(diloco.slice(0, 5)), mean(diloco.slice(-5))];
    const help = await page.locator('#algorithm-help').innerText();
    const rows = await page.locator('#runs tr').allInnerTexts();
    console.log(
      `demo: DiLoCo (sync every ${period}) ${diloco.length} steps, loss ${dFirst.toFixed(3)} -> ${dLast.toFixed(3)}, ` +
        `${diloco[m].bytesCommunicatedPerRank} bytes/rank at step ${m + 1} against sync SGD's ${sync[m].bytesCommunicatedPerRank}; ` +
        `runs table: ${rows.map((r) => r.replace(/\s+/g, ' ')).join(' | ')}`,
    );
    assert.match(help, /pseudo-gradients/);
    assert.ok(dLast < dFirst * 0.8, `DiLoCo's loss should fall: ${dFirst} -> ${dLast}`);
    assert.ok(
      diloco.every((h) => (h.averaged === null) === (h.step % period !== 0)),
      'DiLoCo syncs exactly every period steps',
    );
    assert.ok(diloco.every((h) => h.averaged === null || h.divergence === 0), 'each sync leaves one model');
    assert.ok(diloco.some((h) => h.divergence > 0), 'the replicas drift between syncs');
    assert.ok(
      diloco[m].bytesCommunicatedPerRank * 2 < sync[m].bytesCommunicatedPerRank,
      `DiLoCo sends far fewer bytes than synchronous SGD: ${diloco[m].bytesCommunicatedPerRank} vs ${sync[m].bytesCommunicatedPerRank}`,
    );
    const drawn = await page.evaluate(() => window.demo.framesDrawn);
    assert.ok(drawn >= 10, `the plots redraw while training (${drawn} frames)`);
    assert.equal(rows.length, 3, 'the runs table lists all three runs');
    assert.match(rows[0], /DiLoCo/);
    assert.match(rows[1], /periodic/);
    assert.match(rows[2], /sync SGD/);
    assert.match(rows[0], /\d+\.\d%/, 'the DiLoCo row shows the mean model\'s accuracy');
    await page.screenshot({ path: path.join(SCREENSHOTS, 'demo.png'), fullPage: true });
    await page.close();
  });

  test('trains on the hand-written digits in a Web Worker: held-out accuracy above 80 %, page responsive', async () => {
    const page = await openPage('/');
    await page.waitForFunction(() => window.demo && window.demo.ready === true, null, { timeout: 60_000 });
    await page.selectOption('#task', 'digits');
    await page.selectOption('#algorithm', 'periodic');
    // The shards are non-IID: each rank's shard is dominated by a few digits.
    await page.waitForFunction(() => document.querySelectorAll('#shards .bar[aria-label*="digit 9"]').length === 8, null, {
      timeout: 30_000,
    });
    const shard = await page.locator('#shards .bar').first().getAttribute('aria-label');
    console.log(`demo digits: ${shard}`);
    const counts = shard.match(/: (\d+)/g).map((s) => Number(s.slice(2)));
    assert.equal(counts.length, 10);
    const sorted = [...counts].sort((a, b) => b - a);
    assert.ok(sorted[0] + sorted[1] + sorted[2] > 0.7 * counts.reduce((a, b) => a + b), `rank 0's shard is skewed: ${counts}`);
    // Inapplicable controls are disabled: DiLoCo's fragments under periodic averaging.
    assert.equal(await page.locator('#fragments').isDisabled(), true);
    assert.equal(await page.locator('#warmup').isDisabled(), false);
    assert.equal(await page.locator('#adapter').getAttribute('aria-live'), 'polite');
    // A timer on the page measures the main thread's longest stall while the worker trains.
    await page.evaluate(() => {
      window.stalls = { last: performance.now(), max: 0 };
      window.stallTimer = setInterval(() => {
        const now = performance.now();
        window.stalls.max = Math.max(window.stalls.max, now - window.stalls.last);
        window.stalls.last = now;
      }, 10);
    });
    await page.click('#start');
    await page.waitForFunction(() => window.demo.history.length >= 20, null, { timeout: 60_000 });
    // Responsive while training: a round trip through the page's event loop, and a click on
    // the (disabled-state-aware) UI, answer at once.
    // (On a fast machine the run's steps may all be done by now: then there is nothing left to
    // go on, and the stall bound below is what shows the page stayed responsive.)
    const before = await page.evaluate(() => ({
      steps: window.demo.history.length,
      running: document.querySelector('#start').textContent === 'Pause',
    }));
    const started = Date.now();
    const echo = await page.evaluate(() => new Promise((resolve) => setTimeout(() => resolve(document.title), 0)));
    const roundTrip = Date.now() - started;
    assert.match(echo, /distopt/);
    await page.waitForFunction(
      (target) => window.demo.evaluations.some((e) => e.step > 0 && e.accuracy >= target),
      0.8,
      { timeout: 180_000, polling: 250 },
    );
    // Reports arrive in batches, so the accuracy above may already have been in hand when
    // `before` was read: wait for the next batch (or for the run to have reached its end).
    if (before.running) {
      await page.waitForFunction(
        (n) => window.demo.history.length > n || document.querySelector('#start').textContent !== 'Pause',
        before.steps,
        { timeout: 60_000, polling: 100 },
      );
    }
    const after = await page.evaluate(() => window.demo.history.length);
    const endedWithoutStep = await page.evaluate(() => document.querySelector('#start').textContent !== 'Pause');
    if ((await page.locator('#start').innerText()) === 'Pause') await page.click('#start'); // pause
    const result = await page.evaluate(() => {
      clearInterval(window.stallTimer);
      return {
        evaluations: window.demo.evaluations,
        stall: window.stalls.max,
        worker: window.demo.worker instanceof Worker,
        messages: window.demo.messages,
        steps: window.demo.history.length,
      };
    });
    const first = result.evaluations[0];
    const best = result.evaluations.reduce((a, e) => (e.accuracy > a.accuracy ? e : a));
    console.log(
      `demo digits: held-out accuracy ${(100 * first.accuracy).toFixed(1)}% at step 0 -> ${(100 * best.accuracy).toFixed(1)}% at step ${best.step} ` +
        `(${best.samples} held-out digits); main thread's longest stall ${result.stall.toFixed(0)} ms, round trip ${roundTrip} ms, ` +
        `${result.messages} worker messages`,
    );
    assert.ok(first.heldOut && best.heldOut && best.samples === 359, 'the accuracy is on the 359 held-out digits');
    assert.ok(first.accuracy < 0.25, `an untrained model is near chance (10 %): ${first.accuracy}`);
    assert.ok(best.accuracy >= 0.8, `held-out accuracy ${best.accuracy}`);
    assert.ok(result.worker && result.messages > 5, 'the training loop runs in the Web Worker');
    assert.ok(after > before.steps || !before.running || endedWithoutStep, `training went on while the page answered (${before.steps} -> ${after} steps)`);
    // The worker steps off the main thread: it never stalls for long (a step loop on the main
    // thread would block it for whole batches of steps and evaluations).
    assert.ok(result.stall < 750, `main thread stalled ${result.stall} ms`);
    assert.match(await page.locator('#stat-accuracy-label').innerText(), /Held-out/);
    assert.match(await page.locator('#stat-accuracy').innerText(), /\d+\.\d%/);
    // uPlot charts: labelled canvases, axis titles, a legend with every rank.
    const charts = await page.evaluate(() =>
      [...document.querySelectorAll('.uplot-host')].map((host) => ({
        id: host.id,
        label: host.querySelector('canvas')?.getAttribute('aria-label') || '',
        // uPlot draws the axis titles on the canvas: read them from the chart.
        axes: window.demo.charts[host.id.replace('-chart', '')].axes.map((a) => a.label),
        legend: [...host.querySelectorAll('.u-legend .u-label')].map((l) => l.textContent),
      })),
    );
    assert.equal(charts.length, 4);
    for (const chart of charts) assert.ok(chart.label.length > 20, `${chart.id} is labelled`);
    const loss = charts.find((c) => c.id === 'loss-chart');
    assert.ok(loss.legend.includes('rank 7') && loss.legend.includes('mean'), `loss legend: ${loss.legend}`);
    assert.ok(loss.axes.includes('step') && loss.axes.includes('loss (smoothed)'), `loss axes: ${loss.axes}`);
    const accuracy = charts.find((c) => c.id === 'accuracy-chart');
    assert.ok(accuracy.axes.includes('held-out accuracy'), `accuracy axes: ${accuracy.axes}`);
    // Hovering a chart shows the values in its legend.
    await page.locator('#loss-chart').scrollIntoViewIfNeeded();
    const box = await page.locator('#loss-chart .u-over').boundingBox();
    await page.mouse.move(box.x + box.width * 0.4, box.y + box.height * 0.5);
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.5, { steps: 5 });
    await page.waitForFunction(
      () => [...document.querySelectorAll('#loss-chart .u-legend .u-value')].some((v) => /^\d+\.\d{3}$/.test(v.textContent)),
      null,
      { timeout: 10_000 },
    );
    const hovered = await page.locator('#loss-chart .u-legend .u-value').allInnerTexts();
    console.log(`demo digits: loss legend on hover ${hovered.join(' ')}`);
    await page.screenshot({ path: path.join(SCREENSHOTS, 'demo-digits.png'), fullPage: true });
    await page.close();
  });

  test('runs without WebGPU on the CPU fallback and says so', async () => {
    // A browser without WebGPU: the same flags less the WebGPU switch, and the feature off.
    const noGpu = await launch(NO_WEBGPU_FLAGS);
    try {
      const page = await openPage('/', noGpu);
      await page.waitForFunction(() => window.demo && window.demo.ready === true, null, { timeout: 60_000 });
      const adapter = await page.locator('#adapter').innerText();
      console.log(`demo adapter line (no WebGPU): ${adapter.replace(/\s+/g, ' ')}`);
      assert.equal(await page.locator('#adapter').getAttribute('data-kind'), 'cpu');
      assert.match(adapter, /CPU fallback/);
      assert.match(adapter, /WebGPU is not available/);
      await page.click('#start');
      await page.waitForFunction(() => window.demo.history.length >= 20, null, { timeout: 60_000 });
      await page.click('#start');
      const history = await page.evaluate(() => window.demo.history);
      assert.ok(history.at(-1).meanLoss < history[0].meanLoss, 'the CPU fallback trains too');
      await page.screenshot({ path: path.join(SCREENSHOTS, 'demo-cpu.png') });
      // ZeRO: the replicas stay identical and each rank holds a shard of the optimizer state.
      await page.selectOption('#algorithm', 'zero');
      await page.click('#start');
      await page.waitForFunction(() => window.demo.history.length >= 10, null, { timeout: 60_000 });
      await page.click('#start');
      const zero = await page.evaluate(() => window.demo.history);
      assert.ok(zero.every((h) => h.divergence === 0), 'ZeRO keeps the replicas identical');
      const shards = zero.at(-1).optimizerStateBytesPerRank;
      // Whole parameters are assigned to ranks (a rank may own none): the state is split, not copied.
      const total = shards.reduce((a, b) => a + b, 0);
      assert.ok(shards.length > 1 && total > 0 && Math.max(...shards) < total, `optimizer state per rank ${shards}`);
      const shown = await page.locator('#stat-state').innerText();
      console.log(`demo ZeRO: optimizer state per rank ${shown}`);
      assert.notEqual(shown, '–');
    } finally {
      await noGpu.close();
    }
  });
});

test('no console errors', () => {
  assert.deepEqual(consoleErrors.filter((e) => !e.includes('favicon')), []);
});
