// Shared by the Node tests: where the package is, the golden cases, and a check that the typings
// name exactly what the package exports.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { PENDING_KINDS, hasRunner, runCases } from './golden-runner.js';

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../..');
export const PACKAGE = process.env.DISTOPT_PACKAGE_DIR || path.join(ROOT, 'target/npm/package');
export const GOLDEN = path.join(ROOT, 'tests/golden');
/** The torchft-made cases (scripts/torchft-cases.py), read beside the golden ones. */
export const TORCHFT_CASES = path.join(ROOT, 'tests/torchft-cases');
/** The project's own PyTorch-made cases (scripts/torch-cases.py), read beside the golden ones. */
export const TORCH_CASES = path.join(ROOT, 'tests/torch-cases');
/**
 * More cases, when set, read beside the golden ones as the Rust runner reads them (for
 * example scripts/torch-fuzz.py's; the browser page fetches them under /extra-cases/).
 */
export const EXTRA_CASES = process.env.DISTOPT_GOLDEN_DIR || null;

/** Imports the built package (scripts/build-npm.sh). */
export async function importPackage() {
  const entry = path.join(PACKAGE, 'index.js');
  assert.ok(fs.existsSync(entry), `build the package first (scripts/build-npm.sh): ${entry} is missing`);
  return import(pathToFileURL(entry).href);
}

/** Imports the built package's NATS port (`distopt/nats`: nats.js bundled into its worker). */
export async function importPort() {
  const entry = path.join(PACKAGE, 'nats/port.js');
  assert.ok(fs.existsSync(entry), `build the package first (scripts/build-npm.sh): ${entry} is missing`);
  return import(pathToFileURL(entry).href);
}

/**
 * Every golden case file, as {file, kind, case}, sorted: tests/golden/ (`file` its name), then
 * tests/torch-cases/ and tests/torchft-cases/ (`file` is `../torch-cases/<name>` or
 * `../torchft-cases/<name>`, relative to the golden folder, as the browser page fetches it),
 * and `$DISTOPT_GOLDEN_DIR`'s when set (`../extra-cases/<name>`). Nothing is left out: a file that is not a case, or whose `name`
 * is not its file name, fails here.
 */
export function goldenFiles() {
  const read = (dir, prefix) =>
    fs
      .readdirSync(dir)
      .filter((f) => f.endsWith('.json'))
      .sort()
      .map((name) => {
        const file = `${prefix}${name}`;
        const c = JSON.parse(fs.readFileSync(path.join(dir, name), 'utf8'));
        assert.equal(typeof c.kind, 'string', `${file}: no kind`);
        assert.equal(`${c.name}.json`, name, `${file}: its name ${JSON.stringify(c.name)} is not its file name`);
        return { file, kind: c.kind, case: c };
      });
  const golden = read(GOLDEN, '');
  assert.ok(golden.length > 0, `no golden files in ${GOLDEN}`);
  const torch = read(TORCH_CASES, '../torch-cases/');
  assert.ok(torch.length > 0, `no PyTorch-made cases in ${TORCH_CASES}`);
  const torchft = read(TORCHFT_CASES, '../torchft-cases/');
  assert.ok(torchft.length > 0, `no torchft cases in ${TORCHFT_CASES}`);
  const extra = EXTRA_CASES ? read(EXTRA_CASES, '../extra-cases/') : [];
  return [...golden, ...torch, ...torchft, ...extra];
}

/** The files the JS runner runs (every kind but the pending ones without a runner), and the pending ones. */
export function splitPending(files) {
  const pending = files.filter((f) => PENDING_KINDS.includes(f.kind) && !hasRunner(f.kind));
  return { run: files.filter((f) => !pending.includes(f)), pending };
}

function countBy(items, key) {
  const out = {};
  for (const item of items) out[key(item)] = (out[key(item)] || 0) + 1;
  return out;
}

/**
 * Prints one line per kind and asserts that every kind on disk ran in full: as many passed
 * results as files of that kind (the pending kinds are reported, loudly, by name and count).
 * `typed` are the dp_sgd_step results with typed-array inputs.
 */
