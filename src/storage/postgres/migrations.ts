import type { Logger } from '../../observability/logger.js';
import {
  migrationFailed,
  newestVersion,
  refusedAtStart,
  SCHEMA_VERSION,
  unknownMigrations,
} from '../failure.js';
import { rows, tx, type Pool } from './pool.js';

/**
 * The PostgreSQL schema, as numbered forward-only migrations (a released one is never edited; a
 * change is a new entry). Times are ISO 8601 text, as in SQLite, so both backends order and
 * compare them the same way; JSON values are text, stored exactly as written.
 */
export const migrations: readonly { version: number; name: string; sql: string }[] = [
  {
    version: 1,
    name: 'initial schema',
    sql: `
      CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
      INSERT INTO meta (key, value) VALUES ('revision', '0'), ('seeded', '0'),
        ('audit_head', '${'0'.repeat(64)}'), ('audit_count', '0');

      CREATE TABLE api_keys (
        id text PRIMARY KEY, name text NOT NULL UNIQUE, hash text NOT NULL, scopes text NOT NULL,
        tenant text, agent text, created_at text NOT NULL, revoked_at text);

      CREATE TABLE policies (
        name text PRIMARY KEY, description text NOT NULL, rego text NOT NULL, sha256 text NOT NULL,
        version integer NOT NULL, updated_at text NOT NULL);
      CREATE TABLE data_documents (
        path text PRIMARY KEY, value text NOT NULL, sha256 text NOT NULL, updated_at text NOT NULL);
      CREATE TABLE policy_blobs (sha256 text PRIMARY KEY, rego text NOT NULL);
      CREATE TABLE data_blobs (sha256 text PRIMARY KEY, value text NOT NULL);
      CREATE TABLE revisions (
        revision bigint PRIMARY KEY, time text NOT NULL, actor text NOT NULL, message text,
        changes text NOT NULL, policies text NOT NULL, data text NOT NULL);
      CREATE TABLE policy_versions (
        name text NOT NULL, version integer NOT NULL, revision bigint NOT NULL, sha256 text NOT NULL,
        time text NOT NULL, actor text NOT NULL, deleted boolean NOT NULL, PRIMARY KEY (name, version));
      CREATE TABLE compiled_sets (set_hash text PRIMARY KEY, wasm bytea NOT NULL, created_at text NOT NULL);

      -- Each event is kept as body, the canonical JSON its hash covers; the other columns are
      -- copies that filters use (verification checks them against body).
      CREATE TABLE audit_events (
        seq bigint PRIMARY KEY, time text NOT NULL, kind text NOT NULL, trace_id text, request_id text,
        agent_id text, user_id text, tenant_id text, action text, outcome text,
        body text NOT NULL, hash text NOT NULL);
      CREATE INDEX audit_trace ON audit_events (trace_id, seq);
      CREATE INDEX audit_request ON audit_events (request_id, seq);
      CREATE INDEX audit_kind ON audit_events (kind, seq);
      CREATE INDEX audit_action ON audit_events (action, seq);
      CREATE INDEX audit_outcome ON audit_events (outcome, seq);
      CREATE INDEX audit_time ON audit_events (time, seq);
      CREATE INDEX audit_agent ON audit_events (agent_id, seq) WHERE agent_id IS NOT NULL;
      CREATE INDEX audit_user ON audit_events (user_id, seq) WHERE user_id IS NOT NULL;
      CREATE INDEX audit_tenant ON audit_events (tenant_id, seq) WHERE tenant_id IS NOT NULL;

      CREATE TABLE queue_items (
        id text PRIMARY KEY, status text NOT NULL, kind text NOT NULL, agent_id text, user_id text,
        tenant_id text, action text NOT NULL, resource text NOT NULL, confidence double precision,
        context text NOT NULL, message text NOT NULL, trace_id text NOT NULL, created_at text NOT NULL,
        expires_at text NOT NULL, decided_at text, decided_by text, note text, requested_by text NOT NULL);
      CREATE INDEX queue_pending_id ON queue_items (status, id);
      CREATE INDEX queue_pending_expiry ON queue_items (expires_at) WHERE status = 'pending';
      CREATE INDEX queue_decided_status ON queue_items (status, decided_at, id) WHERE status <> 'pending';
      CREATE INDEX queue_decided ON queue_items (decided_at, id) WHERE status <> 'pending';

      CREATE TABLE decisions (
        request_id text PRIMARY KEY, kind text NOT NULL, status text NOT NULL, key_id text NOT NULL,
        tenant_id text, subject text NOT NULL, action text NOT NULL, resource text NOT NULL, message text,
        trace_id text NOT NULL, created_at text NOT NULL, expires_at text, idem_key text, body_hash text,
        token_id text);
      CREATE UNIQUE INDEX decisions_idempotency ON decisions (key_id, idem_key) WHERE idem_key IS NOT NULL;

      CREATE TABLE tokens (
        id text PRIMARY KEY, request_id text, subject text NOT NULL, scopes text NOT NULL,
        audience text NOT NULL, tenant_id text, issued_at text NOT NULL, expires_at text NOT NULL,
        revoked_at text, minted_by text NOT NULL, trace_id text);
      CREATE TABLE signing_keys (
        kid text PRIMARY KEY, private_jwk text NOT NULL, public_jwk text NOT NULL, created_at text NOT NULL);
    `,
  },
  {
    version: 2,
    name: 'webhooks and their outbox',
    sql: `
      CREATE TABLE webhooks (
        name text PRIMARY KEY, url text NOT NULL, events text NOT NULL, format text NOT NULL,
        secret text NOT NULL, created_at text NOT NULL, updated_at text NOT NULL);
      -- The outbox: a delivery is written in the transaction of the change that causes it.
      CREATE TABLE webhook_deliveries (
        id text PRIMARY KEY, webhook text NOT NULL, type text NOT NULL, payload text NOT NULL,
        status text NOT NULL, attempts integer NOT NULL, next_attempt_at text NOT NULL,
        last_status integer, last_error text, created_at text NOT NULL, delivered_at text);
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
      CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (webhook, id);
    `,
  },
  {
    version: 3,
    name: 'budgets, call-bound approvals, delegation',
    sql: `
      CREATE TABLE limit_counters (
        key text NOT NULL, window_ms bigint NOT NULL, window_start text NOT NULL, "window" text NOT NULL,
        max bigint NOT NULL, used bigint NOT NULL, PRIMARY KEY (key, window_ms, window_start));
      ALTER TABLE decisions ADD COLUMN request_digest text, ADD COLUMN policy_revision bigint;
      ALTER TABLE queue_items ADD COLUMN request_digest text, ADD COLUMN policy_revision bigint,
        ADD COLUMN on_behalf_of text, ADD COLUMN limits text;
      ALTER TABLE tokens ADD COLUMN request_digest text, ADD COLUMN policy_revision bigint;
    `,
  },
  {
    // 4 is another change's number; the runner applies each version on its own, gaps allowed.
    version: 5,
    name: 'shadow policies',
    sql: `
      CREATE TABLE shadow_policies (
        name text PRIMARY KEY, rego text NOT NULL, sha256 text NOT NULL, since text NOT NULL);
      INSERT INTO meta (key, value) VALUES ('shadow_generation', '0'), ('shadow_changed_at', '');
    `,
  },
  {
    version: 6,
    name: 'shadow tallies',
    sql: `
      CREATE TABLE shadow_tallies (
        generation bigint NOT NULL, result text NOT NULL, live text NOT NULL, shadow text NOT NULL,
        n bigint NOT NULL, PRIMARY KEY (generation, result, live, shadow));
      CREATE TABLE shadow_samples (
        seq bigserial PRIMARY KEY, generation bigint NOT NULL, request_id text NOT NULL,
        live text NOT NULL, shadow text NOT NULL);
      CREATE INDEX shadow_samples_by_generation ON shadow_samples (generation, seq);
    `,
  },
  {
    version: 7,
    name: 'tokens by the key that minted them',
    sql: `
      -- Revoking an API key revokes the unexpired tokens it minted, in the key's transaction.
      CREATE INDEX tokens_by_minter ON tokens (minted_by, expires_at);
    `,
  },
  {
    version: 8,
    name: 'no next attempt for a settled webhook delivery',
    sql: `
      -- A delivered or failed delivery has no next attempt (it kept the lease time of its last).
      ALTER TABLE webhook_deliveries ALTER COLUMN next_attempt_at DROP NOT NULL;
      UPDATE webhook_deliveries SET next_attempt_at = NULL WHERE status <> 'pending';
    `,
  },
  {
    version: 9,
    name: 'signing-key rotation',
    sql: `
      -- The active key is the one not retired; a retired key verifies until verify_until.
      ALTER TABLE signing_keys ADD COLUMN retired_at text, ADD COLUMN verify_until text;
      -- The key that signed each token; NULL for tokens minted before: the oldest key signed them.
      ALTER TABLE tokens ADD COLUMN signing_kid text;
      CREATE INDEX tokens_by_signing_key ON tokens (signing_kid, expires_at);
    `,
  },
  {
    version: 10,
    name: "each token's agent",
    sql: `
      -- The agent a token acts for, so that a key bound to another agent cannot introspect or
      -- revoke it: an exchanged token's is its decision's (agent decisions only), a free-form
      -- token's that of the key that minted it (the admin principal has no row: none; a key
      -- stored under a reserved name before names were reserved cannot be told from it: none).
      ALTER TABLE tokens ADD COLUMN agent_id text;
      UPDATE tokens SET agent_id = CASE
        WHEN request_id IS NOT NULL THEN
          (SELECT d.subject FROM decisions d WHERE d.request_id = tokens.request_id AND d.kind = 'agent')
        WHEN lower(tokens.minted_by) IN ('admin', 'system') THEN NULL
        ELSE (SELECT k.agent FROM api_keys k WHERE k.name = tokens.minted_by)
      END;
    `,
  },
  {
    version: 11,
    name: "each decision's and token's user",
    sql: `
      -- The user each decision and token was for, as audit events name one (SPEC §13): a human
      -- decision's user, or the user an agent acted on behalf of. A token names it (claim
      -- on_behalf_of) and its mint and revoke events carry it, so that the audit trail's user_id
      -- filter finds them. Earlier rows take it from their decision's audit event.
      ALTER TABLE decisions ADD COLUMN user_id text;
      ALTER TABLE tokens ADD COLUMN user_id text;
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
    version: 12,
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
    version: 13,
    name: 'pending approvals, by key',
    sql: `
      -- The cap on one API key's pending approvals (ARBITER_QUEUE_MAX_PENDING_PER_KEY) counts them
      -- in each decision's transaction: this index reads a key's unexpired pending items only.
      CREATE INDEX queue_pending_by_key ON queue_items (requested_by, expires_at) WHERE status = 'pending';
    `,
  },
  {
    version: 14,
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

const APPLIED = 'SELECT version, name FROM schema_migrations ORDER BY version';

/** Why this build must not use the database (see unknownMigrations), or undefined. */
export async function schemaProblem(pool: Pool): Promise<string | undefined> {
  return unknownMigrations(await rows<{ version: number; name: string }>(pool, APPLIED), migrations);
}

/**
 * Locks the chain head and the recorded schema version, in key order, and reads them: every
 * append (lockHead) and every migrating start take these rows first, so no append of an older
 * build can be between its read of the schema version and its commit while a migration runs.
 */
export const LOCK_HEAD = `SELECT key, value FROM meta WHERE key IN ('audit_count', 'audit_head', '${SCHEMA_VERSION}')
  ORDER BY key FOR UPDATE`;

/** Any fixed number: the key of the advisory lock that serializes migrations across processes. */
const MIGRATION_LOCK = 7_106_652_481;

/**
 * Brings the schema up to date under a transaction-scoped advisory lock, so any number of
 * processes may start at once against an empty database: one migrates, the others wait and then
 * find nothing left to do.
 *
 * The chain head is locked first (appends wait meanwhile), and the newest version this build
 * knows is recorded in meta `schema_version` in the same transaction, created if missing (an
 * existing row, because an append blocked on the lock sees a row updated meanwhile but not one
 * inserted), never lowered: an append of an older build that waited for the head reads it and
 * refuses (lockHead), rather than writing rows without what the new migrations add.
 *
 * With `upgrade: false` (the CLI) an older schema is refused (refusedAtStart) and a fresh one created.
 */
export async function migrate(pool: Pool, log?: Logger, opts: { upgrade?: boolean } = {}): Promise<void> {
  await tx(pool, async (c) => {
    await c.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
    await c.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)`);
    const hasMeta = (await c.query<{ t: string | null }>("SELECT to_regclass('meta') AS t")).rows[0]?.t;
    const head = hasMeta ? (await c.query<{ key: string; value: string }>(LOCK_HEAD)).rows : [];
    const applied = (await c.query<{ version: number; name: string }>(APPLIED)).rows;
    // Checked under the locks: a newer Arbiter's schema is never migrated or served by this one.
    const refused = refusedAtStart(applied, head, migrations, opts.upgrade !== false);
    if (refused !== undefined) throw new Error(refused);
    const done = new Set(applied.map((r) => r.version));
    for (const m of migrations) {
      if (done.has(m.version)) continue;
      // One transaction for them all: a failure rolls every one of this start's back.
      await c.query(m.sql).catch((e: unknown) => {
        throw migrationFailed(m, e);
      });
      await c.query('INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)', [
        m.version,
        m.name,
        new Date().toISOString(),
      ]);
      log?.info({ version: m.version, name: m.name }, 'database migrated');
    }
    // Never lowered: a newer or unreadable one was refused above.
    await c.query(
      `INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
       WHERE meta.value::integer < EXCLUDED.value::integer`,
      [SCHEMA_VERSION, String(newestVersion(migrations))],
    );
  });
}
