// Runs golden cases (tests/golden/*.json) through distopt's JavaScript API and compares the
// results with PyTorch's, by the golden README's rules (section 15): tensors within the case's
// tolerance per dtype (non-finite values exactly), errors by type and message substring,
// warnings by substring. The same module runs in Node and in the browser test page.

/** The kinds this runner checks. */
export const KINDS = [
  'dp_sgd_step',
  'periodic_averager',
  'hierarchical_averager',
  'local_optimizer',
  'post_local_sgd',
];

class Mismatch extends Error {}

function fail(message) {
  throw new Mismatch(message);
}

/** A golden JSON number: a number or "nan", "inf", "-inf". */
function number(x) {
  if (typeof x === 'number') return x;
  if (x === 'nan') return NaN;
  if (x === 'inf') return Infinity;
  if (x === '-inf') return -Infinity;
  return fail(`bad number ${JSON.stringify(x)}`);
}

function sameShape(a, b) {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** Compares one tensor returned by distopt with an expected golden tensor. */
function compareTensor(api, c, actual, expected, what) {
  if (expected === null) {
    if (actual !== null) fail(`${what}: expected no tensor, got one`);
    return true;
  }
  if (actual === null || actual === undefined) fail(`${what}: expected a tensor, got ${actual}`);
  if (actual.dtype !== expected.dtype) fail(`${what}: dtype ${actual.dtype} != expected ${expected.dtype}`);
  if (!sameShape(actual.shape, expected.shape)) {
    fail(`${what}: shape [${actual.shape}] != expected [${expected.shape}]`);
  }
  const expectArray = { float32: Float32Array, float64: Float64Array, float16: Uint16Array, bfloat16: Uint16Array };
  if (!(actual.data instanceof expectArray[actual.dtype])) {
    fail(`${what}: ${actual.dtype} data should come back as a ${expectArray[actual.dtype].name}`);
  }
  const a = api.tensorValues(actual);
  const e = expected.data.map(number);
  if (a.length !== e.length) fail(`${what}: ${a.length} values, expected ${e.length}`);
  const { rtol, atol } = c.tolerance[actual.dtype];
  let bitExact = true;
  for (let i = 0; i < e.length; i++) {
    const ok = Number.isNaN(e[i])
      ? Number.isNaN(a[i])
      : Number.isFinite(e[i])
        ? Math.abs(a[i] - e[i]) <= atol + rtol * Math.abs(e[i])
        : a[i] === e[i];
    if (!ok) fail(`${what}[${i}]: ${a[i]} != expected ${e[i]} (rtol ${rtol}, atol ${atol})`);
    bitExact &&= Object.is(a[i], e[i]) || (Number.isNaN(a[i]) && Number.isNaN(e[i]));
  }
  return bitExact;
}

function compareTensorList(api, c, actual, expected, what) {
  if (!Array.isArray(actual)) fail(`${what}: expected a list, got ${typeof actual}`);
  if (actual.length !== expected.length) fail(`${what}: ${actual.length} entries, expected ${expected.length}`);
  let exact = true;
  for (let j = 0; j < expected.length; j++) {
    exact = compareTensor(api, c, actual[j], expected[j], `${what}[${j}]`) && exact;
  }
  return exact;
}

function isGoldenTensor(v) {
  return v !== null && typeof v === 'object' && 'dtype' in v && 'shape' in v && 'data' in v;
}

/** Compares JSON-like values: dicts by key, numbers by value, tensors within tolerance. */
function compareJson(api, c, actual, expected, path) {
  if (isGoldenTensor(expected)) return compareTensor(api, c, actual, expected, path);
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) fail(`${path}: expected a list, got ${JSON.stringify(actual)}`);
    if (actual.length !== expected.length) fail(`${path}: ${actual.length} items, expected ${expected.length}`);
    let exact = true;
    expected.forEach((e, i) => {
      exact = compareJson(api, c, actual[i], e, `${path}[${i}]`) && exact;
    });
    return exact;
  }
  if (expected !== null && typeof expected === 'object') {
    if (actual === null || typeof actual !== 'object') fail(`${path}: expected an object`);
    const keys = new Set([...Object.keys(actual), ...Object.keys(expected)]);
    let exact = true;
    for (const key of keys) {
      if (!(key in actual)) fail(`${path}: missing key ${key}`);
      if (!(key in expected)) fail(`${path}: unexpected key ${key}`);
      exact = compareJson(api, c, actual[key], expected[key], `${path}.${key}`) && exact;
    }
    return exact;
  }
  if (typeof expected === 'number' || typeof actual === 'number') {
    if (number(actual) !== number(expected)) fail(`${path}: ${actual} != expected ${expected}`);
    return true;
  }
  if (actual !== expected) fail(`${path}: ${JSON.stringify(actual)} != expected ${JSON.stringify(expected)}`);
  return true;
}