export function checkGoldenCounts(label, files, results, typed) {
  const onDisk = countBy(files, (f) => f.kind);
  const passed = countBy(results.filter((r) => r.ok), (r) => r.kind);
  const failed = countBy(results.filter((r) => !r.ok), (r) => r.kind);
  const exact = countBy(results.filter((r) => r.bitExact), (r) => r.kind);
  const { pending } = splitPending(files);
  const problems = [];
  const kinds = [...new Set([...Object.keys(onDisk), ...results.map((r) => r.kind)])].sort();
  for (const kind of kinds) {
    const n = onDisk[kind] || 0;
    const p = pending.filter((f) => f.kind === kind);
    if (p.length > 0) {
      console.log(
        `${label} ${kind}: PENDING, ${p.length} of ${n} files NOT RUN (no JS runner yet): ${p.map((f) => f.case.name).join(', ')}`,
      );
    } else {
      console.log(`${label} ${kind}: ${passed[kind] || 0} passed, ${failed[kind] || 0} failed (${exact[kind] || 0} bit-exact) of ${n} files`);
    }
    const ran = (passed[kind] || 0) + (failed[kind] || 0);
    if (ran + p.length !== n) problems.push(`${kind}: ${ran} ran and ${p.length} pending, ${n} files on disk`);
    if (p.length === 0 && passed[kind] !== n) problems.push(`${kind}: ${passed[kind] || 0} of ${n} files passed`);
  }
  const typedPassed = typed.filter((r) => r.ok).length;
  console.log(`${label} dp_sgd_step (typed-array inputs): ${typedPassed} passed of ${onDisk.dp_sgd_step || 0} files`);
  if (typedPassed !== (onDisk.dp_sgd_step || 0)) problems.push(`dp_sgd_step (typed-array inputs): ${typedPassed} of ${onDisk.dp_sgd_step || 0} passed`);
  const landed = PENDING_KINDS.filter((k) => hasRunner(k));
  if (landed.length > 0) problems.push(`${landed.join(', ')} now have runners: remove them from PENDING_KINDS`);
  assert.deepEqual(problems, [], `${label}: every golden file must run and pass`);
}

/** Runs the golden cases as subtests of `t` and checks the per-kind counts against the files on disk. */
export async function runGoldenSubtests(t, api, label) {
  const files = goldenFiles();
  const { run, pending } = splitPending(files);
  const cases = run.map((f) => f.case);
  // The cases' expected PyTorch warnings are checked through takeWarnings(); their console
  // copies would only clutter the test log.
  const warn = console.warn;
  console.warn = (...args) => {
    if (!String(args[0]).startsWith('distopt: ')) warn(...args);
  };
  let results;
  let typed;
  try {
    results = await runCases(api, cases);
    typed = await runCases(
      api,
      cases.filter((c) => c.kind === 'dp_sgd_step'),
      { typedInputs: true },
    );
  } finally {
    console.warn = warn;
  }
  for (const r of results) {
    await t.test(`${r.kind}: ${r.name}`, () => assert.ok(r.ok, r.message));
  }
  for (const r of typed) {
    await t.test(`dp_sgd_step (typed-array inputs): ${r.name}`, () => assert.ok(r.ok, r.message));
  }
  for (const f of pending) {
    await t.test(`${f.kind}: ${f.case.name}`, { todo: `PENDING: no JS runner for ${f.kind} yet` }, () => {});
  }
  checkGoldenCounts(label, files, results, typed);
  return results;
}

/** The names index.d.ts exports as values (classes, functions, the default). */
export function typedExports() {
  const dts = fs.readFileSync(path.join(PACKAGE, 'index.d.ts'), 'utf8');
  const names = new Set();
  for (const m of dts.matchAll(/^export (?:declare )?(?:class|function) (\w+)/gm)) names.add(m[1]);
  for (const m of dts.matchAll(/^export \{ ([\w, ]+) \};/gm)) m[1].split(',').forEach((n) => names.add(n.trim()));
  if (/^export default /m.test(dts)) names.add('default');
  return [...names].sort();
}

/**
 * Digests of the bits of every rank's parameters, fed by the golden runner's `observe`
 * (`runCases(api, cases, {observe})`): two placements of the same cases (a simulated world, one
 * rank per process) agree bit for bit when their digests of a rank are equal.
 */
export function bitDigests() {
  const hashes = new Map();
  return {
    observe(name, rank, step, params) {
      if (!hashes.has(rank)) hashes.set(rank, createHash('sha256'));
      const hash = hashes.get(rank);
      hash.update(`${name}/${step}/`);
      for (const p of params) {
        hash.update(`${p.dtype}[${p.shape}]`);
        hash.update(new Uint8Array(p.data.buffer, p.data.byteOffset, p.data.byteLength));
      }
    },
    /** Rank `rank`'s digest (hex), once everything was observed. */
    digest(rank) {
      return hashes.get(rank)?.digest('hex') ?? null;
    },
  };
}

