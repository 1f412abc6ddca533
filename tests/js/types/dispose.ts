// `using` (explicit resource management) with distopt's classes, checked by `tsc --noEmit -p
// tests/js/types/tsconfig.dispose.json` (TypeScript's `esnext.disposable` lib). Never run.

import init, { Replicas, SGD, World, ZeroRedundancyOptimizer, Adam } from 'distopt';

export async function tour(): Promise<number> {
  await init();
  using world = new World(2);
  using model = Replicas.replicate(2, [new Float32Array(4)]);
  using sgd = new SGD(model, { lr: 0.1 });
  sgd.step();
  using zero = new ZeroRedundancyOptimizer(world, model, null, Adam, { lr: 1e-3 });
  zero.step();
  const disposable: Disposable = sgd;
  disposable[Symbol.dispose]();
  return world.size;
}
