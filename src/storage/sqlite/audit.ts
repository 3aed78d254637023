import type { Statement } from 'better-sqlite3';
import {
  headForAppend,
  linkEvents,
  storedHeadOf,
  type AuditIndexColumns,
  type ChainExtent,
  type StoredEvent,
  type StoredHead,
} from '../../audit/chain.js';
import type { AuditFilter, AuditRows, AuditStore } from '../../audit/store.js';
import { auditQuerySql, auditResumeAt } from '../audit-query.js';
import { boundedPage } from './bounded.js';
import type { AuditEvent, NewAuditEvent } from '../../audit/types.js';
import { newId } from '../../ids.js';
import { deliveriesFor, outboxMessages } from '../../webhooks/events.js';
import { refuseNewerSchema, SCHEMA_VERSION } from '../failure.js';
import { auditFromRow, type Row } from '../rows.js';
import { checkInPlace, type Db } from './db.js';
import { migrations } from './migrations.js';

const AUDIT_ROW =
  'seq, time, kind, trace_id, request_id, agent_id, user_id, tenant_id, action, outcome, body, hash';

/**
 * Appends audit events inside the caller's transaction: reads the chain head, links the events
 * after it (src/audit/chain.ts) and inserts them. Must run inside an IMMEDIATE transaction so the
 * head cannot move meanwhile.
 */
export class AuditWriter {
  private readonly head: Statement;
  private readonly insert: Statement;
  private readonly setHead: Statement;
  private readonly hooks: Statement;
  private readonly insertDelivery: Statement;
  constructor(
    private readonly db: Db,
    private readonly onAppend: (kinds: string[]) => void,
  ) {
    // The recorded schema version is read with the head: see appendInTx.
    this.head = db.prepare(
      `SELECT key, value FROM meta WHERE key IN ('audit_head', 'audit_count', '${SCHEMA_VERSION}')`,
    );
    this.setHead = db.prepare(`UPDATE meta SET value = CASE key WHEN 'audit_head' THEN @hash
      ELSE @count END WHERE key IN ('audit_head', 'audit_count')`);
    this.hooks = db.prepare('SELECT name, events FROM webhooks');
    this.insertDelivery =
      db.prepare(`INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts,
      next_attempt_at, last_status, last_error, created_at, delivered_at) VALUES (@id, @webhook, @type, @payload,
      @status, @attempts, @next_attempt_at, @last_status, @last_error, @created_at, @delivered_at)`);
    this.insert = db.prepare(
      `INSERT INTO audit_events (${AUDIT_ROW}) VALUES (@seq, @time, @kind, @trace_id, @request_id,
       @agent_id, @user_id, @tenant_id, @action, @outcome, @body, @hash)`,
    );
  }

  readHead(): StoredHead {
    return storedHeadOf(this.headRows());
  }

  private headRows(): { key: string; value: string }[] {
    return this.head.all() as { key: string; value: string }[];
  }

  appendInTx(events: NewAuditEvent[]): AuditEvent[] {
    // Every state change appends here: none is recorded in a file that is no longer the database.
    checkInPlace(this.db);
    // Nor under a schema newer than this build's: a newer build's migration, committed while this
    // transaction waited for the write lock, recorded its version (migrate in db.ts).
    const rows = this.headRows();
    refuseNewerSchema(rows, migrations);
    const { linked, head } = linkEvents(headForAppend(storedHeadOf(rows)), events);
    for (const l of linked) this.insert.run({ ...l.columns, seq: l.seq, body: l.body, hash: l.hash });
    // As integer text: a number would be bound as a REAL and written as "12.0" (read as 12 too).
    this.setHead.run({ hash: head.hash, count: String(head.count) });
    this.enqueueDeliveries(linked.map((l) => l.event));
    // Reported after the caller's transaction commits would be more exact; a rollback after this
    // point only happens on a storage failure, which already fails the request.
    this.onAppend(linked.map((l) => l.event.kind));
    return linked.map((l) => l.event);
  }

