import { invalid, notFound } from '../errors.js';
import {
  badCursor,
  encodeCursor,
  fetchPage,
  readCursor,
  type Page,
  type PageQuery,
} from '../common/pagination.js';
import { compileSchema } from '../common/validation.js';
import { narrow, narrowToBinding } from '../keys/binding.js';
import type { Principal } from '../keys/types.js';
import { checkStoredEvent, GENESIS_HASH } from './chain.js';
import { isReservedKind } from './kinds.js';
import type { AuditFilter, AuditStore } from './store.js';
import type { AuditEvent, NewAuditEvent } from './types.js';

/** Every outcome an event may carry; filters and ingest accept exactly these. */
export const OUTCOMES = [
  'allow',
  'requires_approval',
  'deny',
  'approved',
  'denied',
  'expired',
  'minted',
  'revoked',
  'success',
  'failure',
  'error',
] as const;

export const MAX_INGEST_BATCH = 1000;

const str = (max: number) => ({ type: ['string', 'null'], maxLength: max });

/** One event as an engine elsewhere forwards it. Unknown fields are kept under `details`. */
export const ingestEventSchema = {
  type: 'object',
  required: ['kind'],
  properties: {
    kind: { type: 'string', minLength: 1, maxLength: 128 },
    time: { type: 'string', format: 'date-time' },
    trace_id: str(128),
    request_id: str(128),
    actor: str(256),
    agent_id: str(256),
    user_id: str(256),
    tenant_id: str(256),
    action: str(256),
    resource: {},
    outcome: { type: ['string', 'null'], enum: [...OUTCOMES, null] },
    message: str(4096),
    confidence: { type: ['number', 'null'], minimum: 0, maximum: 1 },
    policy_revision: { type: ['integer', 'null'], minimum: 0, maximum: Number.MAX_SAFE_INTEGER },
    latency_us: { type: ['integer', 'null'], minimum: 0, maximum: Number.MAX_SAFE_INTEGER },
    details: { type: 'object' },
  },
};

export const ingestBatchSchema = {
  type: 'object',
  required: ['events'],
  additionalProperties: false,
  properties: {
    events: {
      type: 'array',
      minItems: 1,
      maxItems: MAX_INGEST_BATCH,
      items: ingestEventSchema,
    },
  },
};

const validateEvent = compileSchema<Record<string, unknown>>(ingestEventSchema);
const validateBatch = compileSchema<{ events: Record<string, unknown>[] }>(ingestBatchSchema);

const KNOWN = new Set(Object.keys(ingestEventSchema.properties));
/** Chain fields are Arbiter's to compute: a caller's values are dropped, never trusted. */
const CHAIN_FIELDS = new Set(['hash', 'prev_hash', 'seq']);

/** What an audit query asks for; the edge has parsed and checked each value (since/until: ISO 8601, UTC). */
export type AuditQuery = Partial<Omit<AuditFilter, 'before' | 'limit'>> & PageQuery;

export type VerifyResult =
  | { ok: true; checked: number; head: string }
  | { ok: false; checked: number; first_bad: string | null; reason: string };

/** Events hashed between two yields to the event loop while verifying. */
const VERIFY_CHUNK = 2_000;

export class AuditService {
  private verifying: Promise<VerifyResult> | undefined;

  constructor(
    private readonly store: AuditStore,
    private readonly mask: (doc: Record<string, unknown>) => Record<string, unknown>,
  ) {}

