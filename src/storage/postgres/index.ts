import { appendProblem } from '../../audit/chain.js';
import type { Logger } from '../../observability/logger.js';
import type { Stores } from '../stores.js';
import { PgAuditStore } from './audit.js';
import { PgChain } from './chain.js';
import { PgDecisionStore, PgLimitStore } from './decisions.js';
import { PgChangeFeed } from './feed.js';
import { PgKeyStore } from './keys.js';
import { migrate, schemaProblem } from './migrations.js';
import { PgPolicyStore } from './policies.js';
import { createPool, rows } from './pool.js';
import { PgQueueStore } from './queue.js';
import { PgTokenStore } from './tokens.js';
import { PgWebhookStore } from './webhooks.js';

export interface PostgresOptions {
  url: string;
  poolSize: number;
  /** LISTEN for other processes' changes (serving processes; the CLI does not need it). */
  listen?: boolean;
  /** Bring an older schema up to date (the default); false: create a fresh one, refuse an older one. */
  upgrade?: boolean;
  onAuditAppend?: (kinds: string[]) => void;
  onBatch?: (size: number, seconds: number) => void;
  log?: Logger;
}

/**
 * The shared backend: any number of processes on any machines, one database. Migrates under an
 * advisory lock at open, so processes may start together against an empty database.
 */
export async function openPostgresStores(opts: PostgresOptions): Promise<Stores> {
  const pool = createPool(opts.url, opts.poolSize, opts.log);
  try {
    await migrate(pool, opts.log, { upgrade: opts.upgrade });
  } catch (e) {
    await pool.end().catch(() => undefined);
    throw e;
  }
  const chain = new PgChain(opts.onAuditAppend ?? (() => undefined));
  const feed = new PgChangeFeed(opts.url, opts.log);
  if (opts.listen) await feed.start();
  return {
    backend: 'postgres',
    audit: new PgAuditStore(pool, opts.onAuditAppend ?? (() => undefined)),
    decisions: new PgDecisionStore(pool, chain, opts.onBatch),
    limits: new PgLimitStore(pool),
    queue: new PgQueueStore(pool, chain),
    tokens: new PgTokenStore(pool, chain),
    keys: new PgKeyStore(pool, chain),
    policies: new PgPolicyStore(pool, chain),
    webhooks: new PgWebhookStore(pool, chain),
    changes: opts.listen ? feed : { crossProcess: true, subscribe: () => () => undefined },
    /**
     * A server that answers but refuses writes (a standby after a failover, or
     * default_transaction_read_only) records no decision: it is as unusable as one that is down.
     */
    async health(): Promise<string | undefined> {
      try {
        const [r] = await rows<{ ro: string; h: string | null; c: string | null }>(
          pool,
          `SELECT current_setting('transaction_read_only') AS ro,
             (SELECT value FROM meta WHERE key = 'audit_head') AS h,
             (SELECT value FROM meta WHERE key = 'audit_count') AS c`,
        );
        if (r?.ro !== 'off') return 'storage is read-only: no decision can be recorded';
        return appendProblem({ audit_head: r.h ?? undefined, audit_count: r.c ?? undefined });
      } catch {
        return 'storage is unusable';
      }
    },
    async sharedSecret(name: string, ifNone: string): Promise<string> {
      await pool.query('INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING', [
        name,
        ifNone,
      ]);
      const [r] = await rows<{ value: string }>(pool, 'SELECT value FROM meta WHERE key = $1', [name]);
      if (!r) throw new Error(`meta ${name} was not stored`);
      return r.value;
    },
    schemaProblem: () => schemaProblem(pool),
    async close(): Promise<void> {
      await feed.close();
      await pool.end();
    },
  };
}
