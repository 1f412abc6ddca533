// The synchronous NATS port (npm/nats/port.js and its worker) against a real nats-server
// (on PATH) with JetStream: publish/subscribe between two ports, pump's batching and timeout,
// heartbeats, JetStream KV, watches, a server's permission refusal, a failed connect, close.
// Every blocking call runs on this test's main thread (Node lets it Atomics.wait).
//
// The port is the built package's (scripts/build-npm.sh), its worker nats.js bundled for Node.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { buildDistoptCli, importPackage, importPort } from './helpers.js';
import { freePort, startServer as startNats } from './nats-server.js';

const servers = [];
const ports = [];
let openPort;
let url;
let deniedUrl;
let a;
let b;

async function startServer(args) {
  const server = await startNats(args);
  servers.push(server);
  return server.url;
}

async function open(options) {
  const port = await openPort(options);
  ports.push(port);
  return port;
}

const bytes = (text) => new TextEncoder().encode(text);
const text = (data) => new TextDecoder().decode(data);
/** `n` bytes of a pattern that differs per `seed` and position. */
function pattern(n, seed) {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + seed * 7 + (i >> 8)) & 0xff;
  return out;
}

/** Pumps `port` until `count` deliveries came (or `ms` passed); returns them with the pumps' sizes. */
function pumpAll(port, count, ms = 5000) {
  const got = [];
  const batches = [];
  const end = Date.now() + ms;
  while (got.length < count && Date.now() < end) {
    const batch = port.pump(Math.max(1, end - Date.now()));
    if (batch.length > 0) batches.push(batch.length);
    got.push(...batch);
  }
  return { got, batches };
}

before(async () => {
  ({ openPort } = await importPort());

  url = await startServer(['-js']);
  const config = path.join(servers[0].store, 'denied.conf');
  fs.writeFileSync(
    config,
    'authorization { users: [ {user: a, password: b, permissions: {publish: {deny: ["forbidden.>"]}}} ] }\n',
  );
  deniedUrl = await startServer(['-c', config]);
  a = await open({ servers: url, name: 'port-a' });
  b = await open({ servers: url, name: 'port-b' });
});

after(() => {
  for (const port of ports) {
    try {
      port.close();
    } catch {
      // closed already, or its connection is gone
    }
  }
  for (const server of servers) server.stop();
});

test('the port knows the server max_payload', () => {
  assert.equal(a.maxPayload, 1024 * 1024); // nats-server's default
  assert.equal(b.maxPayload, a.maxPayload);
});

test('a 1-byte and a max_payload message arrive intact and in order', () => {
  b.subscribe(1, 'pair.data');
  b.flush();
  const small = new Uint8Array([42]);
  const big = pattern(a.maxPayload, 1);
  a.publish('pair.data', small);
  a.publish('pair.data', big);
  a.flush();
  const { got } = pumpAll(b, 2);
  assert.equal(got.length, 2);
  assert.deepEqual(got[0], [1, small]);
  assert.ok(got[0][1].buffer instanceof ArrayBuffer, 'a payload is a copy in a plain ArrayBuffer, not the shared area');
  assert.equal(got[1][0], 1);
  assert.equal(got[1][1].length, a.maxPayload);
  assert.ok(Buffer.from(got[1][1]).equals(Buffer.from(big)), 'the max_payload message changed');
  b.unsubscribe(1);
  b.flush();
  a.publish('pair.data', small);
  a.flush();
  assert.deepEqual(b.pump(200), [], 'a delivery after unsubscribe');
});

test('pump returns [] after about its timeout when nothing comes', () => {
  const start = performance.now();
  assert.deepEqual(b.pump(300), []);
  const took = performance.now() - start;
  assert.ok(took >= 290 && took < 1000, `pump(300) took ${took} ms`);
});

test('messages larger in total than the answer area arrive across several pumps, in order', () => {
  b.subscribe(2, 'many.data');
  b.flush();
  const count = 8; // 8 MiB, the area is 2 * max_payload + 1 MiB
  for (let i = 0; i < count; i++) a.publish('many.data', pattern(a.maxPayload, 10 + i));
  a.flush();
  b.sleep(500); // let them all reach port b's worker: the pumps then are limited by the area only
  const { got, batches } = pumpAll(b, count);
  assert.equal(got.length, count);
  got.forEach(([sid, data], i) => {
    assert.equal(sid, 2);
    assert.ok(Buffer.from(data).equals(Buffer.from(pattern(a.maxPayload, 10 + i))), `message ${i} changed`);
  });
  assert.ok(batches.length >= 3, `pumps: ${batches}`);
  assert.ok(Math.max(...batches) <= 2, `pumps: ${batches}`);
  b.unsubscribe(2);
});

