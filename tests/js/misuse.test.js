// The misuse suite (issue 15): every public entry point of the npm package, in Node on the CPU
// backend, given what a hostile or careless caller passes. Each case is generated from tables
// (entry point × bad value) and checks:
//   * a *named* error: its constructor name (Python's class) and a message fragment;
//   * that the object it was called on is still usable and unchanged afterwards (a valid call
//     then returns the right value);
//   * no trap and no hang (every promise settles within a timeout).
// Cases that could take the whole process down (huge allocations, a call before init()) run
// each in its own child process with a timeout. Counts per class and per entry point are
// printed at the end.
//
//   node --test tests/js/misuse.test.js     (after scripts/build-npm.sh)

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import test from 'node:test';
import { pathToFileURL } from 'node:url';

import { PACKAGE, importPackage } from './helpers.js';

const d = await importPackage();
await d.default({ backend: 'cpu' });

const TIMEOUT_MS = 10_000;

function within(promise, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: did not settle within ${TIMEOUT_MS} ms (a hang)`)), TIMEOUT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Runs `f` (sync or async) and returns the error it throws or rejects with, or fails. */
async function caught(f, what) {
  let result;
  try {
    result = f();
    if (result && typeof result.then === 'function') result = await within(result, what);
  } catch (e) {
    return e;
  }
  assert.fail(`${what}: expected an error, got ${String(result)}`);
}

function checkNamed(e, name, fragment, what) {
  assert.ok(e instanceof Error, `${what}: threw a non-Error ${String(e)}`);
  assert.notEqual(e.constructor.name, 'RuntimeError', `${what}: a WebAssembly trap: ${e.message}`);
  assert.ok(!(e instanceof WebAssembly.RuntimeError), `${what}: a WebAssembly trap: ${e.message}`);
  assert.equal(e.name, name, `${what}: ${e.name}: ${e.message}`);
  assert.match(e.message, fragment, `${what}: ${e.name}: ${e.message}`);
  assert.ok(e.message.length < 1200, `${what}: a ${e.message.length}-character message`);
  assert.doesNotMatch(e.message, /trapped|unreachable|memory access|null pointer|Cannot read properties/, what);
}

// ---------------------------------------------------------------------------------------------
// Fixtures: one of each object, with known values, rebuilt for each group of cases.

const P0 = [1, 2];
const P1 = [3, 4, 5];

function makeFixture() {
  const world = new d.World(2);
  const replicas = d.Replicas.replicate(2, [new Float32Array(P0), new Float32Array(P1)]);
  for (const rank of [0, 1]) replicas.setGrads(rank, [new Float32Array([0.5, 0.5]), new Float32Array([1, 1, 1])]);
  const sgd = new d.SGD(replicas, { lr: 0.1 });
  const r2 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const adam = new d.Adam(r2, { lr: 0.1 });
  const r3 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const adamw = new d.AdamW(r3, { lr: 0.1 });
  const periodic = new d.PeriodicModelAverager(2, 0, world);
  const hierarchical = new d.HierarchicalModelAverager([[2, 2]], 0, world);
  const state = new d.PostLocalSGDState(world, null, 1);
  const r4 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const zero = new d.ZeroRedundancyOptimizer(world, r4, null, 'SGD', { lr: 0.1 });
  const r5 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const ddp = new d.DistributedDataParallel(world, r5);
  const rpc = new d.RpcWorld(['w0', 'w1']);
  const rref = rpc.remote('w1', new Float32Array(P0));
  const trainer = new d.Trainer({ ranks: 2, algorithm: 'sync', task: { samples: 32 } });
  const r6 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const diloco = new d.DiLoCo(new d.SGD(r6, { lr: 0.1 }), new d.SGD(r6, { lr: 0.7 }), 2, world);
  const r7 = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const join = new d.Join([new d.DistributedDataParallel(world, r7)]);
  return { world, replicas, sgd, adam, adamw, periodic, hierarchical, state, zero, ddp, rpc, rref, trainer, diloco, join, r6 };
}

let fx = makeFixture();

/** Checks that every fixture object still answers correctly (and that nothing changed). */
async function checkUsable(what) {
  assert.equal(fx.world.size, 2, what);
  assert.deepEqual(Array.from(fx.world.groupOf(1)), [0, 1], what);
  assert.equal(fx.replicas.numel(1), 3, what);
  assert.deepEqual(Array.from((await within(fx.replicas.param(0, 0), what)).data), P0, what);
  assert.deepEqual(Array.from((await within(fx.replicas.param(1, 1), what)).data), P1, what);
  assert.deepEqual(Array.from((await within(fx.replicas.grad(1, 0), what)).data), [0.5, 0.5], what);
  assert.deepEqual(fx.sgd.paramGroups(), [[0, 1]], what);
  const sd = await within(fx.adam.stateDict(0), what);
  assert.equal(sd.param_groups[0].lr, 0.1, what);
  assert.deepEqual(fx.zero.paramGroups(), [[0]], what);
  assert.equal(fx.periodic.step, 0, what);
  assert.equal(fx.state.iter, 0, what);
  assert.deepEqual(fx.rpc.workerNames, ['driver', 'w0', 'w1'], what);
  assert.equal(fx.trainer.ranks, 2, what);
  assert.equal(fx.diloco.syncEvery, 2, what);
  assert.equal(fx.diloco.localStep, 0, what);
  assert.deepEqual(fx.join.joined, [false, false], what);
  assert.equal(d.tensorValues(d.tensor('float16', [2], [1, 2]))[1], 2, what);
}

// ---------------------------------------------------------------------------------------------
// The tables

const counts = new Map();
function count(klass, entry) {
  const key = `${klass}\t${entry}`;
  counts.set(key, (counts.get(key) || 0) + 1);
}

const cases = [];
/** A case: `call(fx)` must throw/reject `name` with `fragment`; the fixture must stay usable. */
function add(klass, entry, label, call, name, fragment) {
  cases.push({ klass, entry, label: `${entry}: ${label}`, call, name, fragment });
}

function revokedProxy() {
  const { proxy, revoke } = Proxy.revocable([], {});
  revoke();
  return proxy;
}

function detached(n = 2) {
  const a = new Float32Array(n);
  structuredClone(a.buffer, { transfer: [a.buffer] });
  return a;
}

const NOT_INTEGER = /must be an integer/;
// Values where an integer (a count, a rank, an index) goes.
const BAD_INTEGERS = [
  ['the string "1"', () => '1', 'TypeError', NOT_INTEGER],
  ['true', () => true, 'TypeError', NOT_INTEGER],
  ['[]', () => [], 'TypeError', NOT_INTEGER],
  ['[1]', () => [1], 'TypeError', NOT_INTEGER],
  ['{}', () => ({}), 'TypeError', NOT_INTEGER],
  ['a Date', () => new Date(1), 'TypeError', NOT_INTEGER],
  ['1.5', () => 1.5, 'TypeError', NOT_INTEGER],
  ['NaN', () => NaN, 'TypeError', /must be an integer, got (a number \()?NaN/],
  ['Infinity', () => Infinity, 'TypeError', NOT_INTEGER],
  ['2**53', () => 2 ** 53, 'TypeError', NOT_INTEGER],
  ['a bigint', () => 1n, 'TypeError', NOT_INTEGER],
  ['a symbol', () => Symbol('s'), 'TypeError', NOT_INTEGER],
  ['-1', () => -1, 'ValueError', /non-negative|must be positive|must be a positive/],
  ['a throwing getter object', () => ({ get valueOf() { throw new Error('mine'); } }), 'TypeError', /could not be read|must be an integer/],
  ['a revoked proxy', revokedProxy, 'TypeError', /could not be read/],
];
const BAD_INTEGERS_AND_NULL = [...BAD_INTEGERS, ['null', () => null, 'TypeError', NOT_INTEGER]];

// [entry point, call with the bad value in place, null documented?]
const INTEGER_POSITIONS = [
  ['new World(size)', (f, v) => new d.World(v)],
  ['World.groupOf(rank)', (f, v) => f.world.groupOf(v)],
  ['World.groupOf(rank, groupSize)', (f, v) => f.world.groupOf(0, v), true],
  ['Replicas.replicate(ranks)', (f, v) => d.Replicas.replicate(v, [new Float32Array(2)])],
  ['Replicas.shape(j)', (f, v) => f.replicas.shape(v)],
  ['Replicas.dtype(j)', (f, v) => f.replicas.dtype(v)],
  ['Replicas.numel(j)', (f, v) => f.replicas.numel(v)],
  ['Replicas.param(rank)', (f, v) => f.replicas.param(v, 0)],
  ['Replicas.param(j)', (f, v) => f.replicas.param(0, v)],
  ['Replicas.grad(rank)', (f, v) => f.replicas.grad(v, 0)],
  ['Replicas.hasGrad(j)', (f, v) => f.replicas.hasGrad(0, v)],
  ['Replicas.setParam(rank)', (f, v) => f.replicas.setParam(v, 0, [9, 9])],
  ['Replicas.setParam(j)', (f, v) => f.replicas.setParam(0, v, [9, 9])],
  ['Replicas.setParams(rank)', (f, v) => f.replicas.setParams(v, [[9, 9], [9, 9, 9]])],
  ['Replicas.setGrads(rank)', (f, v) => f.replicas.setGrads(v, [null, null])],
  ['Replicas.setGrad(j)', (f, v) => f.replicas.setGrad(0, v, null)],
  ['Replicas.broadcastParams(root)', (f, v) => f.replicas.broadcastParams(f.world, v), true],
  ['SGD.stateDict(rank)', (f, v) => f.sgd.stateDict(v)],
  ['SGD.loadStateDict(rank)', (f, v) => f.sgd.loadStateDict(v, {})],
  ['Adam.stateDict(rank)', (f, v) => f.adam.stateDict(v)],
  ['AdamW.stateDict(rank)', (f, v) => f.adamw.stateDict(v)],
  ['new PeriodicModelAverager(period)', (f, v) => new d.PeriodicModelAverager(v, 0, f.world), true],
  ['new PeriodicModelAverager(warmupSteps)', (f, v) => new d.PeriodicModelAverager(2, v, f.world), true],
  ['new PeriodicModelAverager(groupSize)', (f, v) => new d.PeriodicModelAverager(2, 0, f.world, v), true],
  ['new PostLocalSGDState(subgroupSize)', (f, v) => new d.PostLocalSGDState(f.world, v, 1), true],
  ['new PostLocalSGDState(startLocalSGDIter)', (f, v) => new d.PostLocalSGDState(f.world, null, v)],
  ['ZeroRedundancyOptimizer.setRequiresGrad(j)', (f, v) => f.zero.setRequiresGrad(v, true)],
  ['ZeroRedundancyOptimizer.stateDict(rank)', (f, v) => f.zero.stateDict(v)],
  ['ZeroRedundancyOptimizer.consolidateStateDict(to)', (f, v) => f.zero.consolidateStateDict(v), true],
  ['Trainer.defaultHierarchy(period)', (f, v) => d.Trainer.defaultHierarchy(v, 4)],
  ['Trainer.defaultHierarchy(ranks)', (f, v) => d.Trainer.defaultHierarchy(2, v)],
  ['Trainer.classCounts(rank)', (f, v) => f.trainer.classCounts(v)],
  ['StepBench.create(ranks)', (f, v) => d.StepBench.create(v, 8)],
  ['StepBench.create(elements)', (f, v) => d.StepBench.create(1, v)],
  ['new DiLoCo(syncEvery)', (f, v) => new d.DiLoCo(new d.SGD(f.r6, { lr: 0.1 }), new d.SGD(f.r6, { lr: 0.7 }), v, f.world)],
  ['DiLoCo.stateDict(rank)', (f, v) => f.diloco.stateDict(v)],
  ['new HierarchicalModelAverager(warmupSteps)', (f, v) => new d.HierarchicalModelAverager([[2, 2]], v, f.world), true],
  ['PostLocalSGDState.synchronizeGradients → new PostLocalSGDState(startLocalSGDIter)', (f, v) => new d.PostLocalSGDState(f.world, 2, v)],
];

for (const [entry, call, nullable] of INTEGER_POSITIONS) {
  let values = nullable ? BAD_INTEGERS : BAD_INTEGERS_AND_NULL;
  // PyTorch keeps the consolidated state nowhere for a `to` outside the world: -1 is no error.
  if (entry.endsWith('consolidateStateDict(to)')) values = values.filter(([label]) => label !== '-1');
  for (const [label, make, name, fragment] of values) {
    add('integer argument', entry, label, (f) => call(f, make()), name, fragment);
  }
}

// `null` where an optional rank goes is no rank (issue 23, 1): only omitting it means the
// default; negative counts among the Trainer's settings are ValueErrors, JS's -0 is 0.
add('integer argument', 'Replicas.broadcastParams(root)', 'null', (f) => f.replicas.broadcastParams(f.world, null), 'TypeError', /^rank must be an integer, got null$/);
for (const [key, settings] of [
  ['ranks', { ranks: -2 }],
  ['period', { ranks: 2, algorithm: 'periodic', period: -1 }],
  ['warmup', { ranks: 2, algorithm: 'periodic', warmup: -1 }],
  ['batchSize', { ranks: 2, batchSize: -4 }],
  ['seed', { ranks: 2, seed: -1 }],
]) {
  add('integer argument', `new Trainer(settings.${key})`, 'a negative integer', () => new d.Trainer(settings), 'ValueError', new RegExp(`^'${key}' must be a non-negative integer, got -\\d+$`));
  add('integer argument', `new Trainer(settings.${key})`, '1.5', () => new d.Trainer({ ...settings, [key]: 1.5 }), 'TypeError', new RegExp(`^'${key}' must be a non-negative integer, got 1.5$`));
}
add('integer argument', 'new Trainer(settings.task.samples)', 'a negative integer', () => new d.Trainer({ ranks: 2, task: { samples: -8 } }), 'ValueError', /^'samples' must be a non-negative integer, got -8$/);

// Rank and index out of range: IndexError.
for (const [entry, call] of [
  ['Replicas.param(rank)', (f) => f.replicas.param(2, 0)],
  ['Replicas.param(j)', (f) => f.replicas.param(0, 2)],
  ['Replicas.setParam(rank)', (f) => f.replicas.setParam(5, 0, [9, 9])],
  ['Replicas.numel(j)', (f) => f.replicas.numel(7)],
  ['SGD.stateDict(rank)', (f) => f.sgd.stateDict(2)],
  ['World.groupOf(rank)', (f) => f.world.groupOf(2)],
]) {
  add('out of range', entry, 'out of range', call, 'IndexError', /out of range/);
}

// Where other entry points take a value of their own kind.
const OTHER_POSITIONS = [
  ['new HierarchicalModelAverager(periodGroupSizeDict[0][0])', (f, v) => new d.HierarchicalModelAverager([[v, 2]], 0, f.world), 'TypeError', /period must be an integer/],
  ['RpcWorld.getGradients(contextId)', (f, v) => f.rpc.getGradients(v, 'w0'), 'TypeError', /context id|must be an integer/],
  ['RpcWorld.recordGradient(contextId)', (f, v) => f.rpc.recordGradient(v, f.rref, [1, 1]), 'TypeError', /context id|must be an integer/],
  ['DistributedOptimizer.step(contextId)', (f, v) => new d.DistributedOptimizer(f.rpc, 'SGD', [f.rref], { lr: 0.1 }).step(v), 'TypeError', /context id|must be an integer/],
  ['RpcWorld.remote(worker)', (f, v) => f.rpc.remote(v, [1]), 'TypeError', /worker must be/],
  ['Join.iteration(hasInput[0])', (f, v) => f.join.iteration([v, true]), 'TypeError', /array of booleans|bigint cannot be converted/],
  ['new Join(options.enable)', (f, v) => new d.Join([f.ddp], { enable: v }), 'TypeError', /options.enable must be a boolean|bigint cannot be converted/],
  ['new DistributedOptimizer(rrefs[0])', (f, v) => new d.DistributedOptimizer(f.rpc, 'SGD', [v], { lr: 0.1 }), 'TypeError', /rrefs\[0\] must be an RRef/],
];
for (const [entry, call, name, fragment] of OTHER_POSITIONS) {
  for (const [label, make] of [
    ['the string "1"', () => '1'],
    ['null', () => null],
    ['1.5', () => 1.5],
    ['NaN', () => NaN],
    ['[]', () => []],
    ['{}', () => ({})],
    ['a Date', () => new Date(1)],
    ['a bigint', () => 1n],
  ]) {
    if (entry.startsWith('RpcWorld.remote') && label === 'the string "1"') continue; // a worker name
    add('typed argument', entry, label, (f) => call(f, make()), name, fragment);
  }
}

// Booleans where flags go.
const BAD_FLAGS = [
  ["'no'", () => 'no'],
  ['1', () => 1],
  ['0', () => 0],
  ['{}', () => ({})],
  ["'false'", () => 'false'],
];
for (const [entry, call] of [
  ['new PostLocalSGDState(postLocalGradientAllreduce)', (f, v) => new d.PostLocalSGDState(f.world, null, 1, v)],
  ['ZeroRedundancyOptimizer.setRequiresGrad(requiresGrad)', (f, v) => f.zero.setRequiresGrad(0, v)],
]) {
  for (const [label, make] of BAD_FLAGS) {
    add('boolean argument', entry, label, (f) => call(f, make()), 'TypeError', /must be a boolean/);
  }
}

// Values the module must never read half-way: exotic objects where data goes.
function throwingData() {
  return {
    dtype: 'float32',
    shape: [2],
    get data() {
      throw new RangeError('mine');
    },
  };
}
function throwingIndexProxy() {
  return new Proxy([7, 7], {
    get(target, key) {
      if (key === '1') throw new Error('boom');
      return Reflect.get(target, key);
    },
  });
}
function cyclic() {
  const o = { dtype: 'float32', shape: [2] };
  o.data = [1, o];
  return o;
}
const EXOTIC = [
  ['a throwing data getter', throwingData, 'TypeError', /could not be read: reading it threw RangeError: mine/],
  ['a Proxy throwing on index access', throwingIndexProxy, 'TypeError', /could not be read: reading it threw Error: boom/],
  ['a revoked Proxy', revokedProxy, 'TypeError', /could not be read/],
  ['a detached Float32Array', () => detached(2), 'TypeError', /detached/],
  ['{data: detached}', () => ({ dtype: 'float32', shape: [2], data: detached(2) }), 'TypeError', /detached/],
  ['a cyclic object', cyclic, 'ValueError', /cyclic/],
];
const TENSOR_POSITIONS = [
  ['Replicas.setParam(value)', (f, v) => f.replicas.setParam(0, 0, v)],
  ['Replicas.setParams(params[1])', (f, v) => f.replicas.setParams(0, [[9, 9], v])],
  ['Replicas.setGrad(grad)', (f, v) => f.replicas.setGrad(0, 0, v)],
  ['Replicas.setGrads(grads[1])', (f, v) => f.replicas.setGrads(1, [[9, 9], v])],
  ['new Replicas(perRank[1][0])', (f, v) => new d.Replicas([[[1, 2]], [v]])],
  ['Replicas.replicate(params[0])', (f, v) => d.Replicas.replicate(2, [v])],
  ['tensor(values)', (f, v) => d.tensor('float32', [2], v)],
  ['tensorValues(tensor)', (f, v) => d.tensorValues(v)],
  ['sgdStep(parameterReplicas[0][0])', (f, v) => d.sgdStep([[v]], [[null]], 0.1)],
  ['sgdStep(gradientReplicas[0][0])', (f, v) => d.sgdStep([[[1, 2]]], [[v]], 0.1)],
  ['RpcWorld.remote(tensor)', (f, v) => f.rpc.remote('w0', v)],
  ['SGD.loadStateDict(stateDict.state)', (f, v) => f.sgd.loadStateDict(0, { state: { 0: { momentum_buffer: v } }, param_groups: [] })],
  ['new SGD(options)', (f, v) => new d.SGD(f.replicas, { lr: 0.1, momentum: v })],
  ['new Trainer(settings.task)', (f, v) => new d.Trainer({ ranks: 2, task: v })],
];
for (const [entry, call] of TENSOR_POSITIONS) {
  for (const [label, make, name, fragment] of EXOTIC) {
    add('exotic value', entry, label, (f) => call(f, make()), name, fragment);
  }
}

// A user's own exception from an options getter, named and wrapped.
for (const [entry, call] of [
  ['new SGD(options)', (f, o) => new d.SGD(f.replicas, o)],
  ['new Adam(options)', (f, o) => new d.Adam(f.replicas, o)],
  ['new AdamW(options)', (f, o) => new d.AdamW(f.replicas, o)],
  ['new ZeroRedundancyOptimizer(options)', (f, o) => new d.ZeroRedundancyOptimizer(f.world, f.replicas, null, 'SGD', o)],
  ['new DistributedOptimizer(options)', (f, o) => new d.DistributedOptimizer(f.rpc, 'SGD', [f.rref], o)],
  ['new Join(options)', (f, o) => new d.Join([f.ddp], o)],
  ['new Trainer(settings)', (f, o) => new d.Trainer(o)],
  ['init(options)', (f, o) => d.default(o)],
]) {
  add('throwing options getter', entry, 'a getter that throws', (f) => call(f, { get lr() { throw new SyntaxError('own'); }, get ranks() { throw new SyntaxError('own'); }, get backend() { throw new SyntaxError('own'); }, get enable() { throw new SyntaxError('own'); } }), 'TypeError', /reading it threw SyntaxError: own/);
}

// Options: NaN/Infinity readably, PyTorch's text where it has one; huge strings cut.
// PyTorch's checks are comparisons: SGD's `lr < 0.0` and `momentum < 0.0` let NaN and +inf
// through, Adam's `not 0.0 <= lr` refuses NaN only. Where PyTorch accepts, so does distopt (the
// test below, 'non-finite options PyTorch accepts').
for (const [cls, Ctor] of [['Adam', d.Adam], ['AdamW', d.AdamW]]) {
  add('non-finite option', `new ${cls}(options)`, 'lr NaN', (f) => new Ctor(f.replicas, { lr: NaN }), 'ValueError', /^Invalid learning rate: nan$/);
}
for (const [cls, Ctor] of [['SGD', d.SGD], ['Adam', d.Adam], ['AdamW', d.AdamW]]) {
  add('non-finite option', `new ${cls}(options)`, 'weight_decay -Infinity', (f) => new Ctor(f.replicas, { lr: 0.1, weight_decay: -Infinity }), 'ValueError', /^Invalid weight_decay value: -inf$/);
  add('huge string', `new ${cls}(options)`, 'a 10 MB lr string', (f) => new Ctor(f.replicas, { lr: 'x'.repeat(10_000_000) }), 'TypeError', /lr/);
}
add('non-finite option', 'new Adam(options)', 'betas[1] NaN', (f) => new d.Adam(f.replicas, { lr: 0.1, betas: [0.9, NaN] }), 'ValueError', /^Invalid beta parameter at index 1: nan$/);
add('non-finite option', 'new Adam(options)', 'eps NaN', (f) => new d.Adam(f.replicas, { lr: 0.1, eps: NaN }), 'ValueError', /^Invalid epsilon value: nan$/);
add('non-finite option', 'new SGD(options)', 'momentum -Infinity', (f) => new d.SGD(f.replicas, { lr: 0.1, momentum: -Infinity }), 'ValueError', /^Invalid momentum value: -inf$/);
add('non-finite option', 'new ZeroRedundancyOptimizer(options)', 'Adam lr NaN', (f) => new d.ZeroRedundancyOptimizer(f.world, f.replicas, null, 'Adam', { lr: NaN }), 'ValueError', /Invalid learning rate: nan/);
add('non-finite option', 'new Trainer(settings)', 'lr NaN', () => new d.Trainer({ ranks: 2, lr: NaN }), 'ValueError', /^'lr' must be finite, got NaN$/);
add('non-finite option', 'new Trainer(settings)', 'task.heterogeneity Infinity', () => new d.Trainer({ ranks: 2, task: { heterogeneity: Infinity } }), 'ValueError', /^task setting 'heterogeneity' must be finite, got Infinity$/);
add('huge string', 'new World(size)', 'a 10 MB string', () => new d.World('y'.repeat(10_000_000)), 'TypeError', /must be an integer, got a string \("y{64}…/);

// ArrayBuffers (Trainer.parseDigits takes the file's bytes): a detached one is named.
function detachedBuffer() {
  const b = new ArrayBuffer(8);
  structuredClone(b, { transfer: [b] });
  return b;
}
add('exotic value', 'Trainer.parseDigits(bytes)', 'a detached ArrayBuffer', () => d.Trainer.parseDigits(detachedBuffer()), 'TypeError', /ArrayBuffer that is detached/);
add('exotic value', 'Trainer.parseDigits(bytes)', 'a revoked Proxy', () => d.Trainer.parseDigits(revokedProxy()), 'TypeError', /could not be read/);
add('exotic value', 'Trainer.parseDigits(bytes)', 'an empty ArrayBuffer', () => d.Trainer.parseDigits(new ArrayBuffer(0)), 'ValueError', /./);

// Wrong and freed receivers.
const RECEIVERS = [
  ['Replicas.prototype.numel', () => d.Replicas.prototype.numel, ['replicas', 'world'], [0]],
  ['Replicas.prototype.setParam', () => d.Replicas.prototype.setParam, ['replicas', 'sgd'], [0, 0, [9, 9]]],
  ['Replicas.prototype.param', () => d.Replicas.prototype.param, ['replicas', 'zero'], [0, 0]],
  ['SGD.prototype.step', () => d.SGD.prototype.step, ['sgd', 'adam'], []],
  ['SGD.prototype.paramGroups', () => d.SGD.prototype.paramGroups, ['sgd', 'adamw'], []],
  ['Adam.prototype.step', () => d.Adam.prototype.step, ['adam', 'sgd'], []],
  ['World.prototype.groupOf', () => d.World.prototype.groupOf, ['world', 'replicas'], [0]],
  ['PeriodicModelAverager.prototype.averageParameters', () => d.PeriodicModelAverager.prototype.averageParameters, ['periodic', 'hierarchical'], [null]],
  ['ZeroRedundancyOptimizer.prototype.step', () => d.ZeroRedundancyOptimizer.prototype.step, ['zero', 'sgd'], []],
  ['Trainer.prototype.step', () => d.Trainer.prototype.step, ['trainer', 'world'], []],
  ['RpcWorld.prototype.remote', () => d.RpcWorld.prototype.remote, ['rpc', 'world'], ['w0', [1]]],
  ['World size getter', () => Object.getOwnPropertyDescriptor(d.World.prototype, 'size').get, ['world', 'replicas'], []],
];
for (const [entry, method, [own, other], args] of RECEIVERS) {
  add('wrong receiver', entry, `called on a ${other}`, (f) => method().apply(f[other], args), 'TypeError', /must be called on a/);
  add('wrong receiver', entry, 'called on a plain object', () => method().apply({ __wbg_ptr: 8 }, args), 'TypeError', /must be called on a/);
  add('wrong receiver', entry, `called on a Proxy of a ${own}`, (f) => method().apply(new Proxy(f[own], {}), args), 'TypeError', /Proxy or copy/);
  add('wrong receiver', entry, 'called on undefined', () => method().apply(undefined, args), 'TypeError', /must be called on a/);
}
// Distopt objects as arguments: a Proxy or the wrong class.
add('wrong object argument', 'new SGD(replicas)', 'a Proxy of a Replicas', (f) => new d.SGD(new Proxy(f.replicas, {}), { lr: 0.1 }), 'TypeError', /not a Replicas made by distopt/);
add('wrong object argument', 'new SGD(replicas)', 'a World', (f) => new d.SGD(f.world, { lr: 0.1 }), 'TypeError', /replicas must be a Replicas/);
add('wrong object argument', 'Replicas.broadcastParams(world)', 'a Replicas', (f) => f.replicas.broadcastParams(f.replicas, 0), 'TypeError', /world must be a World/);
add('wrong object argument', 'new PostLocalSGDOptimizer(optim)', 'a World', (f) => new d.PostLocalSGDOptimizer(f.world, f.periodic), 'TypeError', /optim must be/);
add('wrong object argument', 'new DistributedDataParallel(world)', 'a Proxy of a World', (f) => new d.DistributedDataParallel(new Proxy(f.world, {}), f.replicas), 'TypeError', /not a World made by distopt/);

// Wrong values the library (or PyTorch) rejects.
// PyTorch's own validation (torch/optim/optimizer.py), in the library so every front end has it.
add('silently wrong answer', 'SGD.addParamGroup', 'a parameter another group holds', (f) => f.sgd.addParamGroup({ params: [0], lr: 0.5 }), 'ValueError', /^some parameters appear in more than one parameter group$/);
add('silently wrong answer', 'Adam.addParamGroup', 'a parameter another group holds', (f) => f.adam.addParamGroup({ params: [0] }), 'ValueError', /^some parameters appear in more than one parameter group$/);
add('silently wrong answer', 'new SGD(paramGroups)', 'one parameter in two groups', (f) => new d.SGD(f.replicas, { lr: 0.1 }, [{ params: [0] }, { params: [0, 1] }]), 'ValueError', /^some parameters appear in more than one parameter group$/);
add('silently wrong answer', 'new SGD(paramGroups)', 'an empty parameter list', (f) => new d.SGD(f.replicas, { lr: 0.1 }, []), 'ValueError', /^optimizer got an empty parameter list$/);
// (Both optimizers over the same parameters, so that only the class differs.)
add('silently wrong answer', 'SGD.loadStateDict', "Adam's state dict", async (f) => f.sgd.loadStateDict(0, await new d.Adam(f.replicas, { lr: 0.1 }).stateDict(0)), 'ValueError', /cannot load a state dict of Adam into SGD/);
add('silently wrong answer', 'Adam.loadStateDict', "SGD's state dict", async (f) => new d.Adam(f.replicas, { lr: 0.1 }).loadStateDict(0, await f.sgd.stateDict(0)), 'ValueError', /cannot load a state dict of SGD into Adam/);
add('silently wrong answer', 'Replicas.broadcastParams(world)', 'a world of 3 ranks', (f) => f.replicas.broadcastParams(new d.World(3), 0), 'ValueError', /the world has 3 ranks but the replicas hold 2/);
add('silently wrong answer', 'Trainer.defaultHierarchy', 'period 0', () => d.Trainer.defaultHierarchy(0, 4), 'ValueError', /period must be a positive integer/);
add('silently wrong answer', 'Trainer.defaultHierarchy', 'ranks 0', () => d.Trainer.defaultHierarchy(2, 0), 'ValueError', /ranks must be a positive integer/);
add('silently wrong answer', 'new SGD', 'an empty parameter list', () => new d.SGD(d.Replicas.replicate(1, []), { lr: 0.1 }), 'ValueError', /optimizer got an empty parameter list/);
add('silently wrong answer', 'PostLocalSGDOptimizer.loadStateDict', 'step 2.9', async () => {
  const r = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const post = new d.PostLocalSGDOptimizer(new d.SGD(r, { lr: 0.1 }), new d.PeriodicModelAverager(2, 0, fx.world));
  const sd = await post.stateDict(0);
  sd.step = 2.9;
  try {
    post.loadStateDict(0, sd);
  } finally {
    assert.equal(post.averagerStep, 0, 'a refused load changed the step');
  }
}, 'ValueError', /"step" must be a non-negative integer, got 2.9/);

// Transactional mutators: a failure part-way leaves every rank and parameter as it was.
add('transactional mutator', 'Replicas.setParams', 'second tensor of the wrong shape', (f) => f.replicas.setParams(0, [[9, 9], [9]]), 'ValueError', /shape|size|numel|elements/);
add('transactional mutator', 'Replicas.setGrads', 'second gradient of the wrong shape', (f) => f.replicas.setGrads(1, [[9, 9], [9]]), 'ValueError', /shape|size|numel|elements/);
add('transactional mutator', 'Replicas.setParams', 'too few tensors', (f) => f.replicas.setParams(0, [[9, 9]]), 'ValueError', /2|param/);

// Reads racing writes: a write while a read is pending is refused; the read sees the old value.
for (const [entry, write] of [
  ['setParam', (f) => f.replicas.setParam(0, 0, [9, 9])],
  ['setParams', (f) => f.replicas.setParams(0, [[9, 9], [9, 9, 9]])],
  ['setGrad', (f) => f.replicas.setGrad(0, 0, [9, 9])],
  ['setGrads', (f) => f.replicas.setGrads(0, [null, null])],
  ['zeroGrad', (f) => f.replicas.zeroGrad()],
  ['SGD.step', (f) => f.sgd.step()],
]) {
  for (const [read, start] of [
    ['param', (f) => f.replicas.param(0, 0)],
    ['params', (f) => f.replicas.params()],
    ['grad', (f) => f.replicas.grad(0, 0)],
  ]) {
    add('read racing a write', `Replicas.${read} then ${entry}`, 'write while the read is pending', async (f) => {
      const pending = start(f);
      try {
        write(f);
      } finally {
        const value = await within(pending, 'the pending read');
        const data = read === 'params' ? value[0][0].data : value.data;
        assert.deepEqual(Array.from(data), read === 'grad' ? [0.5, 0.5] : P0, 'the pending read saw the write');
      }
    }, 'RuntimeError', /busy/);
  }
}

// ---------------------------------------------------------------------------------------------
// Running the in-process cases

test(`misuse: ${cases.length} in-process cases, each a named error and a usable object`, async () => {
  assert.ok(cases.length >= 300, `only ${cases.length} cases`);
  const failures = [];
  for (const c of cases) {
    try {
      const e = await caught(() => c.call(fx), c.label);
      checkNamed(e, c.name, c.fragment, c.label);
      await checkUsable(`after ${c.label}`);
      count(c.klass, c.entry);
    } catch (e) {
      failures.push(`${c.label}: ${e.message}`);
      fx = makeFixture();
    }
  }
  for (const f of failures) console.log(`FAILED ${f.split('\n')[0]}`);
  assert.deepEqual(failures, [], `${failures.length} of ${cases.length} cases failed`);
});

test('misuse: -0 is 0 where a count goes, as everywhere in JS', async () => {
  const t = new d.Trainer({ ranks: 2, seed: -0, warmup: -0, task: { samples: 8, seed: -0 } });
  assert.equal(t.ranks, 2);
  t.free();
  const r = d.Replicas.replicate(2, [new Float32Array(P0)]);
  r.broadcastParams(new d.World(2), -0);
  r.broadcastParams(new d.World(2));
  assert.deepEqual(Array.from((await r.param(1, 0)).data), P0);
  count('integer argument', '-0 accepted');
});

test('misuse: non-finite options PyTorch accepts are accepted, as PyTorch does', async () => {
  // SGD(lr=nan), SGD(lr=inf), SGD(momentum=nan), Adam(lr=inf): PyTorch's comparisons let these
  // through, and the optimizer keeps the value it was given (a state dict writes non-finite
  // numbers as the golden files do: "nan", "inf").
  const replicas = d.Replicas.replicate(2, [[1, 2]]);
  const group = async (o) => (await o.stateDict(0)).param_groups[0];
  assert.equal((await group(new d.SGD(replicas, { lr: NaN }))).lr, 'nan');
  assert.equal((await group(new d.SGD(replicas, { lr: Infinity }))).lr, 'inf');
  assert.equal((await group(new d.SGD(replicas, { lr: 0.1, momentum: NaN }))).momentum, 'nan');
  assert.equal((await group(new d.Adam(replicas, { lr: Infinity }))).lr, 'inf');
  assert.equal((await group(new d.AdamW(replicas, { lr: Infinity }))).lr, 'inf');
  replicas.free();
});

test('misuse: console.warn that throws while distopt warns does not leave an object busy', async () => {
  const r = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const post = new d.PostLocalSGDOptimizer(new d.SGD(r, { lr: 0.1 }), new d.PeriodicModelAverager(2, 0, fx.world));
  const sd = await post.stateDict(0);
  delete sd.step;
  const warn = console.warn;
  console.warn = () => {
    throw new Error('warnings are failures here');
  };
  try {
    post.loadStateDict(0, sd); // warns that "step" is missing
  } finally {
    console.warn = warn;
  }
  d.takeWarnings();
  assert.equal(post.averagerStep, 0);
  // Nothing stayed borrowed: the replicas and the optimizer still change and step.
  r.setParam(0, 0, [7, 7]);
  assert.deepEqual(Array.from((await r.param(0, 0)).data), [7, 7]);
  r.setGrads(0, [[1, 1]]);
  r.setGrads(1, [[1, 1]]);
  post.step();
  assert.equal(post.averagerStep, 1);
  count('console.warn throws', 'PostLocalSGDOptimizer.loadStateDict');
});

test('misuse: a freed receiver or argument is a TypeError, freeing twice is harmless', () => {
  const w = new d.World(2);
  const r = d.Replicas.replicate(2, [new Float32Array(P0)]);
  r.free();
  r.free();
  for (const [label, f, fragment] of [
    ['numel', () => r.numel(0), /was freed/],
    ['param', () => r.param(0, 0), /was freed/],
    ['ranks getter', () => r.ranks, /was freed/],
    ['as an argument', () => new d.SGD(r, { lr: 0.1 }), /freed/],
  ]) {
    const e = (() => {
      try {
        f();
      } catch (err) {
        return err;
      }
      assert.fail(`${label}: no error`);
    })();
    checkNamed(e, 'TypeError', fragment, `freed: ${label}`);
    count('freed object', `Replicas ${label}`);
  }
  assert.equal(w.size, 2);
});

test('misuse: sgdStep always settles (rejects) on exotic input', async () => {
  for (const [label, make] of EXOTIC) {
    const e = await caught(() => d.sgdStep([[make()]], [[null]], 0.1), `sgdStep ${label}`);
    assert.ok(['TypeError', 'ValueError'].includes(e.name), `${label}: ${e.name}`);
    count('sgdStep settles', `sgdStep(${label})`);
  }
  const ok = await d.sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
  assert.deepEqual(Array.from(ok.meanGradients[0].data), [3, 5]);
});

// ---------------------------------------------------------------------------------------------
// Identity: only an object distopt made passes as one (issue 23, 3b). A plain object carrying a
// class's internal hand-over method (copied from a genuine object, with or without wasm-bindgen's
// pointer) is a TypeError, at the argument layer and, under it, in the module itself.

test('misuse: a plain object carrying an internal method is not taken for the object it came from', async () => {
  const w = new d.World(2);
  const r = d.Replicas.replicate(2, [new Float32Array(P0)]);
  const sgd = new d.SGD(r, { lr: 0.1 });
  const avg = new d.PeriodicModelAverager(2, 0, w);
  const zero = new d.ZeroRedundancyOptimizer(w, d.Replicas.replicate(2, [new Float32Array(P0)]), null, 'SGD', { lr: 0.1 });
  const ddp = new d.DistributedDataParallel(w, d.Replicas.replicate(2, [new Float32Array(P0)]));
  const rpc = new d.RpcWorld(['w0']);
  const rref = rpc.remote('w0', new Float32Array(P0));
  const ctx = rpc.context();
  const fake = (field, method) => [
    [`{${field}}`, { [field]: method }],
    [`{${field}, __wbg_ptr}`, { [field]: method, __wbg_ptr: 8 }],
  ];
  const cases = [
    ['Replicas.broadcastParams(world)', '__distoptWorld', w.__distoptWorld, (v) => r.broadcastParams(v, 0), /world is not a World made by distopt/],
    ['new PeriodicModelAverager(world)', '__distoptWorld', w.__distoptWorld, (v) => new d.PeriodicModelAverager(2, 0, v), /world is not a World made by distopt/],
    ['new SGD(replicas)', '__distoptReplicas', r.__distoptReplicas, (v) => new d.SGD(v, { lr: 0.1 }), /replicas is not a Replicas made by distopt/],
    ['new PostLocalSGDOptimizer(optim)', '__distoptOptimizer', sgd.__distoptOptimizer, (v) => new d.PostLocalSGDOptimizer(v, avg), /optim is not an SGD, Adam or AdamW made by distopt/],
    ['new PostLocalSGDOptimizer(averager)', '__distoptAverager', avg.__distoptAverager, (v) => new d.PostLocalSGDOptimizer(sgd, v), /averager is not a PeriodicModelAverager or HierarchicalModelAverager made by distopt/],
    ['new Join(joinables[0])', '__distoptDdp', ddp.__distoptDdp, (v) => new d.Join([v]), /joinables\[0\] is not a DistributedDataParallel made by distopt/],
    ['new Join(joinables[0]) (ZeRO)', '__distoptZero', zero.__distoptZero, (v) => new d.Join([v]), /joinables\[0\] is not a ZeroRedundancyOptimizer made by distopt/],
    ['new DistributedOptimizer(rpcWorld)', '__distoptRpcWorld', rpc.__distoptRpcWorld, (v) => new d.DistributedOptimizer(v, 'SGD', [rref]), /rpcWorld is not an RpcWorld made by distopt/],
    ['RRef.toHere → RpcWorld.gradOf(rref)', '__distoptRRef', rref.__distoptRRef, (v) => rpc.gradOf(v), /rref is not an RRef made by distopt/],
    ['RpcWorld.getGradients(contextId)', '__distoptContext', ctx.__distoptContext, (v) => rpc.getGradients(v, 'w0'), /context is not an AutogradContext made by distopt/],
  ];
  for (const [entry, field, method, call, fragment] of cases) {
    assert.equal(typeof method, 'function', `${entry}: the genuine object's ${field}`);
    for (const [label, value] of fake(field, method)) {
      const e = await caught(() => call(value), `${entry}: ${label}`);
      checkNamed(e, 'TypeError', fragment, `${entry}: ${label}`);
      count('genuine object', entry);
    }
  }
  // A plain {id} is no AutogradContext either (a number or a genuine context is).
  const e = await caught(() => rpc.getGradients({ id: ctx.id }, 'w0'), 'getGradients({id})');
  checkNamed(e, 'TypeError', /contextId must be a context id \(a non-negative integer\) or an AutogradContext, got an object/, 'getGradients({id})');
  assert.equal((await rpc.getGradients(ctx, 'w0')).size, 0);
  assert.equal((await rpc.getGradients(ctx.id, 'w0')).size, 0);
  count('genuine object', 'RpcWorld.getGradients({id})');

  // Under the argument layer, the module itself: a method inherited from a polluted
  // Object.prototype passes the argument layer (no own internal field), not the module.
  for (const [label, fields] of [
    ['the method', { __distoptWorld: w.__distoptWorld }],
    ['the method and a pointer', { __distoptWorld: w.__distoptWorld, __wbg_ptr: 8 }],
  ]) {
    for (const [key, value] of Object.entries(fields)) {
      Object.defineProperty(Object.prototype, key, { value, configurable: true, writable: true });
    }
    try {
      const e = await caught(() => r.broadcastParams({}, 0), `Object.prototype carrying ${label}`);
      checkNamed(e, 'TypeError', /^world must be a World \(and not freed\)$/, `Object.prototype carrying ${label}`);
    } finally {
      for (const key of Object.keys(fields)) delete Object.prototype[key];
    }
    count('genuine object', 'the module itself');
  }
  // Genuine objects still pass, and nothing changed.
  r.broadcastParams(w, 0);
  assert.deepEqual(Array.from((await r.param(1, 0)).data), P0);
  count('genuine object', 'the module (glue) itself');
});

