// Node with WebGPU: the npm `webgpu` package (Dawn) on Chromium's SwiftShader Vulkan driver
// (VK_ICD_FILENAMES, set below unless given), exposed as `navigator.gpu` with a `Window` global as
// wgpu expects. Every golden case of the JS-facing kinds on that adapter.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { PACKAGE, importPackage, runGoldenSubtests } from './helpers.js';

let api;
let info;

// Dawn's Vulkan loader reads this when it starts: Chromium's SwiftShader driver.
const SWIFTSHADER_ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';
if (!process.env.VK_ICD_FILENAMES && fs.existsSync(SWIFTSHADER_ICD)) process.env.VK_ICD_FILENAMES = SWIFTSHADER_ICD;

before(async () => {
  const { create, globals } = await import('webgpu');
  Object.assign(globalThis, globals);
  globalThis.navigator = { gpu: create([]) };
  // wgpu looks for WebGPU through `window.navigator`: a `Window` global says "browser-like".
  globalThis.Window = class Window {};
  api = await importPackage();
  info = await api.default({ backend: 'gpu' });
  console.log(`Node WebGPU adapter: ${info.name} (${JSON.stringify(info.adapterInfo)})`);
});

after(() => {
  // Dawn keeps the event loop alive; the test runner waits for this process to end.
  setTimeout(() => process.exit(process.exitCode ?? 0), 100).unref();
});

test('init() takes the WebGPU adapter', () => {
  assert.equal(info.kind, 'gpu');
  assert.equal(info.api, 'BrowserWebGpu');
  assert.ok(info.name.length > 0);
});

test('golden cases on Node WebGPU', async (t) => {
  await runGoldenSubtests(t, api, 'Node WebGPU');
});

test('auto prefers the CPU backend to a software adapter; the trainer runs on WebGPU', async () => {
  const auto = await api.selectBackend('auto');
  assert.equal(auto.kind, 'cpu');
  assert.match(auto.reason, /software rasterizer/);
  assert.equal((await api.selectBackend('gpu')).kind, 'gpu');
  const trainer = new api.Trainer({ ranks: 4, algorithm: 'periodic', period: 4, warmup: 2, task: { samples: 512 } });
  const first = await trainer.step();
  let last = first;
  for (let i = 0; i < 30; i++) last = await trainer.step();
  assert.ok(last.meanLoss < first.meanLoss, `${first.meanLoss} -> ${last.meanLoss}`);
  trainer.free();
});

// Last: it destroys the device (as a driver reset or a GPU process crash would).
test('a lost GPU device gives named errors, and selecting a backend again makes the module usable', async () => {
  assert.equal((await api.selectBackend('gpu')).kind, 'gpu');
  const r = api.Replicas.replicate(2, [new Float32Array([1, 2])]);
  const sgd = new api.SGD(r, { lr: 0.1 });
  r.setGrads(0, [[1, 1]]);
  r.setGrads(1, [[1, 1]]);
  sgd.step();
  assert.deepEqual(Array.from((await r.param(0, 0)).data).map((x) => Math.round(x * 100) / 100), [0.9, 1.9]);
  // The glue module is the one the package loaded (same URL): its test hook destroys the device.
  const glue = await import(pathToFileURL(path.join(PACKAGE, 'wasm/distopt_wasm.js')).href);
  glue.__distoptDestroyDeviceForTest();
  // The device-lost callback runs from the event loop.
  for (let i = 0; i < 50; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    try {
      api.Replicas.replicate(1, [[1]]);
    } catch (e) {
      if (/device was lost/.test(e.message)) break;
    }
  }
  const attempts = [
    ['Replicas.replicate', () => api.Replicas.replicate(1, [[1]])],
    ['Replicas.param', () => r.param(0, 0)],
    ['SGD.step', () => sgd.step()],
    ['sgdStep', () => api.sgdStep([[[1, 2]]], [[[1, 1]]], 0.1)],
  ];
  for (const [what, call] of attempts) {
    let error;
    try {
      await call();
    } catch (e) {
      error = e;
    }
    assert.ok(error, `${what}: no error on a lost device`);
    assert.equal(error.name, 'RuntimeError', `${what}: ${error.name}: ${error.message}`);
    assert.match(error.message, /GPU device was lost .*select a backend again/, what);
  }
  // The module is still usable: the CPU backend, chosen again, runs.
  assert.equal((await api.selectBackend('cpu')).kind, 'cpu');
  const again = api.Replicas.replicate(2, [[1, 2]]);
  assert.deepEqual(Array.from((await again.param(1, 0)).data), [1, 2]);
  const out = await api.sgdStep([[[1, 2]]], [[[1, 1]]], 0.5);
  assert.deepEqual(Array.from(out.updatedReplicas[0][0].data), [0.5, 1.5]);
});
