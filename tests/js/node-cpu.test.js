// Node without WebGPU: the package imports, init() falls back to the CPU backend and says why,
// every golden case of the JS-facing kinds passes, and every misuse is a named Error (no trap).

import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { importPackage, runGoldenSubtests, typedExports } from './helpers.js';

let api;
let info;

before(async () => {
  assert.equal(globalThis.navigator?.gpu, undefined, 'this test runs without WebGPU');
  api = await importPackage();
  info = await api.default();
});

test('init() falls back to the CPU backend and says why', () => {
  assert.equal(info.kind, 'cpu');
  assert.equal(info.api, 'host');
  assert.match(info.reason, /no GPU adapter: WebGPU is not available/);
  assert.deepEqual(api.backendInfo().kind, 'cpu');
  assert.match(api.version(), /^\d+\.\d+\.\d+/);
});

test('the typings name exactly what the package exports', () => {
  assert.deepEqual(Object.keys(api).sort(), typedExports());
});

test('golden cases on the CPU fallback', async (t) => {
  await runGoldenSubtests(t, api, 'Node CPU');
});

/** Calls f; returns the thrown error (or fails when nothing is thrown). */
async function thrown(f) {
  try {
    await f();
  } catch (error) {
    return error;
  }
  return assert.fail('expected an error');
}

const PYTHON_CLASSES = ['ValueError', 'TypeError', 'RuntimeError', 'IndexError', 'ZeroDivisionError'];

test('misuse throws named Errors, never a trap', async () => {
  const { sgdStep, World, Replicas, SGD, Adam, PeriodicModelAverager, HierarchicalModelAverager } = api;
  const { PostLocalSGDOptimizer, PostLocalSGDState, Trainer, tensor, tensorValues, StepBench } = api;
  const r = Replicas.replicate(2, [[1, 2]]);
  const w = new World(2);
  const weird = [undefined, null, 0, -1, 2.5, NaN, 'x', {}, [], [[]], [[null]], { data: 'x' }, Symbol('s'), () => 1, 1n];
  const calls = [];
  for (const x of weird) {
    calls.push(
      () => sgdStep(x, x, x),
      () => sgdStep([[x]], [[x]], 0.1),
      () => new World(x),
      () => new Replicas(x),
      () => Replicas.replicate(x, [[1]]),
      () => Replicas.replicate(2, x),
      () => r.setGrads(x, [[1, 2]]),
      () => r.setGrads(0, x),
      () => r.setParam(0, x, [1, 2]),
      () => r.param(x, 0),
      () => r.shape(x),
      () => new SGD(r, x),
      () => new SGD(r, { lr: x }),
      () => new SGD(r, {}, x),
      () => new Adam(r, { betas: x }),
      () => new PeriodicModelAverager(x, 0, w),
      () => new PeriodicModelAverager(1, x, w, 3),
      () => new HierarchicalModelAverager(x, 0, w),
      () => new PostLocalSGDOptimizer(x, x),
      () => new PostLocalSGDState(w, x, -1),
      () => new Trainer(x),
      () => new Trainer({ ranks: 2, algorithm: x }),
      () => tensor(x, [2], [1, 2]),
      () => tensor('float16', x, [1, 2]),
      () => tensorValues(x),
      () => StepBench.create(x, 10),
    );
  }
  calls.push(
    () => Replicas.replicate(1e9, [[1]]),
    () => new Replicas(Array.from({ length: 3 }, () => [{ dtype: 'float32', shape: [1 << 28], data: new Float32Array(1) }])),
    () => StepBench.create(1 << 20, 1 << 20),
  );
  // Objects of the wrong class, and freed ones.
  const freed = Replicas.replicate(1, [[1]]);
  freed.free();
  const avg = new PeriodicModelAverager(2, 0, w);
  calls.push(
    () => new PeriodicModelAverager(2, 0, r),
    () => avg.averageParameters(w),
    () => avg.averageParameters(freed),
    () => new SGD(freed),
    () => new SGD(w),
    () => new PostLocalSGDOptimizer(avg, new SGD(r)),
    () => r.broadcastParams(r, 0),
  );
  let thrownCount = 0;
  for (const call of calls) {
    try {
      await call();
    } catch (error) {
      thrownCount++;
      assert.ok(error instanceof Error, `a thrown ${typeof error}: ${String(error)}`);
      assert.ok(!(error instanceof WebAssembly.RuntimeError), `a trap: ${error.message}`);
      // Ours are named after the Python class; JS's own (a Symbol or BigInt where a number
      // goes) are TypeErrors too.
      assert.ok(PYTHON_CLASSES.includes(error.name), `${error.name}: ${error.message}`);
    }
  }
  assert.ok(thrownCount > calls.length * 0.8, `${thrownCount} of ${calls.length} calls threw`);
  // The module still works afterwards.
  const out = await sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
  assert.deepEqual([...out.meanGradients[0].data], [3, 5]);
});

