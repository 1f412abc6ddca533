// `distopt/worker`: the package in a worker of its own, every call awaited (npm/worker/). Checked
// against the package called directly in this process:
//   - the README's model example (DDP + SGD over a simulated world) gives the same bits;
//   - misuse is the same named error with the same text, and what cannot cross (a function) is
//     a TypeError naming the argument; assignments, free() and terminate() behave;
//   - two ranks of a run over a real nats-server, each in a worker of this one process, train
//     DiLoCo while this thread keeps running its own timers: their evaluations equal the
//     simulated run's bit for bit.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { PACKAGE, importPackage } from './helpers.js';
import { startServer } from './nats-server.js';

let direct;
let inWorker;
let nats;

before(async () => {
  const entry = path.join(PACKAGE, 'worker/remote.js');
  assert.ok(fs.existsSync(entry), `build the package first (scripts/build-npm.sh): ${entry} is missing`);
  ({ inWorker } = await import(pathToFileURL(entry).href));
  direct = await importPackage();
  await direct.default({ backend: 'cpu' });
});

after(() => nats?.stop());

/** The README's "Use it with your model" loop, over `api` (direct, or a remote when `awaited`). */
async function readmeModel(api, steps) {
  const R = 4;
  const shards = Array.from({ length: R }, (_, r) =>
    Array.from({ length: 32 }, (_, i) => {
      const x = [Math.sin(32 * r + i), Math.cos(3 * (32 * r + i))];
      return { x, y: 3 * x[0] - 2 * x[1] + 1 };
    }),
  );
  const world = await new api.World(R);
  const model = await api.Replicas.replicate(R, [new Float32Array(2), new Float32Array(1)]);
  const ddp = await new api.DistributedDataParallel(world, model);
  const sgd = await new api.SGD(model, { lr: 0.2 });
  for (let step = 0; step < steps; step++) {
    const params = await model.params();
    await sgd.zeroGrad();
    for (let r = 0; r < R; r++) {
      const [w, b] = [params[r][0].data, params[r][1].data];
      const gw = new Float32Array(2);
      const gb = new Float32Array(1);
      for (const { x, y } of shards[r]) {
        const err = w[0] * x[0] + w[1] * x[1] + b[0] - y;
        gw[0] += (2 * err * x[0]) / 32;
        gw[1] += (2 * err * x[1]) / 32;
        gb[0] += (2 * err) / 32;
      }
      await model.setGrads(r, [gw, gb]);
    }
    await ddp.synchronizeGradients();
    await sgd.step();
  }
  const params = await model.params();
  for (const object of [sgd, ddp, model, world]) await object.free();
  return params.map((rank) => rank.map((p) => Array.from(new Uint32Array(p.data.buffer, p.data.byteOffset, p.data.length))));
}

test('the README model example through the worker equals the direct call, bit for bit', async () => {
  const remote = await inWorker({ backend: 'cpu' });
  try {
    const expected = await readmeModel(direct, 30);
    const got = await readmeModel(remote, 30);
    assert.deepEqual(got, expected);
    // It trained: w approaches (3, −2).
    const w = new Float32Array(new Uint32Array(got[0][0]).buffer);
    assert.ok(Math.abs(w[0] - 3) < 1 && Math.abs(w[1] + 2) < 1, `w = ${w}`);
    assert.equal(await remote.version(), direct.version());
  } finally {
    remote.terminate();
  }
});

/** The error `fn` throws or rejects with, as {name, message}. */
async function caught(fn) {
  try {
    await fn();
  } catch (error) {
    return { name: error.name, message: error.message };
  }
  assert.fail('expected an error');
}

