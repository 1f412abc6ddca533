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
      () => new api.DiLoCo(x, x, x, x),
      () => new api.DiLoCo(new SGD(r), new Adam(r), x, w),
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

test('DiLoCo takes both optimizers, syncs every syncEvery steps, and refuses bad arguments keeping them', async () => {
  const { DiLoCo, World, Replicas, SGD } = api;
  const r = Replicas.replicate(2, [[1, 2]]);
  const w = new World(2);
  const inner = new SGD(r, { lr: 0.5 });
  const outer = new SGD(r, { lr: 1 });
  const refused = [
    [() => new DiLoCo(inner, outer, 0, w), 'ValueError', 'sync_every must be a positive integer, got 0'],
    [() => new DiLoCo(inner, outer, 1, new World(3)), 'ValueError', 'the replicas hold 2 ranks'],
    [() => new DiLoCo(inner, inner, 1, w), 'ValueError', 'two different optimizers'],
    [() => new DiLoCo(inner, new SGD(Replicas.replicate(2, [[1, 2]])), 1, w), 'ValueError', 'the same Replicas'],
  ];
  for (const [f, name, text] of refused) {
    const error = await thrown(f);
    assert.equal(error.name, name, error.message);
    assert.ok(error.message.includes(text), error.message);
  }
  // Still their own: they step.
  inner.step();
  outer.step();
  const diloco = new DiLoCo(inner, outer, 2, w);
  assert.equal(diloco.syncEvery, 2);
  let error = await thrown(() => inner.step());
  assert.equal(error.name, 'RuntimeError');
  assert.match(error.message, /belongs to a DiLoCo/);
  error = await thrown(() => new DiLoCo(inner, outer, 2, w));
  assert.match(error.message, /already belongs to a DiLoCo/);
  const grads = () => {
    diloco.zeroGrad();
    r.setGrads(0, [[2, 4]]);
    r.setGrads(1, [[4, 6]]);
  };
  grads();
  assert.equal(diloco.step(), false);
  assert.equal(diloco.localStep, 1);
  const [[a], [b]] = await r.params();
  assert.deepEqual([...a.data, ...b.data], [0, 0, -1, -1]);
  grads();
  assert.equal(diloco.step(), true);
  // Pseudo-gradients [2, 4] and [4, 6]: their mean [3, 5], applied with lr 1 to [1, 2].
  for (const [p] of await r.params()) assert.deepEqual([...p.data], [-2, -3]);
  assert.equal(diloco.localStep, 0);
  const saved = await diloco.stateDict(1);
  assert.equal(saved.local_step, 0);
  assert.deepEqual([...saved.original_parameters[0].data], [-2, -3]);
  assert.deepEqual((await outer.stateDict(0)).param_groups[0].lr, 1);
  diloco.loadStateDict(1, saved);
  diloco.free();
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

test('ZeroRedundancyOptimizer: sharded state, consolidation, named errors', async () => {
  const { World, Replicas, ZeroRedundancyOptimizer, takeWarnings } = api;
  takeWarnings();
  const world = new World(2);
  const replicas = Replicas.replicate(2, [[1, 2, 3], [4], [5, 6]]);
  const zero = new ZeroRedundancyOptimizer(world, replicas, [0, 1, 2], 'SGD', { lr: 0.1, momentum: 0.9 });
  assert.deepEqual(zero.rankOfParam, [0, 1, 1]);
  assert.deepEqual(zero.paramsPerRank, [[0], [2, 1]]);
  assert.deepEqual(zero.numelPerRank, [3, 3]);
  for (let r = 0; r < 2; r++) replicas.setGrads(r, [[1, 1, 1], [1], [1, 1]]);
  world.resetStats();
  zero.step();
  assert.ok(world.stats().broadcastBytes > 0);
  assert.deepEqual(zero.localStateSizes(), [1, 2]);
  assert.ok(zero.stateBytesPerRank().every((b) => b > 0), String(zero.stateBytesPerRank()));
  const params = await replicas.params();
  assert.deepEqual([...params[1][0].data].map((x) => Math.round(x * 10) / 10), [0.9, 1.9, 2.9]);
  let error = await thrown(() => zero.stateDict(0));
  assert.equal(error.name, 'RuntimeError');
  assert.match(error.message, /consolidate_state_dict\(to=0\)/);
  await zero.consolidateStateDict(1);
  error = await thrown(() => zero.stateDict(0));
  assert.equal(error.name, 'RuntimeError');
  const sd = zero.stateDict(1);
  assert.deepEqual(Object.keys(sd.state).sort(), ['0', '1', '2']);
  zero.loadStateDict(sd);
  zero.setRequiresGrad(1, false);
  zero.step();
  assert.ok(takeWarnings().some((w) => w.includes('trainable parameters changed')));
  const cases = [
    [() => new ZeroRedundancyOptimizer(world, replicas, [], 'SGD'), 'ValueError', 'empty parameter list'],
    [() => new ZeroRedundancyOptimizer(new World(3), replicas, null, 'SGD'), 'ValueError', 'ranks'],
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 'NAdam'), 'ValueError', "unknown optimizer 'NAdam'"],
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 42), 'TypeError', 'optimizer must be'],
    [() => new ZeroRedundancyOptimizer(replicas, replicas, null, 'SGD'), 'TypeError', 'world must be a World'],
    [() => new ZeroRedundancyOptimizer(world, world, null, 'SGD'), 'TypeError', 'replicas must be a Replicas'],
    [() => new ZeroRedundancyOptimizer(world, replicas, [7], 'SGD'), 'IndexError', 'out of range'],
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', { lr: -1 }), 'ValueError', 'Invalid learning rate'],
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', {}, { bucket: true }), 'TypeError', "unknown ZeroRedundancyOptimizer option 'bucket'"],
    [() => new ZeroRedundancyOptimizer(world, replicas, [{ lr: 1 }], 'SGD'), 'TypeError', 'params must be an array'],
    [() => zero.addParamGroup({ params: [0] }), 'ValueError', 'more than one parameter group'],
    [() => zero.setRequiresGrad(9, true), 'IndexError', 'out of range'],
    [() => zero.setRequiresGrad(0, 'yes'), 'TypeError', 'boolean'],
    [() => zero.consolidateStateDict(0.5), 'TypeError', 'integer'],
    [() => zero.stateDict(5), 'IndexError', 'rank 5'],
    [() => zero.loadStateDict({ state: {}, param_groups: [] }), 'ValueError', 'different number of parameter groups'],
  ];
  for (const [call, name, text] of cases) {
    const e = await thrown(call);
    assert.equal(e.name, name, e.message);
    assert.ok(e.message.includes(text), `${JSON.stringify(e.message)} lacks ${JSON.stringify(text)}`);
  }
  // overlap_with_ddp without DDP never initializes, as in PyTorch.
  const overlap = new ZeroRedundancyOptimizer(world, replicas, null, 'Adam', {}, { overlapWithDdp: true });
  assert.equal(overlap.rankOfParam, null);
  overlap.step();
  assert.ok(takeWarnings().some((w) => w.includes('overlap_with_ddp=True')));
  error = await thrown(() => overlap.consolidateStateDict(0));
  assert.equal(error.name, 'RuntimeError');
  overlap.free();
  zero.free();
});

