// The demo across tabs, in Chromium, with a real nats-server started as scripts/demo.sh starts
// it (scripts/demo.mjs: JetStream, a WebSocket listener, a user per run): the first tab's
// "Invite other tabs" asks the demo's server for a run (its name and secret, which the link
// carries: the server admits no one without a run's secret) and joins it as one rank of a
// DiLoCo run of 2; a second tab (in another browser) opens the invitation link and
// becomes the other rank; both train, and each plots both ranks. Then the second tab closes:
// the first goes on and says "rank 1 left at step N"; a third tab opens the link late, takes
// the free rank, is healed and trains, and the first says it joined (screenshots of the first
// and third tabs in target/screenshots/demo-nats-tab{0,1}.png). Each closing tab says it
// leaves (www/leave.js), so the first notices well within the failure bound. A tab that sleeps
// past the failure bound (its workers blocked, as a phone suspends a tab) finds on waking that
// the run went on without it, and joins it again, healed.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { demoRoutes, startNats } from '../../scripts/demo.mjs';
import { serve } from '../../scripts/serve.mjs';
import { NO_WEBGPU_FLAGS, launch } from './chromium.js';
import { PACKAGE, ROOT, importPackage, importPort } from './helpers.js';

let nats;
let http;
let baseUrl;
const browsers = [];

before(async () => {
  assert.ok(fs.existsSync(path.join(PACKAGE, 'nats/worker.browser.js')), `build the package first: ${PACKAGE}`);
  const distopt = await importPackage();
  await distopt.default({ backend: 'cpu' });
  nats = await startNats(distopt.natsServerConfig);
  ({ server: http, url: baseUrl } = await serve({
    port: 0,
    mounts: [
      ['/pkg/', PACKAGE],
      ['/', path.join(ROOT, 'www')],
    ].sort((a, b) => b[0].length - a[0].length),
    routes: demoRoutes(nats),
  }));
  browsers.push(await launch(NO_WEBGPU_FLAGS), await launch(NO_WEBGPU_FLAGS));
});

after(async () => {
  for (const b of browsers) await b.close();
  http?.close();
  nats?.stop();
});

test("the demo's server admits a run's ranks by its secret only", async () => {
  const { openPort } = await importPort();
  const runs = await Promise.all([0, 1].map(() => fetch(new URL('/runs', baseUrl), { method: 'POST' }).then((r) => r.json())));
  for (const { run, secret } of runs) {
    assert.match(run, /^demo-[0-9a-f]{16}$/);
    assert.match(secret, /^[0-9a-f]{32}$/);
  }
  assert.notEqual(runs[0].secret, runs[1].secret);
  assert.equal((await fetch(new URL('/runs', baseUrl))).status, 405, 'a run is made by POST only');
  // No secret, a wrong one, another run's: refused by the server.
  const refused = async (options) => {
    const error = await openPort({ servers: nats.url, ...options }).then(
      (port) => (port.close(), null),
      (e) => e,
    );
    assert.ok(error instanceof Error, `refused: ${JSON.stringify(options)}`);
    assert.match(error.message, /cannot connect to .*(Authorization|AUTHORIZATION|auth)/i);
  };
  await refused({});
  await refused({ run: runs[0].run, secret: 'not-the-secret' });
  await refused({ run: runs[0].run, secret: runs[1].secret });
  // The run's own secret: its rank's subjects, not the other run's.
  const port = await openPort({ servers: nats.url, ...runs[0] });
  try {
    port.publish(`distopt.${runs[0].run}.probe`, new Uint8Array([1]));
    port.flush();
    port.subscribe(1, `distopt.${runs[1].run}.>`);
    port.flush();
    const deliveries = port.pump(2_000);
    assert.ok(deliveries.some(([sid, data]) => sid === 0 && /Permissions Violation/i.test(new TextDecoder().decode(data))), 'another run\'s subjects are refused');
  } finally {
    port.close();
  }
});

/** A page of browser `which` at `url`, its uncaught errors pushed to `errors`. */
async function openPage(which, url, errors) {
  const page = await browsers[which].newPage();
  page.on('pageerror', (e) => errors.push(`${which}: ${e.message}`));
  await page.goto(url);
  return page;
}

