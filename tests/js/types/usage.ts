// A typed tour of distopt's API, checked by `tsc --noEmit` (tests/run-js). It is never run:
// it proves that index.d.ts describes what the package exports, and that misuse is caught.

import init, {
  Adam,
  AdamW,
  AutogradContext,
  DistributedDataParallel,
  DiLoCo,
  DistributedOptimizer,
  HierarchicalModelAverager,
  Join,
  PeriodicModelAverager,
  PostLocalSGDOptimizer,
  PostLocalSGDState,
  RRef,
  Replicas,
  RpcWorld,
  SGD,
  StepBench,
  synchronize,
  Trainer,
  World,
  ZeroRedundancyOptimizer,
  backendInfo,
  recordedWarnings,
  selectBackend,
  sgdStep,
  takeWarnings,
  tensor,
  tensorValues,
  version,
} from 'distopt';
import { openPort } from 'distopt/nats';
import { inWorker } from 'distopt/worker';
import type {
  BackendSelection,
  MembershipChange,
  NatsJoinOptions,
  Port,
  CommStats,
  DistoptError,
  ErrorName,
  Evaluation,
  StateDict,
  StepReport,
  StepResult,
  Tensor,
  LocalOptimizerInfo,
  RankError,
  WarningRecord,
} from 'distopt';

