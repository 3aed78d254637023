import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry, type Registry } from 'prom-client';
import type { Api } from './http/context.js';
import { newId } from './ids.js';
import type { Logger } from './observability/logger.js';

/**
 * Several serving processes (`arbiter serve --workers N`): the primary prepares storage once
 * (migrations, seeding, compiling, the signing key), forks N workers that share the listening
 * sockets, and relays what must reach every worker. Everything else that must hold across
 * processes (queue transitions, idempotency, revocation, the audit chain) already lives in the
 * database.
 *
 * - A policy or data change is answered only after every worker has loaded the new revision,
 *   so "live before the response" holds whichever process serves the next request; a signing-key
 *   rotation only after every worker has loaded the new key.
 * - /metrics on any worker answers the sum over all workers (prom-client's AggregatorRegistry).
 */

/** One API's listening socket, as a worker reports it to the primary. */
export interface Listener {
  api: Api;
  url: string;
  port: number;
}

/** What changed: a new policy revision, or the signing keys (a rotation). */
export type Changed = { topic: 'revision'; revision: number } | { topic: 'signing_keys' };

type ToPrimary =
  | { arbiter: 'linked' }
  | { arbiter: 'listening'; listeners: Listener[] }
  | { arbiter: 'changed'; id: string; change: Changed }
  | { arbiter: 'refreshed'; id: string }
  | { arbiter: 'metrics'; id: string };

type ToWorker =
  | { arbiter: 'refresh'; id: string; change: Changed }
  | { arbiter: 'synced'; id: string }
  | { arbiter: 'metrics'; id: string; text?: string; error?: string };

/** How long a change waits for the other workers before answering anyway (and logging it). */
const SYNC_TIMEOUT_MS = 5_000;

const isOurs = (m: unknown): m is { arbiter: string } =>
  typeof m === 'object' && m !== null && typeof (m as { arbiter?: unknown }).arbiter === 'string';

/**
 * The worker side: tells the primary about changes and answers its refresh requests. Made first
 * thing in a worker, before storage is read, and says so (`linked`): from then on the primary
 * waits for this worker's answer to every change. A refresh that arrives while the worker is still
 * starting is answered once it has started (`serve`): its start may have read the store before the
 * change was made.
 */
export class WorkerLink {
  private readonly waiting = new Map<string, (m: ToWorker) => void>();
  private started!: (refresh: (change: Changed) => Promise<void>) => void;
  private readonly refresh = new Promise<(change: Changed) => Promise<void>>((resolve) => {
    this.started = resolve;
  });

  constructor(
    private readonly log: Logger,
    registry: Registry,
  ) {
    AggregatorRegistry.setRegistries([registry]);
    // Constructing one is what makes prom-client answer the primary's metrics requests here.
    new AggregatorRegistry();
    process.on('message', (m: unknown) => {
      if (!isOurs(m)) return;
      const msg = m as ToWorker;
      if (msg.arbiter === 'refresh') {
        this.refresh
          .then((refresh) => refresh(msg.change))
          .catch((err: unknown) => this.log.error({ err, change: msg.change }, 'refresh failed'))
          .finally(() => this.send({ arbiter: 'refreshed', id: msg.id }));
        return;
      }
      this.waiting.get(msg.id)?.(msg);
    });
    this.send({ arbiter: 'linked' });
  }

  /** The worker has started: refreshes (held ones first) are made with `refresh`. */
  serve(refresh: (change: Changed) => Promise<void>): void {
    this.started(refresh);
  }

  listening(listeners: Listener[]): void {
    this.send({ arbiter: 'listening', listeners });
  }

  /** Resolves once every other worker has loaded `revision` (or the sync timed out). */
  async changed(revision: number): Promise<void> {
    await this.ask({ arbiter: 'changed', id: newId(), change: { topic: 'revision', revision } });
  }

  /** Resolves once every other worker has loaded the rotated signing keys (or the sync timed out). */
  async signingKeysRotated(): Promise<void> {
    await this.ask({ arbiter: 'changed', id: newId(), change: { topic: 'signing_keys' } });
  }

  async metrics(): Promise<string> {
    const r = await this.ask({ arbiter: 'metrics', id: newId() });
    if (r.arbiter !== 'metrics' || r.text === undefined)
      throw new Error(`cluster metrics failed: ${r.arbiter === 'metrics' ? r.error : ''}`);
    return r.text;
  }