test('RpcWorld and DistributedOptimizer: steps from autograd contexts, named errors', async () => {
  const { RpcWorld, DistributedOptimizer, takeWarnings } = api;
  takeWarnings();
  const world = new RpcWorld(['worker0', 'worker1']);
  assert.deepEqual(world.workerNames, ['driver', 'worker0', 'worker1']);
  const a = world.remote('worker0', [1, 2]);
  const b = world.remote('worker1', [3]);
  assert.equal(a.owner, 'worker0');
  assert.deepEqual([...(await a.toHere()).data], [1, 2]);
  const dopt = new DistributedOptimizer(world, 'SGD', [a, b, a], { lr: 0.5 });
  assert.equal(dopt.isFunctionalOptim, true);
  assert.deepEqual(dopt.localOptimizers(), [
    { owner: 'worker0', paramIndices: [0, 2] },
    { owner: 'worker1', paramIndices: [1] },
  ]);
  assert.deepEqual(takeWarnings(), []); // the workers' deprecation warnings stay in the workers
  const ctx = world.context();
  await world.recordGradient(ctx.id, a, [1, 1]);
  await world.recordGradient(ctx, a, [1, 1]); // accumulates
  await dopt.step(ctx.id);
  assert.deepEqual([...(await a.toHere()).data], [0, 1]);
  assert.deepEqual([...(await b.toHere()).data], [3]); // no gradient: skipped
  const grads = await world.getGradients(ctx.id, 'worker0');
  assert.deepEqual([...grads.get(a.id).data], [2, 2]);
  assert.equal(await world.gradOf(a), null);
  ctx.release();
  assert.equal(ctx.live, false);
  const other = new RpcWorld([]);
  const foreign = other.remote('driver', [1]);
  const cases = [
    [() => new RpcWorld(['x', 'x']), 'ValueError', 'used twice'],
    [() => new RpcWorld('worker0'), 'TypeError', 'workerNames must be an array'],
    [() => new RpcWorld([1]), 'TypeError', 'workerNames[0] must be a string'],
    [() => world.remote('nobody', [1]), 'RuntimeError', 'Unknown destination worker nobody'],
    [() => world.remote('worker0', 'x'), 'ValueError', 'expected a tensor'],
    [() => dopt.step(ctx.id), 'RuntimeError', `Could not find autograd context with id: ${ctx.id}`],
    [() => dopt.step('x'), 'TypeError', 'contextId'],
    [() => world.recordGradient(ctx.id, a, [1, 1]), 'RuntimeError', 'Could not find autograd context'],
    [() => world.recordGradient(world.context().id, {}, [1]), 'TypeError', 'rref must be an RRef'],
    [() => world.getGradients(world.context().id, 'nobody'), 'RuntimeError', 'Unknown destination worker'],
    [() => new DistributedOptimizer(world, 'NAdam', [a]), 'ValueError', "unknown optimizer 'NAdam'"],
    [() => new DistributedOptimizer(world, 'SGD', [foreign]), 'ValueError', 'belongs to another RpcWorld'],
    [() => new DistributedOptimizer(world, 'SGD', [a], { lr: -1 }), 'ValueError', 'Invalid learning rate'],
    [() => new DistributedOptimizer(world, 'SGD', [a], {}, { functional: 'no' }), 'TypeError', 'functional must be a boolean'],
    [() => new DistributedOptimizer({}, 'SGD', [a]), 'TypeError', 'rpcWorld must be an RpcWorld'],
  ];
  for (const [call, name, text] of cases) {
    const e = await thrown(call);
    assert.equal(e.name, name, e.message);
    assert.ok(e.message.includes(text), `${JSON.stringify(e.message)} lacks ${JSON.stringify(text)}`);
  }
  // The torch.optim path: the gradient persists in param.grad and the driver logs a warning.
  takeWarnings();
  const torchOptim = new DistributedOptimizer(world, 'SGD', [b], { lr: 1 }, { functional: false });
  assert.equal(torchOptim.isFunctionalOptim, false);
  assert.ok(takeWarnings()[0].includes('without a functional optimizer'));
  const ctx2 = world.context();
  await world.recordGradient(ctx2, b, [1]);
  await torchOptim.step(ctx2);
  assert.deepEqual([...(await world.gradOf(b)).data], [1]);
  ctx2.free();
  world.shutdownWorker('worker1');
  const e = await thrown(() => b.toHere());
  assert.equal(e.name, 'RuntimeError');
  torchOptim.free();
  dopt.free();
  world.free();
  other.free();
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

test('the trainer runs ZeRO: synchronous SGD with sharded optimizer state', async () => {
  const sync = new api.Trainer({ ranks: 4, algorithm: 'sync', task: { samples: 512 } });
  const zero = new api.Trainer({ ranks: 4, algorithm: 'zero', task: { samples: 512 } });
  assert.equal(zero.algorithm, 'zero');
  assert.match(zero.description, /ZeRO/);
  let s;
  let z;
  for (let i = 0; i < 10; i++) {
    s = await sync.step();
    z = await zero.step();
    assert.equal(z.divergence, 0);
    assert.ok(Math.abs(s.meanLoss - z.meanLoss) <= 1e-4 * Math.max(1, s.meanLoss), `${s.meanLoss} vs ${z.meanLoss}`);
  }
  assert.ok(z.bytesCommunicatedPerRank > s.bytesCommunicatedPerRank);
  assert.ok(zero.commStats().broadcastBytes > 0);
  const full = s.optimizerStateBytesPerRank;
  assert.equal(full.length, 4);
  assert.deepEqual(z.optimizerStateBytesPerRank, zero.optimizerStateBytesPerRank());
  assert.ok(z.optimizerStateBytesPerRank.every((b) => b < full[0]), `${z.optimizerStateBytesPerRank} vs ${full}`);
  sync.free();
  zero.free();
});
