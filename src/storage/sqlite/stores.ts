import type { Statement } from 'better-sqlite3';
import { eventHash, GENESIS_HASH } from '../../audit/chain.js';
import { AUDIT_EQUALITY_FILTERS, type AuditFilter, type AuditStore } from '../../audit/store.js';
import { AUDIT_FIELDS, type AuditEvent, type NewAuditEvent } from '../../audit/types.js';
import type { DecisionRecord, DecisionStore, RecordOutcome } from '../../decisions/store.js';
import { newId } from '../../ids.js';
import type { ApiKeyRecord, KeyStore, Scope } from '../../keys/types.js';
import type { DataDocument, PolicyRecord, PolicySnapshot, PolicyStore } from '../../policy/types.js';
import type { DecideOutcome, PendingFilter, QueueStore } from '../../queue/store.js';
import type { QueueItem } from '../../queue/types.js';
import type { SigningKeyRecord, TokenRecord, TokenStore } from '../../tokens/types.js';
import type { Db } from './db.js';

type Row = Record<string, unknown>;

/** Compiled sets kept: the live one and a few recent ones (a rollback loads without compiling). */
const KEEP_COMPILED_SETS = 8;

const AUDIT_COLUMNS = AUDIT_FIELDS;

/**
 * Appends audit events inside the caller's transaction: reads the chain head, links each event to
 * the one before it and inserts. Must run inside an IMMEDIATE transaction so the head cannot move.
 */
export class AuditWriter {
  private readonly head: Statement;
  private readonly insert: Statement;
  private readonly setHead: Statement;
  constructor(
    db: Db,
    private readonly onAppend: (kinds: string[]) => void,
  ) {
    this.head = db.prepare('SELECT hash FROM audit_events ORDER BY seq DESC LIMIT 1').pluck();
    this.setHead = db.prepare(`UPDATE meta SET value = CASE key WHEN 'audit_head' THEN @head
      ELSE CAST(CAST(value AS INTEGER) + @n AS TEXT) END WHERE key IN ('audit_head', 'audit_count')`);
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
    this.setHead.run({ head: prev, n: out.length });
    // Reported after the caller's transaction commits would be more exact; a rollback after this
    // point only happens on a storage failure, which already fails the request.
    this.onAppend(out.map((e) => e.kind));
    return out;
  }
}

export function auditFromRow(r: Row): AuditEvent {
  const { seq: _seq, ...rest } = r;
  return {
    ...(rest as unknown as AuditEvent),
    resource: r.resource === null ? null : JSON.parse(r.resource as string),
    details: JSON.parse(r.details as string) as Record<string, unknown>,
  };
}

