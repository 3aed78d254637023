import Database from 'better-sqlite3';
import { expect } from 'chai';
import { renameSync, rmSync } from 'node:fs';
import path from 'node:path';
import { onEveryBackend, onPostgresOnly, onSqliteOnly } from './helpers/backends.js';
import { Arbiter, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';
import { queryDatabase, TEST_SERVER_URL } from './helpers/postgres.js';

const DECISION = { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 };

/** /healthz says unavailable, naming why, and no decision is answered (503, never allow). */
async function expectUnusable(a: Arbiter, why: RegExp): Promise<void> {
  const d = await call('POST', a.engine + '/v1/agent/authorize', { body: DECISION });
  // SPEC §5: a decision that cannot be recorded is a 503 error (never allow), to retry later.
  expectError(d, 503);
  expect(d.headers.get('retry-after')).to.equal('1');
  for (const base of [a.engine, a.platform]) {
    const r = await call('GET', base + '/healthz', { key: null });
    expect(r.status, r.text).to.equal(503);
    expect(r.json.status).to.equal('unavailable');
    expect(r.json.error).to.be.a('string').and.match(why);
  }
}

// /healthz reads storage: every backend. The 503 test breaks the SQLite file behind the service,
// so it is SQLite's own; test/postgres-cluster.test.ts covers an unreachable PostgreSQL.
onEveryBackend('GET /healthz', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('answers 200 {"status":"ok","revision":N} on both listeners without a key', async () => {
    for (const base of [a.engine, a.platform]) {
      const r = await call('GET', base + '/healthz', { key: null });
      expect(r.status).to.equal(200);
      expect(r.json).to.deep.equal({ status: 'ok', revision: 1 });
    }
  });

  // Reads still work, so a probe that only reads said ok while every decision answered 503.
  it('answers 503 while the audit chain cannot be appended to (its recorded head is unreadable), and recovers', async () => {
    const [count] = await a.stored<{ value: string }>("SELECT value FROM meta WHERE key = 'audit_count'");
    await a.alter("UPDATE meta SET value = 'x' WHERE key = 'audit_count'");
    try {
      await expectUnusable(a, /audit/);
    } finally {
      await a.alter("UPDATE meta SET value = $1 WHERE key = 'audit_count'", [count!.value]);
    }
    expect((await call('GET', a.engine + '/healthz', { key: null })).status).to.equal(200);
    const d = await call('POST', a.engine + '/v1/agent/authorize', { body: DECISION });
    expect(d.status, d.text).to.equal(200);
  });

  onPostgresOnly('with the database read-only', () => {
    // What a client meets after a failover to a standby, or with default_transaction_read_only.
    const readOnly = async (on: boolean) => {
      const name = new URL(a.databaseUrl!).pathname.slice(1);
      await queryDatabase(
        TEST_SERVER_URL,
        `ALTER DATABASE ${name} ${on ? 'SET default_transaction_read_only = on' : 'RESET default_transaction_read_only'}`,
      );
      // Sessions keep the setting they began with: end them, and the pool opens new ones.
      await queryDatabase(
        TEST_SERVER_URL,
        'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [name],
      );
    };

    it('answers 503 while the database refuses writes, and recovers', async () => {
      await readOnly(true);
      try {
        // The pool notices its ended sessions on their next use.
        await call('GET', a.engine + '/healthz', { key: null });
        await expectUnusable(a, /read-only/);
      } finally {
        await readOnly(false);
      }
      expect((await call('GET', a.engine + '/healthz', { key: null })).status).to.equal(200);
      const d = await call('POST', a.engine + '/v1/agent/authorize', { body: DECISION });
      expect(d.status, d.text).to.equal(200);
    });
  });

  onSqliteOnly('with the database file broken', () => {
    it('answers 503 {"status":"unavailable","error"} while storage is unusable, and recovers', async () => {
      // Damage the store behind the service's back: the table every probe reads disappears.
      const other = new Database(path.join(a.dataDir, 'arbiter.db'));
      const saved = other.prepare('SELECT key, value FROM meta').all() as { key: string; value: string }[];
      other.exec('DROP TABLE meta');
      try {
        const r = await call('GET', a.engine + '/healthz', { key: null });
        expect(r.status).to.equal(503);
        expect(r.json.status).to.equal('unavailable');
        expect(r.json.error)
          .to.be.a('string')
          .and.match(/storage/);
        // And no decision is answered while the store is unusable.
        const d = await call('POST', a.engine + '/v1/agent/authorize', {
          body: { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 },
        });
        expect(d.status).to.equal(503);
      } finally {
        other.exec('CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT');
        const ins = other.prepare('INSERT INTO meta (key, value) VALUES (?, ?)');
        for (const row of saved) ins.run(row.key, row.value);
        other.close();
      }
      const again = await call('GET', a.engine + '/healthz', { key: null });
      expect(again.status).to.equal(200);
    });
  });
});