/** `first` (a demo page) invites other tabs into a DiLoCo run of 2: the invitation's link. */
async function invite(first) {
  await first.waitForFunction(() => window.demo?.ready === true, null, { timeout: 60_000 });
  // The invitation appears where the page's server runs a NATS server.
  await first.waitForSelector('#invite', { state: 'visible' });
  await first.selectOption('#algorithm', 'diloco');
  await first.evaluate(() => {
    const ranks = document.getElementById('ranks');
    ranks.value = '2';
    ranks.dispatchEvent(new Event('input'));
    ranks.dispatchEvent(new Event('change'));
  });
  await Promise.all([first.waitForURL(/[?&]run=demo-[0-9a-f]{16}/), first.click('#invite')]);
  await first.waitForSelector('#invite-link', { state: 'visible' });
  return first.$eval('#invite-link', (a) => a.href);
}

/** Whether the run's log of `page` has a line starting `start`. */
function logged(page, start) {
  return page.waitForFunction((s) => (window.demo.membership ?? []).some((l) => l.startsWith(s)), start, { timeout: 60_000 });
}

test('a tab invites another, which leaves; a late tab takes its place, healed; the run goes on', async () => {
  const errors = [];
  const open = (which, url) => openPage(which, url, errors);
  const first = await open(0, new URL('/?backend=cpu', baseUrl).href);
  const link = await invite(first);
  // The run the demo's server made, and its secret.
  assert.match(link, /[?&]run=demo-[0-9a-f]{16}&k=[0-9a-f]{32}&s=/);
  assert.match(await first.textContent('#network-status'), /Waiting for all 2 ranks/);
  // The link as a QR code too (the vendored qrcode-generator's SVG).
  assert.match(await first.$eval('#invite-qr', (q) => q.innerHTML), /^<svg[^>]*>.*<path /s);

  const second = await open(1, link);
  for (const page of [first, second]) {
    await page.waitForFunction(() => window.demo?.rank !== undefined && window.demo.history.length >= 40, null, {
      timeout: 180_000,
    });
  }
  const seen = await Promise.all(
    [first, second].map((page) =>
      page.evaluate(() => ({
        rank: window.demo.rank,
        ranks: window.demo.history.at(-1) && document.getElementById('ranks').value,
        lossRanks: window.demo.history.at(-1)?.lossPerRank?.length,
        status: document.getElementById('network-status').textContent,
        subtitle: document.getElementById('subtitle').textContent,
      })),
    ),
  );
  assert.deepEqual(seen.map((s) => s.rank).sort(), [0, 1], 'each tab holds its own rank');
  for (const s of seen) {
    assert.equal(s.lossRanks, 2, 'each tab plots both ranks');
    assert.match(s.status, new RegExp(`rank ${s.rank} of 2 in run demo-`));
    assert.match(s.subtitle, /across tabs/);
  }
  // The second tab closes: under DiLoCo the first goes on without it, and says so. The closing
  // tab says it leaves (pagehide), so the first counts it gone half a second later, well before
  // the 5 s failure bound it would take for a tab that went silent (at least 4.5 s after its
  // last heartbeat, sent every 0.5 s).
  const gone = await second.evaluate(() => window.demo.rank);
  const closing = Date.now();
  await second.close({ runBeforeUnload: true });
  await first.waitForFunction((r) => (window.demo.membership ?? []).some((l) => l.startsWith(`rank ${r} left at step `)), gone, {
    timeout: 60_000,
  });
  const noticed = (Date.now() - closing) / 1000;
  assert.ok(noticed < 4, `the closing tab must say it leaves: the first tab noticed after ${noticed.toFixed(2)} s (a silent tab takes the 5 s bound)`);
  const stepAtLeave = await first.evaluate(() => window.demo.history.length);
  await first.waitForFunction((n) => window.demo.history.length >= n + 20, stepAtLeave, { timeout: 60_000 });
  // A tab opening the link late takes the free rank, healed at the next sync point.
  const third = await open(1, link);
  await third.waitForFunction((r) => window.demo?.rank === r && window.demo.history.length >= 10, gone, { timeout: 120_000 });
  await first.waitForFunction((r) => (window.demo.membership ?? []).some((l) => l.startsWith(`rank ${r} joined at step `)), gone, {
    timeout: 60_000,
  });
  const log = await first.evaluate(() => window.demo.membership);
  const thirdStatus = await third.textContent('#network-status');
  assert.match(thirdStatus, new RegExp(`rank ${gone} of 2`));
  assert.deepEqual(errors, []);
  const shots = path.join(ROOT, 'target/screenshots');
  fs.mkdirSync(shots, { recursive: true });
  for (const [i, page] of [first, third].entries()) {
    await page.screenshot({ path: path.join(shots, `demo-nats-tab${i}.png`) });
  }
  // The late tab leaves too, saying so with the key it was taken in with.
  const leftBefore = log.filter((l) => l.startsWith(`rank ${gone} left at step `)).length;
  const closingLate = Date.now();
  await third.close({ runBeforeUnload: true });
  await first.waitForFunction(
    ([r, n]) => (window.demo.membership ?? []).filter((l) => l.startsWith(`rank ${r} left at step `)).length > n,
    [gone, leftBefore],
    { timeout: 60_000 },
  );
  const noticedLate = (Date.now() - closingLate) / 1000;
  assert.ok(noticedLate < 4, `the late tab must say it leaves: the first tab noticed after ${noticedLate.toFixed(2)} s`);
  console.log(`two tabs in two browsers trained one DiLoCo run as ranks ${seen.map((s) => s.rank).join(' and ')}; the first tab noticed the second leave ${noticed.toFixed(2)} s after it closed, and the late third ${noticedLate.toFixed(2)} s after it closed; its log: ${JSON.stringify(await first.evaluate(() => window.demo.membership))}`);
  await first.close({ runBeforeUnload: true });
});

