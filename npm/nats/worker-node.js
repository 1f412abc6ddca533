// The NATS worker's entry in Node: a worker_threads thread connecting over TCP
// (@nats-io/transport-node). scripts/build-npm.sh bundles it into the package's
// nats/worker.node.js.
import { parentPort } from 'node:worker_threads';
import { connect } from '@nats-io/transport-node';

import { serveWorker } from './worker.js';

serveWorker(connect, {
  post: (data) => parentPort.postMessage(data),
  listen(onMessage, onFailure) {
    parentPort.on('message', onMessage);
    process.on('uncaughtException', onFailure);
    process.on('unhandledRejection', onFailure);
  },
});