/** Checks a thrown error against `expected.error` (and `error_at_step`). */
function compareError(c, error, atStep) {
  const spec = c.expected.error;
  if (!spec) fail(`unexpected error: ${error && error.name}: ${error && error.message}`);
  if (!(error instanceof Error)) fail(`thrown value is not an Error: ${String(error)}`);
  if (error.name !== spec.type) fail(`error type ${error.name} != expected ${spec.type} (${error.message})`);
  if (!error.message.includes(spec.message_contains)) {
    fail(`error message ${JSON.stringify(error.message)} lacks ${JSON.stringify(spec.message_contains)}`);
  }
  if ('error_at_step' in c.expected && atStep !== c.expected.error_at_step) {
    fail(`error at step ${atStep}, expected at step ${c.expected.error_at_step}`);
  }
  return true;
}

function compareWarnings(c, emitted) {
  const expected = c.expected.warnings;
  if (!Array.isArray(expected)) return;
  if (expected.length === 0 && emitted.length > 0) fail(`expected no warnings, got ${JSON.stringify(emitted)}`);
  for (const text of expected) {
    if (!emitted.some((w) => w.includes(text))) {
      fail(`missing warning ${JSON.stringify(text)}; emitted ${JSON.stringify(emitted)}`);
    }
  }
}

function sameList(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** The golden tensor (plain numbers, "nan" strings) as distopt's typed-array form. */
function typed(api, t) {
  if (t === null || !['float32', 'float16', 'bfloat16', 'float64'].includes(t.dtype)) return t;
  return api.tensor(t.dtype, t.shape, t.data);
}

async function dpSgdStep(api, c, { typedInputs }) {
  const input = c.input;
  const params = typedInputs ? input.parameter_replicas.map((r) => r.map((t) => typed(api, t))) : input.parameter_replicas;
  const grads = typedInputs ? input.gradient_replicas.map((r) => r.map((t) => typed(api, t))) : input.gradient_replicas;
  let out;
  try {
    out = await api.sgdStep(params, grads, input.learning_rate);
  } catch (error) {
    return compareError(c, error);
  }
  if (c.expected.error) fail('expected an error, the step succeeded');
  let exact = compareTensorList(api, c, out.meanGradients, c.expected.mean_gradients, 'meanGradients');
  if (out.updatedReplicas.length !== c.expected.updated_replicas.length) {
    fail(`${out.updatedReplicas.length} replicas, expected ${c.expected.updated_replicas.length}`);
  }
  c.expected.updated_replicas.forEach((rank, r) => {
    exact = compareTensorList(api, c, out.updatedReplicas[r], rank, `updatedReplicas[${r}]`) && exact;
  });
  return exact;
}

/** p + u in the parameter's dtype: one correctly rounded addition (f64 sum, rounded once). */
function addUpdate(api, p, u) {
  const a = api.tensorValues(p);
  const b = api.tensorValues(typed(api, u));
  const sum = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) sum[i] = a[i] + b[i];
  return api.tensor(p.dtype, p.shape, sum);
}

function makeAverager(api, c, world) {
  const input = c.input;
  if (c.kind === 'periodic_averager') {
    return new api.PeriodicModelAverager(input.period, input.warmup_steps, world);
  }
  return new api.HierarchicalModelAverager(input.period_group_size_dict, input.warmup_steps, world);
}

function zeroGrads(api, params, hasGrad) {
  return params.map((p, j) => (hasGrad[j] ? api.tensor(p.dtype, p.shape, new Float64Array(p.data.length)) : null));
}

