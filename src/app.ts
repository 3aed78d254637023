import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { makeMasker } from './audit/mask.js';
import { AuditService, RESERVED_KINDS } from './audit/service.js';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { repoRoot, type Config, type Role } from './config.js';
import { DecisionService } from './decisions/service.js';
import type { Api } from './http/context.js';
import { routeTable } from './http/routes.js';
import { buildApp } from './http/server.js';
import { newId, newTraceId } from './ids.js';
import { KeyService } from './keys/service.js';
import type { Logger } from './observability/logger.js';
import { isWorker, WorkerLink } from './cluster.js';
import { createMetrics, gaugeFrom } from './observability/metrics.js';
import { QueueService } from './queue/service.js';
import { TokenService } from './tokens/service.js';
import { RegoCompiler } from './policy/compiler.js';
import { PolicyService } from './policy/service.js';
import { openDatabase } from './storage/sqlite/db.js';
import { sqliteStores, type Stores } from './storage/sqlite/stores.js';
import { threadCommitter } from './storage/sqlite/thread-committer.js';

/** In-flight requests get this long to finish at shutdown; then their connections are cut. */
const SHUTDOWN_GRACE_MS = 30_000;

/**
 * Stops accepting and resolves when every connection is gone. A keep-alive connection that is
 * busy when close() is called becomes idle only after its response, so idle connections are
 * closed again until none is left (responses meanwhile carry Connection: close).
 */
function drain(server: Server): Promise<void> {
  return new Promise((resolve) => {
    const sweep = setInterval(() => server.closeIdleConnections(), 50);
    const deadline = setTimeout(() => server.closeAllConnections(), SHUTDOWN_GRACE_MS);
    server.close(() => {
      clearInterval(sweep);
      clearTimeout(deadline);
      resolve();
    });
    server.closeIdleConnections();
  });
}

/** How often expired queue items are recorded as expired (reads never wait for it). */
const SWEEP_INTERVAL_MS = 5_000;

/** Our own event kinds are a fixed set; ingested kinds are free text, so they share one label. */
const metricKind = (kind: string) => (RESERVED_KINDS.has(kind) ? kind : 'ingested');

