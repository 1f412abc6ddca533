// A real nats-server (on PATH; .ci/run installs it) for the Node tests, on a free 127.0.0.1
// port, started and stopped by the test that needs it.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

/** A TCP port nothing listens on (now). */
export async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Resolves once 127.0.0.1:port accepts a connection (nats-server is up), or throws. */
async function accepting(port, child) {
  const end = Date.now() + 10_000;
  while (Date.now() < end) {
    if (child.exitCode !== null) throw new Error(`nats-server exited (${child.exitCode}): ${child.log}`);
    const ok = await new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1', () => {
        socket.destroy();
        resolve(true);
      });
      socket.on('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`nats-server did not accept on port ${port}: ${child.log}`);
}

/**
 * Starts nats-server on a free loopback port with `args` (`['-js']`: JetStream, its store in a
 * fresh temporary folder); with `websocket`, a WebSocket listener on another free loopback port
 * too (browsers connect there). Resolves to {url, wsUrl, store, stop}; `stop()` kills it and
 * removes its store.
 */
export async function startServer(args = ['-js'], { websocket = false } = {}) {
  const port = await freePort();
  const store = fs.mkdtempSync(path.join(os.tmpdir(), 'distopt-nats-'));
  let wsUrl;
  if (websocket) {
    const wsPort = await freePort();
    const config = path.join(store, 'websocket.conf');
    fs.writeFileSync(config, `websocket { listen: "127.0.0.1:${wsPort}", no_tls: true }\n`);
    args = [...args, '-c', config];
    wsUrl = `ws://127.0.0.1:${wsPort}`;
  }
  const child = spawn('nats-server', ['-a', '127.0.0.1', '-p', String(port), '-sd', store, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.log = '';
  child.stdout.on('data', (d) => (child.log += d));
  child.stderr.on('data', (d) => (child.log += d));
  await accepting(port, child);
  return {
    url: `nats://127.0.0.1:${port}`,
    wsUrl,
    store,
    stop() {
      child.kill('SIGKILL');
      fs.rmSync(store, { recursive: true, force: true });
    },
  };
}
