// Shared by the Node tests: where the package is, the golden cases, and a check that the typings
// name exactly what the package exports.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { KINDS, runCases } from './golden-runner.js';

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../..');
export const PACKAGE = process.env.DISTOPT_PACKAGE_DIR || path.join(ROOT, 'target/npm/package');

/** Imports the built package (scripts/build-npm.sh). */
export async function importPackage() {
  const entry = path.join(PACKAGE, 'index.js');
  assert.ok(fs.existsSync(entry), `build the package first (scripts/build-npm.sh): ${entry} is missing`);
  return import(pathToFileURL(entry).href);
}

/** Every golden case of the kinds the JS API runs. */
export function goldenCases() {
  const dir = path.join(ROOT, 'tests/golden');
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')))
    .filter((c) => KINDS.includes(c.kind));
}

/** Runs the golden cases as subtests of `t` and prints one count line per kind. */
export async function runGoldenSubtests(t, api, label) {
  const cases = goldenCases();
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
  const counts = {};
  for (const r of results) {
    const k = (counts[r.kind] ||= { passed: 0, failed: 0, bitExact: 0 });
    k[r.ok ? 'passed' : 'failed']++;
    if (r.bitExact) k.bitExact++;
    await t.test(`${r.kind}: ${r.name}`, () => assert.ok(r.ok, r.message));
  }
  for (const r of typed) {
    await t.test(`dp_sgd_step (typed-array inputs): ${r.name}`, () => assert.ok(r.ok, r.message));
  }
  for (const [kind, k] of Object.entries(counts)) {
    console.log(`${label} ${kind}: ${k.passed} passed, ${k.failed} failed (${k.bitExact} bit-exact)`);
  }
  for (const kind of ['dp_sgd_step', 'periodic_averager', 'hierarchical_averager', 'zero_partition', 'zero_trajectory', 'distributed_optimizer']) {
    assert.ok(counts[kind]?.passed > 0, `no ${kind} case ran`);
  }
  return counts;
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
