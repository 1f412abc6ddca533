// The TensorFlow.js bridge (examples/tfjs/bridge.mjs): TF.js computes each rank's gradients of a
// real model (a two-layer dense net, tf.variableGrads on the rank's own non-IID shard), distopt
// does the data-parallel part across R = 4 ranks. Each algorithm trains from the same start and
// the test checks that the loss on the whole data set falls, and what each algorithm promises:
// synchronous SGD and ZeRO keep the ranks identical, post-local SGD and hierarchical averaging
// let them drift between averages and send fewer bytes than synchronous SGD.

import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import * as tf from '@tensorflow/tfjs';

import { ROOT, importPackage } from './helpers.js';

const R = 4;
const STEPS = 60;
const CLASSES = 3;
const FEATURES = 8;
const PER_RANK = 96;

let api;
let bridge;

before(async () => {
  await tf.setBackend('cpu');
  api = await importPackage();
  await api.default({ backend: 'cpu' });
  bridge = await import(pathToFileURL(path.join(ROOT, 'examples/tfjs/bridge.mjs')).href);
});

/** A deterministic generator (mulberry32) and Gaussian draws. */
function rng(seed) {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const normal = () => Math.sqrt(-2 * Math.log(uniform() + 1e-12)) * Math.cos(2 * Math.PI * uniform());
  return { uniform, normal };
}

/** Three overlapping Gaussian classes in 8 dimensions; rank r's shard is skewed to class r % 3. */
function makeData() {
  const g = rng(7);
  const centers = Array.from({ length: CLASSES }, () => Array.from({ length: FEATURES }, () => 0.5 * g.normal()));
  const shards = [];
  for (let r = 0; r < R; r++) {
    const xs = [];
    const ys = [];
    for (let i = 0; i < PER_RANK; i++) {
      const c = g.uniform() < 0.6 ? r % CLASSES : Math.floor(g.uniform() * CLASSES);
      xs.push(...centers[c].map((m) => m + g.normal()));
      ys.push(c);
    }
    shards.push({ x: tf.tensor2d(xs, [PER_RANK, FEATURES]), y: tf.oneHot(tf.tensor1d(ys, 'int32'), CLASSES) });
  }
  const all = { x: tf.concat(shards.map((s) => s.x)), y: tf.concat(shards.map((s) => s.y)) };
  return { shards, all };
}

function makeModel() {
  const model = tf.sequential();
  model.add(tf.layers.dense({ inputShape: [FEATURES], units: 16, activation: 'relu', kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) }));
  model.add(tf.layers.dense({ units: CLASSES, kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }));
  return model;
}

const crossEntropy = (model, { x, y }) => tf.losses.softmaxCrossEntropy(y, model.predict(x));

/**
 * Trains with `algorithm(world, replicas)` → {before(step), after(step)} hooks around the
 * gradients. Returns the loss of every rank's model on the whole data before and after, and
 * the world's bytes.
 */
async function train(makeAlgorithm) {
  const { World, Replicas } = api;
  const { shards, all } = makeData();
  const model = makeModel();
  const vars = bridge.variablesOf(model);
  const world = new World(R);
  const replicas = bridge.replicasFor(Replicas, vars, R);
  const algorithm = makeAlgorithm(world, replicas);
  const lossOnAll = async (r) => bridge.evaluateRank(tf, vars, replicas, r, () => crossEntropy(model, all));
  const first = await lossOnAll(0);
  for (let step = 0; step < STEPS; step++) {
    algorithm.zeroGrad();
    const losses = await bridge.trainStep(tf, vars, replicas, (r) => crossEntropy(model, shards[r]));
    assert.equal(losses.length, R);
    assert.ok(losses.every(Number.isFinite));
    await algorithm.step();
  }
  const last = [];
  for (let r = 0; r < R; r++) last.push(await lossOnAll(r));
  const params = await replicas.params();
  const bytes = world.stats().totalBytes;
  return { first, last, params, bytes };
}

const identicalRanks = (params) =>
  params.every((rank) => rank.every((t, j) => t.data.every((x, i) => x === params[0][j].data[i])));

const results = {};

