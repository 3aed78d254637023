import { createHash } from 'node:crypto';
import { canonicalJson } from '../../common/canonical-json.js';
import type { Db } from './db.js';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  /** Runs after `sql`, in the same transaction, for changes SQL alone cannot make. */
  up?: (db: Db) => void;
}

/**
 * Versioned schema migrations. Append only: a released migration is never edited; a change is a
 * new entry. Each runs in its own transaction and is recorded in schema_migrations.
 */
export const migrations: readonly Migration[] = [
  {
    version: 1,
    name: 'initial schema',
    sql: `
      CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
      ) STRICT;
      INSERT INTO meta (key, value) VALUES ('revision', '0'), ('seeded', '0');

      CREATE TABLE api_keys (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        hash       TEXT NOT NULL,
        scopes     TEXT NOT NULL,
        tenant     TEXT,
        agent      TEXT,
        created_at TEXT NOT NULL,
        revoked_at TEXT
      ) STRICT;

      CREATE TABLE policies (
        name        TEXT PRIMARY KEY,
        description TEXT NOT NULL,
        rego        TEXT NOT NULL,
        sha256      TEXT NOT NULL,
        version     INTEGER NOT NULL,
        updated_at  TEXT NOT NULL
      ) STRICT;

      CREATE TABLE data_documents (
        path       TEXT PRIMARY KEY,
        value      TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;

      CREATE TABLE audit_events (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT,
        id              TEXT NOT NULL UNIQUE,
        time            TEXT NOT NULL,
        kind            TEXT NOT NULL,
        trace_id        TEXT,
        request_id      TEXT,
        actor           TEXT,
        agent_id        TEXT,
        user_id         TEXT,
        tenant_id       TEXT,
        action          TEXT,
        resource        TEXT,
        outcome         TEXT,
        message         TEXT,
        confidence      REAL,
        policy_revision INTEGER,
        latency_us      INTEGER,
        details         TEXT NOT NULL,
        hash            TEXT NOT NULL,
        prev_hash       TEXT NOT NULL
      ) STRICT;
      CREATE INDEX audit_trace ON audit_events (trace_id, seq);
      CREATE INDEX audit_request ON audit_events (request_id, seq);
      CREATE INDEX audit_kind ON audit_events (kind, seq);

      CREATE TABLE queue_items (
        id           TEXT PRIMARY KEY,
        status       TEXT NOT NULL,
        kind         TEXT NOT NULL,
        agent_id     TEXT,
        user_id      TEXT,
        tenant_id    TEXT,
        action       TEXT NOT NULL,
        resource     TEXT NOT NULL,
        confidence   REAL,
        context      TEXT NOT NULL,
        message      TEXT NOT NULL,
        trace_id     TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        expires_at   TEXT NOT NULL,
        decided_at   TEXT,
        decided_by   TEXT,
        note         TEXT,
        requested_by TEXT NOT NULL
      ) STRICT;
      CREATE INDEX queue_pending ON queue_items (status, created_at, id);
    `,
  },
  {
    version: 2,
    name: 'decisions, tokens, signing keys',
    sql: `
      -- One row per answered decision: what a token exchange and an idempotent replay need.
      CREATE TABLE decisions (
        request_id TEXT PRIMARY KEY,
        kind       TEXT NOT NULL,
        status     TEXT NOT NULL,
        key_id     TEXT NOT NULL,
        tenant_id  TEXT,
        subject    TEXT NOT NULL,
        action     TEXT NOT NULL,
        resource   TEXT NOT NULL,
        message    TEXT,
        trace_id   TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT,
        idem_key   TEXT,
        body_hash  TEXT,
        token_id   TEXT
      ) STRICT;
      CREATE UNIQUE INDEX decisions_idempotency ON decisions (key_id, idem_key) WHERE idem_key IS NOT NULL;

      CREATE TABLE tokens (
        id         TEXT PRIMARY KEY,
        request_id TEXT,
        subject    TEXT NOT NULL,
        scopes     TEXT NOT NULL,
        audience   TEXT NOT NULL,
        tenant_id  TEXT,
        issued_at  TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        revoked_at TEXT,
        minted_by  TEXT NOT NULL,
        trace_id   TEXT
      ) STRICT;

      CREATE TABLE signing_keys (
        kid         TEXT PRIMARY KEY,
        private_jwk TEXT NOT NULL,
        public_jwk  TEXT NOT NULL,
        created_at  TEXT NOT NULL
      ) STRICT;

      CREATE INDEX queue_pending_id ON queue_items (status, id);
    `,
  },
  {
    version: 3,
    name: 'audit query indexes and chain head',
    sql: `
      -- One index per filter, each ending in seq: a filtered page is an index range scan in
      -- seq order, fast at millions of rows. (kind, trace_id, request_id exist since version 1.)
      CREATE INDEX audit_agent ON audit_events (agent_id, seq);
      CREATE INDEX audit_user ON audit_events (user_id, seq);
      CREATE INDEX audit_tenant ON audit_events (tenant_id, seq);
      CREATE INDEX audit_action ON audit_events (action, seq);
      CREATE INDEX audit_outcome ON audit_events (outcome, seq);
      CREATE INDEX audit_time ON audit_events (time, seq);
      -- The chain head and length, updated with every append: truncating the tail of the chain
      -- is detected too, not only edits and deletions inside it.
      INSERT INTO meta (key, value) SELECT 'audit_head',
        COALESCE((SELECT hash FROM audit_events ORDER BY seq DESC LIMIT 1), '${'0'.repeat(64)}');
      INSERT INTO meta (key, value) SELECT 'audit_count', CAST(count(*) AS TEXT) FROM audit_events;
    `,
  },
  {
    version: 4,
    name: 'compiled policy sets',
    sql: `
      -- Compiled wasm by policy-set hash: one process compiles, every other process (and every
      -- restart) loads the same bytes instead of running the compiler again.
      CREATE TABLE compiled_sets (
        set_hash   TEXT PRIMARY KEY,
        wasm       BLOB NOT NULL,
        created_at TEXT NOT NULL
      ) STRICT;
    `,
  },
  {
    version: 5,
    name: 'partial audit indexes for often-null columns',
    sql: `
      -- user_id is null on agent decisions, agent_id on human ones, tenant_id for untenanted keys:
      -- indexing only the rows that have a value saves B-tree work on every decision, and an
      -- equality filter (col = ?) implies col IS NOT NULL, so queries still use these indexes.
      DROP INDEX audit_agent;
      DROP INDEX audit_user;
      DROP INDEX audit_tenant;
      CREATE INDEX audit_agent ON audit_events (agent_id, seq) WHERE agent_id IS NOT NULL;
      CREATE INDEX audit_user ON audit_events (user_id, seq) WHERE user_id IS NOT NULL;
      CREATE INDEX audit_tenant ON audit_events (tenant_id, seq) WHERE tenant_id IS NOT NULL;
    `,
  },
  {
    version: 6,
    name: 'audit events stored as the hashed text',
    sql: `
      -- Each event is kept as body: the canonical JSON text that its hash covers, byte for byte.
      -- The other columns are copies of body's values that filters and their indexes use; audit
      -- verification checks that they agree with body.
      CREATE TABLE audit_log (
        seq        INTEGER PRIMARY KEY,
        time       TEXT NOT NULL,
        kind       TEXT NOT NULL,
        trace_id   TEXT,
        request_id TEXT,
        agent_id   TEXT,
        user_id    TEXT,
        tenant_id  TEXT,
        action     TEXT,
        outcome    TEXT,
        body       TEXT NOT NULL,
        hash       TEXT NOT NULL
      ) STRICT;
    `,
    up: (db) => {
      const insert = db.prepare(`INSERT INTO audit_log (seq, time, kind, trace_id, request_id, agent_id,
        user_id, tenant_id, action, outcome, body, hash) VALUES (@seq, @time, @kind, @trace_id, @request_id,
        @agent_id, @user_id, @tenant_id, @action, @outcome, @body, @hash)`);
      // Read a page, then write it: better-sqlite3 refuses a write on a connection while one of
      // its statements is still being iterated, and a page at a time keeps a long trail's memory
      // bounded. (Edited after release, as an exception: as first written it iterated and wrote
      // at once, and so failed on every store with events; the schema it makes is unchanged.)
      const page = db.prepare('SELECT * FROM audit_events WHERE seq > ? ORDER BY seq LIMIT 1000');
      let seq = 0;
      for (let after = 0; ;) {
        const rows = page.all(after) as Record<string, unknown>[];
        if (rows.length === 0) break;
        for (const r of rows) {
          const { seq: oldSeq, hash, ...content } = r;
          after = oldSeq as number;
          // The content exactly as it was hashed when it was written (see src/audit/chain.ts).
          const body = canonicalJson({
            ...content,
            resource: r.resource === null ? null : (JSON.parse(r.resource as string) as unknown),
            details: JSON.parse(r.details as string) as unknown,
          });
          insert.run({ ...content, seq: ++seq, body, hash });
        }
      }
      db.exec(`
        DROP TABLE audit_events;
        ALTER TABLE audit_log RENAME TO audit_events;
        CREATE INDEX audit_trace ON audit_events (trace_id, seq);
        CREATE INDEX audit_request ON audit_events (request_id, seq);
        CREATE INDEX audit_kind ON audit_events (kind, seq);
        CREATE INDEX audit_action ON audit_events (action, seq);
        CREATE INDEX audit_outcome ON audit_events (outcome, seq);
        CREATE INDEX audit_time ON audit_events (time, seq);
        CREATE INDEX audit_agent ON audit_events (agent_id, seq) WHERE agent_id IS NOT NULL;
        CREATE INDEX audit_user ON audit_events (user_id, seq) WHERE user_id IS NOT NULL;
        CREATE INDEX audit_tenant ON audit_events (tenant_id, seq) WHERE tenant_id IS NOT NULL;
      `);
      db.prepare("UPDATE meta SET value = ? WHERE key = 'audit_count'").run(String(seq));
    },
  },
  {
    version: 7,
    name: 'queue history indexes',
    sql: `
      -- Decided items, newest decision first (GET /v1/queue?status=approved|denied|expired): one
      -- index for a single status, one for several at once, each read backwards. Pending items
      -- have no row in either, so a decision that queues an item pays nothing for them.
      CREATE INDEX queue_decided_status ON queue_items (status, decided_at, id) WHERE status <> 'pending';
      CREATE INDEX queue_decided ON queue_items (decided_at, id) WHERE status <> 'pending';
    `,
  },
  {
    version: 8,
    name: 'policy history',
    sql: `
      -- Every revision's whole set, content-addressed: a module or data value is stored once by
      -- its sha256 however many revisions hold it. data_documents gains the sha256 of its value.
      CREATE TABLE policy_blobs (
        sha256 TEXT PRIMARY KEY,
        rego   TEXT NOT NULL
      ) STRICT;
      CREATE TABLE data_blobs (
        sha256 TEXT PRIMARY KEY,
        value  TEXT NOT NULL
      ) STRICT;
      CREATE TABLE revisions (
        revision INTEGER PRIMARY KEY,
        time     TEXT NOT NULL,
        actor    TEXT NOT NULL,
        message  TEXT,
        changes  TEXT NOT NULL,
        policies TEXT NOT NULL,
        data     TEXT NOT NULL
      ) STRICT;
      CREATE TABLE policy_versions (
        name     TEXT NOT NULL,
        version  INTEGER NOT NULL,
        revision INTEGER NOT NULL,
        sha256   TEXT NOT NULL,
        time     TEXT NOT NULL,
        actor    TEXT NOT NULL,
        deleted  INTEGER NOT NULL,
        PRIMARY KEY (name, version)
      ) STRICT;
      ALTER TABLE data_documents ADD COLUMN sha256 TEXT NOT NULL DEFAULT '';
    `,
    up: (db) => {
      // History begins with the live set as it stands: that revision is known exactly; earlier
      // ones are not (explanations of older decisions say so).
      const revision = Number(db.prepare("SELECT value FROM meta WHERE key = 'revision'").pluck().get());
      const docs = db.prepare('SELECT path, value FROM data_documents').all() as {
        path: string;
        value: string;
      }[];
      for (const d of docs) {
        const canonical = canonicalJson(JSON.parse(d.value));
        const sha = createHash('sha256').update(canonical).digest('hex');
        db.prepare('UPDATE data_documents SET sha256 = ? WHERE path = ?').run(sha, d.path);
        db.prepare('INSERT OR IGNORE INTO data_blobs (sha256, value) VALUES (?, ?)').run(sha, d.value);
      }
      if (revision === 0) return;
      const policies = db
        .prepare('SELECT name, rego, sha256, version, description, updated_at FROM policies ORDER BY name')
        .all() as {
        name: string;
        rego: string;
        sha256: string;
        version: number;
        description: string;
        updated_at: string;
      }[];
      const now = new Date().toISOString();
      for (const p of policies) {
        db.prepare('INSERT OR IGNORE INTO policy_blobs (sha256, rego) VALUES (?, ?)').run(p.sha256, p.rego);
        db.prepare(
          `INSERT INTO policy_versions (name, version, revision, sha256, time, actor, deleted)
           VALUES (?, ?, ?, ?, ?, 'system', 0)`,
        ).run(p.name, p.version, revision, p.sha256, p.updated_at);
      }
      db.prepare(
        `INSERT INTO revisions (revision, time, actor, message, changes, policies, data) VALUES (?, ?, 'system', ?, '[]', ?, ?)`,
      ).run(
        revision,
        now,
        'history begins: the live set when history was first recorded',
        JSON.stringify(
          policies.map(({ name, sha256, version, description }) => ({ name, sha256, version, description })),
        ),
        JSON.stringify(db.prepare('SELECT path, sha256 FROM data_documents ORDER BY path').all()),
      );
    },
  },
  {
    version: 9,
    name: 'webhooks and their outbox',
    sql: `
      CREATE TABLE webhooks (
        name       TEXT PRIMARY KEY,
        url        TEXT NOT NULL,
        events     TEXT NOT NULL,
        format     TEXT NOT NULL,
        secret     TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      -- The outbox: a delivery is written in the transaction of the change that causes it.
      CREATE TABLE webhook_deliveries (
        id              TEXT PRIMARY KEY,
        webhook         TEXT NOT NULL,
        type            TEXT NOT NULL,
        payload         TEXT NOT NULL,
        status          TEXT NOT NULL,
        attempts        INTEGER NOT NULL,
        next_attempt_at TEXT NOT NULL,
        last_status     INTEGER,
        last_error      TEXT,
        created_at      TEXT NOT NULL,
        delivered_at    TEXT
      ) STRICT;
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
      CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (webhook, id);
    `,
  },
  {
    version: 10,
    name: 'budgets, call-bound approvals, delegation',
    sql: `
      -- Budget counters (SPEC §13): one row per key, window length and fixed window, in
      -- micro-units so that sums are exact integers.
      CREATE TABLE limit_counters (
        key          TEXT NOT NULL,
        window_ms    INTEGER NOT NULL,
        window_start TEXT NOT NULL,
        window       TEXT NOT NULL,
        max          INTEGER NOT NULL,
        used         INTEGER NOT NULL,
        PRIMARY KEY (key, window_ms, window_start)
      ) STRICT;
      ALTER TABLE decisions ADD COLUMN request_digest TEXT;
      ALTER TABLE decisions ADD COLUMN policy_revision INTEGER;
      ALTER TABLE queue_items ADD COLUMN request_digest TEXT;
      ALTER TABLE queue_items ADD COLUMN policy_revision INTEGER;
      ALTER TABLE queue_items ADD COLUMN on_behalf_of TEXT;
      ALTER TABLE queue_items ADD COLUMN limits TEXT;
      ALTER TABLE tokens ADD COLUMN request_digest TEXT;
      ALTER TABLE tokens ADD COLUMN policy_revision INTEGER;
    `,
  },
  {
    // 11 is another change's number; the runner applies each version on its own, gaps allowed.
    version: 12,
    name: 'shadow policies',
    sql: `
      -- The shadow set (SPEC §11): candidate modules evaluated beside the live set. Shared by
      -- every process; meta.shadow_generation tells a process its copy is stale.
      CREATE TABLE shadow_policies (
        name   TEXT PRIMARY KEY,
        rego   TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        since  TEXT NOT NULL
      ) STRICT;
      INSERT INTO meta (key, value) VALUES ('shadow_generation', '0'), ('shadow_changed_at', '');
    `,
  },
  {
    version: 13,
    name: 'shadow tallies',
    sql: `
      -- The shadow report (GET /api/v1/shadow) per shadow generation, kept in each decision's
      -- transaction so that the report never reads the trail: counts, and the newest
      -- disagreements (the writer keeps 20 per generation).
      CREATE TABLE shadow_tallies (
        generation INTEGER NOT NULL,
        result     TEXT NOT NULL,
        live       TEXT NOT NULL,
        shadow     TEXT NOT NULL,
        n          INTEGER NOT NULL,
        PRIMARY KEY (generation, result, live, shadow)
      ) STRICT;
      CREATE TABLE shadow_samples (
        seq        INTEGER PRIMARY KEY,
        generation INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        live       TEXT NOT NULL,
        shadow     TEXT NOT NULL
      ) STRICT;
      CREATE INDEX shadow_samples_by_generation ON shadow_samples (generation, seq);
    `,
  },
  {
    version: 14,
    name: 'tokens by the key that minted them',
    sql: `
      -- Revoking an API key revokes the unexpired tokens it minted, in the key's transaction.
      CREATE INDEX tokens_by_minter ON tokens (minted_by, expires_at);
    `,
  },
  {
    version: 15,
    name: 'no next attempt for a settled webhook delivery',
    sql: `
      -- A delivered or failed delivery has no next attempt: next_attempt_at becomes nullable (a
      -- STRICT table is rebuilt for that), and settled rows lose the lease time they kept.
      CREATE TABLE webhook_deliveries_v15 (
        id              TEXT PRIMARY KEY,
        webhook         TEXT NOT NULL,
        type            TEXT NOT NULL,
        payload         TEXT NOT NULL,
        status          TEXT NOT NULL,
        attempts        INTEGER NOT NULL,
        next_attempt_at TEXT,
        last_status     INTEGER,
        last_error      TEXT,
        created_at      TEXT NOT NULL,
        delivered_at    TEXT
      ) STRICT;
      INSERT INTO webhook_deliveries_v15
        SELECT id, webhook, type, payload, status, attempts,
          CASE WHEN status = 'pending' THEN next_attempt_at END,
          last_status, last_error, created_at, delivered_at
        FROM webhook_deliveries;
      DROP TABLE webhook_deliveries;
      ALTER TABLE webhook_deliveries_v15 RENAME TO webhook_deliveries;
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
      CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (webhook, id);
    `,
  },
  {
    version: 16,
    name: 'signing-key rotation',
    sql: `
      -- Rotation (POST /api/v1/signing-keys/rotate): the active key is the one not retired; a
      -- retired key still verifies until verify_until (revoked: verify_until = retired_at).
      ALTER TABLE signing_keys ADD COLUMN retired_at TEXT;
      ALTER TABLE signing_keys ADD COLUMN verify_until TEXT;
      -- The key that signed each token; NULL for tokens minted before: the oldest key signed them.
      ALTER TABLE tokens ADD COLUMN signing_kid TEXT;
      CREATE INDEX tokens_by_signing_key ON tokens (signing_kid, expires_at);
    `,
  },
  {
    version: 17,
    name: "each token's agent",
    sql: `
      -- The agent a token acts for, so that a key bound to another agent cannot introspect or
      -- revoke it: an exchanged token's is its decision's (agent decisions only), a free-form
      -- token's that of the key that minted it (the admin principal has no row: none; a key
      -- stored under a reserved name before names were reserved cannot be told from it: none).
      ALTER TABLE tokens ADD COLUMN agent_id TEXT;
      UPDATE tokens SET agent_id = CASE
        WHEN request_id IS NOT NULL THEN
          (SELECT d.subject FROM decisions d WHERE d.request_id = tokens.request_id AND d.kind = 'agent')
        WHEN lower(tokens.minted_by) IN ('admin', 'system') THEN NULL
        ELSE (SELECT k.agent FROM api_keys k WHERE k.name = tokens.minted_by)
      END;
    `,
  },
  {
    version: 18,
    name: "each decision's and token's user",
    sql: `
      -- The user each decision and token was for, as audit events name one (SPEC §13): a human
      -- decision's user, or the user an agent acted on behalf of. A token names it (claim
      -- on_behalf_of) and its mint and revoke events carry it, so that the audit trail's user_id
      -- filter finds them. Earlier rows take it from their decision's audit event.
      ALTER TABLE decisions ADD COLUMN user_id TEXT;
      ALTER TABLE tokens ADD COLUMN user_id TEXT;
      -- Only the rows that get a user are written (most agent decisions act for no user).
      UPDATE decisions SET user_id = subject WHERE kind = 'human';
      UPDATE decisions SET user_id = (SELECT a.user_id FROM audit_events a
          WHERE a.request_id = decisions.request_id AND a.kind = 'decision' AND a.user_id IS NOT NULL
          ORDER BY a.seq LIMIT 1)
        WHERE kind = 'agent' AND EXISTS (SELECT 1 FROM audit_events a
          WHERE a.request_id = decisions.request_id AND a.kind = 'decision' AND a.user_id IS NOT NULL);
      UPDATE tokens SET user_id = (SELECT d.user_id FROM decisions d WHERE d.request_id = tokens.request_id)
        WHERE request_id IS NOT NULL AND EXISTS (SELECT 1 FROM decisions d
          WHERE d.request_id = tokens.request_id AND d.user_id IS NOT NULL);
    `,
  },
  {
    version: 19,
    name: 'webhook deliveries due, by webhook',
    sql: `
      -- A claim takes each webhook's earliest due deliveries up to its share: this index reads
      -- just those, however many are due (a receiver that hangs drains 8 per 10 s and its backlog
      -- grows meanwhile; ranking every due row on each claim blocked decisions, soak probe).
      CREATE INDEX webhook_deliveries_claim ON webhook_deliveries (webhook, next_attempt_at, id)
        WHERE status = 'pending';
    `,
  },
  {
    version: 20,
    name: 'pending approvals, by key',
    sql: `
      -- The cap on one API key's pending approvals (ARBITER_QUEUE_MAX_PENDING_PER_KEY) counts them
      -- in each decision's transaction: this index reads a key's unexpired pending items only.
      CREATE INDEX queue_pending_by_key ON queue_items (requested_by, expires_at) WHERE status = 'pending';
    `,
  },
  {
    version: 21,
    name: 'decided queue items, by tenant and by agent',
    sql: `
      -- A page of decided items reads one index in (decided_at, id) order. With these, a key bound to
      -- a tenant (or an agent), and a filter by either, reads that tenant's (agent's) items only:
      -- through (decided_at, id) it read every tenant's to find its own, O(store) for each page, and
      -- a bounded page there would count other tenants' items (docs/decisions.md). Pending items
      -- have no row in either.
      CREATE INDEX queue_decided_tenant ON queue_items (tenant_id, decided_at, id) WHERE status <> 'pending';
      CREATE INDEX queue_decided_agent ON queue_items (agent_id, decided_at, id) WHERE status <> 'pending';
    `,
  },
];
