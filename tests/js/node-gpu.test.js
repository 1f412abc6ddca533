// Node with WebGPU: the npm `webgpu` package (Dawn) on Chromium's SwiftShader Vulkan driver
// (VK_ICD_FILENAMES, set below unless given), exposed as `navigator.gpu` with a `Window` global as
// wgpu expects. Every golden case of the JS-facing kinds on that adapter.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';

import { importPackage, runGoldenSubtests } from './helpers.js';

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
