import type { Statement } from 'better-sqlite3';
import { eventHash, GENESIS_HASH } from '../../audit/chain.js';
import type { AuditStore } from '../../audit/store.js';
import type { AuditEvent, NewAuditEvent } from '../../audit/types.js';
import type { DecisionStore } from '../../decisions/store.js';
import { newId } from '../../ids.js';
import type { ApiKeyRecord, KeyStore, Scope } from '../../keys/types.js';
import type { DataDocument, PolicyRecord, PolicySnapshot, PolicyStore } from '../../policy/types.js';
import type { QueueItem } from '../../queue/types.js';
import type { Db } from './db.js';

type Row = Record<string, unknown>;

const AUDIT_COLUMNS = [
  'id',
  'time',
  'kind',
  'trace_id',
  'request_id',
  'actor',
  'agent_id',
  'user_id',
  'tenant_id',
  'action',
  'resource',
  'outcome',
  'message',
  'confidence',
  'policy_revision',
  'latency_us',
  'details',
  'hash',
  'prev_hash',
] as const;

/**
 * Appends audit events inside the caller's transaction: reads the chain head, links each event to
 * the one before it and inserts. Must run inside an IMMEDIATE transaction so the head cannot move.
 */
class AuditWriter {
  private readonly head: Statement;
  private readonly insert: Statement;
  constructor(db: Db) {
    this.head = db.prepare('SELECT hash FROM audit_events ORDER BY seq DESC LIMIT 1').pluck();
    this.insert = db.prepare(
      `INSERT INTO audit_events (${AUDIT_COLUMNS.join(', ')}) VALUES (${AUDIT_COLUMNS.map((c) => '@' + c).join(', ')})`,
    );
  }

  appendInTx(events: NewAuditEvent[]): AuditEvent[] {
    let prev = (this.head.get() as string | undefined) ?? GENESIS_HASH;
    const out: AuditEvent[] = [];
    for (const e of events) {
      const base: Omit<AuditEvent, 'hash'> = {
        id: e.id ?? newId(),
        time: e.time ?? new Date().toISOString(),
        kind: e.kind,
        trace_id: e.trace_id ?? null,
        request_id: e.request_id ?? null,
        actor: e.actor ?? null,
        agent_id: e.agent_id ?? null,
        user_id: e.user_id ?? null,
        tenant_id: e.tenant_id ?? null,
        action: e.action ?? null,
        resource: e.resource ?? null,
        outcome: e.outcome ?? null,
        message: e.message ?? null,
        confidence: e.confidence ?? null,
        policy_revision: e.policy_revision ?? null,
        latency_us: e.latency_us ?? null,
        details: e.details ?? {},
        prev_hash: prev,
      };
      const event: AuditEvent = { ...base, hash: eventHash(base) };
      this.insert.run({
        ...event,
        resource: event.resource === null ? null : JSON.stringify(event.resource),
        details: JSON.stringify(event.details),
      });
      out.push(event);
      prev = event.hash;
    }
    return out;
  }
}

export function auditFromRow(r: Row): AuditEvent {
  return {
    ...(r as unknown as AuditEvent),
    resource: r.resource === null ? null : JSON.parse(r.resource as string),
    details: JSON.parse(r.details as string) as Record<string, unknown>,
  };
}

export class SqliteAuditStore implements AuditStore {
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {}

  async append(events: NewAuditEvent[]): Promise<AuditEvent[]> {
    return this.db.transaction(() => this.writer.appendInTx(events)).immediate();
  }

  *iterate(): Iterable<AuditEvent> {
    const stmt = this.db.prepare(`SELECT ${AUDIT_COLUMNS.join(', ')} FROM audit_events ORDER BY seq`);
    for (const r of stmt.iterate()) yield auditFromRow(r as Row);
  }

  async count(): Promise<number> {
    return this.db.prepare('SELECT count(*) FROM audit_events').pluck().get() as number;
  }
}

