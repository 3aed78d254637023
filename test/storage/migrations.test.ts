import Database from 'better-sqlite3';
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { canonicalJson } from '../../src/common/canonical-json.js';
import {
  migrate as migratePostgres,
  migrations as pgMigrations,
} from '../../src/storage/postgres/migrations.js';
import { createPool } from '../../src/storage/postgres/pool.js';
import { openDatabase } from '../../src/storage/sqlite/db.js';
import { migrations as sqliteMigrations } from '../../src/storage/sqlite/migrations.js';
import { onceOnly } from '../helpers/backends.js';
import { Arbiter, auditEvents, call } from '../helpers/harness.js';
import { baseEnv, runSync } from '../helpers/process.js';
import { createTestDatabase } from '../helpers/postgres.js';

/**
 * Migrations run on databases an earlier version left, with rows in them: each backend is built
 * up to the version before a migration (by that version's own migrations), given rows, then
 * opened by today's code.
 */
onceOnly('migrations of a database an earlier version left', () => {
  const past = new Date(Date.now() - 60_000).toISOString();
  const lease = new Date(Date.now() + 30_000).toISOString();
  const deliveries = [
    ['pending-1', 'pending', past],
    ['delivered-1', 'delivered', lease],
    ['failed-1', 'failed', lease],
  ] as const;

  /** A SQLite database in `dir` built by the migrations before `version`, as that version left it. */
  const sqliteBefore = (version: number, dir: string) => {
    const db = new Database(path.join(dir, 'arbiter.db'));
    db.exec(`CREATE TABLE schema_migrations (
      version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT`);
    for (const m of sqliteMigrations.filter((x) => x.version < version)) {
      db.exec(m.sql);
      m.up?.(db);
      db.prepare('INSERT INTO schema_migrations VALUES (?, ?, ?)').run(m.version, m.name, past);
    }
    return db;
  };

  /** The versions a SQLite database in `dir` records as applied, in order. */
  const readVersions = (dir: string): number[] => {
    const db = new Database(path.join(dir, 'arbiter.db'), { readonly: true });
    try {
      return db.prepare('SELECT version FROM schema_migrations ORDER BY version').pluck().all() as number[];
    } finally {
      db.close();
    }
  };

  /** A new PostgreSQL database built by the migrations before `version`, and a client on it. */
  const postgresBefore = async (version: number) => {
    const test = await createTestDatabase();
    const client = new pg.Client({ connectionString: test.url });
    await client.connect();
    await client.query(`CREATE TABLE schema_migrations (
      version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)`);
    for (const m of pgMigrations.filter((x) => x.version < version)) {
      await client.query(m.sql);
      await client.query('INSERT INTO schema_migrations VALUES ($1, $2, $3)', [m.version, m.name, past]);
    }
    return { test, client };
  };

  /**
   * An audit event as versions before 6 wrote it: the hash is the SHA-256 of the canonical JSON of
   * every field but `hash` (prev_hash included), resource and details stored as JSON text.
   */
  const oldEvent = (i: number, prev: string) => {
    const human = i % 3 === 0;
    const e = {
      id: `evt-${String(i).padStart(5, '0')}`,
      time: new Date(Date.parse(past) - 1_000_000 + i).toISOString(),
      kind: i % 7 === 0 ? 'policy.changed' : 'decision',
      trace_id: `trace-${i}`,
      request_id: i % 7 === 0 ? null : `req-${i}`,
      actor: human ? 'console' : 'deploy-key',
      agent_id: human ? null : `bot-${i % 4}`,
      user_id: human ? 'alice' : null,
      tenant_id: human ? 'acme' : null,
      action: i % 7 === 0 ? null : 'read',
      resource: i % 7 === 0 ? null : { type: 'repo', id: `r${i}`, tags: ['a', 'ü'] },
      outcome: i % 2 === 0 ? 'allow' : 'deny',
      message: i % 5 === 0 ? null : `event ${i}`,
      confidence: human ? null : 0.25 + (i % 3) / 4,
      policy_revision: 3,
      latency_us: 100 + i,
      details: { n: i, nested: { z: 1, a: [true, null] } },
      prev_hash: prev,
    };
    return { ...e, hash: createHash('sha256').update(canonicalJson(e)).digest('hex') };
  };

  it('SQLite 6: an audit trail written before version 6 (more than one page of it) is converted, verifies, and reads back as written', async function () {
    this.timeout(120_000);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    let arbiter: Arbiter | undefined;
    try {
      const db = sqliteBefore(6, dir);
      const insert = db.prepare(`INSERT INTO audit_events (id, time, kind, trace_id, request_id, actor,
        agent_id, user_id, tenant_id, action, resource, outcome, message, confidence, policy_revision,
        latency_us, details, hash, prev_hash) VALUES (@id, @time, @kind, @trace_id, @request_id, @actor,
        @agent_id, @user_id, @tenant_id, @action, @resource, @outcome, @message, @confidence,
        @policy_revision, @latency_us, @details, @hash, @prev_hash)`);
      const written: ReturnType<typeof oldEvent>[] = [];
      let prev = '0'.repeat(64);
      db.transaction(() => {
        for (let i = 1; i <= 2345; i++) {
          const e = oldEvent(i, prev);
          insert.run({
            ...e,
            resource: e.resource === null ? null : JSON.stringify(e.resource),
            details: JSON.stringify(e.details),
          });
          written.push(e);
          prev = e.hash;
        }
        // Versions 3 to 5 kept the chain's head and length with every append.
        db.prepare("UPDATE meta SET value = ? WHERE key = 'audit_head'").run(prev);
        db.prepare("UPDATE meta SET value = ? WHERE key = 'audit_count'").run(String(written.length));
      })();
      db.close();

      arbiter = await Arbiter.start({}, dir);
      const v = await call('GET', `${arbiter.platform}/api/v1/audit/verify`);
      expect(v.status, v.text).to.equal(200);
      expect(v.json, v.text).to.include({ ok: true });
      expect(v.json.checked).to.be.at.least(written.length);

      const byId = new Map((await auditEvents(arbiter.platform)).map((e) => [e.id as string, e]));
      for (const e of written) {
        const served = byId.get(e.id);
        expect(served, e.id).to.not.equal(undefined);
        expect(served).to.deep.equal(e);
      }
      const applied = readVersions(dir);
      expect(applied).to.deep.equal(sqliteMigrations.map((m) => m.version));
    } finally {
      await arbiter?.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('SQLite: a migration that fails is named at start, and leaves the schema as the one before it left it', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    try {
      const db = sqliteBefore(7, dir);
      // Migration 7 creates queue_decided_status, then queue_decided: the second one fails.
      db.exec('CREATE INDEX queue_decided ON queue_items (id)');
      db.close();
      const r = runSync(['serve'], baseEnv({ ARBITER_DATA_DIR: dir }));
      expect(r.signal, 'arbiter did not exit on its own').to.equal(null);
      expect(r.code).to.equal(1);
      expect(r.stderr).to.contain(
        `cannot open the SQLite database in ARBITER_DATA_DIR (${dir}): schema migration 7 ("queue history indexes") failed and was rolled back: `,
      );
      expect(r.stderr).to.match(/index queue_decided already exists/);
      expect(readVersions(dir)).to.deep.equal(
        sqliteMigrations.filter((m) => m.version < 7).map((m) => m.version),
      );
      const after = new Database(path.join(dir, 'arbiter.db'), { readonly: true });
      try {
        const indexes = after
          .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'queue_items'")
          .pluck()
          .all();
        expect(indexes).to.include('queue_decided').and.not.include('queue_decided_status');
      } finally {
        after.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('PostgreSQL: a migration that fails is named, and leaves the schema as it was', async () => {
    const { test, client } = await postgresBefore(9);
    try {
      // Migration 9 adds columns, then creates tokens_by_signing_key: the last statement fails.
      await client.query('CREATE INDEX tokens_by_signing_key ON tokens (id)');
      const pool = createPool(test.url, 2);
      let failed: unknown;
      try {
        await migratePostgres(pool).catch((e: unknown) => (failed = e));
      } finally {
        await pool.end();
      }
      expect(String(failed)).to.contain(
        'schema migration 9 ("signing-key rotation") failed and was rolled back: ',
      );
      expect(String(failed)).to.match(/tokens_by_signing_key.*already exists/);
      const versions = await client.query('SELECT max(version) AS v FROM schema_migrations');
      expect(versions.rows[0].v).to.equal(8);
      const columns = await client.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'signing_keys'",
      );
      expect(columns.rows.map((r: { column_name: string }) => r.column_name)).to.not.include('retired_at');
    } finally {
      await client.end();
      await test.drop();
    }
  });

  it('SQLite 15: a settled webhook delivery loses the lease time it kept; a pending one keeps its due time', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    try {
      const db = sqliteBefore(15, dir);
      db.prepare(
        `INSERT INTO webhooks (name, url, events, format, secret, created_at, updated_at)
         VALUES ('ops', 'http://127.0.0.1:9/x', '[]', 'json', 'whsec_x', ?, ?)`,
      ).run(past, past);
      const insert = db.prepare(
        `INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
         VALUES (?, 'ops', 'queue.pending', '{}', ?, 1, ?, ?)`,
      );
      for (const [id, status, next] of deliveries) insert.run(id, status, next, past);
      // Version 14's table refuses a null next attempt.
      expect(() =>
        db.prepare("UPDATE webhook_deliveries SET next_attempt_at = NULL WHERE id = 'failed-1'").run(),
      ).to.throw(/NOT NULL/);
      db.close();

      const migrated = openDatabase(dir, 'normal');
      try {
        const rows = migrated
          .prepare('SELECT id, status, next_attempt_at FROM webhook_deliveries ORDER BY id')
          .all();
        expect(rows).to.deep.equal([
          { id: 'delivered-1', status: 'delivered', next_attempt_at: null },
          { id: 'failed-1', status: 'failed', next_attempt_at: null },
          { id: 'pending-1', status: 'pending', next_attempt_at: past },
        ]);
        const indexes = migrated
          .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'webhook_deliveries'")
          .pluck()
          .all();
        expect(indexes).to.include.members(['webhook_deliveries_due', 'webhook_deliveries_by_hook']);
        expect(migrated.prepare('SELECT max(version) FROM schema_migrations').pluck().get()).to.equal(
          Math.max(...sqliteMigrations.map((m) => m.version)),
        );
      } finally {
        migrated.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('PostgreSQL 8: a settled webhook delivery loses the lease time it kept; a pending one keeps its due time', async () => {
    const { test, client } = await postgresBefore(8);
    try {
      await client.query(
        `INSERT INTO webhooks (name, url, events, format, secret, created_at, updated_at)
         VALUES ('ops', 'http://127.0.0.1:9/x', '[]', 'json', 'whsec_x', $1, $1)`,
        [past],
      );
      for (const [id, status, next] of deliveries) {
        await client.query(
          `INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
           VALUES ($1, 'ops', 'queue.pending', '{}', $2, 1, $3, $4)`,
          [id, status, next, past],
        );
      }
      let refused: unknown;
      await client
        .query("UPDATE webhook_deliveries SET next_attempt_at = NULL WHERE id = 'failed-1'")
        .catch((e: unknown) => (refused = e));
      expect(String(refused)).to.match(/not-null|null value/);

      const pool = createPool(test.url, 2);
      try {
        await migratePostgres(pool);
      } finally {
        await pool.end();
      }
      const { rows } = await client.query(
        'SELECT id, status, next_attempt_at FROM webhook_deliveries ORDER BY id',
      );
      expect(rows).to.deep.equal([
        { id: 'delivered-1', status: 'delivered', next_attempt_at: null },
        { id: 'failed-1', status: 'failed', next_attempt_at: null },
        { id: 'pending-1', status: 'pending', next_attempt_at: past },
      ]);
    } finally {
      await client.end();
      await test.drop();
    }
  });

  const tokenRow = (id: string, expires: string) => [
    id,
    'bot',
    '["read:repo/x"]',
    'arbiter',
    past,
    expires,
    'admin',
  ];
  const TOKEN_INSERT = `INSERT INTO tokens (id, subject, scopes, audience, issued_at, expires_at, minted_by)
    VALUES ($1, $2, $3, $4, $5, $6, $7)`;

  it('SQLite 16: existing tokens keep their rows with no signing_kid, the existing key stays the active one', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    try {
      const db = sqliteBefore(16, dir);
      db.prepare(
        "INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at) VALUES ('k0', 'p', 'q', ?)",
      ).run(past);
      const insert = db.prepare(TOKEN_INSERT.replace(/\$\d/g, '?'));
      insert.run(...tokenRow('t-live', lease));
      insert.run(...tokenRow('t-expired', past));
      db.close();

      const migrated = openDatabase(dir, 'normal');
      try {
        expect(
          migrated.prepare('SELECT id, signing_kid, expires_at FROM tokens ORDER BY id').all(),
        ).to.deep.equal([
          { id: 't-expired', signing_kid: null, expires_at: past },
          { id: 't-live', signing_kid: null, expires_at: lease },
        ]);
        expect(
          migrated.prepare('SELECT kid, retired_at, verify_until FROM signing_keys').all(),
        ).to.deep.equal([{ kid: 'k0', retired_at: null, verify_until: null }]);
        const indexes = migrated
          .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tokens'")
          .pluck()
          .all();
        expect(indexes).to.include('tokens_by_signing_key');
      } finally {
        migrated.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('PostgreSQL 9: existing tokens keep their rows with no signing_kid, the existing key stays the active one', async () => {
    const { test, client } = await postgresBefore(9);
    try {
      await client.query(
        "INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at) VALUES ('k0', 'p', 'q', $1)",
        [past],
      );
      await client.query(TOKEN_INSERT, tokenRow('t-live', lease));
      await client.query(TOKEN_INSERT, tokenRow('t-expired', past));

      const pool = createPool(test.url, 2);
      try {
        await migratePostgres(pool);
      } finally {
        await pool.end();
      }
      const tokens = await client.query('SELECT id, signing_kid, expires_at FROM tokens ORDER BY id');
      expect(tokens.rows).to.deep.equal([
        { id: 't-expired', signing_kid: null, expires_at: past },
        { id: 't-live', signing_kid: null, expires_at: lease },
      ]);
      const keys = await client.query('SELECT kid, retired_at, verify_until FROM signing_keys');
      expect(keys.rows).to.deep.equal([{ kid: 'k0', retired_at: null, verify_until: null }]);
      const versions = await client.query('SELECT max(version) AS v FROM schema_migrations');
      expect(versions.rows[0].v).to.equal(Math.max(...pgMigrations.map((m) => m.version)));
    } finally {
      await client.end();
      await test.drop();
    }
  });

  /**
   * Tokens as an earlier version left them, with no agent_id: exchanged from an agent decision and
   * from a human one, free-form by an agent-bound key, and free-form by the admin principal (no row,
   * though a key stored under its name may have one).
   */
  const BEFORE_AGENT_ID = [
    `INSERT INTO decisions (request_id, kind, status, key_id, tenant_id, subject, action, resource, trace_id, created_at)
     VALUES ('r-agent', 'agent', 'allow', 'k', NULL, 'deploy-bot', 'read', '"repo/x"', 'tr', $1)`,
    `INSERT INTO decisions (request_id, kind, status, key_id, tenant_id, subject, action, resource, trace_id, created_at)
     VALUES ('r-human', 'human', 'allow', 'k', 'acme', 'alice', 'read', '{}', 'tr', $1)`,
    `INSERT INTO api_keys (id, name, hash, scopes, tenant, agent, created_at)
     VALUES ('k1', 'finance-minter', 'h', '["admin"]', NULL, 'finance-bot', $1)`,
    // A key stored as "admin" before the name was reserved: the admin principal's tokens are not its.
    `INSERT INTO api_keys (id, name, hash, scopes, tenant, agent, created_at)
     VALUES ('k2', 'admin', 'h', '["admin"]', NULL, 'spy-bot', $1)`,
    `INSERT INTO tokens (id, request_id, subject, scopes, audience, issued_at, expires_at, minted_by)
     VALUES ('t-agent', 'r-agent', 'deploy-bot', '[]', 'arbiter', $1, $1, 'admin'),
            ('t-human', 'r-human', 'alice', '[]', 'arbiter', $1, $1, 'admin'),
            ('t-free-bound', NULL, 'x', '[]', 'arbiter', $1, $1, 'finance-minter'),
            ('t-free-admin', NULL, 'x', '[]', 'arbiter', $1, $1, 'admin')`,
  ];
  const AGENTS_AFTER = [
    { id: 't-agent', agent_id: 'deploy-bot' },
    { id: 't-free-admin', agent_id: null },
    { id: 't-free-bound', agent_id: 'finance-bot' },
    { id: 't-human', agent_id: null },
  ];

  it("SQLite 17: each existing token gets its decision's agent, or its minting key's", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    try {
      const db = sqliteBefore(17, dir);
      for (const sql of BEFORE_AGENT_ID) db.prepare(sql.replace(/\$1/g, '@at')).run({ at: past });
      db.close();
      const migrated = openDatabase(dir, 'normal');
      try {
        expect(migrated.prepare('SELECT id, agent_id FROM tokens ORDER BY id').all()).to.deep.equal(
          AGENTS_AFTER,
        );
      } finally {
        migrated.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("PostgreSQL 10: each existing token gets its decision's agent, or its minting key's", async () => {
    const { test, client } = await postgresBefore(10);
    try {
      for (const sql of BEFORE_AGENT_ID) await client.query(sql, [past]);
      const pool = createPool(test.url, 2);
      try {
        await migratePostgres(pool);
      } finally {
        await pool.end();
      }
      const { rows } = await client.query('SELECT id, agent_id FROM tokens ORDER BY id');
      expect(rows).to.deep.equal(AGENTS_AFTER);
    } finally {
      await client.end();
      await test.drop();
    }
  });

  /**
   * Decisions and tokens as an earlier version left them, with no user_id: an agent acting for
   * itself, an agent on behalf of carol (her id only in the decision's audit event), a human
   * decision of alice's, and a free-form token.
   */
  const BEFORE_USER_ID = [
    `INSERT INTO decisions (request_id, kind, status, key_id, tenant_id, subject, action, resource, trace_id, created_at)
     VALUES ('r-self', 'agent', 'allow', 'k', NULL, 'deploy-bot', 'read', '"repo/x"', 'tr', $1),
            ('r-obo', 'agent', 'allow', 'k', 'acme', 'deploy-bot', 'read', '"repo/x"', 'tr', $1),
            ('r-human', 'human', 'allow', 'k', 'acme', 'alice', 'read', '{}', 'tr', $1)`,
    `INSERT INTO audit_events (seq, time, kind, request_id, agent_id, user_id, tenant_id, body, hash)
     VALUES (1, $1, 'decision', 'r-self', 'deploy-bot', NULL, NULL, '{}', 'h1'),
            (2, $1, 'decision', 'r-obo', 'deploy-bot', 'carol', 'acme', '{}', 'h2'),
            (3, $1, 'token.mint', 'r-obo', 'deploy-bot', NULL, 'acme', '{}', 'h3'),
            (4, $1, 'decision', 'r-human', NULL, 'alice', 'acme', '{}', 'h4')`,
    `INSERT INTO tokens (id, request_id, subject, scopes, audience, issued_at, expires_at, minted_by)
     VALUES ('t-self', 'r-self', 'deploy-bot', '[]', 'arbiter', $1, $1, 'admin'),
            ('t-obo', 'r-obo', 'deploy-bot', '[]', 'arbiter', $1, $1, 'admin'),
            ('t-human', 'r-human', 'alice', '[]', 'arbiter', $1, $1, 'admin'),
            ('t-free', NULL, 'x', '[]', 'arbiter', $1, $1, 'admin')`,
  ];
  const DECISION_USERS_AFTER = [
    { request_id: 'r-human', user_id: 'alice' },
    { request_id: 'r-obo', user_id: 'carol' },
    { request_id: 'r-self', user_id: null },
  ];
  const TOKEN_USERS_AFTER = [
    { id: 't-free', user_id: null },
    { id: 't-human', user_id: 'alice' },
    { id: 't-obo', user_id: 'carol' },
    { id: 't-self', user_id: null },
  ];

  it("SQLite 18: each existing decision and token gets the user it was for, from its decision's audit event", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-migrate-'));
    try {
      const db = sqliteBefore(18, dir);
      for (const sql of BEFORE_USER_ID) db.prepare(sql.replace(/\$1/g, '@at')).run({ at: past });
      db.close();
      const migrated = openDatabase(dir, 'normal');
      try {
        expect(
          migrated.prepare('SELECT request_id, user_id FROM decisions ORDER BY request_id').all(),
        ).to.deep.equal(DECISION_USERS_AFTER);
        expect(migrated.prepare('SELECT id, user_id FROM tokens ORDER BY id').all()).to.deep.equal(
          TOKEN_USERS_AFTER,
        );
      } finally {
        migrated.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("PostgreSQL 11: each existing decision and token gets the user it was for, from its decision's audit event", async () => {
    const { test, client } = await postgresBefore(11);
    try {
      for (const sql of BEFORE_USER_ID) await client.query(sql, [past]);
      const pool = createPool(test.url, 2);
      try {
        await migratePostgres(pool);
      } finally {
        await pool.end();
      }
      const decisions = await client.query('SELECT request_id, user_id FROM decisions ORDER BY request_id');
      expect(decisions.rows).to.deep.equal(DECISION_USERS_AFTER);
      const tokens = await client.query('SELECT id, user_id FROM tokens ORDER BY id');
      expect(tokens.rows).to.deep.equal(TOKEN_USERS_AFTER);
    } finally {
      await client.end();
      await test.drop();
    }
  });
});