test('a failed queued publish surfaces at the next flush', () => {
  a.publish('too.big', new Uint8Array(a.maxPayload + 1));
  assert.throws(() => a.flush(), (error) => error instanceof Error && error.message.length > 0);
  a.flush(); // reported once
});

test('heartbeat frames arrive at the period, in order, skip empty ticks, and stop', () => {
  b.subscribe(3, 'beat.x');
  b.flush();
  a.beats(7, [bytes('f0'), bytes('f1'), bytes('f2')]);
  assert.equal(a.beatsLeft(7), 3);
  const start = performance.now();
  a.heartbeat(7, 'beat.x', 100);
  const times = [];
  const frames = [];
  while (frames.length < 3 && performance.now() - start < 3000) {
    for (const [sid, data] of b.pump(500)) {
      assert.equal(sid, 3);
      frames.push(text(data));
      times.push(performance.now() - start);
    }
  }
  assert.deepEqual(frames, ['f0', 'f1', 'f2']);
  // The first after one period, then one a period: gaps of about 100 ms, never two in a tick.
  const gaps = times.map((t, i) => t - (i === 0 ? 0 : times[i - 1]));
  gaps.forEach((gap, i) => assert.ok(gap > 70 && gap < 300, `frame ${i} came ${gap} ms after the one before (${times})`));
  assert.equal(a.beatsLeft(7), 0);
  assert.deepEqual(b.pump(250), [], 'an empty queue publishes nothing');
  a.beats(7, [bytes('f3')]);
  const [[sid, late]] = pumpAll(b, 1, 1000).got;
  assert.equal(sid, 3);
  assert.equal(text(late), 'f3');
  a.stopHeartbeat(7);
  a.beats(7, [bytes('f4')]);
  assert.deepEqual(b.pump(400), [], 'a frame after stopHeartbeat');
  assert.equal(a.beatsLeft(7), 1);
  a.stopHeartbeat(7);
  b.unsubscribe(3);
});

test('KV: open, get, entry, put, create, delete', () => {
  a.kvOpen('port_kv', true);
  a.kvOpen('port_kv', true); // exists: opened
  b.kvOpen('port_kv', false);
  assert.throws(() => b.kvOpen('port_kv_missing', false), /not found/i);
  assert.throws(() => b.kvGet('never_opened', 'k'), /not open/);
  assert.equal(a.kvGet('port_kv', 'k'), null);
  assert.equal(a.kvEntry('port_kv', 'k'), null);
  a.kvPut('port_kv', 'k', bytes('v1'));
  assert.deepEqual(b.kvGet('port_kv', 'k'), bytes('v1'));
  assert.deepEqual(b.kvEntry('port_kv', 'k'), { value: bytes('v1'), deleted: false });
  a.kvPut('port_kv', 'k', bytes('v2'));
  assert.deepEqual(b.kvGet('port_kv', 'k'), bytes('v2'));
  b.kvCreate('port_kv', 'once', bytes('first'));
  assert.throws(() => a.kvCreate('port_kv', 'once', bytes('second')), /wrong last sequence/i);
  assert.deepEqual(a.kvGet('port_kv', 'once'), bytes('first'));
  a.kvDelete('port_kv', 'k');
  assert.equal(b.kvGet('port_kv', 'k'), null);
  assert.deepEqual(b.kvEntry('port_kv', 'k'), { value: new Uint8Array(0), deleted: true });
  b.kvCreate('port_kv', 'k', bytes('again')); // a deleted key can be created again
  assert.deepEqual(a.kvGet('port_kv', 'k'), bytes('again'));
  // A discard is queued: the same port's next call sees the key gone; a failed one (a bucket
  // never opened) is ignored, and leaves no error for the next flush.
  a.kvPut('port_kv', 'spent', bytes('x'));
  a.kvDiscard('port_kv', 'spent');
  assert.equal(a.kvGet('port_kv', 'spent'), null);
  a.kvDiscard('never_opened', 'k');
  a.flush();
});

