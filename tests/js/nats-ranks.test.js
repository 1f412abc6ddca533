// Ranks in separate Node processes over a real nats-server (on PATH; .ci/run installs it):
// for every world size of the golden cases of the multi-rank kinds (the averagers, post-local
// SGD, DiLoCo, Streaming DiLoCo, ZeRO's trajectories, errors and Join), R processes (tests/js/nats-rank.mjs) join one run through
// the package's port (`distopt/nats`, `World.joinNats`) and each replays every case with its
// own rank, checking that rank's results against PyTorch's; and each rank's parameters after
// every step equal, bit for bit, that rank's in the simulated world replaying the same cases in
// this process (the run reduces in rank order, as the simulated world does).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import { NETWORKED_KINDS, runCases } from './golden-runner.js';
import { HERE, bitDigests, goldenFiles, importPackage, runProcess } from './helpers.js';
import { startServer } from './nats-server.js';

/** The kinds a rank replays. */
const KINDS = NETWORKED_KINDS;
/** How long one run of R processes may take. */
const DEADLINE_MS = 240_000;

let server;
let api;

before(async () => {
  server = await startServer(['-js']);
  api = await importPackage();
  await api.default({ backend: 'cpu' });
});

after(() => server?.stop());

/** Runs `ranks` processes of nats-rank.mjs in run `run`: their exit codes and output. */
function runRanks(run, ranks) {
  const env = { DISTOPT_URL: server.url, DISTOPT_RUN: run, DISTOPT_RANKS: String(ranks) };
  return Promise.all(
    Array.from({ length: ranks }, () => runProcess(process.execPath, [path.join(HERE, 'nats-rank.mjs')], env, DEADLINE_MS)),
  );
}

const sizes = [...new Set(goldenFiles().filter((f) => KINDS.includes(f.kind)).map((f) => f.case.input.world_size))].sort(
  (a, b) => a - b,
);

test('the golden cases have multi-rank worlds to replay', () => {
  assert.ok(sizes.includes(2) && sizes.includes(4), `world sizes ${sizes}`);
});

for (const size of sizes) {
  test(`golden replays with one rank per Node process, W = ${size}`, async () => {
    const cases = goldenFiles()
      .filter((f) => KINDS.includes(f.kind) && f.case.input.world_size === size)
      .map((f) => f.case);
    const expected = cases.length;
    // The same cases in a simulated world of `size` ranks, here.
    const simulated = bitDigests();
    const reference = await runCases(api, cases, { observe: simulated.observe });
    assert.deepEqual(reference.filter((r) => !r.ok), [], 'the simulated world passes them');
    const start = Date.now();
    const exits = await runRanks(`node-golden-${size}`, size);
    const reports = exits.map((e) => {
      const line = e.out.trim().split('\n').pop();
      try {
        return JSON.parse(line);
      } catch {
        return { parseError: `exit ${e.code}: ${e.out}\n${e.err}` };
      }
    });
    const failures = reports.filter((r) => r.parseError || r.failed.length > 0 || r.passed !== expected);
    assert.deepEqual(failures, [], `W = ${size}: every process passes all ${expected} cases`);
    assert.deepEqual(
      reports.map((r) => r.rank).sort((a, b) => a - b),
      Array.from({ length: size }, (_, r) => r),
      'each process holds its own rank',
    );
    assert.ok(exits.every((e) => e.code === 0));
    for (const report of reports) {
      assert.match(String(report.digest), /^[0-9a-f]{64}$/, `rank ${report.rank} observed its parameters`);
      assert.equal(report.digest, simulated.digest(report.rank), `rank ${report.rank}: its parameters after every step are the simulated world's, bit for bit`);
    }
    const exact = Math.min(...reports.map((r) => r.bitExact));
    // What one run cannot replay: a ZeRO reload into another world size, said by name.
    const skipped = reports[0].skipped;
    assert.ok(skipped.every((part) => /: reload into a world of \d+: a run of \d+ cannot run it$/.test(part)), skipped.join('\n'));
    console.log(
      `W = ${size}: ${expected} cases passed on each of ${size} Node processes, every rank's parameters bit-identical to the simulated world's (${exact} cases bit-exact against PyTorch on every rank), ${((Date.now() - start) / 1000).toFixed(1)} s; skipped in part: ${skipped.length ? skipped.join('; ') : 'none'}`,
    );
  });
}
