// One rank of a run over NATS in a browser Worker (tests/browser/nats-rank.html starts it):
// the package on its CPU backend, its port over the server's WebSocket listener, and one of
//   {mode: 'golden', url, run, ranks, files}: the golden cases `files` replayed with this rank
//     (golden-runner.js, `place`), reported as {rank, passed, bitExact, digest, failed}, the
//     digest the SHA-256 of the bytes helpers.js `bitDigests` hashes for this rank;
//   {mode: 'trainer', url, run, ranks, rank, algorithm, period, steps, join?}: the calls
//     `distopt train`'s loop makes with the Trainer over the rank's world (nats-trainer.mjs;
//     with `join`, joining the running run in that rank's place and admitted first; with
//     `leaveBefore`, stopping before that step and reporting {stopped}, for the test to close
//     the page; `failureBound`: the world's, in seconds; `fragments` and `delay`: Streaming
//     DiLoCo's fragments and fragment_sync_delay; a later message {finishAt: N} makes it stop
//     after step N instead of `steps`; it posts {progress: steps} every 50 steps), reported
//     as {rank, steps, meanModelLoss, lossPerRank, live, membershipChanges}.
// Any failure is reported as {error}.

import init, * as api from '/pkg/index.js';
import { openPort } from '/pkg/nats/port.js';
import { runCases } from '/tests/golden-runner.js';

const text = new TextEncoder();

async function golden({ url, run, ranks, files }) {
  const cases = [];
  for (const file of files) {
    const response = await fetch(`/golden/${file}`);
    if (!response.ok) throw new Error(`cannot fetch ${file}: ${response.status}`);
    cases.push(await response.json());
  }
  const port = await openPort({ servers: url, name: 'distopt browser rank' });
  const world = api.World.joinNats(port, { run, ranks });
  const chunks = [];
  const observe = (name, rank, step, params) => {
    chunks.push(text.encode(`${name}/${step}/`));
    for (const p of params) {
      chunks.push(text.encode(`${p.dtype}[${p.shape}]`));
      chunks.push(new Uint8Array(p.data.buffer, p.data.byteOffset, p.data.byteLength).slice());
    }
  };
  const place = (size) => {
    if (size !== ranks) throw new Error(`a run of ${ranks} ranks cannot replay a world of ${size}`);
    return { world, ranks: [...world.localRanks], release: () => {} };
  };
  const results = await runCases(api, cases, { place, observe });
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  const digest = [...new Uint8Array(await crypto.subtle.digest('SHA-256', all))]
    .map((b) => b.toString(16).padStart(2, '0'))
    .join('');
  const report = {
    rank: world.rank,
    passed: results.filter((r) => r.ok).length,
    bitExact: results.filter((r) => r.bitExact).length,
    digest,
    failed: results.filter((r) => !r.ok).map((r) => ({ name: r.name, message: r.message })),
  };
  world.free();
  port.close();
  return report;
}

/** The step after which a trainer stops, when the test says ({finishAt}). */
let finishAt = Infinity;

async function trainer({ url, run, ranks, rank, algorithm, period, steps, join = false, leaveBefore, failureBound, fragments, delay }) {
  const port = await openPort({ servers: url, name: 'distopt browser trainer rank' });
  const world = api.World.joinNats(port, { run, ranks, rank, join, ...(failureBound ? { failureBound } : {}) });
  const streaming = fragments ? { fragments, fragmentSyncDelay: delay ?? 0 } : {};
  const t = new api.Trainer({ ranks, algorithm, period, world, ...streaming });
  if (join) await t.admit();
  await t.evaluate();
  while (t.steps < Math.min(steps, finishAt)) {
    if (t.steps % 50 === 0) {
      self.postMessage({ progress: t.steps });
      // A step's promise settles without a task in between: let a {finishAt} message in.
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
    if (t.steps === leaveBefore) {
      // Stops here without a word and says so; the test then closes the page.
      self.postMessage({ stopped: t.steps });
      await new Promise(() => {});
    }
    await t.step();
  }
  const evaluation = await t.evaluate();
  const report = {
    rank: world.rank,
    steps: t.steps,
    meanModelLoss: evaluation.meanModelLoss,
    lossPerRank: Array.from(evaluation.lossPerRank),
    live: world.live,
    membershipChanges: world.membershipChanges,
  };
  t.free();
  world.free();
  port.close();
  return report;
}

self.onmessage = async ({ data }) => {
  if (data.finishAt !== undefined) {
    finishAt = data.finishAt;
    return;
  }
  try {
    await init({ backend: 'cpu' });
    self.postMessage(await (data.mode === 'golden' ? golden(data) : trainer(data)));
  } catch (error) {
    self.postMessage({ error: `${error?.name}: ${error?.message}\n${error?.stack}` });
  }
};