export async function tour(): Promise<void> {
  const info: BackendSelection = await init({ backend: 'auto' });
  const kind: 'gpu' | 'cpu' = info.kind;
  const reason: string = info.reason;
  const vendor: string | undefined = info.adapterInfo?.vendor;
  console.log(kind, reason, vendor, version(), backendInfo()?.name);
  await selectBackend('cpu');
  // @ts-expect-error: no such backend
  await selectBackend('metal');

  // The data-parallel SGD step: nested lists, typed arrays, golden-style objects, nulls.
  const result: StepResult = await sgdStep(
    [[[1, 2]], [{ dtype: 'float32', shape: [2], data: new Float32Array([1, 2]) }]],
    [[[2, 4]], [null]],
    0.1,
  );
  const mean: Tensor = result.meanGradients[0];
  if (mean.dtype === 'float16') {
    const bits: Uint16Array = mean.data;
    console.log(bits, tensorValues(mean));
  } else if (mean.dtype === 'float32') {
    const values: Float32Array = mean.data;
    console.log(values);
  }
  const half = tensor('float16', [2], [1.5, 'nan']);
  const halfBits: Uint16Array = half.data;
  console.log(halfBits, result.updatedReplicas[1][0].shape);
  await sgdStep([[{ dtype: 'bfloat16', shape: [1], data: new Uint16Array([0x3f80]) }]], [[null]], 'inf');
  // @ts-expect-error: learning rate must be a number
  await sgdStep([[[1]]], [[[1]]], '0.1');

  try {
    await sgdStep([], [], 0.1);
  } catch (e) {
    const error = e as DistoptError;
    const name: ErrorName = error.name;
    console.log(name, error.message);
  }

  // A world, replicas, local optimizers.
  const world = new World(4);
  const replicas = Replicas.replicate(4, [
    { dtype: 'float32', shape: [2, 2], data: new Float32Array(4) },
    [0.5, -0.5],
  ]);
  const perRank = new Replicas([[[1]], [[2]], [[3]], [[4]]]);
  console.log(replicas.ranks, replicas.length, replicas.shape(0), replicas.dtype(1), replicas.numel(0), replicas.bytesPerRank);
  replicas.setGrads(0, [[[1, 1], [1, 1]], null]);
  replicas.setGrad(1, 1, [0.25, 0.25]);
  replicas.setParam(2, 1, new Float32Array([3, 4]));
  replicas.setParams(3, [[[0, 0], [0, 0]], [1, 1]]);
  console.log(replicas.hasGrad(0, 1));
  replicas.broadcastParams(world, 0);

  const sgd = new SGD(replicas, { lr: 0.1, momentum: 0.9, nesterov: true });
  const grouped = new SGD(perRank, { lr: 0.1 }, [{ params: [0], lr: 0.01 }]);
  const adam = new Adam(replicas, { lr: 1e-3, betas: [0.9, 0.999], amsgrad: true });
  const adamw = new AdamW(replicas, { weight_decay: 0.01 });
  // @ts-expect-error: not an SGD option
  new SGD(replicas, { betas: [0.9, 0.999] });
  // @ts-expect-error: betas is a pair
  new Adam(replicas, { betas: [0.9] });
  sgd.step();
  sgd.zeroGrad();
  const groups: number[][] = grouped.paramGroups();
  grouped.addParamGroup({ params: [], momentum: 0.5 });
  const state: StateDict = await sgd.stateDict(0);
  sgd.loadStateDict(1, state);
  console.log(groups, adam.name, adamw.name, state.param_groups[0].params, state.state['0']?.momentum_buffer);

  const params: Tensor[][] = await replicas.params();
  const grads: (Tensor | null)[][] = await replicas.grads();
  const one: Tensor = await replicas.param(0, 0);
  const maybe: Tensor | null = await replicas.grad(0, 1);
  console.log(params, grads, one, maybe);

  // Averaging and post-local SGD.
  const periodic = new PeriodicModelAverager(4, 10, world);
  const grouped2 = new PeriodicModelAverager(2, 0, world, 2);
  const hierarchical = new HierarchicalModelAverager([[2, 2], [4, 4]], 0, world);
  const fromMap = new HierarchicalModelAverager(new Map([[2, 2], [4, 4]]), undefined, world);
  // @ts-expect-error: a plain object loses the insertion order
  new HierarchicalModelAverager({ 2: 2, 4: 4 }, 0, world);
  const used: number | null = hierarchical.averageParameters(replicas, [0, 1]);
  grouped2.step = 3;
  console.log(used, periodic.period, periodic.warmupSteps, grouped2.step, fromMap.step, takeWarnings());

  const hook = new PostLocalSGDState(world, 2, 100, true);
  console.log(hook.synchronizeGradients(replicas), hook.iter);
  const postLocal = new PostLocalSGDOptimizer(adam, periodic);
  const averagedOver: number | null = postLocal.step();
  const saved = await postLocal.stateDict(0);
  const step: number = saved.step;
  postLocal.loadStateDict(0, saved);
  postLocal.zeroGrad();
  console.log(averagedOver, step, postLocal.averagerStep);

  const inner = new AdamW(replicas, { lr: 0.02 });
  const outer = new SGD(replicas, { lr: 0.7, momentum: 0.9, nesterov: true });
  const diloco = new DiLoCo(inner, outer, 3, world);
  diloco.zeroGrad();
  const synced: boolean = diloco.step();
  const checkpoint = await diloco.stateDict(0);
  const localStep: number = checkpoint.local_step;
  diloco.loadStateDict(0, checkpoint);
  diloco.sync();
  // @ts-expect-error: syncEvery is a number
  new DiLoCo(inner, outer, '3', world);
  const compressed: 'none' | 'bf16' | 'f16' = new DiLoCo(inner, outer, 3, world, { compress: 'bf16' }).compress;
  // @ts-expect-error: only bf16, f16 or none
  new DiLoCo(inner, outer, 3, world, { compress: 'int8' });
  console.log(synced, localStep, diloco.localStep, diloco.syncEvery, compressed, checkpoint.original_parameters[0].dtype);

  const stats: CommStats = world.stats();
  console.log(stats.totalBytes, stats.allReduceBytesByGroupSize['4'], world.groupOf(3, 2));
  world.resetStats();

  // ZeRO: the optimizer state sharded over the world's ranks.
  const zero = new ZeroRedundancyOptimizer(world, replicas, [{ params: [0], lr: 0.1 }], 'SGD', { lr: 0.05, momentum: 0.9 }, { parametersAsBucketView: true });
  const zeroAll = new ZeroRedundancyOptimizer(world, replicas, null, 'Adam', { betas: [0.9, 0.99] });
  new ZeroRedundancyOptimizer(world, replicas, [0, 1], 'AdamW');
  // (The options are SGD's or Adam's: the class is not generic over the optimizer's name, as
  // the generated typings cannot be, so an Adam option given to ZeRO's SGD is the run-time
  // TypeError, not a compile error.)
  // @ts-expect-error: no such local optimizer
  new ZeroRedundancyOptimizer(world, replicas, null, 'NAdam');
  zero.zeroGrad();
  zero.step();
  zero.setRequiresGrad(0, false);
  await zeroAll.addParamGroup({ params: [1], lr: 1e-4 });
  await zero.consolidateStateDict(0);
  const zeroState: StateDict = await zero.stateDict(0);
  // @ts-expect-error: stateDict is a promise on ZeRO too
  const notAwaited: StateDict = zero.stateDict(0);
  console.log(notAwaited);
  // The optimizer class as a value, as PyTorch takes `torch.optim.Adam`.
  new ZeroRedundancyOptimizer(world, replicas, null, Adam, { lr: 1e-3, betas: [0.9, 0.99] }).free();
  new ZeroRedundancyOptimizer(world, replicas, null, SGD, { lr: 0.1, momentum: 0.9 }).free();
  // @ts-expect-error: not an optimizer class
  new ZeroRedundancyOptimizer(world, replicas, null, World);
  zero.loadStateDict(zeroState);
  const owners: number[] | null = zero.rankOfParam;
  const perRankParams: number[][] | null = zero.paramsPerRank;
  const numel: number[] | null = zero.numelPerRank;
  const stateBytes: number[] = zero.stateBytesPerRank();
  console.log(owners, perRankParams, numel, zero.paramsPerRankPerGroup, zero.localStateSizes(), stateBytes, zero.paramGroups(), zero.optimizer);
  const localGroups: number[][][] | null = zero.localOptimizerParamGroups();
  const replicaOwners: (number | null)[] = zero.rankOfReplicaParam();
  console.log(localGroups, replicaOwners);
  // PyTorch's checks of `params`: descriptions of tensors that are not parameters.
  new ZeroRedundancyOptimizer(world, replicas, [0, { dtype: 'float32', shape: [3], device: 'meta' }], 'SGD');
  new ZeroRedundancyOptimizer(world, replicas, [{ params: [0] }, { lr: 0.5 }], 'SGD');
  zero.free();
  zeroAll.free();

  // Uneven inputs: DDP's gradient all-reduce and ZeRO under Join, in lock-step.
  const ddp = new DistributedDataParallel(world, replicas);
  const zeroJoined = new ZeroRedundancyOptimizer(world, replicas, null, 'SGD', { lr: 0.1 });
  const join = new Join([ddp, zeroJoined], { divideByInitialWorldSize: false, throwOnEarlyTermination: false });
  // @ts-expect-error: not a Join option
  new Join([ddp], { divide: true });
  join.iteration([true, true, false, true]);
  ddp.synchronizeGradients();
  zeroJoined.step();
  join.exit();
  const joined: boolean[] = join.joined;
  const shadows: number[] = join.shadowIterations();
  console.log(joined, shadows);
  try {
    zeroJoined.step();
  } catch (error) {
    const perRank: RankError[] | undefined = (error as DistoptError).rankErrors;
    console.log(perRank?.map((e) => `${e.rank}: ${e.name}: ${e.message}`));
  }
  const records: WarningRecord[] = recordedWarnings();
  console.log(records.map((w) => [w.channel, w.category, w.ranks]));
  join.free();
  ddp.free();
  zeroJoined.free();

  // DistributedOptimizer over RPC (the workers compute on the CPU backend).
  const rpc = new RpcWorld(['worker0', 'worker1']);
  const w0: RRef = rpc.remote('worker0', [1, 2, 3]);
  const w1: RRef = rpc.remote('driver', { dtype: 'float32', shape: [2], data: [1, 2] });
  const owner: string = w0.owner;
  const dopt = new DistributedOptimizer(rpc, 'Adam', [w0, w1], { lr: 0.01, amsgrad: true }, { functional: false });
  new DistributedOptimizer(rpc, AdamW, [w0], { lr: 0.01 }).free();
  // @ts-expect-error: rrefs, not tensors
  new DistributedOptimizer(rpc, 'SGD', [[1, 2]]);
  const ctx: AutogradContext = rpc.context();
  await rpc.recordGradient(ctx.id, w0, [0.1, 0.2, 0.3]);
  await rpc.recordGradient(ctx, w1, [0.1, 0.2]);
  await dopt.step(ctx.id);
  const ctxGrads: Map<number, Tensor> = await rpc.getGradients(ctx.id, 'worker0');
  const value: Tensor = await w0.toHere();
  const attr: Tensor | null = await rpc.gradOf(w1);
  const locals: LocalOptimizerInfo[] = dopt.localOptimizers();
  const functional: boolean = dopt.isFunctionalOptim;
  console.log(owner, w0.id, ctxGrads.get(w0.id), value, attr, locals[0]?.paramIndices, functional, rpc.workerNames, ctx.live);
  ctx.release();
  rpc.shutdownWorker('worker1');
  dopt.free();
  rpc.free();

  // The demo's trainer.
  const trainer = new Trainer({
    ranks: 8,
    algorithm: 'hierarchical',
    period: 8,
    warmup: 20,
    lr: 0.05,
    task: { heterogeneity: 0.8 },
  });
  // @ts-expect-error: ranks is required
  new Trainer({ algorithm: 'sync' });
  const zeroTrainer = new Trainer({ ranks: 4, algorithm: 'zero', momentum: 0.9 });
  const shardBytes: number[] = (await zeroTrainer.step()).optimizerStateBytesPerRank;
  console.log(shardBytes, zeroTrainer.optimizerStateBytesPerRank());
  zeroTrainer.free();
  const dilocoTrainer = new Trainer({ ranks: 4, algorithm: 'diloco', period: 8, fragments: 2 });
  const dilocoName: 'sync' | 'periodic' | 'hierarchical' | 'zero' | 'diloco' = dilocoTrainer.algorithm;
  console.log(dilocoName, (await dilocoTrainer.step()).bytesCommunicatedPerRank);
  dilocoTrainer.free();
  // @ts-expect-error: fragments is a number
  new Trainer({ ranks: 4, algorithm: 'diloco', fragments: '2' });
  const levels: Array<[number, number]> = Trainer.defaultHierarchy(8, 8);
  const report: StepReport = await trainer.step();
  const lossPerRank: Float64Array = report.lossPerRank;
  const evaluation: Evaluation = await trainer.evaluate();
  console.log(levels, lossPerRank, report.averaged, evaluation.meanModelAccuracy, trainer.description, trainer.classCounts(0), trainer.commStats());

  // The benchmark.
  const bench = await StepBench.create(8, 1 << 22);
  const t0 = performance.now();
  await bench.run();
  console.log(bench.bytes / (performance.now() - t0) / 1e6, 'GB/s on', bench.backend.name);
  const params0: Float32Array = await bench.read('params', 0);
  // @ts-expect-error: only params or grads
  await bench.read('means', 0);
  await synchronize();
  console.log(params0.length);
  bench.free();
  trainer.free();
  world.free();
}

