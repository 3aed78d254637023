import {
  headForAppend,
  linkEvents,
  storedHeadOf,
  type AuditIndexColumns,
  type ChainExtent,
  type ChainHead,
  type StoredEvent,
  type StoredHead,
} from '../../audit/chain.js';
import type { AuditFilter, AuditRows, AuditStore } from '../../audit/store.js';
import { auditQuerySql, auditResumeAt } from '../audit-query.js';
import { boundedPage } from './bounded.js';
import type { AuditEvent, NewAuditEvent } from '../../audit/types.js';
import { newId } from '../../ids.js';
import { deliveriesFor, outboxMessages } from '../../webhooks/events.js';
import { refuseNewerSchema } from '../failure.js';
import { auditFromRow } from '../rows.js';
import { LOCK_HEAD, migrations } from './migrations.js';
import { rows, tx, type Client, type Pool } from './pool.js';

type Row = Record<string, unknown>;

/**
 * Locks the chain head for the rest of the caller's transaction and returns it. Every writing
 * transaction takes this lock first, so appends from every process are serialized into one chain
 * (and no two transactions can wait on each other's rows in opposite orders).
 *
 * The same statement locks and reads the recorded schema version, and refuses (`unavailable`)
 * one newer than this build's: a migration takes the head first and updates that row in its own
 * transaction (migrate), so an append that waited here for it reads the version it committed
 * (READ COMMITTED re-reads a row updated while the lock was awaited), not the snapshot before.
 */
export async function lockHead(c: Client): Promise<ChainHead> {
  const r = await rows<{ key: string; value: string }>(c, LOCK_HEAD);
  refuseNewerSchema(r, migrations);
  return headForAppend(storedHeadOf(r));
}

/** Appends `events` after the locked `head` in the caller's transaction; returns the new head. */
export async function appendAfter(
  c: Client,
  head: ChainHead,
  events: NewAuditEvent[],
): Promise<{ events: AuditEvent[]; head: ChainHead }> {
  if (events.length === 0) return { events: [], head };
  const { linked, head: next } = linkEvents(head, events);
  const col = <K extends keyof AuditIndexColumns>(k: K) => linked.map((l) => l.columns[k]);
  // One statement for the whole batch: arrays unnested into rows (fixed SQL, values as parameters).
  await c.query(
    `INSERT INTO audit_events (seq, time, kind, trace_id, request_id, agent_id, user_id, tenant_id, action,
       outcome, body, hash)
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
       $8::text[], $9::text[], $10::text[], $11::text[], $12::text[])`,
    [
      linked.map((l) => l.seq),
      col('time'),
      col('kind'),
      col('trace_id'),
      col('request_id'),
      col('agent_id'),
      col('user_id'),
      col('tenant_id'),
      col('action'),
      col('outcome'),
      linked.map((l) => l.body),
      linked.map((l) => l.hash),
    ],
  );
  await c.query(
    `UPDATE meta SET value = CASE key WHEN 'audit_head' THEN $1 ELSE $2 END
     WHERE key IN ('audit_head', 'audit_count')`,
    [next.hash, String(next.count)],
  );
  const appended = linked.map((l) => l.event);
  await enqueueDeliveries(c, appended);
  return { events: appended, head: next };
}

/** The webhook outbox: the deliveries appended events cause, in the same transaction. */
async function enqueueDeliveries(c: Client, events: AuditEvent[]): Promise<void> {
  const messages = outboxMessages(events);
  if (messages.length === 0) return;
  const hooks = (await rows<{ name: string; events: string }>(c, 'SELECT name, events FROM webhooks')).map(
    (h) => ({
      name: h.name,
      events: JSON.parse(h.events) as string[],
    }),
  );
  const ds = deliveriesFor(messages, hooks, newId);
  if (ds.length === 0) return;
  await c.query(
    `INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
     SELECT id, webhook, type, payload, 'pending', 0, next_attempt_at, created_at
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
       AS d(id, webhook, type, payload, next_attempt_at, created_at)`,
    [
      ds.map((d) => d.id),
      ds.map((d) => d.webhook),
      ds.map((d) => d.type),
      ds.map((d) => d.payload),
      ds.map((d) => d.next_attempt_at),
      ds.map((d) => d.created_at),
    ],
  );
}

