// Launching Debian's Chromium through playwright-core with WebGPU on (SwiftShader here) and
// nothing that reaches for the network.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { chromium } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

/** The flags this machine needs: WebGPU on, and no background networking. */
export const CHROMIUM_FLAGS = [
  '--headless=new',
  '--no-sandbox',
  '--enable-unsafe-webgpu',
  '--enable-webgpu-developer-features',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
  '--disable-quic',
  '--disable-default-apps',
  '--disable-extensions',
];

/** The same flags for a browser without WebGPU. */
export const NO_WEBGPU_FLAGS = [...CHROMIUM_FLAGS.filter((f) => !f.includes('webgpu')), '--disable-features=WebGPU'];

/** A browser with a fresh profile (removed on close). */
export async function launch(args = CHROMIUM_FLAGS) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distopt-chromium-'));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    args,
    viewport: { width: 1400, height: 900 },
  });
  const close = context.close.bind(context);
  context.close = async (...args) => {
    await close(...args);
    // Chromium may still be flushing its profile for a moment.
    await fs.promises.rm(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 }).catch(() => {});
  };
  return context;
}
