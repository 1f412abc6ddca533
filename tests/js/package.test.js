// The packed tarball as a user gets it: installed offline (the package has no dependencies —
// distopt/nats carries nats.js bundled — so `npm install <tarball> --offline` needs nothing
// from the registry or npm's cache) into a fresh
// plain page and a fresh Vite project, type-checked against the installed typings, built with
// `vite build`, and both run in Chromium with `import init, { sgdStep } from 'distopt'`.
// The Vite project is built by the Vite the tests installed (tests/js/node_modules), run in the
// project's folder: the project itself installs only the tarball, so the test passes with an
// empty npm cache (scripts/fresh-check.sh proves it).

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { serve } from '../../scripts/serve.mjs';
import { launch } from './chromium.js';
import { HERE, ROOT } from './helpers.js';

const OUT = path.join(ROOT, 'target/npm');
const VITE = path.join(HERE, 'node_modules/vite/bin/vite.js');
const WEBPACK = path.join(HERE, 'node_modules/webpack-cli/bin/cli.js');
/** Whether the package holds the threaded build (built where nightly with rust-src exists). */
const THREADED = fs.existsSync(path.join(OUT, 'package/threads/index.js'));

/** The app: the seed example through the package, with `options` passed to init(). */
const main = (options) => `import init, { sgdStep } from 'distopt';
import type { BackendSelection, StepResult } from 'distopt';

const info: BackendSelection = await init(${options});
const out: StepResult = await sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
document.body.dataset.result = JSON.stringify({
  kind: info.kind,
  threads: info.threads,
  cores: navigator.hardwareConcurrency,
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
    'package/LICENSE-APACHE',
    'package/LICENSE-MIT',
    'package/README.md',
    'package/flavor.js',
    'package/index.cjs',
    'package/index.d.ts',
    'package/index.js',
    // distopt/nats: the port a rank of a run over NATS joins through, and its worker.
    'package/nats/port.d.ts',
    'package/nats/port.js',
    'package/nats/worker.browser.js',
    'package/nats/worker.node.js',
    'package/package.json',
    // The threaded build (distopt/threads), where the package was built with nightly.
    ...(THREADED
      ? [
          'package/threads/flavor.js',
          'package/threads/index.js',
          'package/threads/worker.js',
          'package/wasm-threads/distopt_wasm.js',
          'package/wasm-threads/distopt_wasm_bg.wasm',
          'package/wasm-threads/params.js',
        ]
      : []),
    'package/wasm/distopt_wasm.js',
    'package/wasm/distopt_wasm_bg.wasm',
    'package/wasm/params.js',
    // distopt/worker: the package in a worker of its own, every call awaited.
    'package/worker/host.js',
    'package/worker/remote.d.ts',
    'package/worker/remote.js',
  ]);
  const manifest = JSON.parse(fs.readFileSync(path.join(OUT, 'package/package.json'), 'utf8'));
  assert.equal('./threads' in manifest.exports, THREADED, 'distopt/threads is exported exactly when it was built');
  const size = fs.statSync(tarball).size;
  console.log(`packed tarball: ${path.basename(tarball)}, ${size} bytes`);
  // What a registry shows: both license texts, and metadata naming every capability.
  const pkg = JSON.parse(execFileSync('tar', ['-xzOf', tarball, 'package/package.json'], { encoding: 'utf8' }));
  assert.equal(pkg.dependencies, undefined, 'the package installs nothing else (nats.js is bundled into distopt/nats)');
  assert.equal(pkg.license, 'MIT OR Apache-2.0');
  for (const capability of ['data-parallel SGD', 'SGD/Adam/AdamW', 'hierarchical model averaging', 'post-local SGD', 'ZeRO', 'DistributedOptimizer', 'Join', 'DiLoCo']) {
    assert.ok(pkg.description.includes(capability), `the description names ${capability}`);
  }
  assert.match(execFileSync('tar', ['-xzOf', tarball, 'package/LICENSE-MIT'], { encoding: 'utf8' }), /Permission is hereby granted, free of charge/);
  assert.match(execFileSync('tar', ['-xzOf', tarball, 'package/LICENSE-APACHE'], { encoding: 'utf8' }), /Apache License\s+Version 2\.0/);
});

async function runInChromium(dir, page) {
  const { server, url } = await serve({ port: 0, mounts: [['/', dir]] });
  try {
    return await runPage(new URL(page, url).href);
  } finally {
    server.close();
  }
}

/** Opens `href` in Chromium and returns the JSON the page leaves in `document.body.dataset.result`. */
async function runPage(href) {
  const browser = await launch();
  try {
    const tab = await browser.newPage();
    const errors = [];
    tab.on('pageerror', (e) => errors.push(e.message));
    tab.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    await tab.goto(href);
    await tab.waitForFunction(() => document.body.dataset.result, null, { timeout: 60_000 });
    const result = JSON.parse(await tab.evaluate(() => document.body.dataset.result));
    assert.deepEqual(errors.filter((e) => !e.includes('favicon')), []);
    return result;
  } finally {
    await browser.close();
  }
}

/** A free loopback port. */
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
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

test('a fresh Vite project installs the tarball offline, type-checks, builds, and runs on the dev server', async () => {
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
  fs.writeFileSync(
    path.join(dir, 'vite.config.js'),
    "export default { build: { target: 'es2022' }, optimizeDeps: { exclude: ['distopt'] } };\n",
  );
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

  // The dev server, as the docs configure it (the package excluded from pre-bundling).
  const port = await freePort();
  const dev = spawn(process.execPath, [VITE, '--host', '127.0.0.1', '--port', String(port), '--strictPort'], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
    // Plain text: a coloured banner puts escape codes between the host and the port.
    env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
  });
  try {
    let log = '';
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`vite dev server did not start:\n${log}`)), 60_000);
      const onData = (chunk) => {
        log += chunk;
        // (Escape codes stripped too, where a terminal setting still colours the banner.)
        if (log.replace(/\x1b\[[0-9;]*m/g, '').includes(`:${port}`)) {
          clearTimeout(timer);
          resolve();
        }
      };
      dev.stdout.on('data', onData);
      dev.stderr.on('data', onData);
      dev.on('exit', (code) => reject(new Error(`vite dev server exited (${code}):\n${log}`)));
    });
    checkSeedExample(await runPage(`http://127.0.0.1:${port}/`), 'gpu');
  } finally {
    dev.kill();
  }
});