test('a tab asleep past the failure bound finds the run went on without it, and joins it again, healed', async () => {
  const errors = [];
  // A run long enough that the first tab, alone, is still training when the other wakes.
  const first = await openPage(0, new URL('/?backend=cpu&steps=200000', baseUrl).href, errors);
  const link = await invite(first);
  assert.match(link, /[?&]s=/);
  const second = await openPage(1, link, errors);
  for (const page of [first, second]) {
    await page.waitForFunction(() => window.demo?.rank !== undefined && window.demo.history.length >= 40, null, {
      timeout: 180_000,
    });
  }
  const rank = await second.evaluate(() => window.demo.rank);
  // The tab sleeps: both its workers (the training loop, and the port's worker that sends its
  // heartbeats) blocked for 8 s, as a phone suspends a tab. (Freezing the page through CDP does
  // not pause its workers in headless Chromium.)
  const workers = second.workers();
  assert.equal(workers.length, 2, `the tab's workers: ${workers.map((w) => w.url())}`);
  const asleep = Date.now();
  const sleeping = Promise.all(workers.map((w) => w.evaluate((ms) => {
    const end = Date.now() + ms;
    while (Date.now() < end);
  }, 8_000)));
  // The first tab counts it gone after the failure bound and goes on alone, many sync points.
  await logged(first, `rank ${rank} left at step `);
  const noticed = (Date.now() - asleep) / 1000;
  await sleeping;
  // Awake, the tab finds the run went on without it (before: it waited for ranks long past
  // it, for good), says so, and joins again as a late rank, healed at the next sync point.
  await second.waitForFunction(() => (window.demo.rejoins ?? 0) >= 1, null, { timeout: 30_000 });
  const woke = Date.now();
  await logged(first, `rank ${rank} joined at step `);
  const rejoined = (Date.now() - woke) / 1000;
  const runStep = await first.evaluate(() => window.demo.history.at(-1).step);
  await second.waitForFunction((n) => window.demo.history.at(-1)?.step > n, runStep, { timeout: 60_000 });
  const [status, log, rankAfter] = await second.evaluate(() => [
    document.getElementById('network-status').textContent,
    window.demo.membership,
    window.demo.rank,
  ]);
  assert.equal(rankAfter, rank, 'it takes its own rank again, the one free');
  assert.match(status, new RegExp(`rank ${rank} of 2 in run demo-`));
  assert.match(log[0], /^this tab was asleep and the run went on without it: joining again \(run 'demo-[0-9a-f]+' rank \d: sync point \d+ went on without this rank/);
  assert.deepEqual(errors, []);
  console.log(`a tab asleep for 8 s: the first counted it gone ${noticed.toFixed(2)} s after it fell asleep; awake, it joined again and was taken in ${rejoined.toFixed(2)} s later, healed to the run's step ${runStep} and training on; its log: ${JSON.stringify(log)}`);
  for (const page of [second, first]) await page.close({ runBeforeUnload: true });
});