export class SqliteAuditStore implements AuditStore {
  private readonly cols = `seq, ${AUDIT_COLUMNS.join(', ')}`;
  private readonly byTrace: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byTrace = db.prepare(
      `SELECT ${this.cols} FROM audit_events WHERE trace_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
    );
  }

  async append(events: NewAuditEvent[]): Promise<AuditEvent[]> {
    return this.db.transaction(() => this.writer.appendInTx(events)).immediate();
  }

  async query(f: AuditFilter): Promise<{ seq: number; event: AuditEvent }[]> {
    const where: string[] = [];
    const params: Record<string, unknown> = { limit: f.limit };
    for (const c of AUDIT_EQUALITY_FILTERS) {
      if (f[c] !== undefined) {
        where.push(`${c} = @${c}`);
        params[c] = f[c];
      }
    }
    if (f.since !== undefined) {
      where.push('time >= @since');
      params.since = f.since;
    }
    if (f.until !== undefined) {
      where.push('time < @until');
      params.until = f.until;
    }
    const byTime = f.since !== undefined || f.until !== undefined;
    if (f.before !== undefined) {
      if (byTime) {
        where.push('(time, seq) < (@beforeTime, @beforeSeq)');
        params.beforeTime = f.before.time ?? '';
      } else {
        where.push('seq < @beforeSeq');
      }
      params.beforeSeq = f.before.seq;
    }
    const sql = `SELECT ${this.cols} FROM audit_events ${where.length ? 'WHERE ' + where.join(' AND ') : ''}
      ORDER BY ${byTime ? 'time DESC, seq DESC' : 'seq DESC'} LIMIT @limit`;
    return (this.db.prepare(sql).all(params) as Row[]).map((r) => ({
      seq: r.seq as number,
      event: auditFromRow(r),
    }));
  }

  async trace(
    traceId: string,
    afterSeq: number,
    limit: number,
  ): Promise<{ seq: number; event: AuditEvent }[]> {
    return (this.byTrace.all(traceId, afterSeq, limit) as Row[]).map((r) => ({
      seq: r.seq as number,
      event: auditFromRow(r),
    }));
  }

  async chunk(afterSeq: number, limit: number): Promise<(AuditEvent & { seq: number })[]> {
    const rows = this.db
      .prepare(`SELECT ${this.cols} FROM audit_events WHERE seq > ? ORDER BY seq LIMIT ?`)
      .all(afterSeq, limit) as Row[];
    return rows.map((r) => ({ ...auditFromRow(r), seq: r.seq as number }));
  }

  async head(): Promise<{ hash: string; count: number }> {
    const rows = this.db
      .prepare("SELECT key, value FROM meta WHERE key IN ('audit_head', 'audit_count')")
      .all() as { key: string; value: string }[];
    const get = (k: string) => rows.find((r) => r.key === k)?.value;
    return { hash: get('audit_head') ?? GENESIS_HASH, count: Number(get('audit_count') ?? '0') };
  }
}

function queueFromRow(r: Row): QueueItem {
  return {
    ...(r as unknown as QueueItem),
    resource: JSON.parse(r.resource as string) as unknown,
    context: JSON.parse(r.context as string) as Record<string, unknown>,
  };
}

function decisionFromRow(r: Row): DecisionRecord {
  return { ...(r as unknown as DecisionRecord), resource: JSON.parse(r.resource as string) as unknown };
}

export type RecordArgs = [DecisionRecord, NewAuditEvent, QueueItem | undefined, string];

/**
 * Writes batches of decisions: each decision row, its queue item and its audit event, all
 * decisions of a batch in one IMMEDIATE transaction (one fsync). Idempotency is resolved inside
 * the transaction, so two retries in one batch replay correctly. Synchronous; used in-process or
 * from the writer thread.
 */
export class DecisionWriter {
  private readonly insertQueue: Statement;
  private readonly insertDecision: Statement;
  private readonly byIdem: Statement;
  private readonly clearIdem: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.insertQueue =
      db.prepare(`INSERT INTO queue_items (id, status, kind, agent_id, user_id, tenant_id, action,
      resource, confidence, context, message, trace_id, created_at, expires_at, decided_at, decided_by, note,
      requested_by) VALUES (@id, @status, @kind, @agent_id, @user_id, @tenant_id, @action, @resource, @confidence,
      @context, @message, @trace_id, @created_at, @expires_at, @decided_at, @decided_by, @note, @requested_by)`);
    this.insertDecision =
      db.prepare(`INSERT INTO decisions (request_id, kind, status, key_id, tenant_id, subject,
      action, resource, message, trace_id, created_at, expires_at, idem_key, body_hash, token_id) VALUES
      (@request_id, @kind, @status, @key_id, @tenant_id, @subject, @action, @resource, @message, @trace_id,
      @created_at, @expires_at, @idem_key, @body_hash, @token_id)`);
    this.byIdem = db.prepare('SELECT * FROM decisions WHERE key_id = ? AND idem_key = ?');
    this.clearIdem = db.prepare('UPDATE decisions SET idem_key = NULL WHERE key_id = ? AND idem_key = ?');
  }

  recordBatch(batch: RecordArgs[]): RecordOutcome[] {
    return this.db
      .transaction(() => {
        // Rows first (idempotency replays within the batch see earlier rows), then every audit
        // event of the batch in one append: one chain-head read and one head update per batch.
        const outcomes: (RecordOutcome | NewAuditEvent)[] = batch.map((args) => this.recordRow(...args));
        const events = this.writer.appendInTx(outcomes.filter((o): o is NewAuditEvent => !isOutcome(o)));
        let next = 0;
        return outcomes.map((o) => (isOutcome(o) ? o : { recorded: events[next++] as AuditEvent }));
      })
      .immediate();
  }

  /** Writes the decision (and queue item) and returns its audit event, or the replay. */
  private recordRow(
    decision: DecisionRecord,
    event: NewAuditEvent,
    item: QueueItem | undefined,
    idemSince: string,
  ): RecordOutcome | NewAuditEvent {
    if (decision.idem_key !== null) {
      const prior = this.byIdem.get(decision.key_id, decision.idem_key) as Row | undefined;
      if (prior && (prior.created_at as string) >= idemSince) return { replay: decisionFromRow(prior) };
      // An expired key may be used again: the old decision keeps its row but loses the key.
      if (prior) this.clearIdem.run(decision.key_id, decision.idem_key);
    }
    this.insertDecision.run({ ...decision, resource: JSON.stringify(decision.resource) });
    if (item) {
      this.insertQueue.run({
        ...item,
        resource: JSON.stringify(item.resource),
        context: JSON.stringify(item.context),
      });
    }
    return event;
  }
}

const isOutcome = (o: RecordOutcome | NewAuditEvent): o is RecordOutcome => 'replay' in o || 'recorded' in o;

/** Commits batches of decisions, in this thread or another; settles after the commit. */
export interface BatchCommitter {
  commit(batch: RecordArgs[]): Promise<RecordOutcome[]>;
  close(): Promise<void>;
}

/** Commits on the calling thread (the event loop waits for each fsync). */
export function inProcessCommitter(writer: DecisionWriter): BatchCommitter {
  return {
    commit: async (batch) => writer.recordBatch(batch),
    close: async () => undefined,
  };
}

interface PendingRecord {
  args: RecordArgs;
  resolve: (r: RecordOutcome) => void;
  reject: (e: unknown) => void;
}

export class SqliteDecisionStore implements DecisionStore {
  private pending: PendingRecord[] = [];
  private inFlight = false;
  private readonly byIdem: Statement;
  private readonly byId: Statement;
  constructor(
    db: Db,
    private readonly committer: BatchCommitter,
  ) {
    this.byIdem = db.prepare('SELECT * FROM decisions WHERE key_id = ? AND idem_key = ?');
    this.byId = db.prepare('SELECT * FROM decisions WHERE request_id = ?');
  }

  /**
   * Group commit: decisions that arrive while a batch is being committed form the next batch,
   * one transaction and one fsync for all of them. Each caller's promise settles only after its
   * own batch has committed, so "written before the response" holds.
   */
  record(
    decision: DecisionRecord,
    event: NewAuditEvent,
    item: QueueItem | undefined,
    idemSince: string,
  ): Promise<RecordOutcome> {
    return new Promise((resolve, reject) => {
      this.pending.push({ args: [decision, event, item, idemSince], resolve, reject });
      // Let every request parsed in this event-loop turn join the batch.
      if (this.pending.length === 1 && !this.inFlight) setImmediate(() => void this.flush());
    });
  }

  private async flush(): Promise<void> {
    if (this.inFlight || this.pending.length === 0) return;
    const batch = this.pending;
    this.pending = [];
    this.inFlight = true;
    try {
      await this.commitIsolated(batch);
    } finally {
      this.inFlight = false;
      if (this.pending.length > 0) void this.flush();
    }
  }

  /**
   * Commits a batch; if the batch fails, commits its decisions one by one, so that a decision
   * that cannot be recorded fails alone and the others are still answered.
   */
  private async commitIsolated(batch: PendingRecord[]): Promise<void> {
    try {
      const results = await this.committer.commit(batch.map((b) => b.args));
      batch.forEach((b, i) => b.resolve(results[i] as RecordOutcome));
    } catch (e) {
      if (batch.length === 1) {
        batch[0]?.reject(e);
        return;
      }
      for (const b of batch) await this.commitIsolated([b]);
    }
  }

  async findByIdempotencyKey(
    keyId: string,
    idemKey: string,
    since: string,
  ): Promise<DecisionRecord | undefined> {
    const r = this.byIdem.get(keyId, idemKey) as Row | undefined;
    return r && (r.created_at as string) >= since ? decisionFromRow(r) : undefined;
  }

  async get(requestId: string): Promise<DecisionRecord | undefined> {
    const r = this.byId.get(requestId) as Row | undefined;
    return r && decisionFromRow(r);
  }
}

export class SqliteQueueStore implements QueueStore {
  private readonly byId: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM queue_items WHERE id = ?');
  }

  async get(id: string): Promise<QueueItem | undefined> {
    const r = this.byId.get(id) as Row | undefined;
    return r && queueFromRow(r);
  }

  async listPending(f: PendingFilter): Promise<QueueItem[]> {
    const where = ["status = 'pending'", 'expires_at > @now'];
    if (f.after !== undefined) where.push('id > @after');
    if (f.agent_id !== undefined) where.push('agent_id = @agent_id');
    if (f.tenant_id !== undefined) where.push('tenant_id = @tenant_id');
    if (f.action !== undefined) where.push('action = @action');
    const rows = this.db
      .prepare(`SELECT * FROM queue_items WHERE ${where.join(' AND ')} ORDER BY id LIMIT @limit`)
      .all({ ...f }) as Row[];
    return rows.map(queueFromRow);
  }

  async decide(
    id: string,
    to: 'approved' | 'denied',
    by: string,
    note: string | null,
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
  ): Promise<DecideOutcome> {
    return this.db
      .transaction((): DecideOutcome => {
        const changed = this.db
          .prepare(
            `UPDATE queue_items SET status = ?, decided_at = ?, decided_by = ?, note = ?
             WHERE id = ? AND status = 'pending' AND expires_at > ?`,
          )
          .run(to, now, by, note, id, now).changes;
        const r = this.byId.get(id) as Row | undefined;
        const item = r && queueFromRow(r);
        if (changed !== 1 || !item) return { won: false, item };
        this.writer.appendInTx([event(item)]);
        return { won: true, item };
      })
      .immediate();
  }

  async expireDue(
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
    ids?: string[],
  ): Promise<QueueItem[]> {
    return this.db
      .transaction(() => {
        const due = (
          ids
            ? ids.map((id) => this.byId.get(id) as Row | undefined).filter((r): r is Row => r !== undefined)
            : (this.db
                .prepare("SELECT * FROM queue_items WHERE status = 'pending' AND expires_at <= ?")
                .all(now) as Row[])
        )
          .map(queueFromRow)
          .filter((i) => i.status === 'pending' && i.expires_at <= now);
        const upd = this.db.prepare(
          "UPDATE queue_items SET status = 'expired', decided_at = expires_at WHERE id = ? AND status = 'pending'",
        );
        const out: QueueItem[] = [];
        for (const item of due) {
          if (upd.run(item.id).changes !== 1) continue;
          const expired = { ...item, status: 'expired' as const, decided_at: item.expires_at };
          this.writer.appendInTx([event(expired)]);
          out.push(expired);
        }
        return out;
      })
      .immediate();
  }

  async countPending(now: string): Promise<number> {
    return this.db
      .prepare("SELECT count(*) FROM queue_items WHERE status = 'pending' AND expires_at > ?")
      .pluck()
      .get(now) as number;
  }
}

function tokenFromRow(r: Row): TokenRecord {
  return { ...(r as unknown as TokenRecord), scopes: JSON.parse(r.scopes as string) as string[] };
}

export class SqliteTokenStore implements TokenStore {
  private readonly byId: Statement;
  private readonly revokedStmt: Statement;
  private readonly insertStmt: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM tokens WHERE id = ?');
    this.revokedStmt = db.prepare('SELECT revoked_at FROM tokens WHERE id = ?');
    this.insertStmt =
      db.prepare(`INSERT INTO tokens (id, request_id, subject, scopes, audience, tenant_id, issued_at,
      expires_at, revoked_at, minted_by, trace_id) VALUES (@id, @request_id, @subject, @scopes, @audience, @tenant_id,
      @issued_at, @expires_at, @revoked_at, @minted_by, @trace_id)`);
  }

  async signingKey(create: () => Promise<SigningKeyRecord>): Promise<SigningKeyRecord> {
    const existing = this.db.prepare('SELECT * FROM signing_keys ORDER BY created_at LIMIT 1').get() as
      SigningKeyRecord | undefined;
    if (existing) return existing;
    const fresh = await create();
    return this.db
      .transaction(() => {
        // Another process may have won the race: the first key stored is the key.
        const won = this.db.prepare('SELECT * FROM signing_keys ORDER BY created_at LIMIT 1').get() as
          SigningKeyRecord | undefined;
        if (won) return won;
        this.db
          .prepare(
            'INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at) VALUES (@kid, @private_jwk, @public_jwk, @created_at)',
          )
          .run(fresh);
        return fresh;
      })
      .immediate();
  }

  async exchange(requestId: string, token: TokenRecord, event: NewAuditEvent): Promise<'ok' | 'already'> {
    return this.db
      .transaction(() => {
        const changed = this.db
          .prepare('UPDATE decisions SET token_id = ? WHERE request_id = ? AND token_id IS NULL')
          .run(token.id, requestId).changes;
        if (changed !== 1) return 'already' as const;
        this.insertStmt.run({ ...token, scopes: JSON.stringify(token.scopes) });
        this.writer.appendInTx([event]);
        return 'ok' as const;
      })
      .immediate();
  }

  async insert(token: TokenRecord, event: NewAuditEvent): Promise<void> {
    this.db
      .transaction(() => {
        this.insertStmt.run({ ...token, scopes: JSON.stringify(token.scopes) });
        this.writer.appendInTx([event]);
      })
      .immediate();
  }

  async get(id: string): Promise<TokenRecord | undefined> {
    const r = this.byId.get(id) as Row | undefined;
    return r && tokenFromRow(r);
  }

  async revoke(
    id: string,
    at: string,
    event: (t: TokenRecord) => NewAuditEvent,
  ): Promise<TokenRecord | undefined> {
    return this.db
      .transaction(() => {
        const r = this.byId.get(id) as Row | undefined;
        if (!r) return undefined;
        const t = tokenFromRow(r);
        if (t.revoked_at !== null) return t;
        this.db.prepare('UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL').run(at, id);
        const revoked = { ...t, revoked_at: at };
        this.writer.appendInTx([event(revoked)]);
        return revoked;
      })
      .immediate();
  }

  revokedAt(id: string): string | null | undefined {
    const r = this.revokedStmt.get(id) as { revoked_at: string | null } | undefined;
    return r === undefined ? undefined : r.revoked_at;
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

  async getCompiled(setHash: string): Promise<Buffer | undefined> {
    return this.db.prepare('SELECT wasm FROM compiled_sets WHERE set_hash = ?').pluck().get(setHash) as
      Buffer | undefined;
  }

  async putCompiled(setHash: string, wasm: Buffer): Promise<void> {
    this.db
      .transaction(() => {
        this.db
          .prepare('INSERT OR IGNORE INTO compiled_sets (set_hash, wasm, created_at) VALUES (?, ?, ?)')
          .run(setHash, wasm, new Date().toISOString());
        this.db
          .prepare(
            `DELETE FROM compiled_sets WHERE set_hash NOT IN
             (SELECT set_hash FROM compiled_sets ORDER BY created_at DESC LIMIT ${KEEP_COMPILED_SETS})`,
          )
          .run();
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
/**
 * All SQLite-backed stores over one connection. `committer` takes decision batches elsewhere
 * (the writer thread); by default they commit on this connection.
 */
export function sqliteStores(
  db: Db,
  onAuditAppend: (kinds: string[]) => void = () => undefined,
  committer?: BatchCommitter,
) {
  const writer = new AuditWriter(db, onAuditAppend);
  const decisions = committer ?? inProcessCommitter(new DecisionWriter(db, writer));
  return {
    audit: new SqliteAuditStore(db, writer),
    decisions: new SqliteDecisionStore(db, decisions),
    queue: new SqliteQueueStore(db, writer),
    tokens: new SqliteTokenStore(db, writer),
    keys: new SqliteKeyStore(db, writer),
    policies: new SqlitePolicyStore(db, writer),
    /** Liveness probe for /healthz: reads a row, so a locked or unreadable file fails it. */
    ping(): boolean {
      return typeof db.prepare("SELECT value FROM meta WHERE key = 'revision'").pluck().get() === 'string';
    },
    async close(): Promise<void> {
      await decisions.close();
      db.pragma('optimize');
      db.close();
    },
  };
}
export type Stores = ReturnType<typeof sqliteStores>;