test('misuse through the worker: the same named errors, and what cannot cross is named', async () => {
  const remote = await inWorker({ backend: 'cpu' });
  try {
    const world = new direct.World(2);
    const model = direct.Replicas.replicate(2, [new Float32Array(3)]);
    const rWorld = await new remote.World(2);
    const rModel = await remote.Replicas.replicate(2, [new Float32Array(3)]);
    // A World where Replicas belong; an invalid option; a freed object; a wrong shape.
    assert.deepEqual(await caught(() => new remote.SGD(rWorld, { lr: 0.1 })), await caught(() => new direct.SGD(world, { lr: 0.1 })));
    assert.deepEqual(await caught(() => new remote.SGD(rModel, { lr: -1 })), await caught(() => new direct.SGD(model, { lr: -1 })));
    assert.deepEqual(
      await caught(() => rModel.setGrads(1, [new Float32Array(5)])),
      await caught(() => model.setGrads(1, [new Float32Array(5)])),
    );
    const sgd = new direct.SGD(model, { lr: 0.1 });
    const rSgd = await new remote.SGD(rModel, { lr: 0.1 });
    sgd.free();
    await rSgd.free();
    assert.deepEqual(await caught(() => rSgd.zeroGrad()), await caught(() => sgd.zeroGrad()));
    assert.match((await caught(() => rSgd.zeroGrad())).message, /^SGD\.zeroGrad: this SGD was freed/);
    // What cannot cross.
    assert.deepEqual(await caught(() => new remote.SGD(rModel, { lr: () => 0.1 })), {
      name: 'TypeError',
      message: "new SGD: argument 2.lr is a function: only data and distopt's objects can be sent to the worker running distopt",
    });
    assert.equal((await caught(() => remote.tensor(Symbol('x')))).name, 'TypeError');
    // An assignment is sent in order; one that fails rejects the next call.
    const averager = await new remote.PeriodicModelAverager(2, 0, rWorld);
    averager.step = 7;
    assert.equal(await averager.step, 7);
    averager.step = -1;
    const direct7 = new direct.PeriodicModelAverager(2, 0, world);
    assert.deepEqual(await caught(() => remote.version()), await caught(() => (direct7.step = -1)));
    assert.equal(await averager.step, 7, 'the refused assignment changed nothing');
    assert.equal(await remote.version(), direct.version(), 'the failure was reported once');
  } finally {
    remote.terminate();
  }
  assert.deepEqual(await caught(() => remote.version()), {
    name: 'RuntimeError',
    message: 'the worker running distopt was terminated (terminate() was called)',
  });
});

test('two ranks over NATS, each in a worker of this process: this thread never blocks, the run is the simulated one', async () => {
  nats = await startServer(['-js']);
  const [ranks, period, steps] = [2, 4, 40];
  const simulated = new direct.Trainer({ ranks, algorithm: 'diloco', period });
  while (simulated.steps < steps) await simulated.step();
  const expected = await simulated.evaluate();
  simulated.free();

  // This thread's own timer keeps ticking while the ranks wait on each other.
  let ticks = 0;
  const ticker = setInterval(() => ticks++, 5);
  const start = Date.now();
  const rank = async (r) => {
    const d = await inWorker({ backend: 'cpu' });
    try {
      const port = await d.openPort({ servers: nats.url, name: `worker rank ${r}` });
      const world = await d.World.joinNats(port, { run: 'in-workers', ranks, rank: r });
      const trainer = await new d.Trainer({ ranks, algorithm: 'diloco', period, world });
      while ((await trainer.steps) < steps) await trainer.step();
      const evaluation = await trainer.evaluate();
      const report = { rank: await world.rank, live: await world.live, evaluation };
      await trainer.free();
      await world.free();
      await port.free(); // closes the port
      return report;
    } finally {
      d.terminate();
    }
  };
  const reports = await Promise.all([rank(0), rank(1)]);
  clearInterval(ticker);
  const seconds = (Date.now() - start) / 1000;
  assert.deepEqual(reports.map((r) => r.rank), [0, 1]);
  for (const { rank: r, live, evaluation } of reports) {
    assert.deepEqual(live, [true, true]);
    assert.equal(evaluation.meanModelLoss, expected.meanModelLoss, `rank ${r}: the simulated run's mean model loss, bit for bit`);
    assert.deepEqual(Array.from(evaluation.lossPerRank), Array.from(expected.lossPerRank));
  }
  // A blocked thread would tick not at all; this one ticked through the run.
  assert.ok(ticks > (seconds * 1000) / 5 / 4, `${ticks} ticks of 5 ms in ${seconds.toFixed(1)} s`);
  console.log(
    `DiLoCo, 2 ranks in 2 workers over NATS: ${steps} steps in ${seconds.toFixed(1)} s, the simulated run's numbers bit for bit; this thread ticked ${ticks} times`,
  );
});