  private ask(m: ToPrimary & { id: string }): Promise<ToWorker> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(m.id);
        reject(new Error(`no answer from the primary to ${m.arbiter}`));
      }, SYNC_TIMEOUT_MS * 2);
      this.waiting.set(m.id, (answer) => {
        clearTimeout(timer);
        this.waiting.delete(m.id);
        resolve(answer);
      });
      this.send(m);
    });
  }

  private send(m: ToPrimary): void {
    process.send?.(m);
  }
}

/** The primary: forks and supervises workers, relays changes and metrics, logs the listeners. */
export async function runPrimary(workers: number, log: Logger): Promise<{ stop: () => Promise<void> }> {
  // Workers accept on the shared sockets themselves; the kernel spreads connections.
  cluster.schedulingPolicy = cluster.SCHED_NONE;
  const aggregator = new AggregatorRegistry();
  let stopping = false;
  let announced = false;
  const ready = new Map<number, Listener[]>();
  // Workers whose link is up: a change waits for their answer. One that has not linked yet is
  // still loading and has read nothing: it loads the change when it starts. (A replacement forked
  // just before a change was waited for in vain until SYNC_TIMEOUT_MS: its refresh was lost.)
  const linked = new Set<number>();

  const relay = (from: Worker, msg: ToPrimary) => {
    if (msg.arbiter === 'linked') {
      linked.add(from.id);
    } else if (msg.arbiter === 'listening') {
      ready.set(from.id, msg.listeners);
      if (!announced && ready.size === workers) {
        announced = true;
        for (const l of msg.listeners)
          log.info({ api: l.api, port: l.port, url: l.url, workers }, `${l.api} API listening`);
      }
    } else if (msg.arbiter === 'changed') {
      const others = Object.values(cluster.workers ?? {}).filter(
        (w): w is Worker => !!w && w !== from && w.isConnected(),
      );
      const awaited = others.filter((w) => linked.has(w.id));
      let left = awaited.length;
      const finish = () =>
        from.isConnected() && from.send({ arbiter: 'synced', id: msg.id } satisfies ToWorker);
      if (left === 0) return finish();
      const timer = setTimeout(() => {
        log.warn({ change: msg.change, missing: left }, 'workers did not confirm a change in time');
        cleanup();
        finish();
      }, SYNC_TIMEOUT_MS);
      const onMessage = (w: Worker, m: unknown) => {
        if (
          isOurs(m) &&
          (m as ToPrimary).arbiter === 'refreshed' &&
          (m as unknown as { id: string }).id === msg.id &&
          awaited.includes(w)
        ) {
          if (--left === 0) {
            cleanup();
            finish();
          }
        }
      };
      const onExit = (w: Worker) => {
        if (awaited.includes(w) && --left === 0) {
          cleanup();
          finish();
        }
      };
      const cleanup = () => {
        clearTimeout(timer);
        cluster.off('message', onMessage);
        cluster.off('exit', onExit);
      };
      cluster.on('message', onMessage);
      cluster.on('exit', onExit);
      for (const w of others)
        w.send({ arbiter: 'refresh', id: msg.id, change: msg.change } satisfies ToWorker);
    } else if (msg.arbiter === 'metrics') {
      aggregator.clusterMetrics().then(
        (text) =>
          from.isConnected() && from.send({ arbiter: 'metrics', id: msg.id, text } satisfies ToWorker),
        (err: Error) =>
          from.isConnected() &&
          from.send({ arbiter: 'metrics', id: msg.id, error: err.message } satisfies ToWorker),
      );
    }
  };

  cluster.on('message', (w, m: unknown) => {
    if (isOurs(m)) relay(w, m as ToPrimary);
  });
  cluster.on('exit', (w, code, signal) => {
    ready.delete(w.id);
    linked.delete(w.id);
    if (stopping) return;
    log.error({ worker: w.process.pid, code, signal }, 'worker exited; starting a replacement');
    cluster.fork();
  });
  for (let i = 0; i < workers; i++) cluster.fork();

  return {
    stop: () => {
      stopping = true;
      const live = Object.values(cluster.workers ?? {}).filter((w): w is Worker => !!w);
      return Promise.all(
        live.map(
          (w) =>
            new Promise<void>((resolve) => {
              if (w.isDead()) return resolve();
              w.once('exit', () => resolve());
              w.process.kill('SIGTERM');
            }),
        ),
      ).then(() => undefined);
    },
  };
}

export const isWorker = () => cluster.isWorker;
