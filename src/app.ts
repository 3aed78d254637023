import { randomBytes } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isReservedKind } from './audit/kinds.js';
import path from 'node:path';
import {
  ConfigError,
  EXAMPLE_ADMIN_KEY,
  repoRoot,
  unknownVariables,
  type Config,
  type Role,
} from './config.js';
import { VERSION } from './version.js';
import type { Api } from './http/context.js';
import { ConsoleAssets } from './http/console.js';
import { routeTable } from './http/routes/index.js';
import { buildApp, createApiServer, type ServerLimits } from './http/server.js';
import { newId, newTraceId } from './ids.js';
import type { Logger } from './observability/logger.js';
import { isWorker, WorkerLink, type Listener } from './cluster.js';
import { createMetrics, gaugeFrom, threadCpuGauge, type Metrics } from './observability/metrics.js';
import { threadCpuSeconds } from './observability/thread-cpu.js';
import { RegoCompiler } from './policy/compiler.js';
import { guardEvaluations, unguardEvaluations } from './policy/evaluator.js';
import { StallWatchdog } from './policy/stall-watchdog.js';
import { openStores, type Stores } from './storage/index.js';
import { useCursorKey } from './common/pagination.js';
import { buildServices, type Services } from './services.js';

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

/** How often due webhook deliveries are looked for. */
const WEBHOOK_SWEEP_MS = 1_000;

/** How often expired queue items are recorded as expired (reads never wait for it). */
const SWEEP_INTERVAL_MS = 5_000;

/** How often budget counters of superseded windows are deleted (also once at start). */
const COUNTER_SWEEP_INTERVAL_MS = 10 * 60_000;

/** Where `npm run build` puts the reviewer console (scripts/build-console.mjs). */
const CONSOLE_DIR = path.join(repoRoot, 'dist', 'console');

/** Our own event kinds are a fixed set; ingested kinds are free text, so they share one label. */
const metricKind = (kind: string) => (isReservedKind(kind) ? kind : 'ingested');

export interface Running {
  listeners: Listener[];
  close(): Promise<void>;
}

/** Where the policy set comes from at start-up, for its audit event. */
const startContext = () => ({ actor: 'system', traceId: newTraceId(), requestId: newId() });

/**
 * Run once by the primary before it forks workers: migrations, seeding, the first compile (cached
 * in the store for the workers) and the signing key, so that workers only load.
 */
export async function prepareStorage(config: Config, log: Logger): Promise<void> {
  const stores = await openStores(config, { upgrade: true, log });
  const compiler = new RegoCompiler(config.opaBin);
  let s: Services | undefined;
  try {
    await compiler.init();
    s = buildServices(config, stores, compiler, { publicUrl: () => config.publicUrl ?? '', log });
    const r = await s.policies.start(config.policyDir, startContext());
    log.info({ revision: r.revision, seeded: r.seeded, policyDir: config.policyDir }, 'policy set loaded');
    await s.tokens.init();
  } finally {
    // Loading a shadow set started the shadow thread.
    await s?.policies.close();
    await compiler.close();
    await stores.close();
  }
}

/**
 * Re-reads the store's revision this often when other processes change it (cluster workers, or
 * any process on PostgreSQL), in case a change notice was missed: propagation within 1 s.
 */
const REFRESH_MS = 1_000;

/**
 * The one place that wires storage → services → the two HTTP apps, and starts listening. As a
 * cluster worker it also joins the primary's change relay and metrics aggregation.
 */
