// One rank of a run over NATS in a Node process of its own (tests/js/nats-ranks.test.js starts
// R of them): joins run DISTOPT_RUN of DISTOPT_RANKS ranks on the server DISTOPT_URL through the
// package's port (`distopt/nats`) and replays every golden case of the multi-rank kinds at that
// world size with this process's one rank (golden-runner.js, `place`), checking its own rank's
// results. Prints one JSON line {rank, passed, bitExact, digest, failed: [{name, message}],
// skipped: [what a run of this size cannot replay: a ZeRO reload into another world size]}
// (`digest`: of its parameters' bits after every step, helpers.js `bitDigests`) and exits 0 when
// every case passed.

import { bitDigests, goldenFiles, joinFromEnv } from './helpers.js';
import { NETWORKED_KINDS, runCases, takeSkippedParts } from './golden-runner.js';


const { api, port, world, ranks } = await joinFromEnv('test rank');
const cases = goldenFiles()
  .filter((f) => NETWORKED_KINDS.includes(f.kind) && f.case.input.world_size === ranks)
  .map((f) => f.case);
const place = (size) => {
  if (size !== ranks) throw new Error(`a run of ${ranks} ranks cannot replay a world of ${size}`);
  return { world, ranks: [...world.localRanks], release: () => {} };
};
const digests = bitDigests();
const results = await runCases(api, cases, { place, observe: digests.observe });
const failed = results.filter((r) => !r.ok).map((r) => ({ name: r.name, message: r.message }));
console.log(
  JSON.stringify({
    rank: world.rank,
    passed: results.filter((r) => r.ok).length,
    bitExact: results.filter((r) => r.bitExact).length,
    digest: digests.digest(world.rank),
    failed,
    skipped: takeSkippedParts(),
  }),
);
world.free();
port.close();
process.exit(failed.length === 0 ? 0 : 1);
