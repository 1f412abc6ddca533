// The README's "Install", "Use it with your model" and "Train across tabs, devices and
// machines" JavaScript examples, run as written (the last one as 4 Node processes of one run on
// a real nats-server, its address put in):
// each ```js block of those sections is saved as a file of a fresh Node project that installed
// the packed tarball (offline), run with Node, and its output checked. (Their Rust blocks run
// as doctests: src/lib.rs includes the README.) The package's own README (npm/README.md, what a
// registry shows) is run the same way.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { ROOT, runProcess } from './helpers.js';
import { startServer } from './nats-server.js';

const OUT = path.join(ROOT, 'target/npm');
let work;

/** The fenced blocks of `lang` in the README section titled `title` (up to the next `## `). */
export function readmeBlocks(title, lang, file = 'README.md') {
  const readme = fs.readFileSync(path.join(ROOT, file), 'utf8');
  const start = title === null ? 0 : readme.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `the README has a section "${title}"`);
  const end = readme.indexOf('\n## ', start + 1); // the opening (title null) ends at the first section
  const section = readme.slice(start, end < 0 ? undefined : end);
  const blocks = [...section.matchAll(new RegExp('^```' + lang + '\\n([\\s\\S]*?)^```$', 'gm'))].map((m) => m[1]);
  assert.ok(blocks.length > 0, `the section "${title}" has a ${lang} example`);
  return blocks;
}

before(() => {
  const tarballs = fs.readdirSync(OUT).filter((f) => /^distopt-.*\.tgz$/.test(f));
  assert.equal(tarballs.length, 1, `one packed tarball in ${OUT} (run scripts/build-npm.sh)`);
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'distopt-readme-'));
  fs.writeFileSync(path.join(work, 'package.json'), JSON.stringify({ name: 'my-app', private: true, type: 'module' }));
  execFileSync('npm', ['install', path.join(OUT, tarballs[0]), '--offline', '--no-audit', '--no-fund', '--loglevel=error'], {
    cwd: work,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
});

after(() => {
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

function run(name, source) {
  fs.writeFileSync(path.join(work, name), source);
  return execFileSync(process.execPath, [name], { cwd: work, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

test('README "Install": the check that it loads runs as written', () => {
  const [example] = readmeBlocks('Install', 'js');
  const out = run('install.mjs', example);
  assert.match(out, /^distopt on cpu: /m);
  assert.match(out, /Float32Array\(2\) \[ 3, 5 \]/);
});

test('README "Use it with your model": the model trains across 4 ranks as written', () => {
  const [example] = readmeBlocks('Use it with your model', 'js');
  const out = run('use.mjs', example);
  console.log(out.trim());
  const losses = [...out.matchAll(/^step (\d+): loss ([\d.]+)$/gm)].map((m) => Number(m[2]));
  assert.equal(losses.length, 5, out);
  assert.ok(losses[4] < losses[0] / 100, `the loss falls a hundredfold: ${losses}`);
  const [, w0, w1, b] = out.match(/^w = \[([-\d.]+),([-\d.]+)\], b = ([-\d.]+)$/m).map(Number);
  assert.ok(Math.abs(w0 - 3) < 0.05 && Math.abs(w1 + 2) < 0.05 && Math.abs(b - 1) < 0.05, `w = [${w0}, ${w1}], b = ${b}`);
  assert.match(out, /^sent per rank: [1-9]\d* bytes$/m);
});

test('the package README (npm/README.md): its examples run as written', () => {
  const [first] = readmeBlocks(null, 'js', 'npm/README.md');
  run('npm-readme-1.mjs', `${first}\nconsole.log(JSON.stringify(Array.from(updatedReplicas[1][0].data)));\n`).match(/\[0\.699999988079071,1\.5\]/) ||
    assert.fail('the first example computes the step');
  const [training] = readmeBlocks('Training, step by step', 'js', 'npm/README.md');
  const out = run('npm-readme-2.mjs', training);
  assert.match(out, /Float32Array/);
});

test("the README's example across processes runs as 4 Node processes of one run (the installed package's distopt/nats)", async () => {
  const [block] = readmeBlocks('Train across tabs, devices and machines', 'js');
  assert.ok(block.includes("'nats://127.0.0.1:4222'"), 'the example connects to a server on loopback');
  const server = await startServer(['-js']);
  try {
    const file = path.join(work, 'across.mjs');
    fs.writeFileSync(file, block.replace("'nats://127.0.0.1:4222'", JSON.stringify(server.url)));
    const runs = await Promise.all([0, 1, 2, 3].map(() => runProcess(process.execPath, [file], {}, 180_000)));
    runs.forEach((r, i) => assert.equal(r.code, 0, `process ${i}: ${r.out}\n${r.err}`));
    const lines = runs.map((r) => r.out.trim().split('\n'));
    const ranks = lines.map((l) => Number(/^rank (\d+) of 4$/.exec(l[0])?.[1])).sort();
    assert.deepEqual(ranks, [0, 1, 2, 3]);
    const losses = lines.map((l) => /^rank \d: mean model loss (\S+)$/.exec(l[1])?.[1]);
    // DiLoCo's outer step leaves every replica on the same model: every rank reports its loss.
    assert.equal(new Set(losses).size, 1, `every rank evaluates the same mean model: ${losses}`);
    assert.ok(Number(losses[0]) < 1.5, `it trained: ${losses[0]}`);
  } finally {
    server.stop();
  }
});

test("the README's main-thread example (distopt/worker) runs as 4 Node processes of one run, every call awaited", async () => {
  const [, block] = readmeBlocks('Train across tabs, devices and machines', 'js');
  assert.ok(block.includes("from 'distopt/worker'") && block.includes("'ws://127.0.0.1:4223'"), 'the example is the worker one');
  const server = await startServer(['-js']);
  try {
    const file = path.join(work, 'from-page.mjs');
    // In Node the worker's port speaks TCP: the same example against the server's TCP listener.
    fs.writeFileSync(file, block.replace("'ws://127.0.0.1:4223'", JSON.stringify(server.url)));
    const runs = await Promise.all([0, 1, 2, 3].map(() => runProcess(process.execPath, [file], {}, 180_000)));
    runs.forEach((r, i) => assert.equal(r.code, 0, `process ${i}: ${r.out}\n${r.err}`));
    const lines = runs.map((r) => /^rank (\d): (\S+)$/.exec(r.out.trim()));
    assert.deepEqual(lines.map((m) => Number(m?.[1])).sort(), [0, 1, 2, 3]);
    assert.equal(new Set(lines.map((m) => m[2])).size, 1, 'every rank evaluates the same mean model');
    assert.ok(Number(lines[0][2]) < 1.5, `it trained: ${lines[0][2]}`);
  } finally {
    server.stop();
  }
});