async function averager(api, c) {
  const input = c.input;
  const expected = c.expected;
  const world = new api.World(input.world_size);
  let avg;
  try {
    avg = makeAverager(api, c, world);
  } catch (error) {
    return compareError(c, error);
  }
  const replicas = new api.Replicas(input.initial_params);
  input.initial_params.forEach((params, r) => replicas.setGrads(r, zeroGrads(api, params, input.param_has_grad)));
  const averagedAt = [];
  const groupSizes = [];
  let exact = true;
  try {
    for (let t = 0; t < input.updates.length; t++) {
      const params = await replicas.params();
      for (let r = 0; r < input.world_size; r++) {
        replicas.setParams(r, params[r].map((p, j) => addUpdate(api, p, input.updates[t][r][j])));
      }
      let used;
      try {
        used = avg.averageParameters(replicas);
      } catch (error) {
        return compareError(c, error, t);
      }
      if (used !== null) averagedAt.push(t);
      groupSizes.push(used);
      if (expected.error) continue;
      const after = await replicas.params();
      for (let r = 0; r < input.world_size; r++) {
        exact = compareTensorList(api, c, after[r], expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
      }
    }
    if (expected.error) fail('expected an error, none was raised');
    if (!sameList(averagedAt, expected.averaged_at_steps)) {
      fail(`averaged at ${JSON.stringify(averagedAt)}, expected ${JSON.stringify(expected.averaged_at_steps)}`);
    }
    if ('group_size_used_at_step' in expected && !sameList(groupSizes, expected.group_size_used_at_step)) {
      fail(`group sizes ${JSON.stringify(groupSizes)}, expected ${JSON.stringify(expected.group_size_used_at_step)}`);
    }
    if (avg.step !== expected.final_step_counter) fail(`final step ${avg.step}, expected ${expected.final_step_counter}`);
    return exact;
  } finally {
    avg.free();
    replicas.free();
    world.free();
  }
}

function makeOptimizer(api, replicas, spec) {
  const Class = { SGD: api.SGD, Adam: api.Adam, AdamW: api.AdamW }[spec.name];
  if (!Class) fail(`unknown optimizer ${spec.name}`);
  return new Class(replicas, spec.options);
}

async function localOptimizer(api, c) {
  const input = c.input;
  const replicas = api.Replicas.replicate(1, input.initial_params);
  let optimizer;
  try {
    optimizer = makeOptimizer(api, replicas, input.optimizer);
  } catch (error) {
    return compareError(c, error);
  }
  if (c.expected.error) fail('expected a constructor error');
  let exact = true;
  for (let t = 0; t < input.grads.length; t++) {
    optimizer.zeroGrad();
    replicas.setGrads(0, input.grads[t]);
    optimizer.step();
    const params = await replicas.params();
    exact = compareTensorList(api, c, params[0], c.expected.params_after_step[t], `params_after_step[${t}]`) && exact;
  }
  const stateDict = await optimizer.stateDict(0);
  exact = compareJson(api, c, stateDict, c.expected.state_dict, 'state_dict') && exact;
  optimizer.free();
  replicas.free();
  return exact;
}

async function postLocalSgd(api, c) {
  const { input, expected } = c;
  const world = new api.World(input.world_size);
  const replicas = new api.Replicas(input.initial_params);
  let exact = true;
  let hook = null;
  if (input.variant === 'ddp_hook') {
    replicas.broadcastParams(world, 0);
    const params = await replicas.params();
    params.forEach((p, r) => {
      exact = compareTensorList(api, c, p, expected.params_after_ddp_init[r], 'params_after_ddp_init') && exact;
    });
    const h = input.hook;
    hook = new api.PostLocalSGDState(world, h.subgroup_size ?? null, h.start_localSGD_iter ?? 0, h.post_local_gradient_allreduce ?? true);
  }
  const local = makeOptimizer(api, replicas, input.optimizer);
  const spec = input.averager;
  const averagerObject =
    spec.type === 'periodic'
      ? new api.PeriodicModelAverager(spec.period, spec.warmup_steps, world)
      : new api.HierarchicalModelAverager(spec.period_group_size_dict, spec.warmup_steps, world);
  const opt = new api.PostLocalSGDOptimizer(local, averagerObject);
  const load = input.load_state_dict;
  const averagedAt = [];
  const sizes = [];
  const stepsBefore = [];
  for (let t = 0; t < input.grads.length; t++) {
    opt.zeroGrad();
    for (let r = 0; r < input.world_size; r++) replicas.setGrads(r, input.grads[t][r]);
    if (hook) {
      hook.synchronizeGradients(replicas);
      const grads = await replicas.grads();
      grads.forEach((g, r) => {
        exact = compareTensorList(api, c, g, expected.grads_seen[t][r], `grads_seen[${t}][${r}]`) && exact;
      });
    }
    stepsBefore.push(opt.averagerStep);
    const used = opt.step();
    if (used !== null) averagedAt.push(t);
    sizes.push(used);
    const params = await replicas.params();
    params.forEach((p, r) => {
      exact = compareTensorList(api, c, p, expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
    });
    if (load && load.after_step === t + 1) {
      const saved = [];
      for (let r = 0; r < input.world_size; r++) saved.push(await opt.stateDict(r));
      exact = compareJson(api, c, saved[0], expected.saved_state_dict, 'saved_state_dict') && exact;
      if (opt.averagerStep !== expected.averager_step_before_load) fail(`averager step before load ${opt.averagerStep}`);
      saved.forEach((sd, r) => {
        if (load.remove_step_key) delete sd.step;
        opt.loadStateDict(r, sd);
      });
      if (opt.averagerStep !== expected.averager_step_after_load) fail(`averager step after load ${opt.averagerStep}`);
    }
  }
  if (!sameList(averagedAt, expected.averaged_at_steps)) fail(`averaged at ${JSON.stringify(averagedAt)}`);
  if (!sameList(sizes, expected.averaging_group_size_at_step)) fail(`group sizes ${JSON.stringify(sizes)}`);
  if (!sameList(stepsBefore, expected.averager_step_before_each_step)) fail(`averager steps ${JSON.stringify(stepsBefore)}`);
  if (opt.averagerStep !== expected.final_averager_step) fail(`final averager step ${opt.averagerStep}`);
  for (let r = 0; r < input.world_size; r++) {
    const sd = await opt.stateDict(r);
    exact = compareJson(api, c, sd, expected.state_dict_per_rank[r], `state_dict_per_rank[${r}]`) && exact;
    if (r === 0) exact = compareJson(api, c, sd, expected.state_dict_rank0, 'state_dict_rank0') && exact;
  }
  return exact;
}

const RUNNERS = {
  dp_sgd_step: dpSgdStep,
  periodic_averager: averager,
  hierarchical_averager: averager,
  local_optimizer: localOptimizer,
  post_local_sgd: postLocalSgd,
};

/**
 * Runs one case. Resolves to {name, kind, ok, bitExact, message}; never rejects.
 * `typedInputs`: pass dp_sgd_step tensors as typed arrays instead of the golden number lists.
 */
export async function runCase(api, c, { typedInputs = false } = {}) {
  const result = { name: c.name, kind: c.kind, ok: false, bitExact: false, message: '' };
  const runner = RUNNERS[c.kind];
  if (!runner) {
    result.message = `kind ${c.kind} is not run through the JS API`;
    return result;
  }
  api.takeWarnings();
  try {
    const exact = await runner(api, c, { typedInputs });
    compareWarnings(c, api.takeWarnings());
    result.ok = true;
    result.bitExact = exact;
  } catch (error) {
    result.message = error instanceof Mismatch ? error.message : `${error && error.name}: ${error && error.message}\n${error && error.stack}`;
  }
  return result;
}

/** Runs every case; `progress(result)` is called after each. */
export async function runCases(api, cases, options = {}, progress = () => {}) {
  const results = [];
  for (const c of cases) {
    const result = await runCase(api, c, options);
    results.push(result);
    progress(result);
  }
  return results;
}

/** Per kind: {kind: {passed, failed, bitExact}}. */
export function tally(results) {
  const out = {};
  for (const r of results) {
    const t = (out[r.kind] ||= { passed: 0, failed: 0, bitExact: 0 });
    if (r.ok) {
      t.passed++;
      if (r.bitExact) t.bitExact++;
    } else t.failed++;
  }
  return out;
}