/** Locks the head and appends: for transactions that append once. */
export async function append(c: Client, events: NewAuditEvent[]): Promise<AuditEvent[]> {
  return (await appendAfter(c, await lockHead(c), events)).events;
}

export class PgAuditStore implements AuditStore {
  constructor(
    private readonly pool: Pool,
    private readonly onAppend: (kinds: string[]) => void,
  ) {}

  async append(events: NewAuditEvent[]): Promise<AuditEvent[]> {
    const out = await tx(this.pool, (c) => append(c, events));
    this.onAppend(out.map((e) => e.kind));
    return out;
  }

  async query(f: AuditFilter): Promise<AuditRows> {
    return boundedPage(this.pool, auditQuerySql(f, 'postgres'), f.limit, auditFromRow, auditResumeAt);
  }

  async trace(
    traceId: string,
    afterSeq: number,
    limit: number,
    only: { tenant_id?: string | undefined; agent_id?: string | undefined } = {},
  ): Promise<{ seq: number; event: AuditEvent }[]> {
    // A NULL tenant or agent parameter is no filter; a value keeps only that tenant's (agent's) events.
    const r = await rows<Row>(
      this.pool,
      `SELECT seq, body, hash FROM audit_events WHERE trace_id = $1 AND seq > $2
         AND ($4::text IS NULL OR tenant_id = $4) AND ($5::text IS NULL OR agent_id = $5)
       ORDER BY seq LIMIT $3`,
      [traceId, afterSeq, limit, only.tenant_id ?? null, only.agent_id ?? null],
    );
    return r.map(auditFromRow);
  }

  async byRequest(
    requestId: string,
    afterSeq: number,
    limit: number,
    only?: { tenant_id: string | null; agent_id?: string | undefined },
  ): Promise<{ seq: number; event: AuditEvent }[]> {
    const r =
      only === undefined
        ? await rows<Row>(
            this.pool,
            'SELECT seq, body, hash FROM audit_events WHERE request_id = $1 AND seq > $2 ORDER BY seq LIMIT $3',
            [requestId, afterSeq, limit],
          )
        : await rows<Row>(
            this.pool,
            `SELECT seq, body, hash FROM audit_events
              WHERE request_id = $1 AND seq > $2 AND tenant_id IS NOT DISTINCT FROM $4
                AND ($5::text IS NULL OR agent_id = $5) ORDER BY seq LIMIT $3`,
            [requestId, afterSeq, limit, only.tenant_id, only.agent_id ?? null],
          );
    return r.map(auditFromRow);
  }

  async chunk(afterSeq: number, limit: number): Promise<StoredEvent[]> {
    const r = await rows<Row>(
      this.pool,
      `SELECT seq, time, kind, trace_id, request_id, agent_id, user_id, tenant_id, action, outcome, body, hash
       FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2`,
      [afterSeq, limit],
    );
    return r.map(({ seq, body, hash, ...columns }) => ({
      seq: seq as number,
      body: body as string,
      hash: hash as string,
      columns: columns as unknown as AuditIndexColumns,
    }));
  }

  async head(): Promise<StoredHead> {
    return storedHeadOf(
      await rows<{ key: string; value: string }>(
        this.pool,
        "SELECT key, value FROM meta WHERE key IN ('audit_head', 'audit_count')",
      ),
    );
  }

  async extent(): Promise<ChainExtent> {
    // One statement, so one snapshot: the rows and the head recorded with them.
    const [r] = await rows<{
      lo: number | null;
      hi: number | null;
      h: string | null;
      c: string | null;
    }>(
      this.pool,
      `SELECT (SELECT min(seq) FROM audit_events) AS lo,
         (SELECT max(seq) FROM audit_events) AS hi, (SELECT value FROM meta WHERE key = 'audit_head') AS h,
         (SELECT value FROM meta WHERE key = 'audit_count') AS c`,
    );
    // bigint columns arrive as numbers (pool.ts); a sequence number is far below 2^53.
    return {
      minSeq: r?.lo ?? null,
      maxSeq: r?.hi ?? null,
      head: { audit_head: r?.h ?? undefined, audit_count: r?.c ?? undefined },
    };
  }
}
