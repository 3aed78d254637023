import { expect } from 'chai';
import { migrations as pgMigrations } from '../src/storage/postgres/migrations.js';
import { migrations as sqliteMigrations } from '../src/storage/sqlite/migrations.js';
import { VERSION } from '../src/version.js';
import { onEveryBackend, TEST_BACKEND } from './helpers/backends.js';
import { AGENT, Arbiter, call } from './helpers/harness.js';
import { sleep } from './helpers/process.js';

/** The newest schema version this build knows on the backend under test. */
const newest = Math.max(
  ...(TEST_BACKEND === 'postgres' ? pgMigrations : sqliteMigrations).map((m) => m.version),
);

/** What an engine says of a database a newer Arbiter has migrated (at start, and while serving). */
const refusal = `the database has schema migration 999 ("from a newer Arbiter"), which this build (Arbiter ${VERSION}, schema version ${newest}) does not know`;

/** As a newer Arbiter would leave the database: one migration more than this build knows. */
const migrateFurther = (a: Arbiter) =>
  a.alter('INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)', [
    999,
    'from a newer Arbiter',
    new Date().toISOString(),
  ]);

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
  });

  it('stops a running engine: decisions and /healthz answer 503 naming the versions, nothing is recorded; it serves again once the schema is its own', async () => {
    const before = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(before.status, before.text).to.equal(200);
    const decisions = await a.count('decisions');
    const events = await a.count('audit_events');
    await migrateFurther(a);
    // Checked every second by a serving process.
    await sleep(2_500);
    const d = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(d.status, d.text).to.equal(503);
    const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
    expect(q.status, q.text).to.equal(503);
    // Reads too, with the reason.
    const p = await call('GET', `${a.platform}/api/v1/policies`);
    expect(p.status, p.text).to.equal(503);
    expect((p.json as { error: string }).error).to.contain(refusal);
    for (const base of [a.engine, a.platform]) {
      const h = await call('GET', `${base}/healthz`, { key: null });
      expect(h.status, h.text).to.equal(503);
      expect((h.json as { error: string }).error).to.contain(refusal);
    }
    expect(await a.count('decisions')).to.equal(decisions);
    expect(await a.count('audit_events')).to.equal(events);
    // The newer migration undone (a restore, say): the engine serves again by itself.
    await a.alter('DELETE FROM schema_migrations WHERE version = 999');
    await sleep(2_500);
    const after = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(after.status, after.text).to.equal(200);
    const v = await call('GET', `${a.platform}/api/v1/audit/verify`);
    expect(v.json).to.include({ ok: true });
  });
});
