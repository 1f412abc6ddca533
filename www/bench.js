// The browser bench: distopt against TensorFlow.js in the same page, on the same tensors.
//
// For each work (the data-parallel SGD step, one Adam step on every rank) and each pair of
// backends (distopt WebGPU vs TF.js `webgpu`, distopt's CPU fallback vs TF.js `wasm`):
//   1. both start from the same float32 tensors (the step's are read back from distopt's
//      StepBench; Adam's are made here and handed to both);
//   2. one step each, and both answers are checked against a float64 reference computed here
//      (a peer whose answer is wrong is reported with its error, and gets no ratio);
//   3. then `repeats` timed steps each, distopt and the peer alternating, each waited for on its
//      device (distopt: `run()` / `synchronize()`; TF.js: reading one element of the result).
// GB/s count the same nominal bytes for both: (2R + 2)·N·4 for the step (what distopt's
// `bench step` counts), 7·R·N·4 for Adam (what PyTorch's peer and `bench optim` count).
//
// The step's peer is written three ways: the gradients stacked in one [R, N] tensor reduced by
// tf.mean(G, 0) ('mean'), R tensors summed by one tf.addN ('addN'), or summed pairwise by
// R − 1 tf.add ('add'); `variants` picks them.
//
// window.runBench({ranks, log2n, repeats, variants}) resolves to {env, rows}; the page runs
// itself with its query parameters (?R=8&N=20&repeats=5&variants=mean,addN,add) unless ?run=0.

import { loadDistopt } from '/load-distopt.js';

// The package's threaded build where the page is cross-origin isolated (see load-distopt.js).
const distopt = await loadDistopt(new URL('/pkg/', location.href));
const init = distopt.default;

const tf = globalThis.tf;
const LR = Math.fround(1e-3); // StepBench's learning rate, and Adam's here
const BETAS = [0.9, 0.999];
const EPS = 1e-8;
/** A float32 answer may be this far from the float64 reference (|x| ≤ ~2 here: ~16 ulps). */
const TOLERANCE = 2e-6;

const logEl = document.getElementById('log');
const log = (line) => {
  logEl.textContent = logEl.textContent === 'loading…' ? line + '\n' : logEl.textContent + line + '\n';
};

/** Deterministic float32 values in [-1, 1) (xorshift32), different per seed. */
function values(seed, n) {
  let s = (seed * 0x9e3779b1 + 0x6d2b79f5) >>> 0 || 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    out[i] = s / 2 ** 31 - 1;
  }
  return out;
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** Max |answer − reference| over every rank; `answers[r]` and `refs[r]` are arrays of N. */
function maxError(answers, refs) {
  let max = 0;
  for (let r = 0; r < refs.length; r++) {
    const a = answers[r];
    const ref = refs[r];
    if (!a || a.length !== ref.length) return Infinity;
    for (let i = 0; i < ref.length; i++) {
      const e = Math.abs(a[i] - ref[i]);
      if (!(e <= max)) max = Number.isNaN(e) ? Infinity : e;
    }
  }
  return max;
}

/** Reads one element of `t` so that every TF.js kernel queued before has finished. */
async function tfSync(t) {
  const probe = tf.tidy(() => (t.rank === 2 ? t.slice([0, 0], [1, 1]) : t.slice([0], [1])).sum());
  await probe.data();
  probe.dispose();
}

/** Splits an [R·N] Float32Array into R rows. */
function rows(flat, ranks, n) {
  return Array.from({ length: ranks }, (_, r) => flat.subarray(r * n, (r + 1) * n));
}

// --- the data-parallel step ---------------------------------------------------------------

/** distopt's resident step (StepBench) on the current backend, with its inputs read back. */
async function distoptStep(ranks, n) {
  const bench = await distopt.StepBench.create(ranks, n);
  const params = [];
  const grads = [];
  for (let r = 0; r < ranks; r++) {
    params.push(await bench.read('params', r));
    grads.push(await bench.read('grads', r));
  }
  return {
    params,
    grads,
    bytes: bench.bytes,
    backend: bench.backend.name,
    step: () => bench.run(),
    answer: async () => {
      const out = [];
      for (let r = 0; r < ranks; r++) out.push(await bench.read('params', r));
      return out;
    },
    free: () => bench.free(),
  };
}