// The data directory removed (a cleanup job, a volume unmounted) or moved under a running process:
// SQLite keeps writing to the file it holds open, which no longer is the database at its path. A
// restart opens (or creates) whatever is there, so everything answered meanwhile would be lost.
onSqliteOnly('with the data directory removed or moved under it', () => {
  let a: Arbiter;
  beforeEach(async () => {
    a = await Arbiter.start();
    const d = await call('POST', a.engine + '/v1/agent/authorize', { body: DECISION });
    expect(d.status, d.text).to.equal(200);
  });
  afterEach(async () => {
    await a.close();
  });

  it('answers 503 (never allow) and /healthz 503 while the file is moved away, and recovers when it is back', async () => {
    const moved = a.dataDir + '-moved';
    renameSync(a.dataDir, moved);
    try {
      await expectUnusable(a, /database file/);
      const put = await call('PUT', a.platform + '/api/v1/data/moved', { body: { v: 1 } });
      expect(put.status, put.text).to.equal(503);
      expect(put.json).to.have.all.keys('error');
    } finally {
      renameSync(moved, a.dataDir);
    }
    expect((await call('GET', a.engine + '/healthz', { key: null })).status).to.equal(200);
    const d = await call('POST', a.engine + '/v1/agent/authorize', { body: DECISION });
    expect(d.status, d.text).to.equal(200);
    const v = await call('GET', a.platform + '/api/v1/audit/verify');
    expect(v.json.ok, v.text).to.equal(true);
  });

  it('logs every failed request of an outage by its request id, the cause whole once, then by its message', async () => {
    renameSync(a.dataDir, a.dataDir + '-moved');
    try {
      const answers = await Promise.all(
        [1, 2, 3, 4].map(() => call('POST', a.engine + '/v1/agent/authorize', { body: DECISION })),
      );
      const ids = answers.map((r) => {
        expect(r.status, r.text).to.equal(503);
        return r.headers.get('x-request-id') as string;
      });
      const failed = (
        await a.logsWith(ids.map((id) => (l) => l.msg === 'request failed' && l.requestId === id))
      ).filter((l) => l.msg === 'request failed');
      // Each request's own line: its id, level error, and why.
      for (const id of ids) {
        const line = failed.find((l) => l.requestId === id);
        expect(line, id).to.not.equal(undefined);
        expect(line?.level).to.equal('error');
        if (line?.err === undefined) {
          expect(line?.cause, JSON.stringify(line))
            .to.be.a('string')
            .and.match(/database file/);
          expect(line?.error).to.be.a('string').and.not.equal('');
        } else {
          expect((line.err as { stack?: string }).stack).to.be.a('string');
        }
      }
      // The same cause again within seconds is not logged with its stack again.
      const whole = failed.filter((l) => l.err !== undefined);
      const brief = failed.filter((l) => l.err === undefined);
      expect(whole.length).to.be.at.least(1);
      expect(brief.length, JSON.stringify(failed)).to.be.at.least(ids.length - 1);
    } finally {
      renameSync(a.dataDir + '-moved', a.dataDir);
    }
  });

  it('answers 503 (never allow) and /healthz 503 once the directory is removed', async () => {
    rmSync(a.dataDir, { recursive: true, force: true });
    await expectUnusable(a, /database file/);
  });
});
