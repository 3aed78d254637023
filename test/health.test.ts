import Database from 'better-sqlite3';
import { expect } from 'chai';
import path from 'node:path';
import { onEveryBackend, onSqliteOnly } from './helpers/backends.js';
import { Arbiter, call } from './helpers/harness.js';

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
