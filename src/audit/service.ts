import { invalid, notFound, tooLarge } from '../errors.js';
import { jsonBytes, tooSmallToExceed } from '../common/json-size.js';
import {
  badCursor,
  encodeCursor,
  fetchPage,
  readCursor,
  type Page,
  type PageQuery,
} from '../common/pagination.js';
import { ASCII_NAME, ASCII_NAME_RULE, compileSchema } from '../common/validation.js';
import { isBound, narrow, narrowToBinding } from '../keys/binding.js';
import type { Principal } from '../keys/types.js';
import { checkStoredEvent, extentProblem, GENESIS_HASH, HEX64, readStoredHead, sha256Hex } from './chain.js';
import { readsAsReservedKind, RESERVED_KIND_WORDS } from './kinds.js';
import type { AuditFilter, AuditRows, AuditStore } from './store.js';
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

/**
 * The most events one page of GET /api/v1/audit examines when it combines conditions (two
 * equality filters, or one with since/until): its cost per request, whatever the trail's size.
 */
export const AUDIT_EXAMINE = 2_000;

const str = (max: number) => ({ type: ['string', 'null'], maxLength: max });

/** One event as an engine elsewhere forwards it. Unknown fields are kept under `details`. */
export const ingestEventSchema = {
  type: 'object',
  required: ['kind'],
  properties: {
    kind: {
      type: 'string',
      minLength: 1,
      maxLength: 128,
      pattern: ASCII_NAME,
      description: `${ASCII_NAME_RULE}; its first word (up to the first . _ : or -) not one of Arbiter's own, in any letter case, singular or plural: ${RESERVED_KIND_WORDS.join(', ')}`,
    },
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

/**
 * A head saved from an earlier verification (`head` and `checked`), kept where the database's
 * writers cannot reach it: event number `count` of the chain must still hash to `head`.
 */
export interface ChainAnchor {
  head: string;
  count: number;
}

/** `head` of an anchor: a SHA-256 hash as verify answers it, 64 lowercase hex digits. */
export function parseAnchorHead(raw: string): string {
  if (!HEX64.test(raw)) throw invalid('head must be 64 lowercase hex digits (a head verify answered)');
  return raw;
}

/** `count` of an anchor: the `checked` verify answered with the head, a positive integer. */
export function parseAnchorCount(raw: string): number {
  if (!/^[1-9]\d{0,15}$/.test(raw) || !Number.isSafeInteger(Number(raw))) {
    throw invalid('count must be a positive integer (the checked verify answered with the head)');
  }
  return Number(raw);
}

/** An anchor from its two parts, each present or absent as given: both or neither. */
export function anchorOf(head: string | undefined, count: number | undefined): ChainAnchor | undefined {
  if (head === undefined && count === undefined) return undefined;
  if (head === undefined || count === undefined) {
    throw invalid('head and count anchor the chain together: give both or neither');
  }
  return { head, count };
}

/** Events hashed between two yields to the event loop while verifying. */
const VERIFY_CHUNK = 2_000;

export class AuditService {
  private verifying: Promise<VerifyResult> | undefined;

  constructor(
    private readonly store: AuditStore,
    private readonly mask: (doc: Record<string, unknown>) => Record<string, unknown>,
    /** The most an ingested event's details and resource may be as JSON (ARBITER_MAX_CONTEXT_BYTES). */
    private readonly maxDetailsBytes: number,
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
    const cursorAt = (at: { seq: number; time: string }) =>
      byTime ? encodeCursor('audit-t', `${at.time}|${at.seq}`) : encodeCursor('audit', String(at.seq));
    // A bound key's pages are exact, never bounded: a bounded page examines events of every
    // tenant (through the driving index), and how many it examined beside the ones it answered
    // would tell a tenant how many other tenants' events lie between (what sealed cursors hide).
    // It reads its own tenant's (agent's) events through the binding's filter as before.
    const examine = isBound(principal) ? undefined : AUDIT_EXAMINE;
    let found: AuditRows | undefined;
    const page = await fetchPage(
      q,
      async (limit) => (found = await this.store.query({ ...f, limit, ...(examine ? { examine } : {}) })),
      (last) => cursorAt({ seq: last.seq, time: last.event.time }),
    );
    // A query that combines conditions stops after AUDIT_EXAMINE events: when it did, the page
    // (short, or empty) continues after the last event it examined.
    const resume = found?.resumeAfter;
    return {
      items: page.items.map((r) => r.event),
      next_cursor: page.next_cursor ?? (resume ? cursorAt(resume) : null),
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
   * and passes the request's tenant (and the agent a bound key is bound to). Only events of that tenant are its story: any `audit:write`
   * key can ingest an event naming any request_id, and one of another tenant (a tenant-bound
   * key's, even on an untenanted request) must not show to this tenant's reviewers as part of it.
   * An unbound key may ingest for any tenant, so its events of the request's tenant are included;
   * they stay ingested events (a kind that is not reserved), which the console marks as reports.
   */
  async requestTrail(
    requestId: string,
    only: { tenant_id: string | null; agent_id?: string | undefined },
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
      (limit) => this.store.byRequest(requestId, after, limit, only),
      (last) => encodeCursor('request', `${requestId}|${last.seq}`),
    );
    return {
      items: page.items.map((r) => r.event),
      next_cursor: page.next_cursor,
    };
  }

  /**
   * One event or `{"events": [...]}` (≤ 1000), validated as a whole, stored all or nothing.
   * `receivedBytes`: the size of the JSON text the body came in, when known (see `jsonBytesOver`).
   */
  async ingest(
    principal: Principal,
    body: unknown,
    receivedBytes?: number,
  ): Promise<{ accepted: number; ids: string[] }> {
    const isBatch = typeof body === 'object' && body !== null && 'events' in body;
    const raw = isBatch ? validateBatch(body).events : [validateEvent(body)];
    const events = raw.map((e, i) =>
      this.toEvent(principal, e, isBatch ? `events.${i}` : 'event', receivedBytes),
    );
    const stored = await this.store.append(events);
    return { accepted: stored.length, ids: stored.map((e) => e.id) };
  }

  /** `name` names the event in an error: `event`, or `events.3` in a batch. */
  private toEvent(
    principal: Principal,
    e: Record<string, unknown>,
    name: string,
    receivedBytes: number | undefined,
  ): NewAuditEvent {
    // A bound key forwards events of its own tenant and agent only, and those are filled in.
    const tenantId = narrow(principal, 'tenant', (e.tenant_id as string | null | undefined) ?? undefined);
    const agentId = narrow(principal, 'agent', (e.agent_id as string | null | undefined) ?? undefined);
    // `Decision`, `Queue.approve` or `tokens.mint` would read as Arbiter's own in the trail.
    if (readsAsReservedKind(e.kind as string)) {
      throw invalid(
        `${name === 'event' ? 'kind' : `${name}.kind`} ${String(e.kind)} is reserved for events Arbiter records itself: an ingested kind may not begin with the word ${RESERVED_KIND_WORDS.join(', ')} (in any letter case, or plural)`,
      );
    }
    // Unknown fields are kept under details; so is the caller's own `actor`: the event's actor
    // is the key that ingested it, which is the only identity Arbiter can vouch for.
    const extra = Object.fromEntries(
      Object.entries(e)
        .filter(([k]) => (!KNOWN.has(k) || k === 'actor') && !CHAIN_FIELDS.has(k))
        .map(([k, v]) => [k === 'id' ? 'source_id' : k === 'actor' ? 'source_actor' : k, v]),
    );
    const given = { ...((e.details as Record<string, unknown>) ?? {}), ...extra };
    // Free-form, like a decision's context, and held to the same limit as one value: the details
    // (with the unknown fields) and the resource, which may be any JSON too. Both are stored,
    // listed and hashed as part of the chain whole.
    if (!tooSmallToExceed(receivedBytes, this.maxDetailsBytes)) {
      const bytes = jsonBytes(given) + jsonBytes(e.resource);
      if (bytes > this.maxDetailsBytes) {
        throw tooLarge(
          `${name} has ${bytes} bytes of details (with its unknown fields) and resource as JSON, more ` +
            `than the ${this.maxDetailsBytes}-byte limit (ARBITER_MAX_CONTEXT_BYTES)`,
        );
      }
    }
    const details = this.mask({ ...given, ingested_by: principal.name });
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
   * Walks the chain from the start: each event must be the next by number, link to the one before
   * it and hash to its stored hash, the chain must end at the recorded head, and no row may lie
   * outside it. Reports the first event that fails. With an `anchor`, event `anchor.count` must
   * also still hash to `anchor.head`: a chain rebuilt from some event on is consistent, but not
   * the chain that was anchored.
   * The chain spans every tenant: its route refuses bound keys.
   */
  async verify(anchor?: ChainAnchor): Promise<VerifyResult> {
    let r = await this.sharedWalk();
    // A walk already running when this call came began at the chain as it stood then; an anchor
    // taken since (on another process, say) may name an event after its end. Only a walk begun
    // after this call can say that event is missing.
    if (r.ok && anchor && anchor.count > r.checked) r = await this.sharedWalk();
    return r.ok && anchor ? this.checkAnchor(r, anchor) : r;
  }

  /** One walk at a time: concurrent callers share the one running instead of multiplying the work. */
  private sharedWalk(): Promise<VerifyResult> {
    this.verifying ??= this.walk().finally(() => {
      this.verifying = undefined;
    });
    return this.verifying;
  }

  /**
   * Reads the chain in chunks, yielding to the event loop between them, so serving goes on. It
   * verifies the chain as it stood when the walk began (the recorded head and length then):
   * events appended meanwhile belong to the next verification. Rows outside the chain are looked
   * for last, in one snapshot with the head then recorded, which covers those appends.
   */
  private async walk(): Promise<VerifyResult> {
    const recorded = readStoredHead(await this.store.head());
    if (!recorded.ok) return { ok: false, checked: 0, first_bad: null, reason: recorded.reason };
    const head = recorded.head;
    let prev = GENESIS_HASH;
    let checked = 0;
    let after = 0;
    while (checked < head.count) {
      const want = Math.min(VERIFY_CHUNK, head.count - checked);
      const rows = await this.store.chunk(after, want);
      for (const row of rows) {
        const r = checkStoredEvent(row, prev, checked + 1);
        if (!r.ok) return { ok: false, checked, first_bad: r.id, reason: r.reason };
        prev = r.hash;
        checked++;
      }
      if (rows.length < want) break;
      after = checked;
      await new Promise((resolve) => setImmediate(resolve));
    }
    if (checked < head.count) {
      return {
        ok: false,
        checked,
        first_bad: null,
        reason: `the chain ends at event ${checked} but ${head.count} were recorded: events were removed from its end`,
      };
    }
    if (head.hash !== prev) {
      return {
        ok: false,
        checked,
        first_bad: null,
        reason: `event ${checked} does not hash to the recorded head (meta audit_head): the head or the chain was rewritten`,
      };
    }
    const outside = extentProblem(await this.store.extent());
    if (outside !== null) return { ok: false, checked, first_bad: null, reason: outside };
    return { ok: true, checked, head: prev };
  }

  /** Whether event `anchor.count` of a chain the walk found whole still hashes to `anchor.head`. */
  private async checkAnchor(r: VerifyResult & { ok: true }, anchor: ChainAnchor): Promise<VerifyResult> {
    const fail = (reason: string): VerifyResult => ({
      ok: false,
      checked: r.checked,
      first_bad: null,
      reason,
    });
    if (anchor.count > r.checked) {
      return fail(
        `the chain has only ${r.checked} events, not the ${anchor.count} of the anchor: events were removed from its end, or the anchor is of another chain`,
      );
    }
    const [row] = await this.store.chunk(anchor.count - 1, 1);
    // Hashed here from the stored body, not read from the hash column.
    const hash = row?.seq === anchor.count ? sha256Hex(row.body) : undefined;
    if (hash === undefined) return fail(`event ${anchor.count} is no longer stored: it was removed`);
    if (hash !== anchor.head) {
      return fail(
        `event ${anchor.count} hashes to ${hash}, not to the anchored head ${anchor.head}: the chain was rewritten up to it`,
      );
    }
    return r;
  }
}
