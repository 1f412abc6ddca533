// `distopt/nats`: the NATS port a rank of a run joins through (`World.joinNats`).

import type { Port } from '../index.js';

export type { Port };

/** What `openPort` connects with. */
export interface PortOptions {
  /** `nats://host:port` in Node (TCP), `ws://host:port` in a browser (the server's WebSocket listener). */
  servers: string | string[];
  /** The server's authentication token. */
  token?: string;
  /** The user (a run's name on a server with a user per run) and its password (the run's secret). */
  user?: string;
  pass?: string;
  /** The connection's name, as the server reports it. */
  name?: string;
  /** The prefix of the client's reply subjects (`_INBOX.distopt.<run>` on a server with a user per run). */
  inboxPrefix?: string;
  /**
   * With `secret`: the run whose user this connection is, on a server with a user per run
   * (`natsServerConfig`, `distopt nats-config`) — user, password and inbox prefix in one.
   */
  run?: string;
  /** The run's secret (its user's password), as a join link carries it. */
  secret?: string;
}

/**
 * Starts the NATS client in a worker thread and connects it: a port whose calls block the calling
 * thread (Node's main thread, or a Worker; a browser page's main thread cannot block, and a
 * browser page must be cross-origin isolated for the shared memory the port needs). Rejects
 * with an `Error` naming the server when it cannot connect.
 */
export function openPort(options: PortOptions): Promise<Port>;
