import Database from 'better-sqlite3';
import { expect } from 'chai';
import { rmSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { migrations as pgMigrations } from '../src/storage/postgres/migrations.js';
import { migrations as sqliteMigrations } from '../src/storage/sqlite/migrations.js';
import { guarded } from '../src/storage/index.js';
import { SILENT_FEED, type Stores } from '../src/storage/stores.js';
import { VERSION } from '../src/version.js';
import { onceOnly, onEveryBackend, TEST_BACKEND } from './helpers/backends.js';
import { AGENT, Arbiter, call, type Response } from './helpers/harness.js';
import { createTestDatabase } from './helpers/postgres.js';
import { baseEnv, runSync, sleep } from './helpers/process.js';

/** The newest schema version this build knows on the backend under test. */
const newest = Math.max(
  ...(TEST_BACKEND === 'postgres' ? pgMigrations : sqliteMigrations).map((m) => m.version),
);

/** What an engine says of a database a newer Arbiter has migrated (at start, and while serving). */
const refusal = `the database has schema migration 999 ("from a newer Arbiter"), which this build (Arbiter ${VERSION}, schema version ${newest}) does not know`;
/** The part of it every refusal has, whether it names the migration or the recorded schema version. */
const refusedBuild = `which this build (Arbiter ${VERSION}, schema version ${newest}) does not know`;

const NEWER_MIGRATION = 'INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)';
const NEWER_VERSION = `INSERT INTO meta (key, value) VALUES ('schema_version', '999')
  ON CONFLICT (key) DO UPDATE SET value = excluded.value`;
const newerMigration = [999, 'from a newer Arbiter', new Date().toISOString()];

/** As a newer Arbiter would leave the database: one migration more than this build knows. */
const migrateFurther = async (a: Arbiter) => {
  await a.alter(NEWER_MIGRATION, newerMigration);
  await a.alter(NEWER_VERSION);
};

/** Asks `fn` until `done` holds of its answer (a serving process checks every second). */
async function until(fn: () => Promise<Response>, done: (r: Response) => boolean): Promise<Response> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await fn();
    if (done(r) || Date.now() > deadline) return r;
    await sleep(100);
  }
}

/**
 * A newer Arbiter's migration in progress, as its engine runs it (one transaction that takes the
 * chain head first and records its schema version): begun, not yet committed.
 */
async function migrationInProgress(
  a: Arbiter,
): Promise<{ waiting: () => Promise<boolean>; commit: () => Promise<void> }> {
  if (a.databaseUrl) {
    const c = new pg.Client({ connectionString: a.databaseUrl });
    await c.connect();
    await c.query('BEGIN');
    await c.query("SELECT key FROM meta WHERE key IN ('audit_head', 'audit_count') ORDER BY key FOR UPDATE");
    await c.query(NEWER_MIGRATION, newerMigration);
    await c.query(NEWER_VERSION);
    return {
      // A transaction of the engine waits for the head this one holds.
      waiting: async () =>
        (
          await c.query(
            `SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
               AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`,
          )
        ).rowCount !== 0,
      commit: async () => {
        await c.query('COMMIT');
        await c.end();
      },
    };
  }
  const db = new Database(path.join(a.dataDir, 'arbiter.db'), { fileMustExist: true });
  db.exec('BEGIN IMMEDIATE');
  db.prepare(NEWER_MIGRATION.replace(/\$\d/g, '?')).run(...newerMigration);
  db.exec(NEWER_VERSION);
  return {
    // SQLite does not show who waits for its write lock: give the engine's writer time to.
    waiting: async () => {
      await sleep(500);
      return true;
    },
    commit: async () => {
      db.exec('COMMIT');
      db.close();
    },
  };
}

