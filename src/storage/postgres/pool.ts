import pg from 'pg';
import type { Logger } from '../../observability/logger.js';

export type Pool = pg.Pool;
export type Client = pg.PoolClient | pg.Client;

/** int8 (bigint) columns hold sequence numbers, revisions and latencies: all below 2^53. */
const types = new pg.TypeOverrides();
types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

export const CLIENT_TYPES = types;

/** How long a session may sit quiet inside a transaction before PostgreSQL ends it (ms). */
export const IDLE_IN_TRANSACTION_MS = 3_000;

/**
 * Connection settings shared by the pool and the LISTEN connection: fail fast when the database
 * is unreachable (requests answer 503 instead of hanging), bound every statement, and never leave
 * a transaction open on a connection that went quiet. Every write transaction takes the one chain
 * head first (ADR 0007), so a process that stops between two statements of one (paused, cut off
 * from the database without a reset) holds up every process's writes until PostgreSQL ends its
 * session: IDLE_IN_TRANSACTION_MS bounds that. Arbiter's transactions run no work of seconds
 * between their statements; a process whose event loop is blocked longer loses its transaction
 * (503, retried by the caller), not the others theirs.
 */
export function clientConfig(url: string): pg.ClientConfig {
  return {
    connectionString: url,
    types,
    connectionTimeoutMillis: 2_000,
    query_timeout: 15_000,
    statement_timeout: 10_000,
    idle_in_transaction_session_timeout: IDLE_IN_TRANSACTION_MS,
    application_name: 'arbiter',
    keepAlive: true,
  };
}

export function createPool(url: string, size: number, log?: Logger): Pool {
  const pool = new pg.Pool({ ...clientConfig(url), max: size, idleTimeoutMillis: 30_000 });
  // A connection that drops (a PostgreSQL restart, a failover, a reset) emits 'error' on its
  // client, and an 'error' nobody hears ends the process. pg-pool hears it only while the client
  // is idle (then it emits here, after the client's own listener below has logged it); while the
  // client is checked out it hears nothing. So every client gets a listener of its own for life:
  // the statement in flight fails anyway (503 at the edge), and pg-pool drops the client when it
  // is released, since it is no longer queryable.
  pool.on('connect', (client) => {
    client.on('error', (err) => log?.warn({ err: { message: err.message } }, 'database connection lost'));
  });
  pool.on('error', () => undefined);
  return pool;
}

/**
 * Runs `fn` in one transaction on one pooled connection: COMMIT when it resolves, ROLLBACK when it
 * throws. A connection that failed mid-transaction is destroyed rather than reused.
 */
export async function tx<T>(pool: Pool, fn: (c: pg.PoolClient) => Promise<T>, begin = 'BEGIN'): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query(begin);
    const out = await fn(client);
    await client.query('COMMIT');
    return out;
  } catch (e) {
    try {
      await client.query('ROLLBACK');
    } catch (rollbackError) {
      broken = rollbackError as Error;
    }
    throw e;
  } finally {
    client.release(broken);
  }
}

/** Rows of a query, typed by the caller (pg returns plain objects). */
export async function rows<T>(c: Client | Pool, sql: string, params: unknown[] = []): Promise<T[]> {
  return (await c.query(sql, params)).rows as T[];
}

export async function one<T>(c: Client | Pool, sql: string, params: unknown[] = []): Promise<T | undefined> {
  return (await rows<T>(c, sql, params))[0];
}