test('a started key-value call is served in order while the caller goes on; its answer is taken once', () => {
  a.kvOpen('port_start', true);
  const put = a.start('kvPut', 'port_start', 'k', bytes('v'));
  const create = a.start('kvCreate', 'port_start', 'k', bytes('w')); // fails: k has a value
  const get = a.start('kvGet', 'port_start', 'k');
  assert.ok(put < create && create < get, 'fresh tickets');
  const end = Date.now() + 5000;
  while (!a.served(get) && Date.now() < end) a.sleep(1);
  assert.ok(a.served(put) && a.served(create) && a.served(get), 'served, in order');
  assert.equal(a.result(put), null);
  assert.throws(() => a.result(create), /wrong last sequence/i);
  assert.deepEqual(a.result(get), bytes('v'));
  assert.throws(() => a.result(get), /no answer for started call/, 'an answer is taken once');
  // Waited for at once: result blocks until the call is served.
  assert.deepEqual(a.result(a.start('kvEntry', 'port_start', 'k')), { value: bytes('v'), deleted: false });
  const dropped = a.start('kvGet', 'port_start', 'k');
  a.forget(dropped);
  assert.throws(() => a.result(dropped), /no answer for started call/);
  assert.throws(() => a.start('kvDelete', 'port_start', 'k'), TypeError);
});

test('a KV watch sees updates only, from now on', () => {
  a.kvOpen('port_watch', true);
  b.kvOpen('port_watch', false);
  a.kvPut('port_watch', 'w.old', bytes('before'));
  b.kvWatch(1, 'port_watch', 'w.>');
  assert.equal(b.watchNext(1, 300), 'quiet', 'the watch saw a value put before it');
  a.kvPut('port_watch', 'w.k', bytes('u1'));
  a.kvPut('port_watch', 'other', bytes('not watched'));
  a.kvPut('port_watch', 'w.k', bytes('u2'));
  assert.deepEqual(b.watchNext(1, 2000), { key: 'w.k', value: bytes('u1') });
  assert.deepEqual(b.watchNext(1, 2000), { key: 'w.k', value: bytes('u2') });
  a.kvDelete('port_watch', 'w.old');
  assert.deepEqual(b.watchNext(1, 2000), { key: 'w.old', value: null });
  assert.equal(b.watchNext(1, 200), 'quiet');
  assert.equal(b.watchReady(1), null);
  a.kvPut('port_watch', 'w.ready', bytes('r'));
  const end = Date.now() + 2000;
  let ready = null;
  while (ready === null && Date.now() < end) {
    b.sleep(20);
    ready = b.watchReady(1);
  }
  assert.deepEqual(ready, { key: 'w.ready', value: bytes('r') });
  assert.equal(b.watchReady(1), null);
  b.unwatch(1);
  assert.equal(b.watchNext(1, 200), 'ended');
});

test('a server permission refusal arrives as sid 0', async () => {
  const c = await open({ servers: deniedUrl, user: 'a', pass: 'b', name: 'port-denied' });
  c.subscribe(1, 'allowed.x');
  c.flush();
  c.publish('forbidden.x', bytes('no'));
  c.flush();
  const { got } = pumpAll(c, 1, 2000);
  assert.equal(got.length, 1);
  assert.equal(got[0][0], 0);
  assert.match(text(got[0][1]), /permissions violation/i);
  assert.match(text(got[0][1]), /forbidden\.x/);
  c.publish('allowed.x', bytes('yes')); // noEcho: its own message does not come back
  c.flush();
  assert.deepEqual(c.pump(200), []);
  c.close();
});

test('a wrong password and a closed port reject with named errors', async () => {
  const closed = `nats://127.0.0.1:${await freePort()}`;
  await assert.rejects(openPort({ servers: closed }), (error) => {
    assert.ok(error instanceof Error);
    assert.ok(error.message.includes(closed), error.message);
    assert.match(error.message, /refused|connect/i);
    return true;
  });
  await assert.rejects(openPort({ servers: deniedUrl, user: 'a', pass: 'wrong' }), (error) => {
    assert.ok(error.message.includes(deniedUrl), error.message);
    assert.match(error.message, /authorization/i);
    return true;
  });
});

test('sleep blocks about its time', () => {
  const start = performance.now();
  a.sleep(150);
  const took = performance.now() - start;
  assert.ok(took >= 145 && took < 600, `sleep(150) took ${took} ms`);
});

test('close drains, is idempotent, and later calls throw', async () => {
  const c = await open({ servers: url, name: 'port-closing' });
  c.kvOpen('port_kv', false);
  c.publish('pair.data', bytes('last'));
  c.close();
  c.close();
  assert.throws(() => c.flush(), /closed/);
  assert.throws(() => c.publish('x', bytes('y')), /closed/);
});

