#!/usr/bin/env node
// A small static file server for the demo and the browser tests (no dependencies).
//
//   node scripts/serve.mjs [--port N] [--host H] [--no-isolation] MOUNT=DIR [MOUNT=DIR ...]
//
// Each MOUNT=DIR serves DIR under the URL prefix MOUNT ("/" for the root). Prints
// "serving http://HOST:PORT/" once listening; --port 0 picks a free port. Only loopback
// hosts are allowed: this serves a working tree.
//
// Every response carries the cross-origin isolation headers (COOP `same-origin`, COEP
// `require-corp`, CORP `same-origin`), so that pages get `crossOriginIsolated` and with it
// SharedArrayBuffer and WebAssembly threads (TF.js's wasm backend then runs threaded, and the
// demo and bench load `distopt/threads`, whose CPU fallback runs on every core). --no-isolation
// leaves them out, to see a page as a server without them serves it.

import { createServer } from 'node:http';
import { createReadStream, promises as fs } from 'node:fs';
import path from 'node:path';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.ts': 'text/plain; charset=utf-8',
  '.md': 'text/plain; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
};

/** Parses the command line into {host, port, mounts: [[prefix, dir], ...]}. */
export function parseArgs(argv) {
  let host = '127.0.0.1';
  let port = 8080;
  let isolation = true;
  const mounts = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--port') port = Number(argv[++i]);
    else if (arg === '--host') host = argv[++i];
    else if (arg === '--no-isolation') isolation = false;
    else if (arg.includes('=')) {
      const [prefix, dir] = arg.split('=', 2);
      mounts.push([prefix.endsWith('/') ? prefix : prefix + '/', path.resolve(dir)]);
    } else throw new Error(`serve.mjs: unexpected argument ${arg}`);
  }
  if (!['127.0.0.1', 'localhost', '::1'].includes(host)) {
    throw new Error(`serve.mjs: refusing to listen on ${host}: loopback only`);
  }
  // Longest prefix first, so that /pkg/ wins over /.
  mounts.sort((a, b) => b[0].length - a[0].length);
  return { host, port, mounts, isolation };
}

/** The headers that make a page cross-origin isolated (all of this server's files are same-origin). */
export const ISOLATION_HEADERS = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

/**
 * Starts the server; resolves to {server, url}. `isolation` (default true) sends
 * ISOLATION_HEADERS. `routes` maps a path to a handler `(req) => {status, type, body}` (or its
 * promise) that answers it instead of a file (scripts/demo.mjs's `/config/nats.json` and `/runs`).
 */
export function serve({ host = '127.0.0.1', port = 0, mounts, isolation = true, routes = {} }) {
  const extra = isolation ? ISOLATION_HEADERS : {};
  const server = createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://x');
      let pathname = decodeURIComponent(url.pathname);
      if (Object.hasOwn(routes, pathname)) {
        const { status, type, body } = await routes[pathname](req);
        res.writeHead(status, { 'Content-Type': type, 'Cache-Control': 'no-store', ...extra });
        return res.end(body);
      }
      const mount = mounts.find(([prefix]) => pathname.startsWith(prefix) || pathname + '/' === prefix);
      if (!mount) return notFound(res);
      const [prefix, dir] = mount;
      if (pathname + '/' === prefix) {
        res.writeHead(301, { Location: prefix, ...extra });
        return res.end();
      }
      let file = path.join(dir, pathname.slice(prefix.length));
      if (!file.startsWith(dir)) return notFound(res);
      let stat = await fs.stat(file).catch(() => null);
      if (stat && stat.isDirectory()) {
        if (!pathname.endsWith('/')) {
          res.writeHead(301, { Location: pathname + '/', ...extra });
          return res.end();
        }
        file = path.join(file, 'index.html');
        stat = await fs.stat(file).catch(() => null);
      }
      if (!stat || !stat.isFile()) return notFound(res);
      res.writeHead(200, {
        'Content-Type': TYPES[path.extname(file)] || 'application/octet-stream',
        'Content-Length': stat.size,
        'Cache-Control': 'no-store',
        ...extra,
      });
      if (req.method === 'HEAD') return res.end();
      createReadStream(file).pipe(res);
    } catch (err) {
      res.writeHead(500, { 'Content-Type': 'text/plain' });
      res.end(String(err));
    }
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      const { port: actual } = server.address();
      const shown = host.includes(':') ? `[${host}]` : host;
      resolve({ server, url: `http://${shown}:${actual}/` });
    });
  });
}

function notFound(res) {
  res.writeHead(404, { 'Content-Type': 'text/plain' });
  res.end('not found');
}

/** `serve(options)` on `options.port` or, when it is busy, one of the next 20; prints the URL. */
export async function serveOnFreePort(options) {
  for (let attempt = 0; ; attempt++) {
    try {
      const started = await serve(options);
      console.log(`serving ${started.url}`);
      return started;
    } catch (err) {
      if (err.code !== 'EADDRINUSE' || attempt === 20 || options.port === 0) throw err;
      options.port++;
    }
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  await serveOnFreePort(parseArgs(process.argv.slice(2)));
}
