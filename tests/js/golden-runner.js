// Runs golden cases (tests/golden/*.json) through distopt's JavaScript API and compares the
// results with PyTorch's, by the golden README's rules (section 15): tensors within the case's
// tolerance per dtype (non-finite values exactly; in dp_sgd_step zeros with their sign), errors
// by type and message substring, warnings by substring. The same module runs in Node and in
// the browser test page.

/** The kinds this runner checks (each has an entry in RUNNERS below). */
export const KINDS = [
  'dp_sgd_step',
  'periodic_averager',
  'hierarchical_averager',
  'local_optimizer',
  'post_local_sgd',
  'diloco',
  'streaming_diloco',
  'zero_partition',
  'zero_trajectory',
  'zero_errors',
  'zero_join',
  'distributed_optimizer',
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
    // README section 15: dp_sgd_step's arithmetic is fully specified, so a zero must match in
    // sign too (-0.0 is not 0.0). Elsewhere the tolerance rule alone applies.
    if (c.kind === 'dp_sgd_step' && e[i] === 0 && a[i] === 0 && !Object.is(a[i], e[i])) {
      const signed = (x) => (Object.is(x, -0) ? '-0' : '0');
      fail(`${what}[${i}]: ${signed(a[i])} != expected ${signed(e[i])} (in dp_sgd_step a zero must match in sign)`);
    }
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

/**
 * The kinds a rank in a process of its own replays (`place`): the multi-rank kinds over a
 * `World`, as the native tests/nats.rs replays them.
 */
export const NETWORKED_KINDS = [
  'periodic_averager',
  'hierarchical_averager',
  'post_local_sgd',
  'diloco',
  'streaming_diloco',
  'zero_trajectory',
  'zero_errors',
  'zero_join',
];

/** Parts of cases a placement cannot run (a ZeRO reload into another world size), said by name. */
const skippedParts = [];

/** The parts skipped since the last call (see `skippedParts`). */
export function takeSkippedParts() {
  return skippedParts.splice(0);
}

/**
 * Where a case's ranks live: by default a simulated world of all of them (`ranks` 0..size-1);
 * `options.place(size)` puts them elsewhere — this process's rank of a run over NATS, whose
 * other ranks run the same case in other processes. Replicas index the local ranks in order;
 * `ranks[i]` is the world rank of replica `i`, whose expected values a rank checks.
 */
function place(api, options, size) {
  if (options.place) return options.place(size);
  const world = new api.World(size);
  return { world, ranks: [...Array(size).keys()], release: () => world.free() };
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

async function averager(api, c, options) {
  const input = c.input;
  const expected = c.expected;
  const { world, ranks, release } = place(api, options, input.world_size);
  let avg;
  try {
    avg = makeAverager(api, c, world);
  } catch (error) {
    release();
    return compareError(c, error);
  }
  const replicas = new api.Replicas(ranks.map((r) => input.initial_params[r]));
  ranks.forEach((r, i) => replicas.setGrads(i, zeroGrads(api, input.initial_params[r], input.param_has_grad)));
  const averagedAt = [];
  const groupSizes = [];
  let exact = true;
  try {
    for (let t = 0; t < input.updates.length; t++) {
      const params = await replicas.params();
      ranks.forEach((r, i) => {
        replicas.setParams(i, params[i].map((p, j) => addUpdate(api, p, input.updates[t][r][j])));
      });
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
      ranks.forEach((r, i) => {
        options.observe?.(c.name, r, t, after[i]);
        exact = compareTensorList(api, c, after[i], expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
      });
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
    release();
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

async function postLocalSgd(api, c, options) {
  const { input, expected } = c;
  const { world, ranks, release } = place(api, options, input.world_size);
  const replicas = new api.Replicas(ranks.map((r) => input.initial_params[r]));
  let exact = true;
  let hook = null;
  if (input.variant === 'ddp_hook') {
    replicas.broadcastParams(world, 0);
    const params = await replicas.params();
    params.forEach((p, i) => {
      exact = compareTensorList(api, c, p, expected.params_after_ddp_init[ranks[i]], 'params_after_ddp_init') && exact;
    });
    const h = input.hook;
    hook = new api.PostLocalSGDState(world, h.subgroup_size ?? null, h.start_localSGD_iter ?? 0, h.post_local_gradient_allreduce ?? true);
  }
  const spec = input.averager;
  const build = () => {
    const local = makeOptimizer(api, replicas, input.optimizer);
    const averagerObject =
      spec.type === 'periodic'
        ? new api.PeriodicModelAverager(spec.period, spec.warmup_steps, world)
        : new api.HierarchicalModelAverager(spec.period_group_size_dict, spec.warmup_steps, world);
    return new api.PostLocalSGDOptimizer(local, averagerObject);
  };
  let opt = build();
  const load = input.load_state_dict;
  const averagedAt = [];
  const sizes = [];
  const stepsBefore = [];
  for (let t = 0; t < input.grads.length; t++) {
    opt.zeroGrad();
    ranks.forEach((r, i) => replicas.setGrads(i, input.grads[t][r]));
    if (hook) {
      hook.synchronizeGradients(replicas);
      const grads = await replicas.grads();
      grads.forEach((g, i) => {
        const r = ranks[i];
        exact = compareTensorList(api, c, g, expected.grads_seen[t][r], `grads_seen[${t}][${r}]`) && exact;
      });
    }
    stepsBefore.push(opt.averagerStep);
    const used = opt.step();
    if (used !== null) averagedAt.push(t);
    sizes.push(used);
    const params = await replicas.params();
    params.forEach((p, i) => {
      const r = ranks[i];
      options.observe?.(c.name, r, t, p);
      exact = compareTensorList(api, c, p, expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
    });
    if (load && load.after_step === t + 1) {
      const saved = [];
      for (let i = 0; i < ranks.length; i++) saved.push(await opt.stateDict(i));
      if (ranks[0] === 0) {
        exact = compareJson(api, c, saved[0], expected.saved_state_dict, 'saved_state_dict') && exact;
      }
      if (opt.averagerStep !== expected.averager_step_before_load) fail(`averager step before load ${opt.averagerStep}`);
      // PyTorch reloads into the same instance; a freshly built one (new local optimizer,
      // new averager, no state) shows that the load restores everything.
      opt.free();
      opt = build();
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
  for (let i = 0; i < ranks.length; i++) {
    const r = ranks[i];
    const sd = await opt.stateDict(i);
    exact = compareJson(api, c, sd, expected.state_dict_per_rank[r], `state_dict_per_rank[${r}]`) && exact;
    if (r === 0) exact = compareJson(api, c, sd, expected.state_dict_rank0, 'state_dict_rank0') && exact;
  }
  release();
  return exact;
}

/** diloco: inner steps per rank, every sync_every steps the outer step with the mean pseudo-gradient. */
async function diloco(api, c, options) {
  const { input, expected } = c;
  const { world, ranks, release } = place(api, options, input.world_size);
  const replicas = api.Replicas.replicate(ranks.length, input.initial_params);
  // The reference passes foreach=False to both torch.optim optimizers.
  const spec = (s) => ({ name: s.name, options: { foreach: false, ...s.options } });
  const inner = makeOptimizer(api, replicas, spec(input.inner_optimizer));
  const outer = makeOptimizer(api, replicas, spec(input.outer_optimizer));
  const opt = new api.DiLoCo(inner, outer, input.sync_every, world);
  if (expected.params_after_step.length !== input.grads.length) fail('params_after_step: step count');
  if (expected.inner_state_dicts.length !== input.world_size) fail('inner_state_dicts: rank count');
  let exact = true;
  const syncedAt = [];
  for (let t = 0; t < input.grads.length; t++) {
    opt.zeroGrad();
    ranks.forEach((r, i) => replicas.setGrads(i, input.grads[t][r]));
    if (opt.step()) syncedAt.push(t);
    const params = await replicas.params();
    params.forEach((p, i) => {
      const r = ranks[i];
      options.observe?.(c.name, r, t, p);
      exact = compareTensorList(api, c, p, expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
    });
  }
  sameOrFail(syncedAt, expected.synced_at_steps, 'synced_at_steps');
  for (let i = 0; i < ranks.length; i++) {
    const r = ranks[i];
    const sd = await opt.stateDict(i);
    exact = compareJson(api, c, sd.inner_optimizer, expected.inner_state_dicts[r], `inner_state_dicts[${r}]`) && exact;
    exact = compareJson(api, c, sd.outer_optimizer, expected.outer_state_dict, `outer_state_dict (rank ${r})`) && exact;
  }
  // The optimizer objects report their state from inside the DiLoCo.
  exact = compareJson(api, c, await outer.stateDict(0), expected.outer_state_dict, 'outer.stateDict(0)') && exact;
  exact = compareJson(api, c, await inner.stateDict(0), expected.inner_state_dicts[ranks[0]], 'inner.stateDict(0)') && exact;
  opt.free();
  release();
  return exact;
}

/**
 * streaming_diloco (tests/torchft-cases/README.md): torchft's DiLoCo with fragments, each
 * fragment's all-reduce started fragment_sync_delay steps before its outer step, whose result is
 * lerped towards the local parameters by fragment_update_alpha.
 */
async function streamingDiloco(api, c, options) {
  const { input, expected } = c;
  const { world, ranks, release } = place(api, options, input.world_size);
  const replicas = api.Replicas.replicate(ranks.length, input.initial_params);
  const spec = (s) => ({ name: s.name, options: { foreach: false, ...s.options } });
  const inner = makeOptimizer(api, replicas, spec(input.inner_optimizer));
  const outer = makeOptimizer(api, replicas, spec(input.outer_optimizer));
  const opt = new api.DiLoCo(inner, outer, input.sync_every, world, {
    fragments: input.fragments,
    fragmentSyncDelay: input.fragment_sync_delay,
    fragmentUpdateAlpha: input.fragment_update_alpha,
  });
  if (expected.params_after_step.length !== input.grads.length) fail('params_after_step: step count');
  if (expected.inner_state_dicts.length !== input.world_size) fail('inner_state_dicts: rank count');
  sameOrFail(opt.fragments, input.fragments, 'fragments');
  if (opt.fragmentSyncDelay !== input.fragment_sync_delay) fail(`fragmentSyncDelay ${opt.fragmentSyncDelay}`);
  if (opt.fragmentUpdateAlpha !== input.fragment_update_alpha) fail(`fragmentUpdateAlpha ${opt.fragmentUpdateAlpha}`);
  let exact = true;
  const syncedAt = [];
  const preparedAt = [];
  for (let t = 0; t < input.grads.length; t++) {
    opt.zeroGrad();
    ranks.forEach((r, i) => replicas.setGrads(i, input.grads[t][r]));
    const before = opt.pendingFragment;
    const applied = opt.stepFragments();
    for (const f of applied) {
      syncedAt.push([t, f]);
      // torchft prepares and performs in the same step without a delay.
      if (input.fragment_sync_delay === 0) preparedAt.push([t, f]);
    }
    const after = opt.pendingFragment;
    if (after !== null && after !== before) preparedAt.push([t, after]);
    const params = await replicas.params();
    params.forEach((p, i) => {
      const r = ranks[i];
      options.observe?.(c.name, r, t, p);
      exact = compareTensorList(api, c, p, expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
    });
  }
  sameOrFail(syncedAt, expected.synced_at_steps, 'synced_at_steps');
  sameOrFail(preparedAt, expected.prepared_at_steps, 'prepared_at_steps');
  for (let i = 0; i < ranks.length; i++) {
    const r = ranks[i];
    const sd = await opt.stateDict(i);
    exact = compareJson(api, c, sd.inner_optimizer, expected.inner_state_dicts[r], `inner_state_dicts[${r}]`) && exact;
    exact = compareJson(api, c, sd.outer_optimizer, expected.outer_state_dict, `outer_state_dict (rank ${r})`) && exact;
    exact = compareJson(api, c, sd.original_parameters, expected.original_parameters, `original_parameters (rank ${r})`) && exact;
  }
  opt.free();
  release();
  return exact;
}

function zeros(api, dtype, shape) {
  return api.tensor(dtype, shape, new Float64Array(shape.reduce((a, b) => a * b, 1)));
}

function sameOrFail(actual, expected, what) {
  if (!sameList(actual, expected)) fail(`${what}: ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`);
}

function checkPartition(zero, expected, what) {
  sameOrFail(zero.rankOfParam, expected.rank_of_param, `${what}: rank_of_param`);
  sameOrFail(zero.paramsPerRank, expected.params_per_rank, `${what}: params_per_rank`);
  sameOrFail(zero.paramsPerRankPerGroup, expected.params_per_rank_per_group, `${what}: params_per_rank_per_group`);
  sameOrFail(zero.numelPerRank, expected.numel_per_rank, `${what}: numel_per_rank`);
  if ('local_optimizer_param_groups' in expected) {
    // Read from each rank's local optimizer, not from the partition.
    sameOrFail(zero.localOptimizerParamGroups(), expected.local_optimizer_param_groups, `${what}: local_optimizer_param_groups`);
  }
}

/** zero_partition: ZeRO's sorted-greedy partition, before and after add_param_group. */
async function zeroPartition(api, c) {
  const { input, expected } = c;
  const w = input.world_size;
  const shapes = [];
  const groups = [];
  for (const g of input.param_groups) {
    const first = shapes.length;
    shapes.push(...g.shapes);
    groups.push({ ...(g.options ?? {}), params: [...Array(g.shapes.length).keys()].map((k) => first + k) });
  }
  const added = input.add_param_group;
  const addedFirst = shapes.length;
  if (added) shapes.push(...added.shapes);
  const world = new api.World(w);
  const replicas = api.Replicas.replicate(w, shapes.map((sh) => zeros(api, 'float32', sh)));
  const zero = new api.ZeroRedundancyOptimizer(world, replicas, groups, 'SGD', { lr: 0.01 });
  try {
    if (added) {
      checkPartition(zero, expected.before_add, 'before_add');
      await zero.addParamGroup({ ...(added.options ?? {}), params: added.shapes.map((_, k) => addedFirst + k) });
    }
    checkPartition(zero, expected, 'after');
    return true;
  } finally {
    zero.free();
    replicas.free();
    world.free();
  }
}

/**
 * Steps a ZeRO optimizer through grads[t][r][i], comparing params_after_step; replica `i` is
 * world rank `ranks[i]`.
 */
async function zeroSteps(api, c, zero, replicas, grads, expectedParams, added, ranks) {
  let exact = true;
  const total = replicas.length;
  for (let t = 0; t < grads.length; t++) {
    if (added && added.step === t) await zero.addParamGroup(added.group);
    ranks.forEach((r, i) => {
      const g = [...grads[t][r]];
      while (g.length < total) g.push(null);
      replicas.setGrads(i, g);
    });
    zero.step();
    const params = await replicas.params();
    params.forEach((p, i) => {
      const want = expectedParams[t][ranks[i]];
      exact = compareTensorList(api, c, p.slice(0, want.length), want, `params_after_step[${t}][${ranks[i]}]`) && exact;
    });
  }
  return exact;
}

/** The consolidated state dict (on the process holding rank 0) and the partition at the end. */
async function zeroCheckEnd(api, c, zero, expected, what, ranks) {
  await zero.consolidateStateDict(0);
  const exact = !ranks.includes(0) || compareJson(api, c, await zero.stateDict(ranks.indexOf(0)), expected.consolidated_state_dict, `${what}consolidated_state_dict`);
  sameOrFail(zero.localStateSizes(), ranks.map((r) => expected.local_state_sizes[r]), `${what}local_state_sizes`);
  sameOrFail(zero.rankOfParam, expected.rank_of_param, `${what}rank_of_param`);
  if ('params_per_rank' in expected) sameOrFail(zero.paramsPerRank, expected.params_per_rank, `${what}params_per_rank`);
  return exact;
}

/**
 * zero_trajectory: steps, consolidation, add_param_group and reloads into other worlds (a run
 * over NATS, `place`, reloads only into its own size: a reload into another is not run).
 */
async function zeroTrajectory(api, c, options) {
  const { input, expected } = c;
  const name = input.optimizer.name;
  const defaults = input.optimizer.options;
  const params = [...input.initial_params];
  const groups = input.param_groups.map((g) => ({ ...(g.options ?? {}), params: g.param_indices }));
  let added = null;
  const add = input.add_param_group_at_step;
  if (add) {
    const first = params.length;
    params.push(...add.initial_params);
    added = { step: add.step, group: { ...(add.options ?? {}), params: add.initial_params.map((_, k) => first + k) } };
  }
  const owned = [];
  const releases = [];
  try {
    const { world, ranks, release } = place(api, options, input.world_size);
    releases.push(release);
    const replicas = api.Replicas.replicate(ranks.length, params);
    const zero = new api.ZeroRedundancyOptimizer(world, replicas, groups, name, defaults, {
      parametersAsBucketView: !!input.parameters_as_bucket_view,
    });
    owned.push(zero, replicas);
    if ('rank_of_param_before_add' in expected) {
      sameOrFail(zero.rankOfParam, expected.rank_of_param_before_add, 'rank_of_param_before_add');
    }
    let exact = await zeroSteps(api, c, zero, replicas, input.grads, expected.params_after_step, added, ranks);
    exact = (await zeroCheckEnd(api, c, zero, expected, '', ranks)) && exact;
    const reload = input.reload;
    if (reload && options.place && reload.world_size !== input.world_size) {
      skippedParts.push(`${c.name}: reload into a world of ${reload.world_size}: a run of ${input.world_size} cannot run it`);
    } else if (reload) {
      const last = expected.params_after_step[expected.params_after_step.length - 1][0];
      const at = place(api, options, reload.world_size);
      releases.push(at.release);
      const replicas2 = api.Replicas.replicate(at.ranks.length, last);
      const allGroups = added ? [...groups, added.group] : groups;
      const zero2 = new api.ZeroRedundancyOptimizer(at.world, replicas2, allGroups, name, defaults, {
        parametersAsBucketView: !!reload.parameters_as_bucket_view,
      });
      owned.push(zero2, replicas2);
      zero2.loadStateDict(expected.consolidated_state_dict);
      const want = expected.reload;
      sameOrFail(zero2.localStateSizes(), at.ranks.map((r) => want.local_state_sizes_after_load[r]), 'local_state_sizes_after_load');
      exact = (await zeroSteps(api, c, zero2, replicas2, reload.grads, want.params_after_step, null, at.ranks)) && exact;
      exact = (await zeroCheckEnd(api, c, zero2, want, 'reload.', at.ranks)) && exact;
    }
    return exact;
  } finally {
    owned.forEach((o) => o.free());
    releases.forEach((release) => release());
  }
}

/**
 * The tensors a zero_errors case creates, as the JS API takes them: a dense leaf tensor is a
 * parameter of the replicas (its index), any other one a description PyTorch's checks reject.
 */
class ZeroErrorTensors {
  constructor() {
    this.created = []; // {desc, index}: index into the model, or null
    this.model = []; // templates of the model's parameters
  }

  tensor(api, desc) {
    if ('ref' in desc) {
      const t = this.created[desc.ref];
      if (!t) fail(`ref ${desc.ref} before creation`);
      return t.index ?? t.js;
    }
    const dense = desc.device !== 'meta' && desc.layout !== 'sparse_coo' && desc.leaf !== false;
    const entry = { desc, index: null, js: null };
    if (dense) {
      entry.index = this.model.length;
      this.model.push(zeros(api, desc.dtype, desc.shape));
    } else {
      entry.js = { ...desc };
    }
    this.created.push(entry);
    return entry.index ?? entry.js;
  }

  tensors(api, list) {
    return list.map((d) => this.tensor(api, d));
  }

  /** The constructor's `params` as PyTorch got it. */
  params(api, p) {
    switch (p.form) {
      case 'tensor_list':
        return this.tensors(api, p.tensors);
      case 'param_groups':
        return p.groups.map((g) => ('params' in g ? { ...(g.options ?? {}), params: this.tensors(api, g.params) } : { ...(g.options ?? {}) }));
      case 'empty_list':
        return [];
      case 'python_floats':
        return [...p.values];
      case 'single_tensor': {
        // One tensor, not a list: its description (a lone index would be a Python int).
        const desc = p.tensor;
        this.created.push({ desc, index: null, js: null });
        return { ...desc };
      }
      case 'python_int':
        return p.value;
      case 'mixed_tensor_and_group':
        return [this.tensor(api, p.tensor), { params: this.tensors(api, p.group_params) }];
      default:
        return fail(`unknown params form ${p.form}`);
    }
  }
}

/** Each rank's error from a thrown per-rank error (`rankErrors`), or none. */
function rankOutcomes(w, error) {
  const out = Array(w).fill(null);
  if (error === null) return out;
  if (!(error instanceof Error) || !Array.isArray(error.rankErrors)) {
    fail(`a call every rank makes threw without rankErrors: ${error && error.name}: ${error && error.message}`);
  }
  for (const e of error.rankErrors) out[e.rank] = e;
  return out;
}

async function outcome(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return error;
  }
}

/**
 * zero_errors: every stage's outcome, message and warnings per rank, as the library reports
 * them (each process of a run over NATS, `place`, checks its own ranks).
 */
async function zeroErrors(api, c, options) {
  const { input, expected } = c;
  const w = input.world_size;
  const ctor = input.constructor;
  const t = new ZeroErrorTensors();
  const params = t.params(api, ctor.params);
  const constructed = t.created.length;
  const added = input.calls.filter((call) => call.method === 'add_param_group').map((call) => t.tensors(api, call.params));
  const { world, ranks, release } = place(api, options, w);
  const replicas = api.Replicas.replicate(ranks.length, t.model);
  const stages = [];
  const since = (mark) => {
    const records = api.recordedWarnings().slice(mark);
    return [...Array(w).keys()].map((r) => records.filter((x) => x.ranks === null || x.ranks.includes(r)).map((x) => x.message));
  };
  let zero = null;
  try {
    let mark = api.recordedWarnings().length;
    const error = await outcome(() => {
      zero = new api.ZeroRedundancyOptimizer(world, replicas, params, ctor.optimizer.name, ctor.optimizer.options, {
        parametersAsBucketView: !!ctor.parameters_as_bucket_view,
        overlapWithDdp: !!ctor.overlap_with_ddp,
      });
    });
    stages.push({ stage: 'constructor', errors: rankOutcomes(w, error), warnings: since(mark) });
    if (zero) {
      let nextAdded = 0;
      for (let k = 0; k < input.calls.length; k++) {
        const call = input.calls[k];
        mark = api.recordedWarnings().length;
        let errors;
        switch (call.method) {
          case 'set_grads': {
            const grads = Array(t.model.length).fill(null);
            call.grads.forEach((g, id) => {
              const index = t.created[id].index;
              if (index !== null) grads[index] = g;
            });
            ranks.forEach((_, i) => replicas.setGrads(i, grads));
            continue;
          }
          case 'set_requires_grad': {
            const index = t.created[call.param].index;
            if (index !== null) zero.setRequiresGrad(index, call.value);
            continue;
          }
          case 'state_dict':
            // Every rank asks for its own.
            errors = Array(w).fill(null);
            for (const [i, r] of ranks.entries()) {
              const e = await outcome(() => zero.stateDict(i));
              errors[r] = e === null ? null : { rank: r, name: e.name, message: e.message };
            }
            break;
          case 'consolidate_state_dict':
            errors = rankOutcomes(w, await outcome(() => zero.consolidateStateDict(call.to)));
            break;
          case 'step':
            errors = rankOutcomes(w, await outcome(() => zero.step()));
            break;
          case 'add_param_group':
            errors = rankOutcomes(w, await outcome(() => zero.addParamGroup({ params: added[nextAdded++] })));
            break;
          case 'load_state_dict':
            errors = rankOutcomes(w, await outcome(() => zero.loadStateDict(call.state_dict)));
            break;
          default:
            fail(`unknown call ${call.method}`);
        }
        stages.push({ stage: `calls[${k}]`, errors, warnings: since(mark) });
      }
    }
    // Every stage, per rank.
    sameOrFail(stages.map((s) => s.stage), expected.stages.map((s) => s.stage), 'stages');
    stages.forEach((stage, i) => {
      const want = expected.stages[i];
      for (const r of ranks) {
        const e = stage.errors[r];
        const what = `${stage.stage}: rank ${r}`;
        if (want.outcome_per_rank[r] === 'ok') {
          if (e !== null) fail(`${what} raised ${e.name}: ${e.message}`);
        } else {
          // Where PyTorch's ranks raised different classes, each rank's (scripts/torch-fuzz-gloo.py).
          const type = want.error_types_per_rank?.[r] ?? want.error_type;
          if (e === null) fail(`${what} succeeded, expected ${type}`);
          if (e.name !== type) fail(`${what} raised ${e.name}, expected ${type}`);
          if (e.message !== want.messages_per_rank[r]) {
            fail(`${what}: message ${JSON.stringify(e.message)}, expected ${JSON.stringify(want.messages_per_rank[r])}`);
          }
        }
        const got = stage.warnings[r];
        const texts = want.warnings_per_rank[r];
        if (got.length !== texts.length || !texts.every((text, j) => got[j].includes(text))) {
          fail(`${what} warned ${JSON.stringify(got)}, expected ${JSON.stringify(texts)}`);
        }
      }
    });
    // The first error, on the ranks that raised it (a process of a run has checked its own
    // ranks' errors stage by stage above; which rank raised first is the whole run's to say).
    const first = stages.find((s) => s.errors.some((e) => e !== null));
    if (options.place) {
      // nothing more
    } else if (!first) {
      if (expected.error) fail('expected an error, none was raised');
    } else {
      if (!expected.error) fail(`unexpected error at ${first.stage}`);
      const error = first.errors.find((e) => e !== null);
      if (error.name !== expected.error.type) fail(`error type ${error.name} != expected ${expected.error.type}`);
      if (!error.message.includes(expected.error.message_contains)) {
        fail(`error message ${JSON.stringify(error.message)} lacks ${JSON.stringify(expected.error.message_contains)}`);
      }
      if (first.stage !== expected.error_at) fail(`error at ${first.stage}, expected at ${expected.error_at}`);
      const raised = first.errors.map((e, r) => (e === null ? null : r)).filter((r) => r !== null);
      sameOrFail(raised, expected.raised_on_ranks, 'raised_on_ranks');
    }
    // Every warning with its channel and category, and no other (a process of a run sees its
    // own ranks' warnings, checked per rank above: none but those expected).
    const records = api.recordedWarnings();
    const matches = (x, d) => x.channel === d.channel && x.category === d.category && x.message.includes(d.message);
    for (const d of options.place ? [] : expected.warning_details) {
      if (!records.some((x) => matches(x, d))) fail(`no ${d.channel} ${d.category} warning ${JSON.stringify(d.message)}`);
    }
    const extra = records.find((x) => !expected.warning_details.some((d) => matches(x, d)));
    if (extra) fail(`unexpected warning ${extra.channel} ${extra.category} ${JSON.stringify(extra.message)}`);
    let exact = true;
    if (zero && expected.params_after_per_rank) {
      const all = await replicas.params();
      for (const [i, r] of ranks.entries()) {
        const actual = t.created.slice(0, constructed).map((e) => (e.index === null ? null : all[i][e.index]));
        exact = compareTensorList(api, c, actual, expected.params_after_per_rank[r], `params_after_per_rank[${r}]`) && exact;
      }
    }
    if (zero && 'rank_of_param' in expected) {
      const owners = zero.rankOfReplicaParam();
      const actual = t.created.slice(0, constructed).map((e) => (e.index === null ? null : owners[e.index]));
      sameOrFail(actual, expected.rank_of_param, 'rank_of_param');
    }
    return exact;
  } finally {
    if (zero) zero.free();
    replicas.free();
    release();
  }
}

/**
 * zero_join: Join([ddp, zero]) with uneven inputs. The runner feeds each rank's local
 * gradients while it has inputs and tells the context which ranks still have them; DDP's
 * all-reduce, the joined ranks' hooks and the final broadcast are the library's.
 */
async function zeroJoin(api, c, options) {
  const { input, expected } = c;
  const w = input.world_size;
  const steps = input.steps_per_rank;
  const beforeForward = input.zero_grad === 'before_forward';
  if (!beforeForward && input.zero_grad !== 'after_step') fail(`unknown zero_grad ${input.zero_grad}`);
  const { world, ranks, release } = place(api, options, w);
  const replicas = api.Replicas.replicate(ranks.length, input.initial_params);
  const none = input.initial_params.map(() => null);
  const owned = [replicas, { free: release }];
  try {
    const ddp = new api.DistributedDataParallel(world, replicas);
    owned.unshift(ddp);
    const zero = new api.ZeroRedundancyOptimizer(world, replicas, null, input.optimizer.name, input.optimizer.options, {
      parametersAsBucketView: !!input.parameters_as_bucket_view,
    });
    owned.unshift(zero);
    const join = new api.Join([ddp, zero], { divideByInitialWorldSize: input.divide_by_initial_world_size });
    owned.unshift(join);
    let exact = true;
    for (let t = 0; t < input.grads.length; t++) {
      const hasInput = steps.map((s) => s > t);
      // Each process says which of its own ranks still have an input.
      join.iteration(ranks.map((r) => hasInput[r]));
      for (const [i, r] of ranks.entries()) {
        if (!hasInput[r]) continue;
        if (beforeForward) replicas.setGrads(i, none);
        replicas.setGrads(i, input.grads[t][r]);
      }
      ddp.synchronizeGradients();
      const grads = await replicas.grads();
      for (const [i, r] of ranks.entries()) {
        if (hasInput[r]) {
          exact = compareTensorList(api, c, grads[i], expected.grads_after_backward[t][r], `grads_after_backward[${t}][${r}]`) && exact;
        }
      }
      zero.step();
      if (!beforeForward) ranks.forEach((r, i) => hasInput[r] && replicas.setGrads(i, none));
      const params = await replicas.params();
      for (const [i, r] of ranks.entries()) {
        if (hasInput[r]) {
          exact = compareTensorList(api, c, params[i], expected.params_after_step[t][r], `params_after_step[${t}][${r}]`) && exact;
        }
      }
    }
    join.exit();
    const params = await replicas.params();
    const grads = await replicas.grads();
    for (const [i, r] of ranks.entries()) {
      exact = compareTensorList(api, c, params[i], expected.params_after_join[r], `params_after_join[${r}]`) && exact;
      exact = compareTensorList(api, c, grads[i], expected.grads_after_join[r], `grads_after_join[${r}]`) && exact;
    }
    sameOrFail(zero.localStateSizes(), ranks.map((r) => expected.local_state_sizes[r]), 'local_state_sizes');
    sameOrFail(zero.rankOfParam, expected.rank_of_param, 'rank_of_param');
    return exact;
  } finally {
    owned.forEach((o) => o.free());
  }
}

/** distributed_optimizer: per-owner local optimizers over RPC, from autograd contexts. */
async function distributedOptimizer(api, c) {
  const { input, expected } = c;
  const names = [...Array(input.workers).keys()].map((k) => `worker${k}`);
  const world = new api.RpcWorld(names);
  const rrefs = input.params.map((p) => world.remote(p.owner === -1 ? 'driver' : `worker${p.owner}`, p.initial));
  const functional = input.local_optimizer === 'functional';
  const dopt = new api.DistributedOptimizer(world, input.optimizer.name, rrefs, input.optimizer.options, { functional });
  let exact = true;
  try {
    for (let t = 0; t < input.grads.length; t++) {
      const context = world.context();
      try {
        for (let i = 0; i < rrefs.length; i++) {
          const g = input.grads[t][i];
          if (g !== null) await world.recordGradient(context.id, rrefs[i], g);
        }
        try {
          await dopt.step(context.id);
        } catch (error) {
          fail(`step ${t}: ${error.name}: ${error.message}`);
        }
        const params = [];
        const inContext = [];
        const gradAttr = [];
        for (const rref of rrefs) {
          params.push(await rref.toHere());
          const all = await world.getGradients(context.id, rref.owner);
          inContext.push(all.get(rref.id) ?? null);
          gradAttr.push(await world.gradOf(rref));
        }
        exact = compareTensorList(api, c, params, expected.params_after_step[t], `params_after_step[${t}]`) && exact;
        exact = compareTensorList(api, c, inContext, expected.grads_in_context[t], `grads_in_context[${t}]`) && exact;
        exact = compareTensorList(api, c, gradAttr, expected.param_grad_attr_after_step[t], `param_grad_attr_after_step[${t}]`) && exact;
      } finally {
        context.release();
        context.free();
      }
    }
    if (dopt.isFunctionalOptim !== expected.is_functional_optim) fail('is_functional_optim differs');
    const locals = dopt.localOptimizers().map((o) => ({
      owner: o.owner === 'driver' ? -1 : Number(o.owner.replace('worker', '')),
      param_indices: o.paramIndices,
    }));
    sameOrFail(locals, expected.local_optimizers, 'local_optimizers');
    return exact;
  } finally {
    dopt.free();
    rrefs.forEach((r) => r.free());
    world.free();
  }
}

const RUNNERS = {
  dp_sgd_step: dpSgdStep,
  periodic_averager: averager,
  hierarchical_averager: averager,
  local_optimizer: localOptimizer,
  post_local_sgd: postLocalSgd,
  diloco,
  streaming_diloco: streamingDiloco,
  zero_partition: zeroPartition,
  zero_trajectory: zeroTrajectory,
  zero_errors: zeroErrors,
  zero_join: zeroJoin,
  distributed_optimizer: distributedOptimizer,
};

/**
 * Kinds that have golden files but no JS runner yet, reported as pending (by name and count)
 * instead of run. Every other kind on disk must have a runner and pass in full. A kind is
 * removed from this list when its runner lands (the count check fails while a kind is both
 * here and in RUNNERS).
 */
export const PENDING_KINDS = [];

/** Whether this runner has a runner for `kind`. */
export function hasRunner(kind) {
  return Object.hasOwn(RUNNERS, kind);
}

/**
 * Runs one case. Resolves to {name, kind, ok, bitExact, message}; never rejects.
 * `typedInputs`: pass dp_sgd_step tensors as typed arrays instead of the golden number lists.
 * `place(size)`: where the ranks live (see `place` above). `observe(name, rank, step, params)`:
 * called with each rank's parameters after each step (the averagers, post-local SGD, DiLoCo),
 * so that two placements of the same case can be compared bit for bit.
 */
export async function runCase(api, c, { typedInputs = false, place = undefined, observe = undefined } = {}) {
  const result = { name: c.name, kind: c.kind, ok: false, bitExact: false, message: '' };
  const runner = RUNNERS[c.kind];
  if (!runner) {
    result.message = `kind ${c.kind} is not run through the JS API`;
    return result;
  }
  api.takeWarnings();
  try {
    const exact = await runner(api, c, { typedInputs, place, observe });
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