// A rank of a run over NATS, in its own process (Node, or a Worker).
export async function joinRun(): Promise<void> {
  const port: Port = await openPort({ servers: 'nats://127.0.0.1:4222', name: 'rank' });
  const options: NatsJoinOptions = { run: 'demo', ranks: 4, failureBound: 5 };
  const world = World.joinNats(port, options);
  const mine: number[] = world.localRanks;
  const live: boolean[] = world.live;
  const replicas = Replicas.replicate(mine.length, [[1, 2, 3]]);
  const averager = new PeriodicModelAverager(4, 0, world);
  const changes: MembershipChange[] = world.membershipChanges;
  console.log(world.rank, live, world.forgedFrames, averager.averageParameters(replicas), port.maxPayload, changes[0]?.syncPoint);
  // @ts-expect-error: a run has a name
  World.joinNats(port, { ranks: 4 });
  averager.free();
  replicas.free();
  world.free();
  port.close();
}

// The same rank on a browser page's main thread: the package in a worker, every call awaited.
export async function joinRunFromPage(): Promise<void> {
  const distopt = await inWorker({ backend: 'cpu' });
  const port = await distopt.openPort({ servers: 'ws://127.0.0.1:4223' });
  const world = await distopt.World.joinNats(port, { run: 'demo', ranks: 4 });
  const rank: number = await world.rank;
  // @ts-expect-error: joinNats takes a port
  await distopt.World.joinNats(world, { run: 'x', ranks: 2 });
  const trainer = await new distopt.Trainer({ ranks: 4, algorithm: 'diloco', period: 8, world });
  const report: StepReport = await trainer.step();
  const steps: number = await trainer.steps;
  const evaluation: Evaluation = await trainer.evaluate();
  console.log(rank, report, steps, evaluation.meanModelLoss, await distopt.version());
  // @ts-expect-error: a remote object's property is awaited, not read
  const wrong: number = trainer.steps;
  // @ts-expect-error: a World of this thread is not the worker's
  await new distopt.Trainer({ ranks: 4, world: new World(4) });
  await trainer.free();
  await world.free();
  await port.free();
  distopt.terminate();
  console.log(wrong);
}
