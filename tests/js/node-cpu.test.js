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

/** The values every misuse call below is tried with, by label. */
const WEIRD = {
  undefined: undefined,
  null: null,
  0: 0,
  '-1': -1,
  2.5: 2.5,
  NaN: NaN,
  '"x"': 'x',
  '{}': {},
  '[]': [],
  '[[]]': [[]],
  '[[null]]': [[null]],
  '{data:"x"}': { data: 'x' },
  symbol: Symbol('s'),
  function: () => 1,
  '1n': 1n,
};

/** How distopt describes each non-number value in its messages. */
const DESCRIBED = {
  undefined: 'undefined',
  null: 'null',
  '"x"': 'a string ("x")',
  '{}': 'an object',
  '[]': 'an array',
  '[[]]': 'an array',
  '[[null]]': 'an array',
  '{data:"x"}': 'an object',
  symbol: 'a symbol',
  function: 'a function',
  '1n': 'a bigint',
};

const T = (text) => ['TypeError', text];
const V = (text) => ['ValueError', text];
/** Valid input, not misuse: the call must succeed. */
const OK = 'ok';

/** Expectations for an integer argument named `what`: every non-number a TypeError naming what it got. */
function integerArgument(what, { zero, negative = V(`${what} must be a non-negative integer, got -1`) }) {
  const out = { 0: zero, '-1': negative, 2.5: T(`${what} must be an integer, got 2.5`), NaN: T(`${what} must be an integer, got NaN`) };
  for (const [label, described] of Object.entries(DESCRIBED)) out[label] = T(`${what} must be an integer, got ${described}`);
  return out;
}

/** `spec` without the expectations for `labels` (space-separated), to give them anew. */
function omit(spec, labels) {
  const out = { ...spec };
  for (const label of labels.split(' ')) delete out[label];
  return out;
}

/** Expands `{'a b': e}` into `{a: e, b: e}`; every label of WEIRD must be given exactly once. */
function expectations(spec, what) {
  const out = {};
  for (const [labels, expected] of Object.entries(spec)) {
    for (const label of labels.split(' ')) {
      assert.ok(!(label in out), `${what}: ${label} given twice`);
      out[label] = expected;
    }
  }
  assert.deepEqual(Object.keys(out).sort(), Object.keys(WEIRD).sort(), `${what}: one expectation per value`);
  return out;
}

/** Runs `call`; returns the failure (a string) or null when it did what `expected` says. */
async function check(what, call, expected) {
  let error = null;
  try {
    await call();
  } catch (e) {
    error = e;
  }
  if (expected === OK) return error === null ? null : `${what}: valid input threw ${error?.name}: ${error?.message}`;
  if (error === null) return `${what}: did not throw (expected ${expected[0]})`;
  if (!(error instanceof Error)) return `${what}: threw a non-Error ${typeof error}: ${String(error)}`;
  if (error instanceof WebAssembly.RuntimeError) return `${what}: a trap: ${error.message}`;
  if (error.name !== expected[0]) return `${what}: ${error.name} (${error.message}), expected ${expected[0]}`;
  if (!error.message.includes(expected[1])) return `${what}: ${JSON.stringify(error.message)} lacks ${JSON.stringify(expected[1])}`;
  return null;
}