test('errors carry the Python class and PyTorch text', async () => {
  const { sgdStep, World, Replicas, SGD, Adam, PeriodicModelAverager, HierarchicalModelAverager } = api;
  const cases = [
    [() => sgdStep([], [], 0.1), 'ValueError', 'no replicas: parameter_replicas is empty'],
    [() => new World(0), 'ValueError', 'a world needs at least one rank'],
    [() => new SGD(Replicas.replicate(1, [[1]]), { lr: -0.5 }), 'ValueError', 'Invalid learning rate: -0.5'],
    [() => new Adam(Replicas.replicate(1, [[1]]), { eps: -1e-8 }), 'ValueError', 'Invalid epsilon value: -1e-08'],
    [() => new SGD(Replicas.replicate(1, [[1]]), { betas: [1, 2] }), 'TypeError', "SGD.__init__() got an unexpected keyword argument 'betas'"],
    [() => new PeriodicModelAverager(0, -1, new World(2)), 'ValueError', 'Arg ``warmup_steps`` must be a non-negative number.'],
    [() => new HierarchicalModelAverager([[2, 3]], 0, new World(4)), 'ValueError', 'must be equal to the size of arg ``process_group`` 4'],
    [() => new HierarchicalModelAverager({ 2: 4 }, 0, new World(4)), 'TypeError', 'insertion order'],
    [() => Replicas.replicate(2, [[1]]).param(2, 0), 'IndexError', 'rank 2 out of range for 2 ranks'],
    [() => Replicas.replicate(2, [[1]]).shape(1), 'IndexError', 'parameter 1 out of range for 1 parameters'],
    [() => Replicas.replicate(1, [{ dtype: 'int64', shape: [1], data: [1] }]), 'ValueError', 'unsupported dtype int64'],
    [() => Replicas.replicate(1, [{ dtype: 'float32', data: new Uint16Array(1) }]), 'TypeError', 'Uint16Array data holds float16 or bfloat16 bit patterns'],
    [() => Replicas.replicate(1, [[[1, 2], [3]]]), 'ValueError', 'ragged nested list'],
  ];
  for (const [call, name, text] of cases) {
    const error = await thrown(call);
    assert.equal(error.name, name, error.message);
    assert.ok(error.message.includes(text), `${JSON.stringify(error.message)} lacks ${JSON.stringify(text)}`);
  }
});

test('tensors cross as typed arrays both ways', async () => {
  const { sgdStep, tensor, tensorValues } = api;
  const h = tensor('float16', [3], [1, 65520, 2 ** -25]);
  assert.ok(h.data instanceof Uint16Array);
  assert.deepEqual([...h.data], [0x3c00, 0x7c00, 0x0000]); // round to nearest even, overflow to inf
  const b = tensor('bfloat16', [1], ['nan']);
  assert.ok(Number.isNaN(tensorValues(b)[0]));
  const out = await sgdStep(
    [[{ dtype: 'float64', shape: [2], data: new Float64Array([1, 2]) }, h]],
    [[{ dtype: 'float64', shape: [2], data: [0.5, 'inf'] }, null]],
    1,
  );
  assert.ok(out.meanGradients[0].data instanceof Float64Array);
  assert.deepEqual([...out.updatedReplicas[0][0].data], [0.5, -Infinity]);
  assert.ok(out.updatedReplicas[0][1].data instanceof Uint16Array);
  assert.deepEqual([...out.updatedReplicas[0][1].data], [...h.data]); // a null gradient: unchanged
});

test('optimizers, averagers and post-local SGD over replicas', async () => {
  const { World, Replicas, SGD, PeriodicModelAverager, PostLocalSGDOptimizer, PostLocalSGDState, takeWarnings } = api;
  takeWarnings();
  const world = new World(4);
  const replicas = new Replicas([0, 1, 2, 3].map((r) => [[r, r]]));
  const sgd = new SGD(replicas, { lr: 0.5, momentum: 0.9 });
  const hook = new PostLocalSGDState(world, null, 1, false);
  const averager = new PeriodicModelAverager(2, 1, world);
  const opt = new PostLocalSGDOptimizer(sgd, averager);
  const steps = [];
  for (let t = 0; t < 4; t++) {
    opt.zeroGrad();
    for (let r = 0; r < 4; r++) replicas.setGrads(r, [[1, r]]);
    steps.push([hook.synchronizeGradients(replicas), opt.step()]);
  }
  // Iteration 0: gradients all-reduced over the world; after that, local steps averaged every 2.
  assert.deepEqual(steps, [[4, null], [null, 4], [null, null], [null, 4]]);
  assert.equal(opt.averagerStep, 4);
  assert.equal(averager.step, 4);
  const params = await replicas.params();
  assert.deepEqual(params.map((p) => [...p[0].data]), params.map(() => [...params[0][0].data]));
  const error = await thrown(() => sgd.step());
  assert.equal(error.name, 'RuntimeError');
  const sd = await opt.stateDict(0);
  assert.equal(sd.step, 4);
  assert.ok(sd.state['0'].momentum_buffer.data instanceof Float32Array);
  assert.deepEqual(Object.keys(sd.param_groups[0]).sort(), ['dampening', 'differentiable', 'foreach', 'fused', 'lr', 'maximize', 'momentum', 'nesterov', 'params', 'weight_decay']);
  delete sd.step;
  opt.loadStateDict(0, sd);
  assert.equal(opt.averagerStep, 0);
  assert.match(takeWarnings()[0], /does not contain a step counter/);
  assert.ok(world.stats().totalBytes > 0);
});

test('the trainer learns on the CPU fallback', async () => {
  const trainer = new api.Trainer({ ranks: 4, algorithm: 'hierarchical', period: 4, warmup: 5, task: { samples: 1024 } });
  assert.deepEqual(api.Trainer.defaultHierarchy(4, 4), [[2, 2], [4, 4]]);
  const first = await trainer.step();
  let last = first;
  for (let i = 0; i < 60; i++) last = await trainer.step();
  assert.equal(last.step, 61);
  assert.ok(last.meanLoss < first.meanLoss * 0.8, `${first.meanLoss} -> ${last.meanLoss}`);
  assert.equal(last.lossPerRank.length, 4);
  const evaluation = await trainer.evaluate();
  assert.ok(evaluation.meanModelAccuracy > 0.5, String(evaluation.meanModelAccuracy));
  assert.match(trainer.description, /hierarchical/);
  const error = await thrown(() => new api.Trainer({ ranks: 4, bogus: 1 }));
  assert.equal(error.name, 'TypeError');
  trainer.free();
});