export class SqliteDecisionStore implements DecisionStore {
  private readonly insertQueue: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.insertQueue =
      db.prepare(`INSERT INTO queue_items (id, status, kind, agent_id, user_id, tenant_id, action,
      resource, confidence, context, message, trace_id, created_at, expires_at, decided_at, decided_by, note,
      requested_by) VALUES (@id, @status, @kind, @agent_id, @user_id, @tenant_id, @action, @resource, @confidence,
      @context, @message, @trace_id, @created_at, @expires_at, @decided_at, @decided_by, @note, @requested_by)`);
  }

  async record(event: NewAuditEvent, item: QueueItem | undefined): Promise<AuditEvent> {
    return this.db
      .transaction(() => {
        if (item) {
          this.insertQueue.run({
            ...item,
            resource: JSON.stringify(item.resource),
            context: JSON.stringify(item.context),
          });
        }
        return this.writer.appendInTx([event])[0] as AuditEvent;
      })
      .immediate();
  }
}

function keyFromRow(r: Row): ApiKeyRecord {
  return { ...(r as unknown as ApiKeyRecord), scopes: JSON.parse(r.scopes as string) as Scope[] };
}

export class SqliteKeyStore implements KeyStore {
  private readonly byId: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM api_keys WHERE id = ?');
  }

  async create(rec: ApiKeyRecord, event: NewAuditEvent): Promise<void> {
    this.db
      .transaction(() => {
        this.db
          .prepare(
            `INSERT INTO api_keys (id, name, hash, scopes, tenant, agent, created_at, revoked_at)
             VALUES (@id, @name, @hash, @scopes, @tenant, @agent, @created_at, @revoked_at)`,
          )
          .run({ ...rec, scopes: JSON.stringify(rec.scopes) });
        this.writer.appendInTx([event]);
      })
      .immediate();
  }

  async findById(id: string): Promise<ApiKeyRecord | undefined> {
    const r = this.byId.get(id) as Row | undefined;
    return r && keyFromRow(r);
  }

  async findByName(name: string): Promise<ApiKeyRecord | undefined> {
    const r = this.db.prepare('SELECT * FROM api_keys WHERE name = ?').get(name) as Row | undefined;
    return r && keyFromRow(r);
  }

  async list(): Promise<ApiKeyRecord[]> {
    return (this.db.prepare('SELECT * FROM api_keys ORDER BY created_at, name').all() as Row[]).map(
      keyFromRow,
    );
  }

  async revoke(name: string, at: string, event: NewAuditEvent): Promise<ApiKeyRecord | undefined> {
    return this.db
      .transaction(() => {
        const r = this.db.prepare('SELECT * FROM api_keys WHERE name = ?').get(name) as Row | undefined;
        if (!r) return undefined;
        if (r.revoked_at === null) {
          this.db.prepare('UPDATE api_keys SET revoked_at = ? WHERE name = ?').run(at, name);
          this.writer.appendInTx([event]);
          r.revoked_at = at;
        }
        return keyFromRow(r);
      })
      .immediate();
  }
}