  /** Newest first; the cursor is a sequence number, so new events never shift later pages. */
  async query(principal: Principal, q: AuditQuery): Promise<Page<AuditEvent>> {
    const { limit: _limit, cursor, ...filters } = q;
    const f: Omit<AuditFilter, 'limit'> = filters;
    const byTime = f.since !== undefined || f.until !== undefined;
    if (cursor !== undefined) {
      // A cursor of the other ordering (with or without a time window) is refused, not guessed.
      const m = byTime
        ? readCursor(cursor, 'audit-t', /^(\d{4}-\d\d-\d\dT[\d:.]+Z)\|([1-9]\d{0,15})$/)
        : readCursor(cursor, 'audit', /^()([1-9]\d{0,15})$/);
      f.before = byTime ? { time: m[1] as string, seq: Number(m[2]) } : { seq: Number(m[2]) };
    }
    // A bound key lists its own tenant's and agent's events (asking for another's is 403).
    Object.assign(f, narrowToBinding(principal, f));
    const page = await fetchPage(
      q,
      (limit) => this.store.query({ ...f, limit }),
      (last) =>
        byTime
          ? encodeCursor('audit-t', `${last.event.time}|${last.seq}`)
          : encodeCursor('audit', String(last.seq)),
    );
    return {
      items: page.items.map((r) => r.event),
      next_cursor: page.next_cursor,
    };
  }

  /**
   * One trace, oldest first, as one ordered story. A trace is normally a handful of events and
   * comes back whole; one longer than `limit` (default 100, at most 1000) continues by cursor.
   */
  async trace(
    principal: Principal,
    traceId: string,
    q: PageQuery = {},
  ): Promise<{
    trace_id: string;
    events: AuditEvent[];
    next_cursor: string | null;
  }> {
    if (traceId === '' || traceId.length > 128) throw invalid('trace id must be 1 to 128 characters');
    let after = 0;
    if (q.cursor !== undefined) {
      const m = readCursor(q.cursor, 'trace', /^(.+)\|([1-9]\d{0,15})$/);
      if (m[1] !== traceId) throw badCursor();
      after = Number(m[2]);
    }
    // A bound key's events only, filtered in the store before paging: for another tenant's (or
    // agent's) trace it gets exactly the answer for an unknown trace, whatever the limit.
    const only = narrowToBinding(principal, {});
    const page = await fetchPage(
      q,
      (limit) => this.store.trace(traceId, after, limit, only),
      (last) => encodeCursor('trace', `${traceId}|${last.seq}`),
    );
    const events = page.items.map((r) => r.event);
    if (after === 0 && events.length === 0) {
      throw notFound(`no audit events for trace ${traceId}`);
    }
    return { trace_id: traceId, events, next_cursor: page.next_cursor };
  }

  /**
   * The events of one request (decision, queue transition, token mint and revoke), oldest first,
   * paginated like a trace. No binding check here: the caller has shown the request is visible,
   * and passes the request's tenant. Only events of that tenant are its story: any `audit:write`
   * key can ingest an event naming any request_id, and one of another tenant (a tenant-bound
   * key's, even on an untenanted request) must not show to this tenant's reviewers as part of it.
   * An unbound key may ingest for any tenant, so its events of the request's tenant are included;
   * they stay ingested events (a kind that is not reserved), which the console marks as reports.
   */
  async requestTrail(
    requestId: string,
    tenantId: string | null,
    q: PageQuery = {},
  ): Promise<Page<AuditEvent>> {
    let after = 0;
    if (q.cursor !== undefined) {
      const m = readCursor(q.cursor, 'request', /^(.+)\|([1-9]\d{0,15})$/);
      if (m[1] !== requestId) throw badCursor();
      after = Number(m[2]);
    }
    const page = await fetchPage(
      q,
      (limit) => this.store.byRequest(requestId, after, limit, { tenant_id: tenantId }),
      (last) => encodeCursor('request', `${requestId}|${last.seq}`),
    );
    return {
      items: page.items.map((r) => r.event),
      next_cursor: page.next_cursor,
    };
  }

  /** One event or `{"events": [...]}` (≤ 1000), validated as a whole, stored all or nothing. */
  async ingest(principal: Principal, body: unknown): Promise<{ accepted: number; ids: string[] }> {
    const isBatch = typeof body === 'object' && body !== null && 'events' in body;
    const raw = isBatch ? validateBatch(body).events : [validateEvent(body)];
    const events = raw.map((e) => this.toEvent(principal, e));
    const stored = await this.store.append(events);
    return { accepted: stored.length, ids: stored.map((e) => e.id) };
  }