// ---------------------------------------------------------------------------------------------
// Reads see the data as of the call (issue 23, 3c): an asynchronous read requested before a
// change resolves to what was there when it was called (as Replicas reads do), and an
// asynchronous change takes effect in call order, before the calls that follow it.

function steppable(ranks = 2) {
  const r = d.Replicas.replicate(ranks, [new Float32Array(P0)]);
  for (let rank = 0; rank < ranks; rank++) r.setGrads(rank, [new Float32Array([1, 1])]);
  return r;
}

test('misuse: an optimizer state dict requested before a step is the state before it', async () => {
  for (const [Ctor, options, key] of [
    [d.SGD, { lr: 0.1, momentum: 0.9 }, 'momentum_buffer'],
    [d.Adam, { lr: 0.1 }, 'exp_avg'],
    [d.AdamW, { lr: 0.1 }, 'exp_avg'],
  ]) {
    const r = steppable();
    const opt = new Ctor(r, options);
    const before = opt.stateDict(0);
    opt.step();
    const sd = await within(before, `${Ctor.name}.stateDict`);
    assert.deepEqual(Object.keys(sd.state), [], `${Ctor.name}: the state dict asked for before the step holds the step's state`);
    const after = await opt.stateDict(0);
    assert.ok(after.state['0'][key], `${Ctor.name}: the step made ${key}`);
    count('read as of the call', `${Ctor.name}.stateDict`);
  }
});

