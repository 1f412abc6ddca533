// One run mixing native and Node processes over a real nats-server: `distopt train --world`
// (the command line, native) as rank 0 and Node processes (tests/js/nats-trainer.mjs, the
// package's Trainer over `World.joinNats`) as the other ranks. The native rank prints the
// simulated `distopt train --ranks R` run's numbers bit for bit: the Node ranks trained their
// shards and reduced in rank order exactly as the simulated world does.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import { HERE, buildDistoptCli, runProcess } from './helpers.js';
import { startServer } from './nats-server.js';

let server;
let distopt;

before(async () => {
  server = await startServer(['-js']);
  distopt = buildDistoptCli();
});

after(() => server?.stop());

for (const algorithm of ['diloco', 'periodic']) {
  test(`distopt train --world with Node processes as ranks 1 and 2 prints the simulated run's numbers (${algorithm})`, async () => {
    const ranks = 3;
    const steps = 40;
    const period = 4;
    const flags = ['train', '--algorithm', algorithm, '--steps', String(steps), '--period', String(period), '--backend', 'cpu', '--json', '--ranks', String(ranks)];
    const simulated = await runProcess(distopt, flags);
    assert.equal(simulated.code, 0, simulated.err);
    const runName = `mixed-${algorithm}`;
    const start = Date.now();
    const [native, ...node] = await Promise.all([
      runProcess(distopt, [...flags, '--world', server.url, '--run', runName, '--rank', '0']),
      ...[1, 2].map((rank) =>
        runProcess(process.execPath, [path.join(HERE, 'nats-trainer.mjs')], {
          DISTOPT_URL: server.url,
          DISTOPT_RUN: runName,
          DISTOPT_RANKS: String(ranks),
          DISTOPT_RANK: String(rank),
          DISTOPT_ALGORITHM: algorithm,
          DISTOPT_PERIOD: String(period),
          DISTOPT_STEPS: String(steps),
        }),
      ),
    ]);
    assert.equal(native.code, 0, `the native rank: ${native.err}`);
    node.forEach((n, i) => assert.equal(n.code, 0, `Node rank ${i + 1}: ${n.out}\n${n.err}`));
    const reports = node.map((n) => JSON.parse(n.out.trim().split('\n').pop()));
    assert.deepEqual(reports.map((r) => [r.rank, r.steps]), [[1, steps], [2, steps]]);
    const a = JSON.parse(simulated.out).results[0];
    const b = JSON.parse(native.out).results[0];
    const keys = ['mean_loss_per_step', 'divergence_per_step', 'replica_loss_per_rank', 'all_reduce_bytes_by_group_size'];
    const differ = keys.filter((key) => JSON.stringify(b[key]) !== JSON.stringify(a[key]));
    assert.deepEqual(differ, [], `the mixed run prints the simulated run's numbers: ${differ.map((k) => `${k}: ${JSON.stringify(b[k])} != ${JSON.stringify(a[k])}`).join('; ')}`);
    assert.equal(a.mean_loss_per_step.length, steps);
    console.log(
      `${algorithm}: 1 native + 2 Node processes, ${steps} steps, printed the simulated run's losses and divergences bit for bit (${((Date.now() - start) / 1000).toFixed(1)} s)`,
    );
  });
}