/** A fresh Node project with the tarball installed (offline), shared by the Node consumer tests. */
let nodeApp;
function freshNodeApp() {
  if (nodeApp) return nodeApp;
  nodeApp = path.join(work, 'node-app');
  fs.mkdirSync(nodeApp);
  fs.writeFileSync(path.join(nodeApp, 'package.json'), JSON.stringify({ name: 'fresh-node-app', private: true }));
  npm(['install', tarball], nodeApp);
  return nodeApp;
}

/** Runs `source` as file `name` in the fresh Node project; returns {status, stdout, stderr}. */
function runNode(name, source, flags = []) {
  const dir = freshNodeApp();
  fs.writeFileSync(path.join(dir, name), source);
  try {
    const stdout = execFileSync(process.execPath, [...flags, name], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    return { status: 0, stdout, stderr: '' };
  } catch (error) {
    return { status: error.status, stdout: error.stdout, stderr: error.stderr };
  }
}

const SEED_NODE = `const { meanGradients, updatedReplicas } = await sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
console.log(JSON.stringify({ kind: info.kind, mean: Array.from(meanGradients[0].data), updated: Array.from(updatedReplicas[1][0].data) }));`;

test('Node ESM: import from the installed tarball', () => {
  const out = runNode('esm.mjs', `import init, { sgdStep } from 'distopt';\nconst info = await init();\n${SEED_NODE}\n`);
  assert.equal(out.status, 0, out.stderr);
  checkSeedExample(JSON.parse(out.stdout), 'cpu');
});

test('init({wasm}) in Node: a file URL, a path, bytes (Uint8Array, ArrayBuffer), a Response, a promise of one', () => {
  // Each in its own process: the module loads once per process. The .wasm is copied elsewhere
  // and the package's own copy hidden, so only the `wasm` option can have found it.
  const dir = freshNodeApp();
  const elsewhere = path.join(dir, 'assets/other-name.wasm');
  fs.mkdirSync(path.dirname(elsewhere), { recursive: true });
  const own = path.join(dir, 'node_modules/distopt/wasm/distopt_wasm_bg.wasm');
  if (fs.existsSync(own)) fs.renameSync(own, elsewhere);
  try {
    const sources = {
      fileUrl: `new URL('./assets/other-name.wasm', import.meta.url)`,
      fileUrlString: `new URL('./assets/other-name.wasm', import.meta.url).href`,
      path: `${JSON.stringify(elsewhere)}`,
      uint8Array: `new Uint8Array(await readFile('./assets/other-name.wasm'))`,
      arrayBuffer: `(await readFile('./assets/other-name.wasm')).buffer.slice(0)`,
      response: `new Response(await readFile('./assets/other-name.wasm'), { headers: { 'content-type': 'application/wasm' } })`,
      responsePromise: `Promise.resolve(new Response(await readFile('./assets/other-name.wasm'), { headers: { 'content-type': 'application/wasm' } }))`,
    };
    for (const [label, expr] of Object.entries(sources)) {
      const out = runNode(
        `wasm-${label}.mjs`,
        `import { readFile } from 'node:fs/promises';\nimport init, { sgdStep } from 'distopt';\nconst info = await init({ wasm: ${expr} });\n${SEED_NODE}\n`,
      );
      assert.equal(out.status, 0, `${label}: ${out.stderr}`);
      checkSeedExample(JSON.parse(out.stdout), 'cpu');
    }
    // Without the option the hidden default is missing: the option was what loaded it.
    const missing = runNode('wasm-default.mjs', `import init from 'distopt';\nawait init();\n`);
    assert.notEqual(missing.status, 0);
    assert.match(missing.stderr, /ENOENT/);
    const bad = runNode('wasm-bad.mjs', `import init from 'distopt';\ntry { await init({ wasm: 42 }); } catch (e) { console.log(e.name + ': ' + e.message); }\n`);
    assert.match(bad.stdout, /^TypeError: init: wasm must be a URL, .* got Number/);
  } finally {
    if (fs.existsSync(elsewhere)) fs.renameSync(elsewhere, own);
  }
});

test('CommonJS: require("distopt") works where Node can require ES modules, else says to use import()', () => {
  const source = `const { default: init, sgdStep } = require('distopt');
(async () => {
  const info = await init();
  ${SEED_NODE}
})().catch((e) => { console.error(e); process.exit(1); });
`;
  const [major, minor] = process.versions.node.split('.').map(Number);
  const canRequireEsm = major > 22 || (major === 22 && minor >= 12) || (major === 20 && minor >= 19);
  if (canRequireEsm) {
    const out = runNode('app.cjs', source);
    assert.equal(out.status, 0, out.stderr);
    checkSeedExample(JSON.parse(out.stdout), 'cpu');
  }
  // A Node that cannot (simulated here: require(esm) turned off) gets the clear error.
  const old = runNode('app-old.cjs', source, ['--no-experimental-require-module']);
  assert.notEqual(old.status, 0);
  assert.match(old.stderr, /distopt is an ES module package .* cannot require\(\) ES modules: load it with `const distopt = await import\('distopt'\)`/);
});

test('a page loads the .wasm from another path: init({wasm}) with a URL, a Response and bytes', async () => {
  // The package's scripts under /lib/ without their .wasm, the .wasm under /blobs/ by another
  // name: the default location would 404, so each page works only through its `wasm` option.
  const dir = path.join(work, 'elsewhere');
  fs.mkdirSync(path.join(dir, 'lib/wasm'), { recursive: true });
  fs.mkdirSync(path.join(dir, 'blobs'));
  const pkg = path.join(work, 'page/node_modules/distopt');
  for (const script of ['index.js', 'flavor.js']) {
    fs.copyFileSync(path.join(pkg, script), path.join(dir, 'lib', script));
  }
  for (const script of ['distopt_wasm.js', 'params.js']) {
    fs.copyFileSync(path.join(pkg, 'wasm', script), path.join(dir, 'lib/wasm', script));
  }
  fs.copyFileSync(path.join(pkg, 'wasm/distopt_wasm_bg.wasm'), path.join(dir, 'blobs/model-code.wasm'));
  const pages = {
    url: `new URL('/blobs/model-code.wasm', location.href)`,
    string: `'/blobs/model-code.wasm'`,
    response: `await fetch('/blobs/model-code.wasm')`,
    responsePromise: `fetch('/blobs/model-code.wasm')`,
    bytes: `new Uint8Array(await (await fetch('/blobs/model-code.wasm')).arrayBuffer())`,
    arrayBuffer: `await (await fetch('/blobs/model-code.wasm')).arrayBuffer()`,
  };
  for (const [label, expr] of Object.entries(pages)) {
    fs.writeFileSync(
      path.join(dir, `${label}.html`),
      `<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body><script type="module">
import init, { sgdStep } from '/lib/index.js';
const info = await init({ backend: 'cpu', wasm: ${expr} });
const out = await sgdStep([[[1, 2]], [[1, 2]]], [[[2, 4]], [[4, 6]]], 0.1);
document.body.dataset.result = JSON.stringify({ kind: info.kind, mean: Array.from(out.meanGradients[0].data), updated: Array.from(out.updatedReplicas[1][0].data) });
</script></body></html>`,
    );
    checkSeedExample(await runInChromium(dir, `/${label}.html`), 'cpu');
  }
});

test('a fresh webpack 5 project installs the tarball offline, builds, and runs in Chromium', async () => {
  const dir = path.join(work, 'webpack-app');
  fs.mkdirSync(path.join(dir, 'src'), { recursive: true });
  fs.writeFileSync(
    path.join(dir, 'package.json'),
    JSON.stringify({ name: 'fresh-webpack-app', private: true, dependencies: { distopt: `file:${tarball}` } }, null, 2),
  );
  fs.writeFileSync(
    path.join(dir, 'src/main.js'),
    main("{ backend: 'gpu' }").replace(/^import type.*\n/m, '').replace(/: \w+ =/g, ' ='),
  );
  fs.writeFileSync(
    path.join(dir, 'webpack.config.cjs'),
    `const path = require('path');
module.exports = {
  mode: 'production',
  entry: './src/main.js',
  output: { path: path.resolve(__dirname, 'dist'), filename: 'main.js', clean: true },
  performance: { hints: false },
};
`,
  );
  fs.writeFileSync(
    path.join(dir, 'index.html'),
    '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body><script type="module" src="./main.js"></script></body></html>\n',
  );
  npm(['install'], dir);
  const log = execFileSync(process.execPath, [WEBPACK, 'build', '--config', 'webpack.config.cjs'], {
    cwd: dir,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  assert.doesNotMatch(log, /WARNING|ERROR/, log);
  fs.copyFileSync(path.join(dir, 'index.html'), path.join(dir, 'dist/index.html'));
  const assets = fs.readdirSync(path.join(dir, 'dist'));
  console.log(`webpack build: ${assets.join(', ')}`);
  assert.ok(assets.some((f) => f.endsWith('.wasm')), 'the .wasm is emitted as an asset');
  checkSeedExample(await runInChromium(path.join(dir, 'dist'), '/index.html'), 'gpu');
  if (!THREADED) return;
  // distopt/threads through webpack: the worker and its glue are bundled too, and the CPU
  // fallback runs on every core of the (cross-origin isolated) page.
  fs.writeFileSync(
    path.join(dir, 'src/main.js'),
    main("{ backend: 'cpu' }")
      .replace(/^import type.*\n/m, '')
      .replace(/: \w+ =/g, ' =')
      .replace("from 'distopt'", "from 'distopt/threads'"),
  );
  const threadsLog = execFileSync(process.execPath, [WEBPACK, 'build', '--config', 'webpack.config.cjs'], {
    cwd: dir,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  assert.doesNotMatch(threadsLog, /WARNING|ERROR/, threadsLog);
  assert.match(threadsLog, /distopt\/threads\/worker\.js/, 'webpack bundles the worker');
  fs.copyFileSync(path.join(dir, 'index.html'), path.join(dir, 'dist/index.html'));
  const threaded = await runInChromium(path.join(dir, 'dist'), '/index.html');
  checkSeedExample(threaded, 'cpu');
  assert.equal(threaded.threads, Math.min(threaded.cores, 16), 'one thread per core');
});