test('misuse: PostLocalSGDOptimizer and DiLoCo state dicts requested before a step are the state before it', async () => {
  const w = new d.World(2);
  {
    const r = steppable();
    const post = new d.PostLocalSGDOptimizer(new d.SGD(r, { lr: 0.1, momentum: 0.9 }), new d.PeriodicModelAverager(2, 0, w));
    const before = post.stateDict(0);
    post.step();
    const sd = await within(before, 'PostLocalSGDOptimizer.stateDict');
    assert.equal(sd.step, 0, 'the averager step before the step');
    assert.deepEqual(Object.keys(sd.state), []);
    assert.equal((await post.stateDict(0)).step, 1);
    count('read as of the call', 'PostLocalSGDOptimizer.stateDict');
  }
  {
    const r = steppable();
    const diloco = new d.DiLoCo(new d.SGD(r, { lr: 0.1 }), new d.SGD(r, { lr: 0.7 }), 4, w);
    const before = diloco.stateDict(0);
    diloco.step();
    const sd = await within(before, 'DiLoCo.stateDict');
    assert.equal(sd.local_step, 0, 'the local step before the step');
    assert.equal((await diloco.stateDict(0)).local_step, 1);
    count('read as of the call', 'DiLoCo.stateDict');
  }
});

test('misuse: ZeRO consolidates the state as of the call, and addParamGroup takes effect in call order', async () => {
  const w = new d.World(2);
  {
    const zero = new d.ZeroRedundancyOptimizer(w, steppable(), null, 'SGD', { lr: 0.1, momentum: 0.9 });
    const consolidated = zero.consolidateStateDict(0);
    zero.step();
    await within(consolidated, 'consolidateStateDict');
    const sd = await zero.stateDict(0);
    assert.deepEqual(Object.keys(sd.state), [], 'the consolidation asked for before the step holds its momentum');
    await zero.consolidateStateDict(0);
    assert.ok((await zero.stateDict(0)).state['0'].momentum_buffer, 'a consolidation after the step has it');
    count('read as of the call', 'ZeroRedundancyOptimizer.consolidateStateDict');
  }
  {
    const r = d.Replicas.replicate(2, [new Float32Array(P0), new Float32Array(P1)]);
    const zero = new d.ZeroRedundancyOptimizer(w, r, [0], 'SGD', { lr: 0.1 });
    const added = zero.addParamGroup({ params: [1], lr: 0.5 });
    assert.deepEqual(zero.paramGroups(), [[0], [1]], 'the group is there right after the call');
    await within(added, 'addParamGroup');
    count('read as of the call', 'ZeroRedundancyOptimizer.addParamGroup');
  }
});