test('World.joinNats: one world per port, and named errors for a wrong port or options', async () => {
  const api = await importPackage();
  await api.default({ backend: 'cpu' });
  const port = await open({ servers: url, name: 'port-world' });
  const world = api.World.joinNats(port, { run: 'one-rank', ranks: 1 });
  assert.deepEqual([world.rank, world.size, world.localRanks, world.live], [0, 1, [0], [true]]);
  assert.throws(() => api.World.joinNats(port, { run: 'another', ranks: 1 }), {
    name: 'ValueError',
    message: /this port already serves a World/,
  });
  world.free();
  // Freed, the port serves the next world.
  const again = api.World.joinNats(port, { run: 'one-rank-again', ranks: 1 });
  assert.equal(again.size, 1);
  again.free();
  assert.throws(() => api.World.joinNats({ pump() {} }, { run: 'r', ranks: 1 }), {
    name: 'TypeError',
    message: /port must be a Port/,
  });
  assert.throws(() => api.World.joinNats(port, { run: 'no spaces', ranks: 1 }), { name: 'ValueError' });
  assert.throws(() => api.World.joinNats(port, { run: 'r', ranks: 0 }), { name: 'ValueError', message: /at least one rank/ });
  assert.throws(() => api.World.joinNats(port, { ranks: 2 }), { name: 'TypeError', message: /options.run must be a string/ });
  assert.throws(() => api.World.joinNats(port, { run: 'r', ranks: 2, failurebound: 3 }), {
    name: 'TypeError',
    message: "unknown World.joinNats option 'failurebound': expected run, ranks, rank, join, failureBound or joinTimeout",
  });
  assert.throws(() => api.World.joinNats(port, { run: 'r', ranks: 2, rank: -1 }), {
    name: 'ValueError',
    message: 'options.rank must be a non-negative integer, got -1',
  });
  assert.throws(() => api.World.joinNats(port, { run: 'r', ranks: 2, joinTimeout: NaN }), {
    name: 'ValueError',
    message: 'options.joinTimeout must be a positive number of seconds, got NaN',
  });
  assert.throws(() => api.World.joinNats(port, { run: 'r', ranks: 2, failureBound: -1 }), {
    name: 'ValueError',
    message: /options.failureBound must be a positive number of seconds/,
  });
});

test('natsServerConfig writes what `distopt nats-config` prints, and names what is wrong', async () => {
  const api = await importPackage();
  await api.default({ backend: 'cpu' });
  const runs = [
    { run: 'alpha', secret: 'secret-alpha-1' },
    { run: 'beta_2', secret: 'secret.beta~22' },
  ];
  const listen = { client: '127.0.0.1:4222', websocket: '127.0.0.1:8443', storeDir: '/tmp/store' };
  const cli = execFileSync(
    buildDistoptCli(),
    ['nats-config', ...runs.flatMap((r) => ['--run', `${r.run}:${r.secret}`]), '--listen', listen.client, '--websocket', listen.websocket, '--store-dir', listen.storeDir],
    { encoding: 'utf8' },
  );
  assert.equal(api.natsServerConfig(runs, listen), cli, 'one source: the library writes both');
  const error = (runs_, listen_) => {
    try {
      api.natsServerConfig(runs_, listen_);
    } catch (e) {
      return `${e.name}: ${e.message}`;
    }
    return 'no error';
  };
  assert.equal(error([], listen), 'ValueError: natsServerConfig: a server configuration needs at least one run');
  assert.equal(error([{ run: 'alpha' }], listen), 'TypeError: natsServerConfig: runs: missing field `secret`');
  assert.equal(error([{ run: 'alpha', secret: 'short' }], listen), "ValueError: natsServerConfig: a run's secret holds 8 to 128 letters, digits, '-', '.', '_' and '~' (it travels in join links)");
  assert.equal(error([runs[0], runs[0]], listen), "ValueError: natsServerConfig: run 'alpha' is named twice");
  assert.equal(error(null, listen), 'TypeError: natsServerConfig: runs must be an array of {run, secret}');
  assert.equal(error(runs, {}), 'TypeError: natsServerConfig: listen: missing field `client`');
  assert.equal(error(runs, 'x'), 'TypeError: natsServerConfig: listen must be an object {client, websocket?, storeDir?}');
});
