import { maskPassword } from '../common/urls.js';
import type { Config } from '../config.js';
import type { Logger } from '../observability/logger.js';
import { unavailable } from '../errors.js';
import { storageCall } from './failure.js';
import { openPostgresStores } from './postgres/index.js';
import { openSqliteStores } from './sqlite/index.js';
import type { Stores } from './stores.js';

export type { Change, ChangeFeed, Stores } from './stores.js';

export interface OpenOptions {
  /** A serving process: decisions committed by a writer thread (SQLite), changes listened for (PostgreSQL). */
  serving?: boolean;
  /**
   * Bring an older schema up to date: `arbiter serve` and the cluster primary only. Otherwise (the
   * CLI) a fresh store is created and an older one refused, naming both versions: a newer CLI run
   * against production must not migrate it under every engine of the older build (each would
   * then answer 503).
   */
  upgrade?: boolean;
  onAuditAppend?: (kinds: string[]) => void;
  /** Told each committed decision batch's size and commit time (metrics). */
  onBatch?: (size: number, seconds: number) => void;
  log?: Logger;
}

/**
 * The one place that picks the backend from the configuration: PostgreSQL when
 * ARBITER_DATABASE_URL is set, else the embedded SQLite file in ARBITER_DATA_DIR.
 */
export async function openStores(config: Config, opts: OpenOptions = {}): Promise<Stores> {
  const url = config.databaseUrl;
  let stores: Stores;
  try {
    stores = url
      ? await openPostgresStores({
          url,
          poolSize: config.databasePool,
          listen: opts.serving,
          upgrade: opts.upgrade === true,
          onAuditAppend: opts.onAuditAppend,
          onBatch: opts.onBatch,
          log: opts.log,
        })
      : openSqliteStores({
          dataDir: config.dataDir,
          sync: config.dbSync,
          writerThread: opts.serving,
          upgrade: opts.upgrade === true,
          onAuditAppend: opts.onAuditAppend,
          onBatch: opts.onBatch,
        });
  } catch (e) {
    // An operator reading this at start needs the setting to look at, never the password.
    const where = url
      ? `the PostgreSQL database of ARBITER_DATABASE_URL (${maskPassword(url, 'password')})`
      : `the SQLite database in ARBITER_DATA_DIR (${config.dataDir})`;
    throw new Error(`cannot open ${where}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  }
  return guarded(stores, opts.serving === true);
}

/** How often a serving process looks for a newer Arbiter's migration of its database. */
const SCHEMA_CHECK_MS = 1_000;

/**
 * Every store method, whatever the backend, reports an unreachable database as an `unavailable`
 * error (503), in one place rather than in each method. In a serving process (`watchSchema`),
 * once a newer Arbiter has migrated the database (a rolling upgrade), every method refuses with
 * `unavailable` naming the versions, and /healthz says so; the process serves again if the schema
 * becomes its own again. This stops reads within a second; appends are refused exactly by the
 * schema version each reads with the chain head (lockHead, AuditWriter), whenever they began.
 *
 * One state answers both the calls and /healthz, checked at start and then every second, one check
 * at a time: on an unreachable database a check waits its connection timeout, and checks started
 * meanwhile would wait in the pool behind it and could finish out of order.
 */
export async function guarded(stores: Stores, watchSchema: boolean): Promise<Stores> {
  let refused: string | undefined;
  let inFlight: Promise<void> | undefined;
  const check = (): Promise<void> =>
    (inFlight ??= stores
      .schemaProblem()
      .then(
        (p) => {
          refused = p;
        },
        () => undefined, // unreachable: every call says so on its own
      )
      .finally(() => {
        inFlight = undefined;
      }));
  let timer: NodeJS.Timeout | undefined;
  if (watchSchema) {
    await check();
    timer = setInterval(() => void check(), SCHEMA_CHECK_MS);
    timer.unref();
  }
  const wrap = <T extends object>(store: T): T =>
    new Proxy(store, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver) as unknown;
        if (typeof v !== 'function') return v;
        return (...args: unknown[]) =>
          storageCall(async () => {
            if (refused !== undefined) throw unavailable(refused);
            return (v as (...a: unknown[]) => unknown).apply(target, args);
          });
      },
    });
  return {
    ...stores,
    audit: wrap(stores.audit),
    decisions: wrap(stores.decisions),
    limits: wrap(stores.limits),
    queue: wrap(stores.queue),
    tokens: wrap(stores.tokens),
    keys: wrap(stores.keys),
    policies: wrap(stores.policies),
    webhooks: wrap(stores.webhooks),
    health: async () => refused ?? stores.health(),
    schemaProblem: () => stores.schemaProblem(),
    close: () => {
      clearInterval(timer);
      return stores.close();
    },
  };
}