test('misuse: DistributedOptimizer.step takes effect in call order, with the gradients recorded before it', async () => {
  const rpc = new d.RpcWorld(['w0']);
  const rref = rpc.remote('w0', new Float32Array([1, 2]));
  const dopt = new d.DistributedOptimizer(rpc, 'SGD', [rref], { lr: 0.5 });
  const ctx = rpc.context();
  await rpc.recordGradient(ctx, rref, new Float32Array([2, 2]));
  const stepped = dopt.step(ctx);
  // Called after the step: they see it, and do not reach it.
  const value = rref.toHere();
  const later = rpc.recordGradient(ctx, rref, new Float32Array([100, 100]));
  await within(stepped, 'DistributedOptimizer.step');
  await later;
  assert.deepEqual(Array.from((await value).data), [0, 1], 'toHere() called after step() sees the step');
  assert.deepEqual(Array.from((await rref.toHere()).data), [0, 1], 'the step used only the gradient recorded before it');
  count('read as of the call', 'DistributedOptimizer.step');
});

test('misuse: sgdStep reads its typed arrays when it is called', async () => {
  const p = new Float32Array([1, 2]);
  const g = new Float32Array([2, 4]);
  const pending = d.sgdStep([[p]], [[g]], 0.5);
  g[0] = 100;
  p[1] = 100;
  const out = await within(pending, 'sgdStep');
  assert.deepEqual(Array.from(out.meanGradients[0].data), [2, 4]);
  assert.deepEqual(Array.from(out.updatedReplicas[0][0].data), [0, 0]);
  count('read as of the call', 'sgdStep');
});