export async function startArbiter(config: Config, role: Role, log: Logger): Promise<Running> {
  const metrics = createMetrics();
  const clustered = isWorker();
  // First, before storage is read: from here on the primary waits for this worker on every change.
  const link = clustered ? new WorkerLink(log, metrics.registry) : undefined;
  const stores = await openStores(config, { serving: true, upgrade: true, log, ...storeObservers(metrics) });
  // CPU per thread (Linux): what a decision costs the serving thread and the writer thread.
  threadCpuGauge(metrics, async () => ({
    serving: threadCpuSeconds(),
    writer: await stores.writerCpuSeconds?.(),
  }));
  const compiler = new RegoCompiler(config.opaBin);
  let watchdog: StallWatchdog | undefined;
  const unwatch = async () => {
    if (!watchdog) return;
    unguardEvaluations(watchdog);
    await watchdog.close();
  };
  let built: Services | undefined;
  try {
    // One key seals every process's list cursors, so a page handed out by one pages on another.
    useCursorKey(
      Buffer.from(
        await stores.sharedSecret('cursor_key', randomBytes(32).toString('base64url')),
        'base64url',
      ),
    );
    // A live (or proven shadow) set that never finishes on some input ends this process rather
    // than leaving it listening and answering nothing (ADR 0011).
    if (config.evalStallSeconds > 0) {
      watchdog = StallWatchdog.start(config.evalStallSeconds, log);
      guardEvaluations(watchdog);
    }
    await compiler.init();
    // Links in notifications point at ARBITER_PUBLIC_URL, else at this process's Engine API.
    let engineUrl = `http://${hostInUrl(config.host)}:${config.enginePort}`;
    const services = buildServices(config, stores, compiler, {
      metrics,
      policyChanged: (revision) => link?.changed(revision) ?? Promise.resolve(),
      signingKeysRotated: () => link?.signingKeysRotated() ?? Promise.resolve(),
      publicUrl: () => config.publicUrl ?? engineUrl,
      log,
    });
    built = services;
    const { budgets, policies, queue, signingKeys, tokens, webhooks } = services;
    const started = await policies.start(config.policyDir, startContext());
    log.info(
      { revision: started.revision, seeded: started.seeded, policyDir: config.policyDir },
      clustered ? 'worker loaded the policy set' : 'policy set loaded',
    );
    link?.serve((change) => (change.topic === 'revision' ? policies.refresh() : signingKeys.reload()));
    const unfollow = followOtherProcesses(stores, services, clustered, log);
    startSweepers(services, metrics, log);
    await tokens.init();
    const routes = routeTable({
      ...services,
      config,
      version: VERSION,
      metricsText: () => (link ? link.metrics() : metrics.registry.metrics()),
      metrics,
      health: () => healthOf(stores, services),
      console: ConsoleAssets.load(CONSOLE_DIR),
    });
    warnAboutSettings(config, log);
    // Declared before any listener exists: a request may arrive while the next one binds.
    let closing: Promise<void> | undefined;
    const apis: Api[] = role === 'all' ? ['engine', 'platform'] : [role];
    const { servers, listeners } = await listenAll(apis, routes, config, {
      keys: services.keys,
      log,
      metrics,
      clustered,
      isClosing: () => closing !== undefined,
      onListening: (listener) => {
        if (listener.api === 'engine') engineUrl = listener.url;
      },
    });
    link?.listening(listeners);
    // The outbox is worked through in the background, never on a request's path.
    webhooks.start(WEBHOOK_SWEEP_MS);
    return {
      listeners,
      close: () =>
        (closing ??= (async () => {
          // Stop accepting at once (SPEC §1), before anything is waited for: a webhook send in
          // flight may take its full 10 s, and a listener left open meanwhile would keep taking
          // requests (and its port from a replacement process). In-flight requests, sends and
          // sweeps then finish together; storage closes after all of them.
          const drained = Promise.all(servers.map(drain));
          queue.stop();
          const finished = Promise.all([webhooks.stop(), budgets.stop()]);
          unfollow();
          await Promise.all([drained, finished]);
          try {
            await policies.close();
            await compiler.close();
            await stores.close();
          } finally {
            await unwatch();
          }
        })()),
    };
  } catch (e) {
    await unwatch();
    await built?.budgets.stop();
    await built?.policies.close();
    await compiler.close();
    await stores.close();
    throw e;
  }
}

/** What the stores report to the metrics: audit events appended, decision batches committed. */
function storeObservers(metrics: Metrics) {
  return {
    onAuditAppend: (kinds: string[]) => {
      for (const kind of kinds) metrics.auditEvents.inc({ kind: metricKind(kind) });
    },
    onBatch: (size: number, seconds: number) => {
      metrics.decisionBatchSize.observe(size);
      metrics.decisionCommit.observe(seconds);
    },
  };
}

/** The background sweeps (expired queue items, stale budget counters) and the gauges read from storage. */
function startSweepers(
  { budgets, queue, webhooks }: Pick<Services, 'budgets' | 'queue' | 'webhooks'>,
  metrics: Metrics,
  log: Logger,
): void {
  queue.startSweeper(SWEEP_INTERVAL_MS);
  budgets.startSweeper(COUNTER_SWEEP_INTERVAL_MS, (err) =>
    log.warn({ err }, 'budget counter sweep failed; retried at the next'),
  );
  gaugeFrom(metrics, 'arbiter_queue_pending', 'Human-review items pending now.', () => queue.countPending());
  gaugeFrom(
    metrics,
    'arbiter_webhook_deliveries_pending',
    'Webhook deliveries waiting to be sent or retried.',
    () => webhooks.countPending(),
  );
}