  /** The webhook outbox: the deliveries appended events cause, in the same transaction. */
  private enqueueDeliveries(events: AuditEvent[]): void {
    const messages = outboxMessages(events);
    if (messages.length === 0) return;
    const hooks = (this.hooks.all() as { name: string; events: string }[]).map((h) => ({
      name: h.name,
      events: JSON.parse(h.events) as string[],
    }));
    for (const d of deliveriesFor(messages, hooks, newId)) this.insertDelivery.run(d);
  }
}

export class SqliteAuditStore implements AuditStore {
  private readonly byTrace: Statement;
  private readonly chunkStmt: Statement;
  private readonly byRequestId: Statement;
  private readonly byRequestOfTenant: Statement;
  private readonly extentStmt: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    // A NULL tenant or agent parameter is no filter; a value keeps only that tenant's (agent's) events.
    this.byTrace = db.prepare(
      `SELECT seq, body, hash FROM audit_events WHERE trace_id = @traceId AND seq > @afterSeq
         AND (@tenant IS NULL OR tenant_id = @tenant) AND (@agent IS NULL OR agent_id = @agent)
       ORDER BY seq LIMIT @limit`,
    );
    // Two seeks on the primary key, not a scan of the table.
    this.extentStmt = db.prepare(
      'SELECT (SELECT min(seq) FROM audit_events) AS lo, (SELECT max(seq) FROM audit_events) AS hi',
    );
    this.chunkStmt = db.prepare(`SELECT ${AUDIT_ROW} FROM audit_events WHERE seq > ? ORDER BY seq LIMIT ?`);
    this.byRequestId = db.prepare(
      'SELECT seq, body, hash FROM audit_events WHERE request_id = ? AND seq > ? ORDER BY seq LIMIT ?',
    );
    // `IS` compares as equality that also matches NULL to NULL (an untenanted request).
    this.byRequestOfTenant = db.prepare(
      `SELECT seq, body, hash FROM audit_events WHERE request_id = @requestId AND seq > @afterSeq
         AND tenant_id IS @tenant AND (@agent IS NULL OR agent_id = @agent) ORDER BY seq LIMIT @limit`,
    );
  }

  async append(events: NewAuditEvent[]): Promise<AuditEvent[]> {
    return this.db.transaction(() => this.writer.appendInTx(events)).immediate();
  }

  async query(f: AuditFilter): Promise<AuditRows> {
    return boundedPage(this.db, auditQuerySql(f, 'sqlite'), f.limit, auditFromRow, auditResumeAt);
  }

  async trace(
    traceId: string,
    afterSeq: number,
    limit: number,
    only: { tenant_id?: string | undefined; agent_id?: string | undefined } = {},
  ): Promise<{ seq: number; event: AuditEvent }[]> {
    const found = this.byTrace.all({
      traceId,
      afterSeq,
      limit,
      tenant: only.tenant_id ?? null,
      agent: only.agent_id ?? null,
    });
    return (found as Row[]).map(auditFromRow);
  }

  async chunk(afterSeq: number, limit: number): Promise<StoredEvent[]> {
    return (this.chunkStmt.all(afterSeq, limit) as Row[]).map(({ seq, body, hash, ...columns }) => ({
      seq: seq as number,
      body: body as string,
      hash: hash as string,
      columns: columns as unknown as AuditIndexColumns,
    }));
  }

  async byRequest(
    requestId: string,
    afterSeq: number,
    limit: number,
    only?: { tenant_id: string | null; agent_id?: string | undefined },
  ): Promise<{ seq: number; event: AuditEvent }[]> {
    const found =
      only === undefined
        ? this.byRequestId.all(requestId, afterSeq, limit)
        : this.byRequestOfTenant.all({
            requestId,
            afterSeq,
            tenant: only.tenant_id,
            agent: only.agent_id ?? null,
            limit,
          });
    return (found as Row[]).map(auditFromRow);
  }

  async head(): Promise<StoredHead> {
    return this.writer.readHead();
  }

  async extent(): Promise<ChainExtent> {
    // One read transaction: the rows and the head as of one snapshot, whatever commits meanwhile.
    return this.db.transaction(() => {
      const r = this.extentStmt.get() as { lo: number | null; hi: number | null };
      return { minSeq: r.lo, maxSeq: r.hi, head: this.writer.readHead() };
    })();
  }
}