test('every misuse throws the named Error it should, never a trap', async (t) => {
  const { sgdStep, World, Replicas, SGD, Adam, AdamW, PeriodicModelAverager, HierarchicalModelAverager } = api;
  const { PostLocalSGDOptimizer, PostLocalSGDState, Trainer, tensor, tensorValues, StepBench, takeWarnings } = api;
  const r = Replicas.replicate(2, [[1, 2]]);
  const w = new World(2);
  const expectedTensor = (prefix) => {
    const out = {};
    for (const label of ['undefined', 'null', '"x"', 'symbol', 'function', '1n']) {
      out[label] = V(`${prefix}expected a tensor (a {dtype, shape, data} object, a typed array or a nested list), got ${DESCRIBED[label]}`);
    }
    out['{}'] = V(`${prefix}a tensor object needs a "data" typed array or list, got undefined`);
    out['{data:"x"}'] = V(`${prefix}a tensor object needs a "data" typed array or list, got a string ("x")`);
    out['[[null]]'] = V(`${prefix}expected a number, got null`);
    // A number is a 0-d tensor, [] a tensor of shape [0], [[]] one of shape [1, 0].
    out['0 -1 2.5 NaN [] [[]]'] = OK;
    return out;
  };
  const notAnArray = (what) => {
    const out = {};
    for (const label of ['undefined', 'null', '"x"', '{}', '{data:"x"}', 'symbol', 'function', '1n']) {
      out[label] = T(`${what} must be an array, got ${DESCRIBED[label]}`);
    }
    for (const label of ['0', '-1', '2.5', 'NaN']) out[label] = T(`${what} must be an array, got a number (${label})`);
    return out;
  };
  const objectConversion = (what) => ({
    symbol: T(`${what}: a symbol cannot be converted`),
    function: T(`${what}: a function cannot be converted`),
    '1n': T(`${what}: a bigint cannot be converted`),
  });
  const MISUSE = [
    ['sgdStep(x, x, x)', (x) => sgdStep(x, x, x), {
      ...notAnArray('parameterReplicas'),
      '[] [[]] [[null]]': T('learningRate must be a number, got an array'),
    }],
    ['sgdStep([[x]], [[x]], 0.1)', (x) => sgdStep([[x]], [[x]], 0.1), expectedTensor('parameter 0 of rank 0: ')],
    ['new World(x)', (x) => new World(x), integerArgument('size', { zero: V('a world needs at least one rank') })],
    ['new Replicas(x)', (x) => new Replicas(x), {
      ...notAnArray('perRank'),
      '[]': V('Replicas need at least one rank'),
      '[[]]': OK, // one rank without parameters
      '[[null]]': V('perRank[0][0]: expected a tensor (a {dtype, shape, data} object, a typed array or a nested list), got null'),
    }],
    ['Replicas.replicate(x, [[1]])', (x) => Replicas.replicate(x, [[1]]), integerArgument('ranks', { zero: V('Replicas need at least one rank') })],
    ['Replicas.replicate(2, x)', (x) => Replicas.replicate(2, x), {
      ...notAnArray('params'),
      '[] [[]]': OK, // no parameters; one parameter of shape [0]
      '[[null]]': V('params[0]: expected a number, got null'),
    }],
    ['r.setGrads(x, [[1, 2]])', (x) => r.setGrads(x, [[1, 2]]), integerArgument('rank', { zero: OK })],
    ['r.setGrads(0, x)', (x) => r.setGrads(0, x), {
      ...notAnArray('grads'),
      '[]': V('0 gradients given for rank 0, the model has 1 parameters'),
      '[[]]': V('gradient 0 of rank 0 has shape [0], expected [2]'),
      '[[null]]': V('grads[0]: expected a number, got null'),
    }],
    ['r.setParam(0, x, [1, 2])', (x) => r.setParam(0, x, [1, 2]), integerArgument('parameter index', { zero: OK })],
    ['r.param(x, 0)', (x) => r.param(x, 0), integerArgument('rank', { zero: OK })],
    ['r.shape(x)', (x) => r.shape(x), integerArgument('parameter index', { zero: OK })],
    ['new SGD(r, x)', (x) => new SGD(r, x), {
      'undefined null {}': OK, // the defaults
      0: T('optimizer options must be an object, got 0'),
      '-1': T('optimizer options must be an object, got -1'),
      2.5: T('optimizer options must be an object, got 2.5'),
      NaN: T('optimizer options must be an object, got "nan"'),
      '"x"': T('optimizer options must be an object, got "x"'),
      '[]': T('optimizer options must be an object, got []'),
      '[[]]': T('optimizer options must be an object, got [[]]'),
      '[[null]]': T('optimizer options must be an object, got [[null]]'),
      '{data:"x"}': T("SGD.__init__() got an unexpected keyword argument 'data'"),
      ...objectConversion('options'),
    }],
    ['new SGD(r, { lr: x })', (x) => new SGD(r, { lr: x }), {
      'undefined null': T("option 'lr' must be a number, got null"),
      '0 2.5': OK,
      '-1': V('Invalid learning rate: -1.0'),
      NaN: OK, // PyTorch's SGD checks `lr < 0.0`, which NaN passes (its Adam refuses NaN)
      '"x"': T(`option 'lr' must be a number, got "x"`),
      '{}': T("option 'lr' must be a number, got {}"),
      '[]': T("option 'lr' must be a number, got []"),
      '[[]]': T("option 'lr' must be a number, got [[]]"),
      '[[null]]': T("option 'lr' must be a number, got [[null]]"),
      '{data:"x"}': T(`option 'lr' must be a number, got {"data":"x"}`),
      ...objectConversion('options.lr'),
    }],
    ['new SGD(r, {}, x)', (x) => new SGD(r, {}, x), {
      'undefined null': OK, // one group of every parameter
      '0 -1 2.5 NaN "x" {} {data:"x"}': T('paramGroups must be an array of {params: [...], ...options} objects'),
      '[]': V('optimizer got an empty parameter list'),
      '[[]] [[null]]': T('paramGroups[0] must be an object {params: [...], ...options}'),
      ...objectConversion('paramGroups'),
    }],
    ['new Adam(r, { betas: x })', (x) => new Adam(r, { betas: x }), {
      'undefined null 0 -1 2.5 NaN "x" {} [] [[]] [[null]] {data:"x"}': T("option 'betas' must be a pair of numbers"),
      ...objectConversion('options.betas'),
    }],
    ['new PeriodicModelAverager(x, 0, w)', (x) => new PeriodicModelAverager(x, 0, w), {
      ...omit(integerArgument('period', { zero: V('Arg ``period`` must be a positive value.'), negative: V('Arg ``period`` must be a positive value.') }), 'undefined null'),
      'undefined null': OK, // period 1 (with PyTorch's warning)
    }],
    ['new PeriodicModelAverager(1, x, w, 3)', (x) => new PeriodicModelAverager(1, x, w, 3), {
      ...omit(integerArgument('warmupSteps', {}), 'undefined null 0 -1'),
      // warm-up 0 (the default) or -1: the group of 3 in a world of 2 fails first, as new_subgroups would.
      'undefined null 0 -1': V("The arg 'group_size' (3) must not exceed the world size (2)"),
    }],
    ['new HierarchicalModelAverager(x, 0, w)', (x) => new HierarchicalModelAverager(x, 0, w), {
      'undefined null 0 -1 2.5 NaN "x" {} {data:"x"} symbol function 1n': T('periodGroupSizeDict must be an array of [period, groupSize] pairs or a Map'),
      '[]': V('Arg ``period_group_size_dict`` must not be empty.'),
      '[[]] [[null]]': T('periodGroupSizeDict[0] must be a [period, groupSize] pair'),
    }],
    ['new PostLocalSGDOptimizer(x, x)', (x) => new PostLocalSGDOptimizer(x, x), {
      'undefined null 0 -1 2.5 NaN "x" {} [] [[]] [[null]] {data:"x"} symbol function 1n': T('optim must be an SGD, Adam or AdamW object (and not freed)'),
    }],
    ['new PostLocalSGDState(w, x, -1)', (x) => new PostLocalSGDState(w, x, -1), {
      ...omit(integerArgument('subgroupSize', {}), 'undefined null 0 -1'),
      // No subgroup size (the world) or a number: the start iteration -1 fails.
      'undefined null 0 -1': V('startLocalSGDIter must be a non-negative integer, got -1'),
    }],
    ['new Trainer(x)', (x) => new Trainer(x), {
      'undefined null 0 -1 2.5 NaN "x" [] [[]] [[null]]': T('Trainer needs a settings object: {ranks, algorithm, …}'),
      '{}': T("Trainer settings need 'ranks'"),
      '{data:"x"}': T("Trainer got an unexpected setting 'data'"),
      ...objectConversion('settings'),
    }],
    ['new Trainer({ ranks: 2, algorithm: x })', (x) => new Trainer({ ranks: 2, algorithm: x }), {
      'undefined null': OK, // the default algorithm
      0: T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got 0`),
      '-1': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got -1`),
      2.5: T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got 2.5`),
      // (JSON has no NaN: it used to read as the string "nan".)
      NaN: V("'algorithm' must be finite, got NaN"),
      '"x"': V("unknown algorithm 'x': expected sync, periodic, hierarchical, zero or diloco"),
      '{}': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got {}`),
      '[]': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got []`),
      '[[]]': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got [[]]`),
      '[[null]]': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got [[null]]`),
      '{data:"x"}': T(`'algorithm' must be "sync", "periodic", "hierarchical", "zero" or "diloco", got {"data":"x"}`),
      ...objectConversion('settings.algorithm'),
    }],
    ['tensor(x, [2], [1, 2])', (x) => tensor(x, [2], [1, 2]), {
      'undefined null': T('tensor() needs a dtype'),
      0: T('dtype must be a string, got a number (0)'),
      '-1': T('dtype must be a string, got a number (-1)'),
      2.5: T('dtype must be a string, got a number (2.5)'),
      NaN: T('dtype must be a string, got a number (NaN)'),
      '"x"': V('tensor: unsupported dtype x'),
      '{} {data:"x"}': T('dtype must be a string, got an object'),
      '[] [[]] [[null]]': T('dtype must be a string, got an array'),
      symbol: T('dtype must be a string, got a symbol'),
      function: T('dtype must be a string, got a function'),
      '1n': T('dtype must be a string, got a bigint'),
    }],
    ["tensor('float16', x, [1, 2])", (x) => tensor('float16', x, [1, 2]), {
      ...omit(notAnArray('shape'), 'undefined null'),
      'undefined null': T('tensor() needs a shape'),
      '[]': V('tensor: data has 2 values but shape [] needs 1'),
      '[[]] [[null]]': V('tensor: shape entries must be non-negative integers, got an array'),
    }],
    ['tensorValues(x)', (x) => tensorValues(x), expectedTensor('tensor: ')],
    ['StepBench.create(x, 10)', (x) => StepBench.create(x, 10), integerArgument('ranks', { zero: V('StepBench needs at least one rank and one element') })],
  ];
  for (const [template, call, spec] of MISUSE) {
    await t.test(template, async () => {
      const expected = expectations(spec, template);
      const failures = [];
      for (const [label, x] of Object.entries(WEIRD)) {
        const failure = await check(template.replace(/\bx\b/g, label), () => call(x), expected[label]);
        if (failure) failures.push(failure);
      }
      takeWarnings();
      assert.deepEqual(failures, [], `${failures.length} of ${Object.keys(WEIRD).length} calls`);
    });
  }
  // Objects of the wrong class, freed ones, and sizes beyond what the module can hold.
  const freed = Replicas.replicate(1, [[1]]);
  freed.free();
  const avg = new PeriodicModelAverager(2, 0, w);
  const huge = [{ dtype: 'float32', shape: [1 << 28], data: new Float32Array(1) }];
  const SPECIFIC = [
    ['Replicas.replicate(1e9, [[1]])', () => Replicas.replicate(1e9, [[1]]), ['RuntimeError', 'not enough memory for 1000000000 replicas of these parameters (their parameters and gradients): 512000000000 bytes requested, more than a 32-bit WebAssembly module can address']],
    ['new Replicas(data shorter than its shape)', () => new Replicas([huge, huge, huge]), V('perRank[0][0]: data has 1 values but shape [268435456] needs 268435456')],
    ['StepBench.create(2^20, 2^20)', () => StepBench.create(1 << 20, 1 << 20), V('StepBench: ranks × elements is too large')],
    ['new PeriodicModelAverager(2, 0, replicas)', () => new PeriodicModelAverager(2, 0, r), T('world must be a World (and not freed)')],
    ['avg.averageParameters(world)', () => avg.averageParameters(w), T('replicas must be a Replicas object (and not freed)')],
    ['avg.averageParameters(freed)', () => avg.averageParameters(freed), T('PeriodicModelAverager.averageParameters: replicas is a Replicas that was freed (free() was called)')],
    ['new SGD(freed)', () => new SGD(freed), T('new SGD: replicas is a Replicas that was freed (free() was called)')],
    ['new SGD(world)', () => new SGD(w), T('replicas must be a Replicas object (and not freed)')],
    ['new PostLocalSGDOptimizer(averager, optimizer)', () => new PostLocalSGDOptimizer(avg, new SGD(r)), T('optim must be an SGD, Adam or AdamW object (and not freed)')],
    ['r.broadcastParams(replicas, 0)', () => r.broadcastParams(r, 0), T('world must be a World (and not freed)')],
    ['r.broadcastParams(world, 2)', () => r.broadcastParams(w, 2), ['IndexError', 'rank 2 out of range for 2 ranks']],
    ['r.broadcastParams(world, "0")', () => r.broadcastParams(w, '0'), T('rank must be an integer, got a string ("0")')],
  ];
  await t.test('wrong classes, freed objects, sizes', async () => {
    const failures = [];
    for (const [what, call, expected] of SPECIFIC) {
      const failure = await check(what, call, expected);
      if (failure) failures.push(failure);
    }
    assert.deepEqual(failures, []);
  });
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

test('DiLoCo compress sends bfloat16 pseudo-gradients, counted at 2 bytes, and refuses bad options keeping the optimizers', async () => {
  const { DiLoCo, World, Replicas, SGD } = api;
  const run = async (options) => {
    const r = Replicas.replicate(2, [[1, 2]]);
    const w = new World(2);
    const diloco = new DiLoCo(new SGD(r, { lr: 1 }), new SGD(r, { lr: 1 }), 1, w, options);
    diloco.zeroGrad();
    r.setGrads(0, [[1 + 2 ** -10, 0.5]]);
    r.setGrads(1, [[3, 0.25]]);
    assert.equal(diloco.step(), true);
    const params = (await r.params()).map(([p]) => [...p.data]);
    return { params, bytes: w.stats().allReduceBytesByGroupSize['2'], compress: diloco.compress };
  };
  // Uncompressed: mean(1 + 2^-10, 3) = 2 + 2^-11; in bfloat16 1 + 2^-10 rounds to 1, mean 2.
  const plain = await run(undefined);
  assert.equal(plain.compress, 'none');
  assert.deepEqual(plain.params, [[-1 - 2 ** -11, 1.625], [-1 - 2 ** -11, 1.625]]);
  assert.equal(plain.bytes, 8);
  const bf16 = await run({ compress: 'bf16' });
  assert.equal(bf16.compress, 'bf16');
  assert.deepEqual(bf16.params, [[-1, 1.625], [-1, 1.625]]);
  assert.equal(bf16.bytes, 4);
  // float16 keeps 1 + 2^-10 and its half exactly, but the sum 2 + 2^-11 rounds to 2 (float16's
  // spacing at 2 is 2^-9): the mean is computed in the wire format.
  const f16 = await run({ compress: 'f16' });
  assert.equal(f16.compress, 'f16');
  assert.deepEqual(f16.params, [[-1, 1.625], [-1, 1.625]]);
  assert.equal(f16.bytes, 4);
  const r = Replicas.replicate(2, [[1, 2]]);
  const w = new World(2);
  const inner = new SGD(r, { lr: 0.5 });
  const outer = new SGD(r, { lr: 1 });
  const refused = [
    [{ compress: 'int8' }, 'ValueError', "compression must be one of 'none', 'bf16', 'f16', got 'int8'"],
    [{ compress: 16 }, 'TypeError', 'compress must be a string'],
    [{ compres: 'bf16' }, 'TypeError', "DiLoCo got an unexpected keyword argument 'compres'"],
    ['bf16', 'TypeError', 'DiLoCo options must be an object'],
  ];
  for (const [options, name, text] of refused) {
    const error = await thrown(() => new DiLoCo(inner, outer, 1, w, options));
    assert.equal(error.name, name, error.message);
    assert.ok(error.message.includes(text), error.message);
  }
  // Still their own.
  inner.step();
  outer.step();
});

test('errors carry the Python class and PyTorch text', async () => {
  const { sgdStep, World, Replicas, SGD, Adam, AdamW, PeriodicModelAverager, HierarchicalModelAverager } = api;
  const cases = [
    [() => sgdStep([], [], 0.1), 'ValueError', 'no replicas: parameter_replicas is empty'],
    [() => new World(0), 'ValueError', 'a world needs at least one rank'],
    [() => new SGD(Replicas.replicate(1, [[1]]), { lr: -0.5 }), 'ValueError', 'Invalid learning rate: -0.5'],
    [() => new Adam(Replicas.replicate(1, [[1]]), { eps: -1e-8 }), 'ValueError', 'Invalid epsilon value: -1e-08'],
    [() => new Adam(Replicas.replicate(1, [[1]]), { lr: NaN }), 'ValueError', 'Invalid learning rate: nan'],
    [() => new AdamW(Replicas.replicate(1, [[1]]), { betas: [0.9, Infinity] }), 'ValueError', 'Invalid beta parameter at index 1: inf'],
    [() => new SGD(Replicas.replicate(1, [[1]]), { momentum: -Infinity }), 'ValueError', 'Invalid momentum value: -inf'],
    [() => new SGD(Replicas.replicate(2, [[1], [2]]), {}, [{ params: [0] }, { params: [1, 0] }]), 'ValueError', 'some parameters appear in more than one parameter group'],
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

test("sgdStep reads rank 0's copy of a parameter only, its values and its dtype (the reference's p0j)", async () => {
  const { sgdStep } = api;
  const out = await sgdStep([[new Float32Array([1, 2])], [new Float64Array([7, 9])]], [[[2, 4]], [null]], 0.5);
  for (const rank of out.updatedReplicas) {
    assert.ok(rank[0].data instanceof Float32Array);
    assert.deepEqual([...rank[0].data], [0.5, 1]);
  }
  assert.deepEqual([...out.meanGradients[0].data], [1, 2]);
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
  const sd = await zero.stateDict(1);
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
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', {}, { bucket: true }), 'TypeError', "unknown ZeroRedundancyOptimizer option 'bucket': expected parametersAsBucketView or overlapWithDdp"],
    [() => new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', {}, { overlapWithDdp: 'yes' }), 'TypeError', 'zeroOptions.overlapWithDdp must be a boolean, got "yes"'],
    [() => new ZeroRedundancyOptimizer(world, replicas, [{ lr: 1 }], 'SGD'), 'ValueError', "must have a 'params' key"],
    [() => new ZeroRedundancyOptimizer(world, replicas, 5, 'SGD'), 'TypeError', 'iterable of Tensors or dicts, but got int'],
    [() => new ZeroRedundancyOptimizer(world, replicas, [0, 1.5], 'SGD'), 'TypeError', 'iterable of Tensors or dicts'],
    [() => new ZeroRedundancyOptimizer(world, replicas, [0, { dtype: 'float32', shape: [3], device: 'meta' }], 'SGD'), 'ValueError', 'torch.FloatTensor and torch.meta.FloatTensor'],
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

test('Join: DDP and ZeRO with uneven inputs, each rank\'s error, warnings with their ranks', async () => {
  const { World, Replicas, DistributedDataParallel, ZeroRedundancyOptimizer, Join, takeWarnings, recordedWarnings } = api;
  takeWarnings();
  const world = new World(3);
  const replicas = Replicas.replicate(3, [[0]]);
  const ddp = new DistributedDataParallel(world, replicas);
  const zero = new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', { lr: 1 });
  const join = new Join([ddp, zero], { divideByInitialWorldSize: false });
  join.iteration([true, true, true]);
  for (let r = 0; r < 3; r++) replicas.setGrads(r, [[6]]);
  ddp.synchronizeGradients();
  zero.step();
  join.iteration([false, true, true]);
  replicas.setGrads(1, [[3]]);
  replicas.setGrads(2, [[6]]);
  ddp.synchronizeGradients();
  // Rank 0 joined: it keeps its own gradient (2 + 2 + 2); the others divide by the 2 active ranks.
  assert.deepEqual((await replicas.grads()).map((g) => [...g[0].data]), [[6], [4.5], [4.5]]);
  zero.step();
  join.exit();
  assert.deepEqual(join.joined, [true, true, true]);
  assert.deepEqual(join.shadowIterations(), [1, 0, 0]);
  // Rank 0 owns the parameter and stepped with its stale gradient at the second iteration.
  assert.deepEqual((await replicas.params()).map((p) => [...p[0].data]), [[-12], [-12], [-12]]);

  zero.free();
  ddp.free();

  // throwOnEarlyTermination: every rank raises its own error.
  const ddp2 = new DistributedDataParallel(world, replicas);
  const strict = new Join([ddp2], { throwOnEarlyTermination: true });
  strict.iteration([true, false, true]);
  const early = await thrown(() => ddp2.synchronizeGradients());
  assert.equal(early.name, 'RuntimeError');
  assert.deepEqual(early.rankErrors, [
    { rank: 0, name: 'RuntimeError', message: 'Detected at least one rank that exhausted inputs. Throwing across all ranks.' },
    { rank: 1, name: 'RuntimeError', message: 'Rank 1 exhausted all inputs.' },
    { rank: 2, name: 'RuntimeError', message: 'Detected at least one rank that exhausted inputs. Throwing across all ranks.' },
  ]);
  ddp2.free();
  const joinError = await thrown(() => new Join([]));
  assert.equal(joinError.name, 'ValueError');
  assert.equal(joinError.message, 'The join context manager requires at least one joinable');
  // Join's options are read by their declared keys: an unknown one before any value.
  const ddp3 = new DistributedDataParallel(world, replicas);
  for (const [options, name, message] of [
    [{ enable: true, throwOnEarly: true }, 'TypeError', "unknown Join option 'throwOnEarly': expected enable, throwOnEarlyTermination or divideByInitialWorldSize"],
    [{ enable: null }, 'TypeError', 'options.enable must be a boolean, got null'],
    [{ divideByInitialWorldSize: 0 }, 'TypeError', 'options.divideByInitialWorldSize must be a boolean, got 0'],
    ['on', 'TypeError', 'options must be an object {enable, throwOnEarlyTermination, divideByInitialWorldSize}'],
  ]) {
    const e = await thrown(() => new Join([ddp3], options));
    assert.deepEqual([e.name, e.message], [name, message]);
  }
  ddp3.free();

  // Warnings carry their channel, category and ranks; errors each rank's message.
  const world2 = new World(2);
  const replicas2 = Replicas.replicate(2, [[1, 2, 3], [4, 5, 6]]);
  takeWarnings();
  const z = new ZeroRedundancyOptimizer(world2, replicas2, [0, 1, 0], 'SGD', { lr: 0.1 });
  const duplicate = recordedWarnings().filter((w) => w.message.includes('duplicate parameters'));
  // Every rank's check, then rank 0's local optimizer, which holds both copies.
  assert.deepEqual(duplicate.map((w) => [w.channel, w.category, w.ranks]), [
    ['warnings', 'UserWarning', [0, 1]],
    ['warnings', 'UserWarning', [0]],
  ]);
  assert.deepEqual(z.rankOfReplicaParam(), [0, 1]);
  assert.deepEqual(z.localOptimizerParamGroups(), [[[0]], [[1]]]);
  assert.equal(takeWarnings().length, 2);
  assert.deepEqual(recordedWarnings(), []);
  z.setRequiresGrad(0, false);
  z.step();
  assert.deepEqual(recordedWarnings().map((w) => [w.channel, w.category, w.ranks]), [['logging', 'WARNING', [0, 1]]]);
  await z.consolidateStateDict(-1);
  const notHere = await thrown(() => z.stateDict(1));
  assert.equal(notHere.name, 'RuntimeError');
  assert.match(notHere.message, /consolidate_state_dict\(to=1\)/);
  const loadError = await thrown(() => z.loadStateDict({ state: {}, param_groups: [] }));
  assert.deepEqual(loadError.rankErrors.map((e) => [e.rank, e.name]), [[0, 'ValueError'], [1, 'ValueError']]);
  z.free();
  takeWarnings();
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
    [() => new DistributedOptimizer(world, 'SGD', [a], {}, { functional: 'no' }), 'TypeError', 'settings.functional must be a boolean, got "no"'],
    [() => new DistributedOptimizer(world, 'SGD', [a], {}, { functionl: false }), 'TypeError', "unknown DistributedOptimizer option 'functionl': expected functional"],
    [() => new DistributedOptimizer(world, 'SGD', [a], {}, [true]), 'TypeError', 'settings must be an object {functional: boolean}'],
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

test('the trainer learns the hand-written digits (task.dataset, Trainer.parseDigits): held-out accuracy, typed errors', async () => {
  const fs = await import('node:fs');
  const { ROOT } = await import('./helpers.js');
  const bytes = fs.readFileSync(`${ROOT}/www/data/digits.bin`);
  const digits = api.Trainer.parseDigits(new Uint8Array(bytes));
  assert.equal(digits.name, 'digits');
  assert.equal(digits.classes, 10);
  assert.equal(digits.featureCount, 64);
  assert.ok(digits.features instanceof Float32Array && digits.features.length === 1797 * 64);
  assert.ok(digits.labels instanceof Uint8Array && digits.labels.length === 1797);
  // scikit-learn's first image is a 0 whose first row is 0,0,5,13,9,1,0,0 (of 16).
  assert.equal(digits.labels[0], 0);
  assert.deepEqual(Array.from(digits.features.slice(0, 4)), [0, 0, 5 / 16, 13 / 16]);
  const trainer = new api.Trainer({ ranks: 4, algorithm: 'periodic', period: 4, task: { dataset: digits } });
  assert.equal(trainer.taskName, 'digits');
  assert.equal(trainer.heldOut, true);
  assert.match(trainer.taskDescription, /359 held out/);
  // Non-IID: rank 0's shard is dominated by a few digits.
  const counts = Array.from(trainer.classCounts(0));
  const sorted = [...counts].sort((a, b) => b - a);
  assert.ok(sorted[0] + sorted[1] + sorted[2] > 0.7 * counts.reduce((a, b) => a + b), String(counts));
  const before = await trainer.evaluate();
  for (let i = 0; i < 120; i++) await trainer.step();
  const after = await trainer.evaluate();
  assert.equal(after.heldOut, true);
  assert.equal(after.samples, 359);
  assert.ok(before.meanModelAccuracy < 0.25, String(before.meanModelAccuracy));
  assert.ok(after.meanModelAccuracy > 0.8, `held-out accuracy ${before.meanModelAccuracy} -> ${after.meanModelAccuracy}`);
  trainer.free();
  // A plain-array data set works too; bad ones are named errors.
  const tiny = { features: [0, 1, 0.1, 0.9, 1, 0, 0.9, 0.1], labels: [0, 0, 1, 1], classes: 2 };
  const small = new api.Trainer({ ranks: 1, task: { dataset: tiny, testFraction: 0.25 } });
  assert.equal((await small.evaluate()).samples, 1);
  small.free();
  const cases = [
    [{ ...tiny, labels: [0, 0, 1, 2] }, 'ValueError', /label 2 of sample 3 is out of range for 2 classes/],
    [{ ...tiny, labels: [0, 0.5, 1, 1] }, 'ValueError', /labels must be integers/],
    [{ ...tiny, features: [0, 1, 2] }, 'ValueError', /not a whole number of rows/],
    [{ ...tiny, featureCount: 3 }, 'ValueError', /featureCount/],
    [{ ...tiny, features: 'x' }, 'TypeError', /must be a typed array or an array of numbers/],
    [{ ...tiny, classes: -1 }, 'TypeError', /classes/],
    [{ ...tiny, colour: 1 }, 'TypeError', /unexpected setting 'colour'/],
  ];
  for (const [dataset, name, message] of cases) {
    const e = await thrown(() => new api.Trainer({ ranks: 2, task: { dataset, testFraction: 0.25 } }));
    assert.equal(e.name, name, e.message);
    assert.match(e.message, message);
  }
  const mixed = await thrown(() => new api.Trainer({ ranks: 2, task: { dataset: tiny, samples: 10 } }));
  assert.match(mixed.message, /unexpected setting 'samples'/);
  // The settings' keys are the ones TrainerSettings declares; `world: undefined` is no world.
  for (const [settings, name, message] of [
    [{ ranks: 2, colour: 1 }, 'TypeError', "Trainer got an unexpected setting 'colour' (known: ranks, algorithm, period, fragments, fragmentSyncDelay, fragmentUpdateAlpha, compress, warmup, levels, subgroupSize, lr, momentum, batchSize, seed, task, world)"],
    [{ ranks: 2, task: { sample: 10 } }, 'TypeError', "task got an unexpected setting 'sample' (known: features, hidden, classes, samples, heterogeneity, seed)"],
    [{ ranks: 2, task: { dataset: { ...tiny, name: 5 } } }, 'TypeError', "'task.dataset.name' must be a string, got 5"],
    [{ ranks: 2, lr: '0.1' }, 'TypeError', `'lr' must be a number, got "0.1"`],
    [{ ranks: 2 ** 40 }, 'ValueError', "'ranks': invalid value: integer `1099511627776`, expected usize"],
    [{ ranks: 2, levels: [[2, 2], [4]] }, 'TypeError', "'levels' must be [period, groupSize] pairs of non-negative integers, got [4]"],
    [{ ranks: 2, task: 3 }, 'TypeError', "'task' must be an object, got 3"],
  ]) {
    const e = await thrown(() => new api.Trainer(settings));
    assert.deepEqual([e.name, e.message], [name, message]);
  }
  const worldless = new api.Trainer({ ranks: 2, world: undefined, task: { samples: 64 } });
  assert.equal(worldless.ranks, 2);
  worldless.free();
  const notDigits = await thrown(() => api.Trainer.parseDigits(new Uint8Array([1, 2, 3])));
  assert.equal(notDigits.name, 'ValueError');
  assert.match(notDigits.message, /not a digits file/);
  const notBytes = await thrown(() => api.Trainer.parseDigits('digits.bin'));
  assert.equal(notBytes.name, 'TypeError');
});

test('the trainer runs DiLoCo: local steps, an outer step every period, a quarter of the bytes', async () => {
  const sync = new api.Trainer({ ranks: 4, algorithm: 'sync', task: { samples: 1024 } });
  const diloco = new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, task: { samples: 1024 } });
  assert.equal(diloco.algorithm, 'diloco');
  assert.match(diloco.description, /^DiLoCo \(sync every 4 steps/);
  const syncReports = [];
  const reports = [];
  for (let i = 0; i < 40; i++) {
    syncReports.push(await sync.step());
    reports.push(await diloco.step());
  }
  for (const r of reports) {
    // No gradient all-reduce; every 4th step the outer step leaves one model on every rank.
    assert.equal(r.gradientsReduced, null, `step ${r.step}`);
    assert.equal(r.averaged, r.step % 4 === 0 ? 4 : null, `step ${r.step}`);
    if (r.step % 4 === 0) assert.equal(r.divergence, 0, `step ${r.step}`);
    else if (r.step > 1) assert.ok(r.divergence > 0, `step ${r.step}: the replicas drift between syncs`);
  }
  // One all-reduce of the pseudo-gradients (the model's size) per 4 steps against sync SGD's
  // gradient all-reduce every step.
  assert.ok(reports[0].bytesCommunicatedPerRank === 0);
  assert.equal(reports[39].bytesCommunicatedPerRank * 4, syncReports[39].bytesCommunicatedPerRank);
  const mean = (h) => h.reduce((a, r) => a + r.meanLoss, 0) / h.length;
  assert.ok(mean(reports.slice(-4)) < 0.6 * mean(reports.slice(0, 4)), `${mean(reports.slice(0, 4))} -> ${mean(reports.slice(-4))}`);
  const evaluation = await diloco.evaluate();
  assert.ok(evaluation.meanModelAccuracy > 0.5, String(evaluation.meanModelAccuracy));
  // Streaming DiLoCo: 2 fragments syncing staggered, each every 4 steps.
  const streaming = new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, fragments: 2, task: { samples: 1024 } });
  assert.match(streaming.description, /^Streaming DiLoCo \(2 fragments/);
  const synced = [];
  for (let i = 0; i < 8; i++) {
    const r = await streaming.step();
    if (r.averaged !== null) synced.push(r.step);
  }
  assert.equal(synced.length, 4, `fragment syncs at steps ${synced}`);
  for (const [settings, name, text] of [
    [{ fragments: 0 }, 'ValueError', 'into 0 non-empty fragments'],
    [{ fragments: 5 }, 'ValueError', 'into 5 non-empty fragments'],
    [{ fragments: 'x' }, 'TypeError', "'fragments' must be a non-negative integer"],
    [{ period: 0 }, 'ValueError', ''],
    [{ compress: 'int4' }, 'ValueError', "compression must be one of 'none', 'bf16', 'f16', got 'int4'"],
    [{ compress: 16 }, 'TypeError', "'compress' must be 'none', 'bf16' or 'f16', got 16"],
  ]) {
    const e = await thrown(() => new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, ...settings }));
    assert.equal(e.name, name, `${JSON.stringify(settings)}: ${e.message}`);
    assert.ok(e.message.includes(text), e.message);
  }
  // The pseudo-gradients all-reduced in bfloat16: half the bytes, and it still learns.
  const compressed = new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, compress: 'bf16', task: { samples: 1024 } });
  const squeezed = [];
  for (let i = 0; i < 40; i++) squeezed.push(await compressed.step());
  assert.equal(squeezed[39].bytesCommunicatedPerRank * 2, reports[39].bytesCommunicatedPerRank);
  assert.ok(mean(squeezed.slice(-4)) < 0.6 * mean(squeezed.slice(0, 4)), `${mean(squeezed.slice(0, 4))} -> ${mean(squeezed.slice(-4))}`);
  // torchft's fragment_sync_delay and fragment_update_alpha: the same steps, another trajectory
  // (the outer steps land a step later and are mixed with the local parameters).
  const overlapped = new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, fragments: 2, fragmentSyncDelay: 1, fragmentUpdateAlpha: 0.5, task: { samples: 1024 } });
  const again = new api.Trainer({ ranks: 4, algorithm: 'diloco', period: 4, fragments: 2, task: { samples: 1024 } });
  const [lossesOverlapped, lossesPlain] = [[], []];
  for (let i = 0; i < 8; i++) {
    lossesOverlapped.push((await overlapped.step()).meanLoss);
    lossesPlain.push((await again.step()).meanLoss);
  }
  assert.deepEqual(lossesOverlapped.slice(0, 2), lossesPlain.slice(0, 2), 'before the first outer step the runs agree');
  assert.notDeepEqual(lossesOverlapped, lossesPlain, 'the delay and the mixing change the trajectory');
  overlapped.free();
  again.free();
  for (const [settings, name, text] of [
    [{ algorithm: 'diloco', fragments: 2, fragmentSyncDelay: 2 }, 'ValueError', 'fragment_sync_delay'],
    [{ algorithm: 'diloco', fragmentUpdateAlpha: 1.5 }, 'ValueError', 'fragment_update_alpha'],
    [{ algorithm: 'diloco', fragmentSyncDelay: 'x' }, 'TypeError', "'fragmentSyncDelay'"],
    [{ algorithm: 'periodic', fragmentSyncDelay: 1 }, 'ValueError', "'fragmentSyncDelay' applies to algorithm 'diloco' only"],
    [{ algorithm: 'sync', fragmentUpdateAlpha: 0.5 }, 'ValueError', "'fragmentUpdateAlpha' applies to algorithm 'diloco' only"],
  ]) {
    const e = await thrown(() => new api.Trainer({ ranks: 4, period: 4, ...settings }));
    assert.equal(e.name, name, `${JSON.stringify(settings)}: ${e.message}`);
    assert.ok(e.message.includes(text), e.message);
  }
  const notDiLoCo = await thrown(() => new api.Trainer({ ranks: 4, algorithm: 'sync', compress: 'bf16' }));
  assert.equal(notDiLoCo.name, 'ValueError');
  assert.match(notDiLoCo.message, /'compress' applies to algorithm 'diloco' only/);
  sync.free();
  diloco.free();
  streaming.free();
  compressed.free();
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

test('ZeRO and DistributedOptimizer take the optimizer class as a value, as PyTorch does; ZeRO stateDict is a promise', async () => {
  const { World, Replicas, Adam, AdamW, SGD, ZeroRedundancyOptimizer, RpcWorld, DistributedOptimizer, takeWarnings } = api;
  const world = new World(2);
  const replicas = Replicas.replicate(2, [[1, 2, 3], [4, 5]]);
  const byClass = new ZeroRedundancyOptimizer(world, replicas, null, Adam, { lr: 0.1 });
  assert.equal(byClass.optimizer, 'Adam');
  for (let r = 0; r < 2; r++) replicas.setGrads(r, [[1, 1, 1], [1, 1]]);
  byClass.step();
  await byClass.consolidateStateDict(0);
  const pending = byClass.stateDict(0);
  assert.ok(pending instanceof Promise, 'stateDict returns a promise');
  const sd = await pending;
  assert.equal(sd.param_groups[0].lr, 0.1);
  assert.ok(sd.state['0'].exp_avg, 'Adam state');
  await assert.rejects(byClass.stateDict(1), { name: 'RuntimeError' });
  assert.equal(new ZeroRedundancyOptimizer(world, replicas, null, SGD, { lr: 0.1 }).optimizer, 'SGD');
  // Another class is refused as its name is: PyTorch's error.
  assert.throws(() => new ZeroRedundancyOptimizer(world, replicas, null, World), (e) => e.rankErrors?.length === 2 || e.name === 'ValueError');
  const rpc = new RpcWorld(['worker0']);
  const w = rpc.remote('worker0', [1, 2]);
  const dopt = new DistributedOptimizer(rpc, AdamW, [w], { lr: 0.1 });
  assert.deepEqual(dopt.localOptimizers().map((o) => o.owner), ['worker0']);
  takeWarnings();
});

test('StepBench.read hands out the step\'s tensors and its answer; synchronize() resolves', async () => {
  const { StepBench, synchronize } = api;
  const bench = await StepBench.create(2, 10);
  const before = await bench.read('params', 0);
  const grads = [await bench.read('grads', 0), await bench.read('grads', 1)];
  assert.ok(before instanceof Float32Array && before.length === 10);
  assert.deepEqual(await bench.read('params', 1), before, 'the ranks start equal');
  assert.notDeepEqual(grads[0], grads[1], 'each rank has its own gradients');
  assert.ok(grads[0].some((g) => g !== 0));
  await bench.run();
  await synchronize();
  for (const rank of [0, 1]) {
    const after = await bench.read('params', rank);
    for (let i = 0; i < 10; i++) {
      const want = before[i] - Math.fround(1e-3) * ((grads[0][i] + grads[1][i]) / 2);
      assert.ok(Math.abs(after[i] - want) <= 1e-7, `rank ${rank} element ${i}: ${after[i]} vs ${want}`);
    }
  }
  const rejects = (promise, name, text) =>
    assert.rejects(promise, (e) => e instanceof Error && e.name === name && e.message.includes(text));
  await rejects(bench.read('means', 0), 'ValueError', 'StepBench.read reads "params" or "grads", not "means"');
  await rejects(bench.read('params', 2), 'IndexError', 'rank 2 out of range for 2 ranks');
  const half = await StepBench.create(1, 4, 'float16');
  await rejects(half.read('params', 0), 'ValueError', 'StepBench.read returns float32 values; this bench times float16');
  half.free();
  bench.free();
});