/** TF.js doing the same step on the same tensors: P [R, N] −= lr · mean over ranks of G. */
function tfStep(variant, params, grads) {
  const ranks = params.length;
  const n = params[0].length;
  const flat = (xs) => {
    const out = new Float32Array(ranks * n);
    xs.forEach((x, r) => out.set(x, r * n));
    return out;
  };
  const P = tf.variable(tf.tensor2d(flat(params), [ranks, n]));
  let G;
  let mean;
  if (variant === 'mean') {
    // As a TF.js user writes it with the gradients stacked: one tensor, tf.mean over axis 0.
    G = [tf.tensor2d(flat(grads), [ranks, n])];
    mean = () => tf.mean(G[0], 0);
  } else if (variant === 'addN') {
    // The gradients as R tensors summed by one addN.
    G = grads.map((g) => tf.tensor1d(g));
    mean = () => tf.div(tf.addN(G), ranks);
  } else if (variant === 'add') {
    // The gradients as R tensors summed pairwise (R − 1 tf.add).
    G = grads.map((g) => tf.tensor1d(g));
    mean = () => tf.div(G.reduce((a, b) => tf.add(a, b)), ranks);
  } else {
    throw new Error(`unknown step variant ${variant}`);
  }
  return {
    step: async () => {
      tf.tidy(() => {
        P.assign(tf.sub(P, tf.mul(mean(), LR)));
      });
      await tfSync(P);
    },
    answer: async () => rows(await P.data(), ranks, n),
    free: () => {
      P.dispose();
      G.forEach((g) => g.dispose());
    },
  };
}

function stepReference(params, grads) {
  const ranks = grads.length;
  const n = params[0].length;
  const mean = new Float64Array(n);
  for (const g of grads) for (let i = 0; i < n; i++) mean[i] += g[i];
  return params.map((p) => {
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = p[i] - LR * (mean[i] / ranks);
    return out;
  });
}

// --- Adam ---------------------------------------------------------------------------------

function adamInputs(ranks, n) {
  const p = values(1000, n);
  return { params: Array.from({ length: ranks }, () => p), grads: Array.from({ length: ranks }, (_, r) => values(r + 1, n)) };
}

/** distopt's Adam (the public API: Replicas + Adam, resident on the backend). */
function distoptAdam(params, grads) {
  const ranks = params.length;
  const n = params[0].length;
  const replicas = new distopt.Replicas(params.map((p) => [distopt.tensor('float32', [n], p)]));
  grads.forEach((g, r) => replicas.setGrads(r, [distopt.tensor('float32', [n], g)]));
  const adam = new distopt.Adam(replicas, { lr: LR, betas: BETAS, eps: EPS });
  return {
    bytes: 7 * ranks * n * 4,
    backend: replicas.backend.name,
    step: async () => {
      adam.step();
      await distopt.synchronize();
    },
    answer: async () => (await replicas.params()).map((rank) => rank[0].data),
    free: () => {
      adam.free();
      replicas.free();
    },
  };
}

/** TF.js's own Adam (tf.train.adam) on one [R, N] variable with an [R, N] gradient. */
function tfAdam(params, grads) {
  const ranks = params.length;
  const n = params[0].length;
  const flat = (xs) => {
    const out = new Float32Array(ranks * n);
    xs.forEach((x, r) => out.set(x, r * n));
    return out;
  };
  const P = tf.variable(tf.tensor2d(flat(params), [ranks, n]), true, 'bench_params');
  const G = tf.tensor2d(flat(grads), [ranks, n]);
  const optimizer = tf.train.adam(LR, BETAS[0], BETAS[1], EPS);
  return {
    step: async () => {
      optimizer.applyGradients({ [P.name]: G });
      await tfSync(P);
    },
    answer: async () => rows(await P.data(), ranks, n),
    free: () => {
      optimizer.dispose();
      P.dispose();
      G.dispose();
    },
  };
}

