// The NATS worker's entry in a browser: a module Web Worker connecting over WebSocket
// (@nats-io/nats-core's wsconnect). scripts/build-npm.sh bundles it into the package's
// nats/worker.browser.js.
import { wsconnect } from '@nats-io/nats-core';

import { serveWorker } from './worker.js';

serveWorker(wsconnect, {
  post: (data) => self.postMessage(data),
  listen(onMessage, onFailure) {
    self.addEventListener('message', ({ data }) => onMessage(data));
    self.addEventListener('error', (event) => onFailure(event.message));
    self.addEventListener('unhandledrejection', (event) => onFailure(event.reason));
  },
});