// An upgrade goes one way: an engine never serves a schema newer than its own, which it would
// misread or under-fill (a newer migration's columns left empty by rows it writes). Storage: both.
onEveryBackend('a database a newer Arbiter has migrated', function () {
  this.timeout(120_000);
  let a: Arbiter;
  beforeEach(async () => {
    a = await Arbiter.start();
  });
  afterEach(async () => {
    await a.close();
  });

  it('is refused at start, and by the CLI, naming its migration and this build', async () => {
    await a.stop();
    await migrateFurther(a);
    let failed: unknown;
    await a.restart().catch((e: unknown) => (failed = e));
    expect(String(failed)).to.contain('arbiter exited with 1').and.contain(refusal);
    const cli = a.cli(['keys', 'list']);
    expect(cli.code).to.equal(1);
    expect(cli.stderr).to.contain(refusal);
    // Nothing was applied or recorded by the refused start.
    const versions = await a.stored<{ version: number | string }>(
      'SELECT version FROM schema_migrations ORDER BY version DESC LIMIT 2',
    );
    expect(versions.map((r) => Number(r.version))).to.deep.equal([999, newest]);
    const recorded = await a.stored<{ value: string }>("SELECT value FROM meta WHERE key = 'schema_version'");
    expect(recorded).to.deep.equal([{ value: '999' }]);
  });

  it('records the schema version it migrated to, which every append reads with the chain head', async () => {
    const recorded = await a.stored<{ value: string }>("SELECT value FROM meta WHERE key = 'schema_version'");
    expect(recorded).to.deep.equal([{ value: String(newest) }]);
    // A store an earlier build left has no such row: appends go on without it.
    await a.alter("DELETE FROM meta WHERE key = 'schema_version'");
    const d = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(d.status, d.text).to.equal(200);
    // A newer Arbiter's version recorded there, without a migration row: every append refuses.
    await a.alter(NEWER_VERSION);
    const events = await a.count('audit_events');
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(r.status, r.text).to.equal(503);
    // Any append, with the reason.
    const i = await call('POST', `${a.platform}/api/v1/audit/ingest`, { body: { kind: 'ext.check' } });
    expect(i.status, i.text).to.equal(503);
    expect((i.json as { error: string }).error).to.contain(
      'the database has schema version 999, ' + refusedBuild,
    );
    expect(await a.count('audit_events')).to.equal(events);
  });

  it('refuses a decision that was already waiting for the chain head while a newer Arbiter migrated: 503, nothing recorded', async () => {
    const before = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(before.status, before.text).to.equal(200);
    const decisions = await a.count('decisions');
    const events = await a.count('audit_events');
    const migration = await migrationInProgress(a);
    // Past the engine's once-a-second check (nothing committed yet), waiting for the head.
    const pending = call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    const deadline = Date.now() + 60_000;
    while (!(await migration.waiting()) && Date.now() < deadline) await sleep(50);
    await migration.commit();
    const d = await pending;
    expect(d.status, d.text).to.equal(503);
    expect(await a.count('decisions')).to.equal(decisions);
    expect(await a.count('audit_events')).to.equal(events);
  });

  it('stops a running engine: decisions and /healthz answer 503 naming the versions, nothing is recorded; it serves again once the schema is its own', async () => {
    const before = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(before.status, before.text).to.equal(200);
    const decisions = await a.count('decisions');
    const events = await a.count('audit_events');
    await a.alter(NEWER_MIGRATION, newerMigration);
    // Checked every second by a serving process: /healthz says so once it has looked.
    const health = await until(
      () => call('GET', `${a.engine}/healthz`, { key: null }),
      (r) => r.status === 503,
    );
    expect(health.status, health.text).to.equal(503);
    const d = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(d.status, d.text).to.equal(503);
    const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
    expect(q.status, q.text).to.equal(503);
    // Reads too, with the reason.
    const p = await call('GET', `${a.platform}/api/v1/policies`);
    expect(p.status, p.text).to.equal(503);
    expect((p.json as { error: string }).error).to.contain(refusal);
    for (const base of [a.engine, a.platform]) {
      const h = await until(
        () => call('GET', `${base}/healthz`, { key: null }),
        (r) => r.status === 503,
      );
      expect(h.status, h.text).to.equal(503);
      expect((h.json as { error: string }).error).to.contain(refusal);
    }
    expect(await a.count('decisions')).to.equal(decisions);
    expect(await a.count('audit_events')).to.equal(events);
    // The newer migration undone (a restore, say): the engine serves again by itself.
    await a.alter('DELETE FROM schema_migrations WHERE version = 999');
    const after = await until(
      () => call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow }),
      (r) => r.status !== 503,
    );
    expect(after.status, after.text).to.equal(200);
    const v = await call('GET', `${a.platform}/api/v1/audit/verify`);
    expect(v.json).to.include({ ok: true });
  });

  it('is not upgraded by the CLI: an older schema is refused naming both versions, and the engines serving it go on', async () => {
    // As an engine of the build before this one left it: its newest migration not yet applied.
    const older = newest - 1;
    await a.alter('DELETE FROM schema_migrations WHERE version = $1', [newest]);
    await a.alter("UPDATE meta SET value = $1 WHERE key = 'schema_version'", [String(older)]);
    for (const args of [
      ['keys', 'list'],
      ['audit', 'verify'],
    ]) {
      const cli = a.cli(args);
      expect(cli.code, cli.stderr).to.equal(1);
      expect(cli.stderr).to.contain(
        `the database has schema version ${older}, older than this build's (Arbiter ${VERSION}, schema version ${newest}): upgrade the servers first`,
      );
    }
    // Nothing was migrated: the engine of the older schema still serves.
    const versions = await a.stored<{ version: number | string }>(
      'SELECT version FROM schema_migrations ORDER BY version DESC LIMIT 1',
    );
    expect(versions.map((r) => Number(r.version))).to.deep.equal([older]);
    const d = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(d.status, d.text).to.equal(200);
  });

  it('is created by the CLI when there is none yet (a first key before the first start)', async () => {
    const fresh = TEST_BACKEND === 'postgres' ? await createTestDatabase() : undefined;
    const env = baseEnv(fresh ? { ARBITER_DATABASE_URL: fresh.url } : {});
    try {
      const cli = runSync(['keys', 'create', '--name', 'first', '--scopes', 'authorize'], env, 60_000);
      expect(cli.code, cli.stderr).to.equal(0);
      expect(runSync(['audit', 'verify'], env, 60_000).code).to.equal(0);
    } finally {
      await fresh?.drop();
      rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
    }
  });
});