/** The distopt command line, built as tests/run builds it (with MPI where mpirun exists): its path. */
export function buildDistoptCli() {
  const args = ['build', '--release', '--quiet', '-p', 'distopt-cli', '--bin', 'distopt'];
  let mpi = false;
  try {
    execFileSync('sh', ['-c', 'command -v mpirun'], { stdio: 'ignore' });
    mpi = process.env.DISTOPT_TEST_MPI !== '0';
  } catch {
    // no MPI here
  }
  if (mpi) args.push('--features', 'distopt-cli/mpi');
  execFileSync('cargo', args, { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  return path.join(process.env.CARGO_TARGET_DIR || path.join(ROOT, 'target'), 'release', 'distopt');
}

/** Runs `command args` with `env` added, killed after `deadlineMs`: resolves to {code, out, err}. */
export function runProcess(command, args, env = {}, deadlineMs = 240_000) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), deadlineMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? signal, out, err });
    });
  });
}

/**
 * A rank process of the NATS tests: the package on its CPU backend, and this process's rank of
 * run DISTOPT_RUN (DISTOPT_RANKS ranks; rank DISTOPT_RANK when set) on the server DISTOPT_URL,
 * joined through the package's port (DISTOPT_JOIN=1: joining the running run;
 * DISTOPT_FAILURE_BOUND: the world's failure bound in seconds). Resolves to {api, port, world, ranks}.
 */
export async function joinFromEnv(role) {
  const env = (name) => {
    const value = process.env[name];
    if (value === undefined) throw new Error(`${name} is not set`);
    return value;
  };
  const api = await importPackage();
  await api.default({ backend: 'cpu' });
  const { openPort } = await importPort();
  const ranks = Number(env('DISTOPT_RANKS'));
  const port = await openPort({ servers: env('DISTOPT_URL'), name: `distopt ${role} (pid ${process.pid})` });
  const options = { run: env('DISTOPT_RUN'), ranks };
  if (process.env.DISTOPT_RANK !== undefined) options.rank = Number(process.env.DISTOPT_RANK);
  if (process.env.DISTOPT_JOIN === '1') options.join = true;
  if (process.env.DISTOPT_FAILURE_BOUND !== undefined) options.failureBound = Number(process.env.DISTOPT_FAILURE_BOUND);
  return { api, port, world: api.World.joinNats(port, options), ranks, env };
}

/**
 * The membership schedule `distopt train --membership` replays, from a rank's
 * `World.membershipChanges`: each sync point's live ranks, a rank that joined at point K live
 * from K + 1, up to the point after the last change.
 */
export function membershipSchedule(changes, ranks) {
  const byPoint = new Map(changes.map((c) => [c.syncPoint, c]));
  const last = Math.max(...changes.map((c) => c.syncPoint));
  let current = Array.from({ length: ranks }, (_, r) => r);
  const out = [];
  for (let k = 0; k <= last + 1; k++) {
    const change = byPoint.get(k);
    if (change) {
      current = [...change.live];
      out.push(current);
      current = [...new Set([...current, ...change.joining])].sort((a, b) => a - b);
    } else {
      out.push(current);
    }
  }
  return out.map((live) => live.join(',')).join(';');
}

/**
 * The simulated world (`distopt train --membership`) replaying the membership `changes` (a
 * rank's `World.membershipChanges`) of a run of these settings: its result, whose
 * `replica_loss_per_rank` the run's must equal bit for bit.
 */
export async function simulatedReplay({ algorithm, steps, ranks = 3, period = 8, fragments, delay }, changes) {
  const flags = ['train', '--algorithm', algorithm, '--period', String(period), '--steps', String(steps), '--backend', 'cpu', '--json', '--ranks', String(ranks)];
  if (fragments) flags.push('--fragments', String(fragments), '--fragment-sync-delay', String(delay ?? 0));
  const out = await runProcess(buildDistoptCli(), [...flags, '--membership', membershipSchedule(changes, ranks)]);
  if (out.code !== 0) throw new Error(`the simulated replay failed: ${out.err}`);
  return JSON.parse(out.out).results[0];
}
