import { badRequest, forbidden, notFound } from '../errors.js';
import { decodeCursor, encodeCursor, parseLimit } from '../http/pagination.js';
import { compileSchema, isRfc3339 } from '../http/validation.js';
import type { Principal } from '../keys/types.js';
import { eventHash, GENESIS_HASH } from './chain.js';
import { AUDIT_EQUALITY_FILTERS, type AuditFilter, type AuditStore } from './store.js';
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

/** Kinds of the events Arbiter writes itself: ingest cannot forge them. */
export const RESERVED_KINDS: ReadonlySet<string> = new Set([
  'decision',
  'queue.approve',
  'queue.deny',
  'queue.expire',
  'token.mint',
  'token.revoke',
  'policy.put',
  'policy.delete',
  'policy.seed',
  'data.put',
  'data.delete',
  'key.create',
  'key.revoke',
]);

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
    policy_revision: { type: ['integer', 'null'], minimum: 0 },
    latency_us: { type: ['integer', 'null'], minimum: 0 },
    details: { type: 'object' },
  },
};

export const ingestBatchSchema = {
  type: 'object',
  required: ['events'],
  additionalProperties: false,
  properties: {
    events: { type: 'array', minItems: 1, maxItems: MAX_INGEST_BATCH, items: ingestEventSchema },
  },
};

const validateEvent = compileSchema<Record<string, unknown>>(ingestEventSchema);
const validateBatch = compileSchema<{ events: Record<string, unknown>[] }>(ingestBatchSchema);

const KNOWN = new Set(Object.keys(ingestEventSchema.properties));
/** Chain fields are Arbiter's to compute: a caller's values are dropped, never trusted. */
const CHAIN_FIELDS = new Set(['hash', 'prev_hash', 'seq']);

export type AuditQuery = Partial<
  Record<keyof Omit<AuditFilter, 'before' | 'limit'> | 'limit' | 'cursor', string>
>;

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
  async query(
    principal: Principal,
    q: AuditQuery,
  ): Promise<{ events: AuditEvent[]; next_cursor: string | null }> {
    const limit = parseLimit(q.limit);
    const f: AuditFilter = { limit: limit + 1 };
    for (const k of AUDIT_EQUALITY_FILTERS) {
      if (k === 'outcome') continue; // checked against OUTCOMES below
      const v = q[k];
      if (v === undefined) continue;
      if (v === '' || v.length > 256) throw badRequest(`query parameter ${k} must be 1 to 256 characters`);
      f[k] = v;
    }
    if (q.outcome !== undefined) {
      if (!(OUTCOMES as readonly string[]).includes(q.outcome)) {
        throw badRequest(`query parameter outcome must be one of ${OUTCOMES.join(', ')}`);
      }
      f.outcome = q.outcome;
    }
    for (const k of ['since', 'until'] as const) {
      const v = q[k];
      if (v === undefined) continue;
      if (!isRfc3339(v)) throw badRequest(`query parameter ${k} must be an RFC 3339 date-time`);
      f[k] = new Date(v).toISOString();
    }
    const byTime = f.since !== undefined || f.until !== undefined;
    if (q.cursor !== undefined) {
      // A cursor of the other ordering (with or without a time window) is refused, not guessed.
      const pos = decodeCursor(q.cursor, byTime ? 'audit-t' : 'audit');
      const m = byTime
        ? /^(\d{4}-\d\d-\d\dT[\d:.]+Z)\|([1-9]\d{0,15})$/.exec(pos)
        : /^()([1-9]\d{0,15})$/.exec(pos);
      if (!m) throw badRequest('query parameter cursor is not a valid cursor for this list');
      f.before = byTime ? { time: m[1] as string, seq: Number(m[2]) } : { seq: Number(m[2]) };
    }
    if (principal.tenant !== null) {
      if (f.tenant_id !== undefined && f.tenant_id !== principal.tenant) {
        throw forbidden(`API key is bound to tenant ${principal.tenant}`);
      }
      f.tenant_id = principal.tenant;
    }
    const rows = await this.store.query(f);
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return {
      events: page.map((r) => r.event),
      next_cursor:
        rows.length > limit && last
          ? byTime
            ? encodeCursor('audit-t', `${last.event.time}|${last.seq}`)
            : encodeCursor('audit', String(last.seq))
          : null,
    };
  }

  /**
   * One trace, oldest first, as one ordered story. A trace is normally a handful of events and
   * comes back whole; one longer than `limit` (default 100, at most 1000) continues by cursor.
   */
  async trace(
    principal: Principal,
    traceId: string,
    q: { limit?: string; cursor?: string } = {},
  ): Promise<{ trace_id: string; events: AuditEvent[]; next_cursor: string | null }> {
    if (traceId === '' || traceId.length > 128) throw badRequest('trace id must be 1 to 128 characters');
    const limit = parseLimit(q.limit);
    let after = 0;
    if (q.cursor !== undefined) {
      const m = /^(.+)\|([1-9]\d{0,15})$/.exec(decodeCursor(q.cursor, 'trace'));
      if (!m || m[1] !== traceId)
        throw badRequest('query parameter cursor is not a valid cursor for this list');
      after = Number(m[2]);
    }
    const rows = await this.store.trace(traceId, after, limit + 1);
    const page = rows.slice(0, limit);
    let events = page.map((r) => r.event);
    if (principal.tenant !== null) events = events.filter((e) => e.tenant_id === principal.tenant);
    if (after === 0 && events.length === 0 && rows.length <= limit) {
      throw notFound(`no audit events for trace ${traceId}`);
    }
    const last = page[page.length - 1];
    return {
      trace_id: traceId,
      events,
      next_cursor: rows.length > limit && last ? encodeCursor('trace', `${traceId}|${last.seq}`) : null,
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
    if (principal.tenant !== null && e.tenant_id != null && e.tenant_id !== principal.tenant) {
      throw forbidden(`API key is bound to tenant ${principal.tenant}`);
    }
    if (principal.agent !== null && e.agent_id != null && e.agent_id !== principal.agent) {
      throw forbidden(`API key is bound to agent ${principal.agent}`);
    }
    if (RESERVED_KINDS.has(e.kind as string)) {
      throw badRequest(`kind ${String(e.kind)} is reserved for events Arbiter records itself`);
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
      agent_id: principal.agent ?? (e.agent_id as string | null) ?? null,
      user_id: (e.user_id as string | null) ?? null,
      tenant_id: principal.tenant ?? (e.tenant_id as string | null) ?? null,
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
   */
  async verify(principal?: Principal): Promise<VerifyResult> {
    // The chain spans every tenant: its length and head are not one tenant's to read.
    if (principal && principal.tenant !== null) {
      throw forbidden('verifying the audit chain needs an API key that is not bound to a tenant');
    }
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
      for (const e of rows) {
        const { seq: _seq, hash, ...content } = e;
        if (content.prev_hash !== prev) {
          return {
            ok: false,
            checked,
            first_bad: e.id,
            reason:
              'prev_hash does not match the event before it: an event was deleted, inserted or reordered',
          };
        }
        if (eventHash(content) !== hash) {
          return {
            ok: false,
            checked,
            first_bad: e.id,
            reason: 'event content does not match its hash: it was modified',
          };
        }
        prev = hash;
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
