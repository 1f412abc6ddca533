#!/usr/bin/env node
// The demo's server (scripts/demo.sh runs it after building the package): serves www/ and the
// package as scripts/serve.mjs does and, where nats-server is on PATH, runs one for runs across
// tabs — JetStream for the runs' rendezvous, a WebSocket listener for the tabs, and a user per
// run (the package's `natsServerConfig`: a run's user reaches that run's subjects and bucket
// only). The page asks for a run with `POST /runs`: a new user is added and the server reloads
// its configuration (SIGHUP), and the answer {run, secret} is what the invitation link carries.
// The page learns the listener from `/config/nats.json` ({websocket, runs}, or {websocket: null}
// without a server). Everything listens on loopback; Ctrl-C stops the server with the page's.
//
//   node scripts/demo.mjs [--port N] [--no-nats] MOUNT=DIR [MOUNT=DIR ...]
//
// The package is the one mounted at /pkg/.

import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { parseArgs, serveOnFreePort } from './serve.mjs';

/** The most runs one demo server admits (each is a user of the NATS server). */
export const MAX_RUNS = 256;

/** A TCP port nothing listens on (now). */
async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const hex = (bytes) => crypto.randomBytes(bytes).toString('hex');

/** Resolves once `check()` is true, polling; rejects with `what` after `ms`. */
async function until(check, ms, what) {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(what());
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/**
 * Starts nats-server (on PATH) on free loopback ports with a user per run, configured by
 * `natsServerConfig` (the package's). Resolves to {url, websocket, createRun, stop}:
 * `createRun()` admits a new run and resolves to {run, secret} once the server has reloaded;
 * `stop()` kills the server and removes its folder.
 */
export async function startNats(natsServerConfig) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'distopt-demo-nats-'));
  const [client, websocket] = [await freePort(), await freePort()];
  const listen = { client: `127.0.0.1:${client}`, websocket: `127.0.0.1:${websocket}`, storeDir: path.join(dir, 'store') };
  const file = path.join(dir, 'nats.conf');
  // The server needs a user from the start, or it admits anyone: a run nobody is told of.
  const runs = [{ run: `lobby-${hex(8)}`, secret: hex(16) }];
  fs.writeFileSync(file, natsServerConfig(runs, listen));
  const child = spawn('nats-server', ['-c', file], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const reloads = () => (log.match(/Reloaded server configuration/g) ?? []).length;
  const accepting = () =>
    new Promise((resolve) => {
      const socket = net.connect(client, '127.0.0.1', () => {
        socket.destroy();
        resolve(true);
      });
      socket.on('error', () => resolve(false));
    });
  await until(async () => child.exitCode === null && (await accepting()), 10_000, () => `nats-server did not start: ${log}`);
  // One run is admitted at a time: each waits for the reload of its own configuration.
  let admitting = Promise.resolve();
  const createRun = () => {
    const admitted = admitting.then(async () => {
      if (runs.length > MAX_RUNS) throw new Error(`this demo server admits at most ${MAX_RUNS} runs: restart it`);
      const credentials = { run: `demo-${hex(8)}`, secret: hex(16) };
      const before = reloads();
      fs.writeFileSync(file, natsServerConfig([...runs, credentials], listen));
      child.kill('SIGHUP');
      await until(() => reloads() > before, 10_000, () => `nats-server did not reload its configuration: ${log}`);
      runs.push(credentials);
      return credentials;
    });
    admitting = admitted.catch(() => {});
    return admitted;
  };
  const stop = () => {
    child.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { url: `nats://127.0.0.1:${client}`, websocket: `ws://127.0.0.1:${websocket}`, createRun, stop, log: () => log };
}

/**
 * The demo's routes over `nats` (startNats's, or null): `/config/nats.json` and `POST /runs`.
 */
export function demoRoutes(nats) {
  const json = (status, value) => ({ status, type: 'application/json; charset=utf-8', body: JSON.stringify(value) });
  return {
    '/config/nats.json': () => json(200, nats ? { websocket: nats.websocket, runs: '/runs' } : { websocket: null }),
    '/runs': async (req) => {
      if (!nats) return json(404, { error: 'this demo server runs no NATS server' });
      if (req.method !== 'POST') return json(405, { error: 'POST makes a run' });
      try {
        return json(200, await nats.createRun());
      } catch (error) {
        return json(503, { error: error.message });
      }
    },
  };
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const argv = process.argv.slice(2);
  const withNats = !argv.includes('--no-nats');
  const options = parseArgs(argv.filter((a) => a !== '--no-nats'));
  let nats = null;
  if (withNats) {
    const pkg = options.mounts.find(([prefix]) => prefix === '/pkg/');
    if (!pkg) throw new Error('demo.mjs: mount the package at /pkg/');
    const distopt = await import(pathToFileURL(path.join(pkg[1], 'index.js')).href);
    await distopt.default({ backend: 'cpu' });
    nats = await startNats(distopt.natsServerConfig);
    for (const signal of ['SIGINT', 'SIGTERM']) {
      process.on(signal, () => {
        nats.stop();
        process.exit(0);
      });
    }
    process.on('exit', () => nats.stop());
    console.log(`demo: "Invite other tabs" makes a run over the NATS server started here (${nats.url},`);
    console.log(`      WebSocket ${nats.websocket}), each run a user of its own whose secret the link carries.`);
  }
  options.routes = demoRoutes(nats);
  await serveOnFreePort(options);
}