// ---------------------------------------------------------------------------------------------
// Risky cases, each in its own process: a trap or an abort there cannot take this one down.

const ENTRY = pathToFileURL(path.join(PACKAGE, 'index.js')).href;
const CHILD_CASES = [
  ['before init', 'new World(2) before init()', 'const w = new d.World(2);', 'RuntimeError', /init\(\) first/, false],
  ['before init', 'sgdStep before init()', 'await d.sgdStep([[[1]]], [[null]], 0.1);', 'RuntimeError', /init\(\) first/, false],
  ['before init', 'tensorValues before init()', 'd.tensorValues([1]);', 'RuntimeError', /init\(\) first/, false],
  ['memory budget', 'tensorValues of a 2 GiB Float32Array', 'd.tensorValues(new Float32Array(2 ** 29));', 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'tensor(): a 2 GiB Float32Array', "d.tensor('float32', [2 ** 29], new Float32Array(2 ** 29));", 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'Replicas.replicate of a 2 GiB parameter', 'd.Replicas.replicate(1, [new Float32Array(2 ** 29)]);', 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'RpcWorld.remote of a 2 GiB tensor', "new d.RpcWorld(['a']).remote('a', new Float32Array(2 ** 29));", 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'Replicas.replicate: the fourth live 1 GiB Replicas', 'const keep = []; for (let i = 0; i < 4; i++) keep.push(d.Replicas.replicate(2, [new Float32Array(2 ** 26)]));', 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'StepBench.create(1, 2**28)', 'await d.StepBench.create(1, 2 ** 28);', 'RuntimeError', /out of memory|not enough memory/, true],
  ['memory budget', 'sgdStep with 2 ranks x 2^27 float32', 'const p = new Float32Array(2 ** 27); await d.sgdStep([[p], [p]], [[p], [p]], 0.1);', 'RuntimeError', /out of memory|not enough memory/, true],
  // Plain arrays are refused by their length before they are iterated (issue 23, 3a): a sparse
  // array of 2^32 - 1 holes would otherwise keep the call busy for minutes.
  ...[
    ['sgdStep: tensor data a sparse array of length 2^32-1', "await d.sgdStep([[{ dtype: 'float32', shape: [2 ** 32 - 1], data: new Array(2 ** 32 - 1) }]], [[null]], 0.1);"],
    ['sgdStep: a parameter a sparse array of length 2^32-1', 'await d.sgdStep([[new Array(2 ** 32 - 1)]], [[null]], 0.1);'],
    ['sgdStep: parameterReplicas a sparse array of length 2^32-1', 'await d.sgdStep(new Array(2 ** 32 - 1), new Array(2 ** 32 - 1), 0.1);'],
    ['Replicas.setParam: a sparse array of length 2^28', 'd.Replicas.replicate(1, [[1, 2]]).setParam(0, 0, new Array(2 ** 28));'],
    ['new SGD: an options list of length 2^32-1', "new d.SGD(d.Replicas.replicate(1, [[1]]), { lr: 0.1, betas: new Array(2 ** 32 - 1) });"],
  ].map(([label, body]) => ['memory budget', label, `const t0 = Date.now(); try { ${body} } finally { if (Date.now() - t0 > 5000) console.log('SLOW ' + (Date.now() - t0) + ' ms'); }`, 'RuntimeError', /out of memory: .* is an array of \d+ elements/, true]),
];