/** Stores whose schema checks answer when the test says, counting them; every store is empty. */
function watchedStores() {
  const checks: ((problem: string | undefined) => void)[] = [];
  const empty = { list: async () => [] };
  const stores = {
    backend: 'sqlite',
    audit: empty,
    decisions: empty,
    limits: empty,
    queue: empty,
    tokens: empty,
    keys: empty,
    policies: empty,
    webhooks: empty,
    changes: SILENT_FEED,
    health: async () => undefined,
    sharedSecret: async (_name: string, ifNone: string) => ifNone,
    schemaProblem: () => new Promise<string | undefined>((resolve) => checks.push(resolve)),
    close: async () => undefined,
  } as unknown as Stores;
  return { stores, checks };
}

// The storage wrapper on its own, with a fake store: no backend involved.
onceOnly('the schema check of a serving process', function () {
  this.timeout(30_000);

  it('runs one check at a time: a slow one (an unreachable database) is not joined by more', async () => {
    const { stores, checks } = watchedStores();
    const opening = guarded(stores, true);
    // The check at start is in flight and does not answer: the 1 s timer starts none beside it.
    while (checks.length === 0) await sleep(10);
    checks[0]?.(undefined);
    const watched = await opening;
    try {
      while (checks.length < 2) await sleep(50);
      await sleep(3_500);
      expect(checks).to.have.length(2);
      checks[1]?.('newer');
      while (checks.length < 3) await sleep(50);
    } finally {
      await watched.close();
    }
  });

  it('answers /healthz from the state every store call uses, checked at start', async () => {
    const { stores, checks } = watchedStores();
    const opening = guarded(stores, true);
    while (checks.length === 0) await sleep(10);
    // A fresh process on a database a newer Arbiter has migrated: refused before the first tick.
    checks[0]?.('the database has schema migration 999');
    const watched = await opening;
    try {
      expect(await watched.health()).to.equal('the database has schema migration 999');
      let refused: unknown;
      await watched.keys.list().catch((e: unknown) => (refused = e));
      expect(String(refused)).to.contain('the database has schema migration 999');
      // Until the next check answers, both still say so; then both serve.
      while (checks.length < 2) await sleep(50);
      expect(await watched.health()).to.equal('the database has schema migration 999');
      checks[1]?.(undefined);
      await sleep(10);
      expect(await watched.health()).to.equal(undefined);
      expect(await watched.keys.list()).to.deep.equal([]);
    } finally {
      await watched.close();
    }
  });
});