function adamReference(params, grads) {
  // Step 1 from zero state: m̂ = g, v̂ = g², p − lr · g / (|g| + eps) (PyTorch's formula; the
  // bias corrections cancel exactly in float64).
  return params.map((p, r) => {
    const g = grads[r];
    const out = new Float64Array(p.length);
    for (let i = 0; i < p.length; i++) out[i] = p[i] - (LR * g[i]) / (Math.abs(g[i]) + EPS);
    return out;
  });
}

// --- one comparison -----------------------------------------------------------------------

/**
 * Checks both answers after one step, then times `repeats` steps of each, alternating.
 * `makeDistopt()` and `makePeer(inputs)` build the two sides (the peer gets distopt's inputs).
 */
async function compare({ work, distoptBackend, peer, variant, repeats, makeDistopt, makePeer, reference }) {
  const row = { work, distoptBackend, peer, variant, tolerance: TOLERANCE };
  let d;
  let p;
  try {
    d = await makeDistopt();
    row.distoptAdapter = d.backend;
    const ref = reference(d.params, d.grads);
    try {
      p = makePeer(d.params, d.grads);
    } catch (e) {
      row.peerError = `${e.name}: ${e.message}`;
    }
    await d.step();
    row.distoptMaxError = maxError(await d.answer(), ref);
    row.distoptOk = row.distoptMaxError <= TOLERANCE;
    if (p) {
      try {
        await p.step();
        row.peerMaxError = maxError(await p.answer(), ref);
        row.peerOk = row.peerMaxError <= TOLERANCE;
      } catch (e) {
        row.peerError = `${e.name}: ${e.message}`;
      }
    }
    const dTimes = [];
    const pTimes = [];
    for (let i = 0; i < repeats; i++) {
      let t0 = performance.now();
      await d.step();
      dTimes.push(performance.now() - t0);
      if (p && !row.peerError) {
        t0 = performance.now();
        await p.step();
        pTimes.push(performance.now() - t0);
      }
    }
    row.bytes = d.bytes;
    row.distoptTimes = dTimes;
    row.distoptMs = median(dTimes);
    row.distoptGbps = d.bytes / (row.distoptMs / 1000) / 1e9;
    if (pTimes.length) {
      row.peerTimes = pTimes;
      row.peerMs = median(pTimes);
      row.peerGbps = d.bytes / (row.peerMs / 1000) / 1e9;
    }
    // A ratio only where both answers are right: a wrong answer has no speed.
    row.speedup = row.distoptOk && row.peerOk && row.peerMs ? row.peerMs / row.distoptMs : null;
  } catch (e) {
    row.error = `${e.name}: ${e.message}`;
  } finally {
    d?.free();
    p?.free();
  }
  return row;
}

async function useTf(name) {
  if (tf.getBackend() === name) return true;
  try {
    if (!(await tf.setBackend(name))) return false;
    await tf.ready();
    return tf.getBackend() === name;
  } catch {
    return false;
  }
}

function show(row) {
  const tr = document.createElement('tr');
  const f = (x, digits = 2) => (x == null ? '–' : Number(x).toFixed(digits));
  const speed = row.error
    ? `error: ${row.error}`
    : row.peerError
      ? `peer failed: ${row.peerError}`
      : row.peerOk === false
        ? `peer WRONG (max error ${row.peerMaxError.toPrecision(3)})`
        : row.distoptOk === false
          ? `distopt WRONG (max error ${row.distoptMaxError.toPrecision(3)})`
          : `${f(row.speedup)}×`;
  const cells = [
    [row.work, 'text'],
    [`${row.distoptBackend} (${row.distoptAdapter ?? '?'})`, 'text'],
    [`TF.js ${row.peer}${row.variant ? ` [${row.variant}]` : ''}`, 'text'],
    [f(row.distoptMs, 1)],
    [f(row.peerMs, 1)],
    [f(row.distoptGbps)],
    [f(row.peerGbps)],
    [speed, row.peerOk === false || row.error || row.peerError ? 'wrong text' : 'text'],
    [row.peerMaxError == null ? '–' : row.peerMaxError.toPrecision(3)],
  ];
  for (const [text, cls] of cells) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    tr.append(td);
  }
  document.querySelector('#results tbody').append(tr);
  log(`${row.work} | distopt ${row.distoptBackend} vs TF.js ${row.peer}${row.variant ? ` [${row.variant}]` : ''}: ${speed}`);
}

