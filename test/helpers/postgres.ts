import pg from 'pg';

/**
 * PostgreSQL for tests: ARBITER_TEST_DATABASE_URL names a server (default: the local one, trust
 * auth, user postgres); each test database is created fresh and dropped afterwards. A missing
 * server is a failure, never a skip: CI has one.
 */
export const TEST_SERVER_URL =
  process.env.ARBITER_TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

/** Which backend the HTTP suite runs against (ARBITER_TEST_BACKEND=postgres: every instance on PostgreSQL). */
export const TEST_BACKEND: 'sqlite' | 'postgres' =
  process.env.ARBITER_TEST_BACKEND === 'postgres' ? 'postgres' : 'sqlite';

let counter = 0;

export interface TestDatabase {
  url: string;
  name: string;
  drop(): Promise<void>;
}

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: TEST_SERVER_URL, connectionTimeoutMillis: 5_000 });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/**
 * A new, empty database on the test server; with `icuLocale` (e.g. `en-US`), one whose text
 * columns sort by that ICU collation, as a database created on a server of another locale would.
 */
export async function createTestDatabase(opts: { icuLocale?: string } = {}): Promise<TestDatabase> {
  const name = `arbiter_test_${process.pid}_${Date.now().toString(36)}_${counter++}`;
  const { icuLocale } = opts;
  if (icuLocale !== undefined && !/^[A-Za-z]+(-[A-Za-z0-9]+)*$/.test(icuLocale)) {
    throw new Error(`not an ICU locale name: ${icuLocale}`);
  }
  await admin((c) =>
    c.query(
      icuLocale === undefined
        ? `CREATE DATABASE ${name}`
        : `CREATE DATABASE ${name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '${icuLocale}'`,
    ),
  );
  const url = new URL(TEST_SERVER_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    name,
    drop: () => admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(() => undefined),
  };
}

/** Runs one query against a test database (for what the API cannot show, e.g. tampering). */
export async function queryDatabase<T = Record<string, unknown>>(
  url: string,
  sql: string,
  params: unknown[] = [],
): Promise<T[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query(sql, params)).rows as T[];
  } finally {
    await c.end();
  }
}
