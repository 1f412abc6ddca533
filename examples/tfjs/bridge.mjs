// The bridge between TensorFlow.js and distopt: TF.js computes each rank's gradients of a real
// model, distopt does the data-parallel part across the ranks (synchronous SGD, post-local SGD,
// hierarchical averaging, ZeRO, DiLoCo — anything that steps a `Replicas`).
//
// No dependency of its own: pass your `tf` (the `@tensorflow/tfjs` module, any backend) and
// distopt's `Replicas`. The model is one set of `tf.Variable`s reused by every rank in turn:
// before rank r's forward/backward pass its parameters are written into the variables, and
// its gradients read out of `tf.variableGrads`. See examples/tfjs/README.md for what crosses
// between the two libraries per step and what it costs.
//
//   import * as tf from '@tensorflow/tfjs';
//   import init, { Replicas, SGD, World, DistributedDataParallel } from 'distopt';
//   import { replicasFor, trainStep, variablesOf } from './bridge.mjs';
//
//   const vars = variablesOf(model);                      // a tf.LayersModel's trainable weights
//   const replicas = replicasFor(Replicas, vars, R);      // every rank starts from the same weights
//   const ddp = new DistributedDataParallel(world, replicas);
//   const sgd = new SGD(replicas, { lr: 0.1 });
//   for (let step = 0; step < steps; step++) {
//     sgd.zeroGrad();
//     const losses = await trainStep(tf, vars, replicas, (r) => lossOnShard(r, step));
//     ddp.synchronizeGradients();                         // the data-parallel all-reduce
//     sgd.step();
//   }

/** The trainable `tf.Variable`s of a `tf.LayersModel` (or a list of variables, returned as is). */
export function variablesOf(model) {
  if (Array.isArray(model)) return model;
  return model.trainableWeights.map((w) => w.val);
}

/** A tf tensor (or variable) as a distopt float32 tensor: one copy out of TF.js. */
export function toDistopt(tensor) {
  return { dtype: 'float32', shape: tensor.shape.slice(), data: Float32Array.from(tensor.dataSync()) };
}

/** Writes distopt tensors (one per variable, as `Replicas.params()` returns a rank's) into the variables. */
export function writeVariables(tf, vars, tensors) {
  if (tensors.length !== vars.length) {
    throw new RangeError(`writeVariables: ${tensors.length} tensors for ${vars.length} variables`);
  }
  tf.tidy(() => {
    vars.forEach((v, j) => v.assign(tf.tensor(tensors[j].data, v.shape, 'float32')));
  });
}

/** `Replicas` of `ranks` ranks, each a copy of the variables' current values. */
export function replicasFor(Replicas, vars, ranks) {
  return Replicas.replicate(ranks, vars.map(toDistopt));
}

/**
 * One forward/backward pass per rank: for each rank r, its parameters (read from `replicas`)
 * go into `vars`, `lossOf(r)` — a function returning rank r's scalar loss tensor on its own
 * data, computed from `vars` — is differentiated with `tf.variableGrads`, and the gradients are
 * set as rank r's in `replicas`. Resolves to each rank's loss. The caller then runs the
 * data-parallel step (all-reduce, optimizer, averaging) on `replicas`.
 */
export async function trainStep(tf, vars, replicas, lossOf, ranks = replicas.ranks) {
  const params = await replicas.params();
  const losses = [];
  for (let r = 0; r < ranks; r++) {
    writeVariables(tf, vars, params[r]);
    const { value, grads } = tf.variableGrads(() => lossOf(r), vars);
    losses.push(value.dataSync()[0]);
    replicas.setGrads(
      r,
      vars.map((v) => (grads[v.name] ? toDistopt(grads[v.name]) : null)),
    );
    value.dispose();
    for (const g of Object.values(grads)) g.dispose();
  }
  return losses;
}

/** Evaluates `lossOf()` with rank r's parameters written into the variables. */
export async function evaluateRank(tf, vars, replicas, r, lossOf) {
  const params = await replicas.params();
  writeVariables(tf, vars, params[r]);
  return tf.tidy(() => lossOf().dataSync()[0]);
}