const VERSION = (JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')) as { version: string })
  .version;

export interface Listener {
  api: Api;
  url: string;
  port: number;
}

export interface Running {
  listeners: Listener[];
  close(): Promise<void>;
}

/** Opens storage and wires stores → services; used by `serve` and the `keys` commands alike. */
export function openStores(config: Config, onAuditAppend?: (kinds: string[]) => void): Stores {
  return sqliteStores(openDatabase(config.dataDir, config.dbSync), onAuditAppend);
}

/** Stores for a serving process: decisions are committed by a writer thread (see stores.ts). */
function openServingStores(config: Config, onAuditAppend: (kinds: string[]) => void): Stores {
  const db = openDatabase(config.dataDir, config.dbSync);
  const committer = threadCommitter(config.dataDir, config.dbSync, (outcomes) => {
    const kinds = outcomes.flatMap((o) => ('recorded' in o ? [o.recorded.kind] : []));
    if (kinds.length > 0) onAuditAppend(kinds);
  });
  return sqliteStores(db, onAuditAppend, committer);
}

/**
 * Run once by the primary before it forks workers: migrations, seeding, the first compile (cached
 * in the store for the workers) and the signing key, so that workers only load.
 */
export async function prepareStorage(config: Config, log: Logger): Promise<void> {
  const stores = openStores(config);
  const compiler = new RegoCompiler(config.opaBin);
  try {
    await compiler.init();
    const policies = new PolicyService(stores.policies, compiler, config.evalBudgetMs, {
      compiled: () => undefined,
      revision: () => undefined,
    });
    const r = await policies.start(config.policyDir, {
      actor: 'system',
      traceId: newTraceId(),
      requestId: newId(),
    });
    log.info({ revision: r.revision, seeded: r.seeded, policyDir: config.policyDir }, 'policy set loaded');
    const queue = new QueueService(stores.queue, { transitioned: () => undefined });
    await new TokenService(stores.tokens, stores.decisions, queue, tokenConfig(config), {
      minted: () => undefined,
      revoked: () => undefined,
    }).init();
  } finally {
    await compiler.close();
    await stores.close();
  }
}

const tokenConfig = (config: Config) => ({
  issuer: config.issuer,
  defaultTtlSeconds: config.tokenTtlSeconds,
  maxTtlSeconds: config.tokenMaxTtlSeconds,
  exchangeWindowSeconds: config.tokenExchangeWindowSeconds,
});

/** Re-reads the store's revision this often in a worker, in case a change notice was missed. */
const WORKER_REFRESH_MS = 1_000;

/**
 * The one place that wires storage → services → the two HTTP apps, and starts listening. As a
 * cluster worker it also joins the primary's change relay and metrics aggregation.
 */
export async function startArbiter(config: Config, role: Role, log: Logger): Promise<Running> {
  const metrics = createMetrics();
  const clustered = isWorker();
  let link: WorkerLink | undefined;
  const stores = openServingStores(config, (kinds) => {
    for (const kind of kinds) metrics.auditEvents.inc({ kind: metricKind(kind) });
  });
  const compiler = new RegoCompiler(config.opaBin);
  try {
    await compiler.init();
    const keys = new KeyService(stores.keys, config.adminKey);
    const policies = new PolicyService(stores.policies, compiler, config.evalBudgetMs, {
      compiled: (ok, seconds) => {
        metrics.compiles.inc({ result: ok ? 'success' : 'failure' });
        metrics.compileDuration.observe(seconds);
      },
      revision: (r) => metrics.revision.set(r),
      changed: (revision) => link?.changed(revision) ?? Promise.resolve(),
    });
    const started = await policies.start(config.policyDir, {
      actor: 'system',
      traceId: newTraceId(),
      requestId: newId(),
    });
    log.info(
      { revision: started.revision, seeded: started.seeded, policyDir: config.policyDir },
      clustered ? 'worker loaded the policy set' : 'policy set loaded',
    );
    let refresher: NodeJS.Timeout | undefined;
    if (clustered) {
      link = new WorkerLink(() => policies.refresh(), log, metrics.registry);
      refresher = setInterval(() => {
        policies.refresh().catch((err: unknown) => log.error({ err }, 'policy refresh failed'));
      }, WORKER_REFRESH_MS);
      refresher.unref();
    }
    const decisions = new DecisionService(
      policies,
      stores.decisions,
      config.queueTtlSeconds,
      makeMasker(config.auditMaskFields),
      {
        decided: (kind, outcome, seconds) => {
          metrics.decisions.inc({ kind, outcome });
          metrics.evaluation.observe(seconds);
        },
      },
    );
    const queue = new QueueService(
      stores.queue,
      { transitioned: (to) => metrics.queueTransitions.inc({ status: to }) },
      config.maxLongPolls,
    );
    queue.startSweeper(SWEEP_INTERVAL_MS);
    gaugeFrom(metrics, 'arbiter_queue_pending', 'Human-review items pending now.', () =>
      queue.countPending(),
    );
    const tokens = new TokenService(stores.tokens, stores.decisions, queue, tokenConfig(config), {
      minted: () => metrics.tokensMinted.inc(),
      revoked: () => metrics.tokensRevoked.inc(),
    });
    await tokens.init();
    const health = () => {
      const revision = policies.evaluator?.revision ?? null;
      try {
        if (!stores.ping()) return { ok: false, revision, error: 'storage is unusable' };
      } catch {
        return { ok: false, revision, error: 'storage is unusable' };
      }
      if (revision === null) return { ok: false, revision, error: 'no policy set is loaded' };
      return { ok: true, revision };
    };
    const audit = new AuditService(stores.audit, makeMasker(config.auditMaskFields));
    const metricsText = () => (link ? link.metrics() : metrics.registry.metrics());
    const routes = routeTable({
      config,
      version: VERSION,
      metricsText,
      audit,
      decisions,
      queue,
      tokens,
      policies,
      metrics,
      health,
    });
    const apis: Api[] = role === 'all' ? ['engine', 'platform'] : [role];
    const servers: { api: Api; server: Server }[] = [];
    const listeners: Listener[] = [];
    for (const api of apis) {
      const app = buildApp(api, routes, { keys, log, metrics, maxBodyBytes: config.maxBodyBytes });
      const server = createServer(app.callback());
      // Requests Node's parser refuses never reach Koa: answer them in the same JSON shape.
      server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
        if (!socket.writable) return socket.destroy();
        const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
        const body = JSON.stringify({
          error: tooLarge ? 'request headers too large' : 'malformed HTTP request',
        });
        socket.end(
          `HTTP/1.1 ${tooLarge ? '431 Request Header Fields Too Large' : '400 Bad Request'}\r\n` +
            `Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
            `X-Request-Id: ${newId()}\r\nConnection: close\r\n\r\n${body}`,
        );
      });
      // Once shutting down, every response tells the client to close its connection.
      server.on('request', (_req, res) => {
        if (closing) res.shouldKeepAlive = false;
      });
      server.keepAliveTimeout = 65_000;
      const port = api === 'engine' ? config.enginePort : config.platformPort;
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, config.host, () => resolve());
      });
      const actual = (server.address() as AddressInfo).port;
      const host = config.host.includes(':') ? `[${config.host}]` : config.host;
      const url = `http://${host}:${actual}`;
      // A worker's listeners are announced once, by the primary, when every worker is ready.
      if (!clustered) log.info({ api, port: actual, url }, `${api} API listening`);
      servers.push({ api, server });
      listeners.push({ api, url, port: actual });
    }
    link?.listening(listeners);
    let closing: Promise<void> | undefined;
    return {
      listeners,
      close: () =>
        (closing ??= (async () => {
          // Stop accepting, let in-flight requests finish, then close storage.
          queue.stop();
          if (refresher) clearInterval(refresher);
          await Promise.all(servers.map(({ server }) => drain(server)));
          await compiler.close();
          await stores.close();
        })()),
    };
  } catch (e) {
    await compiler.close();
    await stores.close();
    throw e;
  }
}