test(`misuse: ${CHILD_CASES.length} risky cases, each in its own process`, () => {
  const failures = [];
  for (const [klass, label, body, name, fragment, initFirst] of CHILD_CASES) {
    const script = `
      const d = await import(${JSON.stringify(ENTRY)});
      ${initFirst ? "await d.default({ backend: 'cpu' });" : ''}
      try {
        ${body}
        console.log('NO ERROR');
      } catch (e) {
        console.log('NAMED ' + e.name + ' ' + e.message);
      }
      ${initFirst ? "const w = new d.World(3); console.log('USABLE ' + w.size + ' ' + d.tensorValues(d.tensor('float32', [2], [1, 2])).join(','));" : ''}
    `;
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    const out = `${child.stdout}\n${child.stderr}`;
    const named = /NAMED (\S+) (.*)/.exec(child.stdout);
    try {
      assert.equal(child.status, 0, `exit ${child.status} ${child.signal || ''}: ${out.slice(-400)}`);
      assert.ok(named, `no error: ${out.slice(-400)}`);
      assert.equal(named[1], name, named[0]);
      assert.match(named[2], fragment, named[0]);
      assert.doesNotMatch(named[2], /trapped|unreachable|capacity overflow/, named[0]);
      assert.doesNotMatch(child.stdout, /^SLOW /m, `refused, but only after a while: ${out.slice(-400)}`);
      if (initFirst) assert.match(child.stdout, /USABLE 3 1,2/, `not usable afterwards: ${out.slice(-400)}`);
      count(klass, label);
    } catch (e) {
      failures.push(`${label}: ${e.message}`);
    }
  }
  assert.deepEqual(failures, []);
});

