/**
 * Versioned schema migrations. Append only: a released migration is never edited; a change is a
 * new entry. Each runs in its own transaction and is recorded in schema_migrations.
 */
export const migrations: readonly { version: number; name: string; sql: string }[] = [
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
];