  private toEvent(principal: Principal, e: Record<string, unknown>): NewAuditEvent {
    // A bound key forwards events of its own tenant and agent only, and those are filled in.
    const tenantId = narrow(principal, 'tenant', (e.tenant_id as string | null | undefined) ?? undefined);
    const agentId = narrow(principal, 'agent', (e.agent_id as string | null | undefined) ?? undefined);
    if (isReservedKind(e.kind as string)) {
      throw invalid(`kind ${String(e.kind)} is reserved for events Arbiter records itself`);
    }
    // Unknown fields are kept under details; so is the caller's own `actor`: the event's actor
    // is the key that ingested it, which is the only identity Arbiter can vouch for.
    const extra = Object.fromEntries(
      Object.entries(e)
        .filter(([k]) => (!KNOWN.has(k) || k === 'actor') && !CHAIN_FIELDS.has(k))
        .map(([k, v]) => [k === 'id' ? 'source_id' : k === 'actor' ? 'source_actor' : k, v]),
    );
    const details = this.mask({
      ...((e.details as Record<string, unknown>) ?? {}),
      ...extra,
      ingested_by: principal.name,
    });
    return {
      kind: e.kind as string,
      time: e.time === undefined ? undefined : new Date(e.time as string).toISOString(),
      trace_id: (e.trace_id as string | null) ?? null,
      request_id: (e.request_id as string | null) ?? null,
      actor: principal.name,
      agent_id: agentId ?? null,
      user_id: (e.user_id as string | null) ?? null,
      tenant_id: tenantId ?? null,
      action: (e.action as string | null) ?? null,
      resource: e.resource ?? null,
      outcome: (e.outcome as string | null) ?? null,
      message: (e.message as string | null) ?? null,
      confidence: (e.confidence as number | null) ?? null,
      policy_revision: (e.policy_revision as number | null) ?? null,
      latency_us: (e.latency_us as number | null) ?? null,
      details,
    };
  }

  /**
   * Walks the chain from the start: each event must link to the one before it and hash to its
   * stored hash, and the chain must end at the recorded head. Reports the first event that fails.
   * The chain spans every tenant: its route refuses bound keys.
   */
  async verify(): Promise<VerifyResult> {
    // One walk at a time: concurrent callers share it instead of multiplying the work.
    this.verifying ??= this.walk().finally(() => {
      this.verifying = undefined;
    });
    return this.verifying;
  }

  /**
   * Reads the chain in chunks, yielding to the event loop between them, so serving goes on. It
   * verifies the chain as it stood when the walk began (the recorded head and length then):
   * events appended meanwhile belong to the next verification.
   */
  private async walk(): Promise<VerifyResult> {
    const head = await this.store.head();
    let prev = GENESIS_HASH;
    let checked = 0;
    let after = 0;
    for (;;) {
      const rows = (await this.store.chunk(after, VERIFY_CHUNK)).slice(0, head.count - checked);
      for (const row of rows) {
        const r = checkStoredEvent(row, prev);
        if (!r.ok) return { ok: false, checked, first_bad: r.id, reason: r.reason };
        prev = r.hash;
        checked++;
      }
      if (rows.length < VERIFY_CHUNK || checked >= head.count) break;
      after = (rows[rows.length - 1] as { seq: number }).seq;
      await new Promise((resolve) => setImmediate(resolve));
    }
    if (head.hash !== prev || head.count !== checked) {
      return {
        ok: false,
        checked,
        first_bad: null,
        reason: `the chain ends at event ${checked} but ${head.count} were recorded: events were removed from its end`,
      };
    }
    return { ok: true, checked, head: prev };
  }
}