test('misuse: Float16Array input (where the runtime has it)', { skip: typeof globalThis.Float16Array !== 'function' && 'this runtime has no Float16Array' }, () => {
  const t = d.tensor('float16', [2], new globalThis.Float16Array([1.5, -2]));
  assert.deepEqual(Array.from(d.tensorValues(t)), [1.5, -2]);
  const bare = d.tensorValues(new globalThis.Float16Array([0.5]));
  assert.deepEqual(Array.from(bare), [0.5]);
});

test('misuse: counts per class', () => {
  const byClass = new Map();
  const byEntry = new Map();
  for (const [key, n] of counts) {
    const [klass, entry] = key.split('\t');
    byClass.set(klass, (byClass.get(klass) || 0) + n);
    const cls = entry.replace(/^new /, '').split(/[.( ]/)[0];
    byEntry.set(cls, (byEntry.get(cls) || 0) + n);
  }
  const total = [...byClass.values()].reduce((a, b) => a + b, 0);
  console.log(`misuse: ${total} cases passed`);
  for (const [k, n] of [...byClass].sort((a, b) => b[1] - a[1])) console.log(`  class  ${String(n).padStart(4)}  ${k}`);
  for (const [k, n] of [...byEntry].sort((a, b) => b[1] - a[1])) console.log(`  entry  ${String(n).padStart(4)}  ${k}`);
  assert.ok(total >= 300, `${total} cases`);
});
