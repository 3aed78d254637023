import Database from 'better-sqlite3';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Agent, setGlobalDispatcher } from 'undici';
import { checkAnswer, unwatchOrigin, watchOrigin } from './openapi-check.js';
import { createTestDatabase, queryDatabase, TEST_BACKEND, type TestDatabase } from './postgres.js';

// fetch keeps an idle connection as long as the server's Keep-Alive hint allows, less 1 s
// (Arbiter's hint is 65 s). A test that blocks this process's event loop (spawnSync of the CLI,
// as createKey does) close to that limit could send its next request on a connection the server
// had just closed, and fail with "other side closed" (it did, once, in CI). Idle connections are
// dropped after 10 s here instead, far from the server's limit. (undici is the library inside
// Node's fetch; its global dispatcher is the one fetch uses.)
setGlobalDispatcher(new Agent({ keepAliveMaxTimeout: 10_000 }));

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const MAIN = path.join(REPO, 'dist', 'src', 'main.js');
export const ADMIN_KEY = 'test-admin-key-0123456789abcdef';

export interface Response {
  status: number;
  headers: Headers;
  text: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- tests read arbitrary JSON shapes
  json: any;
}

export interface RequestOptions {
  key?: string | null;
  body?: unknown;
  /** Sent as-is, with no JSON encoding (for malformed bodies). */
  raw?: string | Buffer;
  headers?: Record<string, string>;
}

/** Test databases by the data directory of the instance that created them. */
const databases = new Map<string, TestDatabase>();

/** A real Arbiter process on ports chosen by the OS, with its own data directory. */
export class Arbiter {
  engine = '';
  platform = '';
  logs: string[] = [];
  private child: ChildProcess | undefined;

  private constructor(
    readonly dataDir: string,
    readonly env: Record<string, string>,
    private readonly ownsDir: boolean,
    private readonly ownDatabase: TestDatabase | undefined,
  ) {}

  /**
   * Starts an instance with a fresh data directory, or over `dataDir` (another instance's state).
   * With ARBITER_TEST_BACKEND=postgres each fresh instance gets a database of its own, and an
   * instance over another's data directory shares that instance's database.
   */
  static async start(env: Record<string, string> = {}, dataDir?: string): Promise<Arbiter> {
    const dir = dataDir ?? mkdtempSync(path.join(os.tmpdir(), 'arbiter-test-'));
    let own: TestDatabase | undefined;
    const withDb = { ...env };
    if (TEST_BACKEND === 'postgres' && env.ARBITER_DATABASE_URL === undefined) {
      let db = databases.get(dir);
      if (!db) {
        own = db = await createTestDatabase();
        databases.set(dir, db);
      }
      withDb.ARBITER_DATABASE_URL = db.url;
    }
    const a = new Arbiter(dir, withDb, dataDir === undefined, own);
    try {
      await a.spawn();
    } catch (e) {
      if (own) await own.drop().catch(() => undefined);
      throw e;
    }
    return a;
  }

  /** The process id of the running service (with ARBITER_WORKERS, the primary's). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** The PostgreSQL URL this instance uses, if any. */
  get databaseUrl(): string | undefined {
    return this.env.ARBITER_DATABASE_URL;
  }

  /**
   * Runs a read-only query against this instance's database, whichever backend it is on: for what
   * the API does not show (that nothing at all was stored, say). Placeholders are $1, $2, ….
   */
  async stored<T = Record<string, unknown>>(sql: string, params: unknown[] = []): Promise<T[]> {
    if (this.databaseUrl) return queryDatabase<T>(this.databaseUrl, sql, params);
    return readDb(this.dataDir, (db) => db.prepare(sql.replace(/\$\d+/g, '?')).all(...params) as T[]);
  }

  /**
   * Runs SQL that changes this instance's database, on either backend (`$1` placeholders), as an
   * earlier version of Arbiter (or an operator) could have left it.
   */
  async alter(sql: string, params: unknown[] = []): Promise<void> {
    if (this.databaseUrl) {
      await queryDatabase(this.databaseUrl, sql, params);
      return;
    }
    const db = new Database(path.join(this.dataDir, 'arbiter.db'), { fileMustExist: true });
    try {
      db.prepare(sql.replace(/\$\d+/g, '?')).run(...params);
    } finally {
      db.close();
    }
  }

  /** A count of rows, through `stored`. */
  async count(table: string, where = 'true', params: unknown[] = []): Promise<number> {
    const [r] = await this.stored<{ n: number | string }>(
      `SELECT count(*) AS n FROM ${table} WHERE ${where}`,
      params,
    );
    return Number(r?.n ?? 0);
  }