export class SqlitePolicyStore implements PolicyStore {
  private readonly getRevision: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.getRevision = db.prepare("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'revision'").pluck();
  }

  private bump(): number {
    this.db
      .prepare("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'revision'")
      .run();
    return this.getRevision.get() as number;
  }

  async revision(): Promise<number> {
    return this.getRevision.get() as number;
  }

  async snapshot(): Promise<PolicySnapshot> {
    return this.db.transaction(() => ({
      revision: this.getRevision.get() as number,
      policies: this.db.prepare('SELECT * FROM policies ORDER BY name').all() as PolicyRecord[],
      data: (this.db.prepare('SELECT * FROM data_documents ORDER BY path').all() as Row[]).map((r) => ({
        path: r.path as string,
        value: JSON.parse(r.value as string) as unknown,
        updated_at: r.updated_at as string,
      })),
      seeded: this.db.prepare("SELECT value FROM meta WHERE key = 'seeded'").pluck().get() === '1',
    }))();
  }

  async putPolicy(
    p: Omit<PolicyRecord, 'version' | 'updated_at'>,
    ifVersion: number | undefined,
    event: (revision: number) => NewAuditEvent,
  ) {
    return this.db
      .transaction(() => {
        const cur = this.db.prepare('SELECT version FROM policies WHERE name = ?').pluck().get(p.name) as
          number | undefined;
        if (ifVersion !== undefined && (cur ?? 0) !== ifVersion) return 'conflict' as const;
        const policy: PolicyRecord = { ...p, version: (cur ?? 0) + 1, updated_at: new Date().toISOString() };
        this.db
          .prepare(
            `INSERT INTO policies (name, description, rego, sha256, version, updated_at)
             VALUES (@name, @description, @rego, @sha256, @version, @updated_at)
             ON CONFLICT (name) DO UPDATE SET description = excluded.description, rego = excluded.rego,
               sha256 = excluded.sha256, version = excluded.version, updated_at = excluded.updated_at`,
          )
          .run(policy);
        const revision = this.bump();
        this.writer.appendInTx([event(revision)]);
        return { policy, created: cur === undefined, revision };
      })
      .immediate();
  }

  async deletePolicy(
    name: string,
    ifVersion: number | undefined,
    event: (revision: number) => NewAuditEvent,
  ) {
    return this.db
      .transaction(() => {
        const cur = this.db.prepare('SELECT version FROM policies WHERE name = ?').pluck().get(name) as
          number | undefined;
        if (cur === undefined) return 'absent' as const;
        if (ifVersion !== undefined && cur !== ifVersion) return 'conflict' as const;
        this.db.prepare('DELETE FROM policies WHERE name = ?').run(name);
        const revision = this.bump();
        this.writer.appendInTx([event(revision)]);
        return { revision };
      })
      .immediate();
  }

  async putData(path: string, value: unknown, event: (revision: number) => NewAuditEvent) {
    return this.db
      .transaction(() => {
        const exists = this.db.prepare('SELECT 1 FROM data_documents WHERE path = ?').pluck().get(path) === 1;
        const doc: DataDocument = { path, value, updated_at: new Date().toISOString() };
        this.db
          .prepare(
            `INSERT INTO data_documents (path, value, updated_at) VALUES (?, ?, ?)
             ON CONFLICT (path) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`,
          )
          .run(path, JSON.stringify(value), doc.updated_at);
        const revision = this.bump();
        this.writer.appendInTx([event(revision)]);
        return { created: !exists, revision, doc };
      })
      .immediate();
  }

  async deleteData(path: string, event: (revision: number) => NewAuditEvent) {
    return this.db
      .transaction(() => {
        if (this.db.prepare('DELETE FROM data_documents WHERE path = ?').run(path).changes === 0) {
          return 'absent' as const;
        }
        const revision = this.bump();
        this.writer.appendInTx([event(revision)]);
        return { revision };
      })
      .immediate();
  }

  async seed(
    policies: Omit<PolicyRecord, 'version' | 'updated_at'>[],
    data: { path: string; value: unknown }[],
    event: (revision: number) => NewAuditEvent,
  ): Promise<boolean> {
    return this.db
      .transaction(() => {
        if (this.db.prepare("SELECT value FROM meta WHERE key = 'seeded'").pluck().get() === '1')
          return false;
        const now = new Date().toISOString();
        const insP = this.db.prepare(
          `INSERT INTO policies (name, description, rego, sha256, version, updated_at)
           VALUES (@name, @description, @rego, @sha256, 1, @now)`,
        );
        for (const p of policies) insP.run({ ...p, now });
        const insD = this.db.prepare('INSERT INTO data_documents (path, value, updated_at) VALUES (?, ?, ?)');
        for (const d of data) insD.run(d.path, JSON.stringify(d.value), now);
        this.db.prepare("UPDATE meta SET value = '1' WHERE key = 'seeded'").run();
        const revision = this.bump();
        this.writer.appendInTx([event(revision)]);
        return true;
      })
      .immediate();
  }
}

/** All SQLite-backed stores over one connection. */
export function sqliteStores(db: Db) {
  const writer = new AuditWriter(db);
  return {
    audit: new SqliteAuditStore(db, writer),
    decisions: new SqliteDecisionStore(db, writer),
    keys: new SqliteKeyStore(db, writer),
    policies: new SqlitePolicyStore(db, writer),
    /** Cheap liveness probe for /healthz. */
    ping(): boolean {
      return db.prepare('SELECT 1').pluck().get() === 1;
    },
    close(): void {
      db.close();
    },
  };
}
export type Stores = ReturnType<typeof sqliteStores>;
