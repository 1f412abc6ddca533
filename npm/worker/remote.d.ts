// `distopt/worker`: the package in a worker of its own, every call awaited (remote.js).

import type * as Distopt from '../index.js';
import type { InitOptions, Port } from '../index.js';
import type { PortOptions } from '../nats/port.js';

/** What stays in the worker and is handled through a proxy: distopt's objects and a port. */
type Held = { free(): void } | Port;

/** A value the worker answers with: its objects as proxies, data as it is. */
export type Remote<T> = T extends Held ? RemoteObject<T> : T;

/** An argument: data as it is, distopt's objects as the proxies of them (deep in options too). */
export type RemoteArg<T> = T extends Held
  ? RemoteObject<T>
  : T extends string | number | boolean | bigint | symbol | null | undefined | ArrayBuffer | ArrayBufferView
    ? T
    : T extends readonly (infer E)[]
      ? readonly RemoteArg<E>[]
      : T extends object
        ? { [K in keyof T]: RemoteArg<T[K]> }
        : T;

export type RemoteArgs<A extends readonly unknown[]> = { [K in keyof A]: RemoteArg<A[K]> };

/** A method made a call to the worker. */
type RemoteMethod<F> = F extends (...args: infer A) => infer R ? (...args: RemoteArgs<A>) => Promise<Remote<Awaited<R>>> : never;

/**
 * An object that lives in the worker: each method returns a promise of its result, each
 * property is awaited (`await trainer.steps`), and an assignment (`averager.step = 3`) is sent in
 * order, a failure of it rejecting the next call. `free()` frees it in the worker.
 */
export type RemoteObject<T> = {
  [K in keyof T as K extends 'free' | symbol ? never : K]: T[K] extends (...args: never[]) => unknown
    ? RemoteMethod<T[K]>
    : Promise<Remote<T[K]>>;
} & {
  free(): Promise<void>;
  /** Frees it in the worker without waiting (a `using` block); a failure rejects the next call. */
  [Symbol.dispose](): void;
};

/** A class of the worker's: `await new Class(…)`, and its static methods. */
export type RemoteClass<C> = (C extends abstract new (...args: infer A) => infer I
  ? new (...args: RemoteArgs<A>) => Promise<RemoteObject<I>>
  : unknown) & {
  [K in keyof C as K extends 'prototype' ? never : K]: C[K] extends (...args: never[]) => unknown ? RemoteMethod<C[K]> : Promise<C[K]>;
};

type Module = Omit<typeof Distopt, 'default' | 'init'>;

/** distopt as `inWorker` returns it: every export of `distopt`, awaited, and `openPort`. */
export type RemoteModule = {
  [K in keyof Module]: Module[K] extends abstract new (...args: never[]) => unknown ? RemoteClass<Module[K]> : RemoteMethod<Module[K]>;
} & {
  /** `distopt/nats`'s `openPort`, in the worker (where the port's calls may block). */
  openPort(options: PortOptions): Promise<RemoteObject<Port>>;
  /** Ends the worker: every pending and later call rejects with a `RuntimeError`. */
  terminate(): void;
};

/**
 * Loads distopt in a Worker (Node's `worker_threads` in Node), initializes it with `options`
 * (`init()`'s), and returns the module as a remote whose every call is awaited: the thread that
 * holds it never blocks, so a browser page's main thread can run a rank of a run over NATS.
 * Data crosses by copy (the structured clone); distopt's objects stay in the worker, handled
 * through proxies; a function cannot cross (a `TypeError` naming the argument). Rejects with
 * `init()`'s error when the worker cannot initialize distopt.
 */
export function inWorker(options?: InitOptions): Promise<RemoteModule>;