  fullEnv(): NodeJS.ProcessEnv {
    return {
      ...process.env,
      ARBITER_DATA_DIR: this.dataDir,
      ARBITER_ENGINE_PORT: '0',
      ARBITER_PLATFORM_PORT: '0',
      ARBITER_ADMIN_KEY: ADMIN_KEY,
      ARBITER_POLICY_DIR: path.join(REPO, 'policies'),
      ARBITER_LOG_LEVEL: 'info',
      ...this.env,
    };
  }

  private spawn(): Promise<void> {
    this.engine = '';
    this.platform = '';
    const child = spawn(process.execPath, [MAIN, 'serve'], {
      env: this.fullEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`arbiter did not start:\n${this.logs.join('\n')}`)),
        60_000,
      );
      let ready = false;
      const onLine = (line: string) => {
        this.logs.push(line);
        try {
          const rec = JSON.parse(line) as { api?: string; url?: string };
          if (rec.api === 'engine' && rec.url) this.engine = rec.url;
          if (rec.api === 'platform' && rec.url) this.platform = rec.url;
        } catch {
          /* not JSON: kept in logs */
        }
        if (this.engine && this.platform && !ready) {
          ready = true;
          clearTimeout(timer);
          // Every answer it gives is then checked against the OpenAPI document it serves.
          const admin = this.fullEnv().ARBITER_ADMIN_KEY ?? ADMIN_KEY;
          void Promise.all([
            watchOrigin(this.engine, 'engine', admin, this),
            watchOrigin(this.platform, 'platform', admin, this),
          ]).then(() => resolve());
        }
      };
      createInterface({ input: child.stdout! }).on('line', onLine);
      createInterface({ input: child.stderr! }).on('line', onLine);
      child.once('exit', (code) => {
        clearTimeout(timer);
        this.unwatch();
        reject(new Error(`arbiter exited with ${code}:\n${this.logs.join('\n')}`));
      });
    });
  }

  /**
   * Waits up to `ms` for the process to exit by itself (nothing is sent to it): how it ended, or
   * undefined if it is still running.
   */
  exited(ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null } | undefined> {
    const child = this.child;
    if (!child) return Promise.resolve(undefined);
    if (child.exitCode !== null || child.signalCode !== null) {
      return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
    }
    return new Promise((resolve) => {
      const onExit = (code: number | null, signal: NodeJS.Signals | null) => {
        clearTimeout(timer);
        resolve({ code, signal });
      };
      const timer = setTimeout(() => {
        child.off('exit', onExit);
        resolve(undefined);
      }, ms);
      child.once('exit', onExit);
    });
  }

  /** SIGTERM and wait for a clean exit. */
  async stop(): Promise<number | null> {
    return this.signal('SIGTERM');
  }

  /** SIGKILL: no chance to clean up, as in a crash. */
  async kill(): Promise<void> {
    await this.signal('SIGKILL');
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.spawn();
  }

  /** Its listeners' ports are free once it exits: their answers are no longer checked. */
  private unwatch(): void {
    unwatchOrigin(this.engine, this);
    unwatchOrigin(this.platform, this);
  }

  private signal(sig: NodeJS.Signals): Promise<number | null> {
    const child = this.child;
    this.unwatch();
    if (!child || child.exitCode !== null || child.signalCode !== null)
      return Promise.resolve(child?.exitCode ?? null);
    return new Promise((resolve) => {
      child.removeAllListeners('exit');
      child.once('exit', (code) => resolve(code));
      child.kill(sig);
    });
  }

  async close(): Promise<void> {
    await this.stop();
    if (this.ownsDir) rmSync(this.dataDir, { recursive: true, force: true });
    if (this.ownDatabase) {
      databases.delete(this.dataDir);
      await this.ownDatabase.drop();
    }
  }

  /** The process's JSON log lines so far, parsed (other lines left out). */
  logRecords(): Record<string, unknown>[] {
    return this.logs.flatMap((l) => {
      try {
        const rec: unknown = JSON.parse(l);
        return rec !== null && typeof rec === 'object' ? [rec as Record<string, unknown>] : [];
      } catch {
        return [];
      }
    });
  }

  /**
   * Waits up to `ms` until every one of `wanted` matches a JSON log line (the lines reach this
   * process through a pipe, a little after the answers they log), then returns the lines.
   */
  async logsWith(
    wanted: ((rec: Record<string, unknown>) => boolean)[],
    ms = 5000,
  ): Promise<Record<string, unknown>[]> {
    const deadline = Date.now() + ms;
    for (;;) {
      const recs = this.logRecords();
      if (wanted.every((w) => recs.some(w)) || Date.now() >= deadline) return recs;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Runs `arbiter <args>` (e.g. keys create) against this instance's data directory. */
  cli(args: string[]): { code: number | null; stdout: string; stderr: string } {
    const r = spawnSync(process.execPath, [MAIN, ...args], { env: this.fullEnv(), encoding: 'utf8' });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  /** Creates an API key with the CLI and returns the secret. */
  createKey(name: string, scopes: string[], opts: { tenant?: string; agent?: string } = {}): string {
    const args = ['keys', 'create', '--name', name, '--scopes', scopes.join(',')];
    if (opts.tenant) args.push('--tenant', opts.tenant);
    if (opts.agent) args.push('--agent', opts.agent);
    const r = this.cli(args);
    if (r.code !== 0) throw new Error(`keys create failed: ${r.stderr}`);
    return (JSON.parse(r.stdout) as { key: string }).key;
  }
}

/** One HTTP request; the admin key is used unless `key` says otherwise (null = no header). */
export async function call(method: string, url: string, opts: RequestOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { ...opts.headers };
  const key = opts.key === undefined ? ADMIN_KEY : opts.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  let body: string | Buffer | undefined;
  if (opts.raw !== undefined) {
    body = opts.raw;
  } else if (opts.body !== undefined) {
    body = typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await fetch(url, { method, headers, body });
  const text = await res.text();
  let json: unknown;
  try {
    json = text === '' ? undefined : JSON.parse(text);
  } catch {
    json = undefined;
  }
  // Every answer of an Arbiter this harness started must be what its OpenAPI document says.
  await checkAnswer(method, url, res.status, res.headers.get('content-type'), text, json);
  return { status: res.status, headers: res.headers, text, json };
}

/** Example requests whose outcome the example policies fix (see policies/agent.rego). */
export const AGENT = {
  allow: { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 },
  approval: { agent_id: 'deploy-bot', action: 'deploy', resource: 'prod/api', confidence: 0.95 },
  deny: { agent_id: 'deploy-bot', action: 'delete', resource: 'prod/db', confidence: 0.99 },
  lowConfidence: { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.3 },
  unknownAgent: { agent_id: 'unknown-agent', action: 'read', resource: 'repo/arbiter', confidence: 0.99 },
};

export const HUMAN = {
  allow: { tenant_id: 'acme', user_id: 'alice', action: 'delete', resource: { type: 'project', id: 'p1' } },
  approval: {
    tenant_id: 'acme',
    user_id: 'carol',
    action: 'delete',
    resource: { type: 'project', id: 'p1' },
  },
  deny: { tenant_id: 'acme', user_id: 'bob', action: 'delete', resource: { type: 'project', id: 'p1' } },
};

/** Reads the instance's SQLite file directly (read-only), to check what was stored. */
export function readDb<T>(dataDir: string, fn: (db: import('better-sqlite3').Database) => T): T {
  const db = new Database(path.join(dataDir, 'arbiter.db'), { readonly: true, fileMustExist: true });
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

/** Every audit event matching `query` (GET /api/v1/audit, all pages), newest first, as the API shows it. */
export async function auditEvents(
  platform: string,
  query: Record<string, string> = {},
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- audit events are read as plain JSON
): Promise<any[]> {
  const out: unknown[] = [];
  let cursor: string | null = null;
  do {
    const q = new URLSearchParams({ ...query, limit: '1000', ...(cursor ? { cursor } : {}) });
    const r = await call('GET', `${platform}/api/v1/audit?${q}`);
    if (r.status !== 200) throw new Error(`audit query failed: ${r.status} ${r.text}`);
    out.push(...(r.json.events as unknown[]));
    cursor = r.json.next_cursor as string | null;
  } while (cursor !== null);
  return out;
}

/**
 * How many audit events are stored, as the API shows it: GET /api/v1/audit/verify checks every
 * event and reports how many it checked (and fails the test if the chain does not verify).
 */
export async function auditCount(platform: string): Promise<number> {
  const r = await call('GET', `${platform}/api/v1/audit/verify`);
  if (r.status !== 200 || r.json.ok !== true) throw new Error(`audit verify failed: ${r.status} ${r.text}`);
  return r.json.checked as number;
}

/**
 * Every row of every table of the instance's database as one JSON text, whichever backend it is
 * on (compiled WebAssembly aside): to check that a secret was stored nowhere.
 */
export async function storedText(a: Arbiter): Promise<string> {
  const tables = await a.stored<{ name: string }>(
    a.databaseUrl
      ? "SELECT tablename AS name FROM pg_tables WHERE schemaname = 'public'"
      : "SELECT name FROM sqlite_master WHERE type = 'table'",
  );
  const out: Record<string, unknown[]> = {};
  for (const { name } of tables) {
    if (name === 'compiled_sets') continue;
    out[name] = await a.stored(`SELECT * FROM ${name}`);
  }
  return JSON.stringify(out);
}
