// The packed tarball as a user gets it: installed offline (the package has no dependencies, so
// `npm install <tarball> --offline` needs nothing from the registry or npm's cache) into a fresh
// plain page and a fresh Vite project, type-checked against the installed typings, built with
// `vite build`, and both run in Chromium with `import init, { sgdStep } from 'distopt'`.
// The Vite project is built by the Vite the tests installed (tests/js/node_modules), run in the
// project's folder: the project itself installs only the tarball, so the test passes with an
// empty npm cache (scripts/fresh-check.sh proves it).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { launch } from './chromium.js';
import { HERE, ROOT } from './helpers.js';

const OUT = path.join(ROOT, 'target/npm');
const VITE = path.join(HERE, 'node_modules/vite/bin/vite.js');

/** The app: the seed example through the package, with `options` passed to init(). */
const main = (options) => `import init, { sgdStep } from 'distopt';
import type { BackendSelection, StepResult } from 'distopt';

const info: BackendSelection = await init(${options});
const out: StepResult = await sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
document.body.dataset.result = JSON.stringify({
  kind: info.kind,
  fallbackAdapter: info.adapterInfo?.isFallbackAdapter,
  mean: Array.from(out.meanGradients[0].data),
  updated: Array.from(out.updatedReplicas[1][0].data),
});
`;

let work;
let tarball;

function npm(args, cwd) {
  return execFileSync('npm', [...args, '--offline', '--no-audit', '--no-fund', '--loglevel=error'], {
    cwd,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

before(() => {
  const tarballs = fs.readdirSync(OUT).filter((f) => /^distopt-.*\.tgz$/.test(f));
  assert.equal(tarballs.length, 1, `one packed tarball in ${OUT} (run scripts/build-npm.sh)`);
  tarball = path.join(OUT, tarballs[0]);
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'distopt-package-'));
});

after(() => {
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

test('the tarball holds the package and nothing else', () => {
  const listing = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).trim().split('\n').sort();
  assert.deepEqual(listing, [
    'package/README.md',
    'package/index.d.ts',
    'package/index.js',
    'package/package.json',
    'package/wasm/distopt_wasm.js',
    'package/wasm/distopt_wasm_bg.wasm',
  ]);
  const size = fs.statSync(tarball).size;
  console.log(`packed tarball: ${path.basename(tarball)}, ${size} bytes`);
});

async function runInChromium(dir, page) {
  const { server, url } = await serve({ port: 0, mounts: [['/', dir]] });
  const browser = await launch();
  try {
    const tab = await browser.newPage();
    const errors = [];
    tab.on('pageerror', (e) => errors.push(e.message));
    tab.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    await tab.goto(new URL(page, url).href);
    await tab.waitForFunction(() => document.body.dataset.result, null, { timeout: 60_000 });
    const result = JSON.parse(await tab.evaluate(() => document.body.dataset.result));
    assert.deepEqual(errors.filter((e) => !e.includes('favicon')), []);
    return result;
  } finally {
    await browser.close();
    server.close();
  }
}

function checkSeedExample(result, kind) {
  assert.equal(result.kind, kind);
  assert.deepEqual(result.mean, [3, 5]);
  assert.deepEqual(result.updated, [0.699999988079071, 1.5]);
}

test('a fresh page installs the tarball and imports it through an import map', async () => {
  const dir = path.join(work, 'page');
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'fresh-page', private: true }));
  npm(['install', tarball], dir);
  fs.writeFileSync(
    path.join(dir, 'index.html'),
    `<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="importmap">{"imports": {"distopt": "./node_modules/distopt/index.js"}}</script></head>
<body><script type="module">${main('').replace(/^import type.*\n/m, '').replace(/: \w+ =/g, ' =')}</script></body></html>`,
  );
  // The default backend: SwiftShader is a software adapter, so 'auto' takes the CPU backend.
  const result = await runInChromium(dir, '/index.html');
  assert.equal(result.fallbackAdapter, true, 'the browser has a (software) WebGPU adapter');
  checkSeedExample(result, 'cpu');
});

test('a fresh Vite project installs the tarball offline, type-checks and builds', async () => {
  const dir = path.join(work, 'vite-app');
  fs.mkdirSync(path.join(dir, 'src'), { recursive: true });
  fs.writeFileSync(
    path.join(dir, 'package.json'),
    JSON.stringify(
      {
        name: 'fresh-vite-app',
        private: true,
        type: 'module',
        dependencies: { distopt: `file:${tarball}` },
      },
      null,
      2,
    ),
  );
  fs.writeFileSync(
    path.join(dir, 'index.html'),
    '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body><script type="module" src="/src/main.ts"></script></body></html>\n',
  );
  fs.writeFileSync(path.join(dir, 'src/main.ts'), main("{ backend: 'gpu' }"));
  fs.writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'es2022',
        module: 'esnext',
        moduleResolution: 'bundler',
        lib: ['es2022', 'dom'],
        strict: true,
        noEmit: true,
        types: [],
      },
      include: ['src'],
    }),
  );
  fs.writeFileSync(path.join(dir, 'vite.config.js'), "export default { build: { target: 'es2022' } };\n");
  npm(['install'], dir);
  // The installed typings resolve through the package's `exports` and `types`.
  execFileSync(process.execPath, [path.join(HERE, 'node_modules/typescript/bin/tsc'), '-p', dir], { stdio: 'inherit' });
  execFileSync(process.execPath, [VITE, 'build', '--logLevel', 'warn'], {
    cwd: dir,
    stdio: 'inherit',
  });
  const assets = fs.readdirSync(path.join(dir, 'dist/assets'));
  console.log(`vite build: ${assets.join(', ')}`);
  assert.ok(assets.some((f) => f.endsWith('.wasm')), 'the .wasm is emitted as an asset');
  checkSeedExample(await runInChromium(path.join(dir, 'dist'), '/index.html'), 'gpu');
});
