// One rank of `distopt train`'s run, as a Node process (tests/js/nats-mixed.test.js runs it
// beside native `distopt train --world` processes): joins run DISTOPT_RUN of DISTOPT_RANKS ranks
// on DISTOPT_URL as rank DISTOPT_RANK (with DISTOPT_JOIN=1, the running run as a rank that left
// it, taken in and healed by `trainer.admit()` before its first step), builds the Trainer the command line builds for
// `--algorithm DISTOPT_ALGORITHM --period DISTOPT_PERIOD` (and, when set, `--fragments
// DISTOPT_FRAGMENTS --fragment-sync-delay DISTOPT_FRAGMENT_SYNC_DELAY`) over that world, and
// makes the calls its train loop makes (an evaluation, DISTOPT_STEPS steps, an evaluation). With
// DISTOPT_LEAVE_BEFORE=T it dies without a word (SIGKILL, as a closed tab) before step T (with
// DISTOPT_LEAVE_SAYING=1 too, it calls world.leave() and exits 0 instead; with
// DISTOPT_LEAVE_SAYING=elsewhere, it writes its `world.leavingMessage()` to stderr when it has
// joined, as a tab hands it to its page, and dies without a word, leaving the saying to whoever
// read it). With
// DISTOPT_STEPS=told it trains until a line "finish N" on its stdin, then stops after step N, and
// writes "progress S" (its steps so far) to stderr every 50 steps. Prints one JSON line {rank,
// steps, meanModelLoss, lossPerRank, live, membershipChanges} and exits 0; a failure prints
// {rank, error: {name, message}, at} and exits 1.

import { joinFromEnv } from './helpers.js';

const { api, port, world, ranks, env } = await joinFromEnv('trainer rank');
const trainer = new api.Trainer({
  ranks,
  algorithm: env('DISTOPT_ALGORITHM'),
  period: Number(env('DISTOPT_PERIOD')),
  ...(process.env.DISTOPT_FRAGMENTS ? { fragments: Number(process.env.DISTOPT_FRAGMENTS) } : {}),
  ...(process.env.DISTOPT_FRAGMENT_SYNC_DELAY ? { fragmentSyncDelay: Number(process.env.DISTOPT_FRAGMENT_SYNC_DELAY) } : {}),
  world,
});
const leaveBefore = process.env.DISTOPT_LEAVE_BEFORE === undefined ? Infinity : Number(process.env.DISTOPT_LEAVE_BEFORE);
const started = Date.now();
if (process.env.DISTOPT_LEAVE_SAYING === 'elsewhere') {
  const { subject, frames } = world.leavingMessage();
  const encoded = frames.map((f) => Buffer.from(f).toString('base64'));
  process.stderr.write(`leaving ${JSON.stringify({ subject, frames: encoded })}\n`);
}
try {
  if (process.env.DISTOPT_JOIN === '1') await trainer.admit();
  await trainer.evaluate();
  const told = env('DISTOPT_STEPS') === 'told';
  let steps = told ? Infinity : Number(env('DISTOPT_STEPS'));
  if (told) {
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (line) => {
      const n = /finish (\d+)/.exec(line);
      if (n) steps = Number(n[1]);
    });
  }
  while (trainer.steps < steps) {
    if (told && trainer.steps % 50 === 0) {
      process.stderr.write(`progress ${trainer.steps}\n`);
      // A step's promise settles without a task in between: let the "finish" line in.
      await new Promise((resolve) => setImmediate(resolve));
    }
    if (trainer.steps === leaveBefore) {
      // With DISTOPT_LEAVE_SAYING=1 it tells the run first, and exits 0 without a report.
      if (process.env.DISTOPT_LEAVE_SAYING === '1') {
        world.leave();
        // Said once: there is nothing left to say.
        if (world.leavingMessage() !== null) throw new Error('leavingMessage() after leave() must be null');
        process.exit(0);
      }
      process.kill(process.pid, 'SIGKILL');
    }
    await trainer.step();
  }
  // Listening on stdin would keep the process alive after its report.
  if (told) process.stdin.destroy();
  const evaluation = await trainer.evaluate();
  console.log(
    JSON.stringify({
      rank: world.rank,
      steps: trainer.steps,
      meanModelLoss: evaluation.meanModelLoss,
      lossPerRank: Array.from(evaluation.lossPerRank),
      live: world.live,
      membershipChanges: world.membershipChanges,
    }),
  );
} catch (error) {
  // A failed collective: its named error, and when it came (ms since the epoch).
  console.log(JSON.stringify({ rank: world.rank, error: { name: error.name, message: error.message }, at: Date.now(), ms: Date.now() - started }));
  process.exit(1);
}
trainer.free();
world.free();
port.close();