test('synchronous data-parallel SGD: DDP all-reduce, then SGD on every rank', async () => {
  const { DistributedDataParallel, SGD } = api;
  results.sync = await train((world, replicas) => {
    const ddp = new DistributedDataParallel(world, replicas);
    const sgd = new SGD(replicas, { lr: 0.1, momentum: 0.9 });
    return { zeroGrad: () => sgd.zeroGrad(), step: () => (ddp.synchronizeGradients(), sgd.step()) };
  });
  const { first, last, params } = results.sync;
  console.log(`sync SGD: loss ${first.toFixed(3)} → ${last.map((l) => l.toFixed(3)).join(', ')}`);
  assert.ok(last[0] < 0.7 * first, `the loss falls: ${first} → ${last[0]}`);
  assert.ok(identicalRanks(params), 'the ranks stay identical');
});

test('post-local SGD: all-reduced gradients for a warm-up, then local steps averaged every 4 (no gradient all-reduce: subgroups of 1)', async () => {
  const { PeriodicModelAverager, PostLocalSGDOptimizer, PostLocalSGDState, SGD } = api;
  results.postLocal = await train((world, replicas) => {
    const hook = new PostLocalSGDState(world, 1, 10);
    const opt = new PostLocalSGDOptimizer(new SGD(replicas, { lr: 0.1, momentum: 0.9 }), new PeriodicModelAverager(4, 10, world));
    return { zeroGrad: () => opt.zeroGrad(), step: () => (hook.synchronizeGradients(replicas), opt.step()) };
  });
  const { first, last } = results.postLocal;
  console.log(`post-local SGD: loss ${first.toFixed(3)} → ${last.map((l) => l.toFixed(3)).join(', ')}; bytes ${results.postLocal.bytes} vs ${results.sync.bytes} (sync)`);
  assert.ok(Math.max(...last) < 0.7 * first, `every rank's loss falls: ${first} → ${last}`);
  assert.ok(results.postLocal.bytes < results.sync.bytes, `fewer bytes than sync: ${results.postLocal.bytes} vs ${results.sync.bytes}`);
});

test('hierarchical model averaging: pairs every 2 steps, all 4 ranks every 4', async () => {
  const { HierarchicalModelAverager, PostLocalSGDOptimizer, SGD } = api;
  results.hierarchical = await train((world, replicas) => {
    const opt = new PostLocalSGDOptimizer(
      new SGD(replicas, { lr: 0.1, momentum: 0.9 }),
      new HierarchicalModelAverager(new Map([[2, 2], [4, 4]]), 0, world),
    );
    return { zeroGrad: () => opt.zeroGrad(), step: () => opt.step() };
  });
  const { first, last, params } = results.hierarchical;
  console.log(`hierarchical: loss ${first.toFixed(3)} → ${last.map((l) => l.toFixed(3)).join(', ')}`);
  assert.ok(Math.max(...last) < 0.7 * first, `every rank's loss falls: ${first} → ${last}`);
  assert.ok(!identicalRanks(params), 'the ranks drift between averages (the last steps were local)');
  assert.ok(results.hierarchical.bytes < results.sync.bytes);
});

test('ZeRO: all-reduced gradients, Adam state sharded over the ranks', async () => {
  const { Adam, DistributedDataParallel, ZeroRedundancyOptimizer } = api;
  let zero;
  results.zero = await train((world, replicas) => {
    const ddp = new DistributedDataParallel(world, replicas);
    zero = new ZeroRedundancyOptimizer(world, replicas, null, Adam, { lr: 0.01 });
    return { zeroGrad: () => zero.zeroGrad(), step: () => (ddp.synchronizeGradients(), zero.step()) };
  });
  const { first, last, params } = results.zero;
  console.log(`ZeRO (Adam): loss ${first.toFixed(3)} → ${last.map((l) => l.toFixed(3)).join(', ')}; state bytes per rank ${zero.stateBytesPerRank()}`);
  assert.ok(last[0] < 0.7 * first, `the loss falls: ${first} → ${last[0]}`);
  assert.ok(identicalRanks(params), 'the owners broadcast: the ranks stay identical');
  assert.ok(zero.stateBytesPerRank().filter((b) => b > 0).length > 1, 'the state is sharded over several ranks');
});