let initialized = null;

/** Runs every comparison; resolves to {env, rows}. */
async function runBench({ ranks = 8, log2n = 20, repeats = 5, variants = ['mean', 'addN', 'add'] } = {}) {
  const n = 2 ** log2n;
  initialized ??= init({ backend: 'cpu' });
  await initialized;
  tf.wasm.setWasmPaths('/vendor/tfjs/tfjs-backend-wasm/dist/');
  const hasWebGpu = Boolean(navigator.gpu && (await navigator.gpu.requestAdapter().catch(() => null)));
  const env = {
    ranks,
    elements: n,
    repeats,
    variants,
    distoptVersion: distopt.version(),
    tfjsVersion: tf.version.tfjs,
    crossOriginIsolated: globalThis.crossOriginIsolated === true,
    hardwareConcurrency: navigator.hardwareConcurrency,
    distoptCpuThreads: null,
    webgpu: hasWebGpu,
    userAgent: navigator.userAgent,
  };
  const rows = [];
  const pairs = [
    { distoptBackend: 'gpu', peer: 'webgpu', available: hasWebGpu },
    { distoptBackend: 'cpu', peer: 'wasm', available: true },
  ];
  for (const pair of pairs) {
    if (!pair.available) {
      log(`skipped: distopt ${pair.distoptBackend} vs TF.js ${pair.peer}: no WebGPU in this browser`);
      continue;
    }
    const selected = await distopt.selectBackend(pair.distoptBackend);
    if (pair.distoptBackend === 'cpu') env.distoptCpuThreads = selected.threads;
    if (!(await useTf(pair.peer))) {
      rows.push({ work: 'all', distoptBackend: pair.distoptBackend, peer: pair.peer, peerError: `TF.js backend ${pair.peer} did not start` });
      show(rows.at(-1));
      continue;
    }
    if (pair.peer === 'wasm') env.tfjsWasmThreads = tf.wasm.getThreadsCount?.() ?? null;
    if (pair.peer === 'webgpu') env.distoptAdapter = distopt.backendInfo()?.name;
    for (const variant of variants) {
      rows.push(
        await compare({
          work: 'step',
          variant,
          ...pair,
          repeats,
          makeDistopt: () => distoptStep(ranks, n),
          makePeer: (params, grads) => tfStep(variant, params, grads),
          reference: stepReference,
        }),
      );
      show(rows.at(-1));
    }
    const inputs = adamInputs(ranks, n);
    rows.push(
      await compare({
        work: 'adam',
        ...pair,
        repeats,
        makeDistopt: async () => ({ ...distoptAdam(inputs.params, inputs.grads), ...inputs }),
        makePeer: (params, grads) => tfAdam(params, grads),
        reference: adamReference,
      }),
    );
    show(rows.at(-1));
  }
  document.getElementById('env').textContent =
    `R = ${ranks}, N = 2^${log2n} float32, ${repeats} timed steps (median); TF.js ${env.tfjsVersion}; ` +
    `cross-origin isolated: ${env.crossOriginIsolated} (TF.js wasm threads: ${env.tfjsWasmThreads ?? '?'}, ` +
    `distopt CPU fallback threads: ${env.distoptCpuThreads ?? '?'}); ${env.hardwareConcurrency} logical cores`;
  const report = { env, rows };
  window.benchReport = report;
  return report;
}

window.runBench = runBench;
window.benchReady = true;

const query = new URLSearchParams(location.search);
if (query.get('run') !== '0') {
  runBench({
    ranks: Number(query.get('R') ?? 8),
    log2n: Number(query.get('N') ?? 20),
    repeats: Number(query.get('repeats') ?? 5),
    variants: (query.get('variants') ?? 'mean,addN,add').split(','),
  }).then(
    () => log('done'),
    (e) => log(`failed: ${e.stack ?? e}`),
  );
}