/** Settings that start the service but deserve a warning: unknown ARBITER_* names, the README's key. */
function warnAboutSettings(config: Config, log: Logger): void {
  for (const name of unknownVariables()) {
    log.warn({ variable: name }, `${name} names no setting and is ignored (a typo?)`);
  }
  if (config.adminKey === EXAMPLE_ADMIN_KEY) {
    log.warn(
      'ARBITER_ADMIN_KEY is the example key from the README: anyone who read it has every scope; set a random key',
    );
  }
}

const serverLimits = (config: Config): ServerLimits => ({
  headersTimeoutMs: config.httpHeadersTimeoutSeconds * 1000,
  requestTimeoutMs: config.httpRequestTimeoutSeconds * 1000,
  maxConnections: config.maxConnections,
});

/**
 * Binds each API's app to its port, one after another (a request may arrive at the first while
 * the next binds). A worker's listeners are announced once, by the primary, when every worker is
 * ready.
 */
async function listenAll(
  apis: Api[],
  routes: ReturnType<typeof routeTable>,
  config: Config,
  opts: {
    keys: Services['keys'];
    log: Logger;
    metrics: Metrics;
    clustered: boolean;
    isClosing: () => boolean;
    onListening: (listener: Listener) => void;
  },
): Promise<{ servers: Server[]; listeners: Listener[] }> {
  const { keys, log, metrics } = opts;
  const servers: Server[] = [];
  const listeners: Listener[] = [];
  for (const api of apis) {
    const app = buildApp(api, routes, { keys, log, metrics, maxBodyBytes: config.maxBodyBytes });
    const server = createApiServer(app, opts.isClosing, serverLimits(config));
    const listener = await listen(server, api, config);
    if (!opts.clustered) log.info({ api, port: listener.port, url: listener.url }, `${api} API listening`);
    servers.push(server);
    listeners.push(listener);
    opts.onListening(listener);
  }
  return { servers, listeners };
}

/** `host` as a URL writes it (an IPv6 address in brackets). */
const hostInUrl = (host: string) => (host.includes(':') ? `[${host}]` : host);

/** Binds `server` to the API's port; a port in use or a host that is no address of this machine is a ConfigError naming the settings. */
async function listen(server: Server, api: Api, config: Config): Promise<Listener> {
  const port = api === 'engine' ? config.enginePort : config.platformPort;
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      reject(
        new ConfigError(
          `the ${api} API cannot listen on ${config.host}:${port} ` +
            `(ARBITER_HOST, ARBITER_${api.toUpperCase()}_PORT): ${err.code ?? err.message}`,
        ),
      ),
    );
    server.listen(port, config.host, () => resolve());
  });
  const actual = (server.address() as AddressInfo).port;
  return { api, url: `http://${hostInUrl(config.host)}:${actual}`, port: actual };
}

/**
 * Follows other processes' changes (cluster workers, or any process on PostgreSQL): a new revision
 * to load, a decided item whose waiters can return, rotated signing keys; and re-reads the revision
 * and the signing keys every REFRESH_MS in case a notice was missed. Returns what stops it.
 */
function followOtherProcesses(
  stores: Stores,
  { policies, queue, signingKeys }: Pick<Services, 'policies' | 'queue' | 'signingKeys'>,
  clustered: boolean,
  log: Logger,
): () => void {
  const refresh = () =>
    policies.refresh().catch((err: unknown) => log.error({ err }, 'policy refresh failed'));
  const reloadKeys = () =>
    signingKeys.reload().catch((err: unknown) => log.error({ err }, 'signing key reload failed'));
  let refresher: NodeJS.Timeout | undefined;
  if (clustered || stores.changes.crossProcess) {
    refresher = setInterval(() => {
      void refresh();
      void reloadKeys();
    }, REFRESH_MS);
    refresher.unref();
  }
  const unsubscribe = stores.changes.subscribe((change) => {
    if (change.topic === 'revision') void refresh();
    else if (change.topic === 'queue') queue.wake(change.id);
    else if (change.topic === 'signing_keys') void reloadKeys();
    else if (change.topic === 'resync') {
      void refresh();
      void reloadKeys();
      queue.wake();
    }
  });
  return () => {
    if (refresher) clearInterval(refresher);
    unsubscribe();
  };
}

/** What /healthz answers: storage usable and a policy set loaded. */
async function healthOf(stores: Stores, { policies }: Pick<Services, 'policies'>) {
  const revision = policies.evaluator?.revision ?? null;
  const unusable = await stores.health();
  if (unusable !== undefined) return { ok: false, revision, error: unusable };
  if (revision === null) return { ok: false, revision, error: 'no policy set is loaded' };
  return { ok: true, revision };
}
