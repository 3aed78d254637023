import { createHash } from 'node:crypto';
import { canonicalJson } from '../common/canonical-json.js';
import { newId } from '../ids.js';
import type { AuditEvent, NewAuditEvent } from './types.js';

/**
 * The audit hash chain, as pure functions that every storage backend calls inside its append
 * transaction: "link these events after this head". Stores hold the SQL; the rules are here.
 *
 * What is hashed is exactly what is stored: each event is kept as `body`, the canonical JSON text
 * of every field but `hash` (prev_hash included), and `hash` is the SHA-256 of that text. The
 * columns a store indexes for filtering are copies taken from the body, checked by verification.
 */

/** The hash that precedes the first event of the chain. */
export const GENESIS_HASH = '0'.repeat(64);

/** The end of the chain as recorded with the last append. */
export interface ChainHead {
  hash: string;
  /** Events in the chain; the next event's sequence number is count + 1. */
  count: number;
}

export const EMPTY_CHAIN: ChainHead = { hash: GENESIS_HASH, count: 0 };

/** The head as the `meta` table holds it: each value's text, undefined when its row is missing. */
export interface StoredHead {
  audit_head: string | undefined;
  audit_count: string | undefined;
}

/** A stored head read as a ChainHead, or why it cannot be (every migration records one). */
export type RecordedHead = { ok: true; head: ChainHead } | { ok: false; reason: string };

/** A SHA-256 hash as the chain stores and verify answers it: 64 lowercase hex digits. */
export const HEX64 = /^[0-9a-f]{64}$/;
/** Integer text. SQLite appends once wrote it as a REAL's text ("12.0"), which reads the same. */
const COUNT = /^(0|[1-9]\d{0,14})(\.0)?$/;

/**
 * Reads the recorded head. Migrations record one in every database, an empty one included
 * (64 zeros, count 0), so a missing or malformed value is never read as "empty": someone changed
 * the table, and both verification and appends refuse to go on from it.
 */
export function readStoredHead(s: StoredHead): RecordedHead {
  const missing = (['audit_head', 'audit_count'] as const).filter((k) => s[k] === undefined);
  if (missing.length > 0) {
    return {
      ok: false,
      reason: `the chain head is not recorded: meta ${missing.join(' and ')} ${missing.length > 1 ? 'are' : 'is'} missing`,
    };
  }
  const hash = s.audit_head as string;
  const count = s.audit_count as string;
  if (!HEX64.test(hash)) {
    return { ok: false, reason: 'the recorded chain head (meta audit_head) is not a SHA-256 hex hash' };
  }
  if (!COUNT.test(count)) {
    return {
      ok: false,
      reason: 'the recorded event count (meta audit_count) is not a non-negative integer',
    };
  }
  return { ok: true, head: { hash, count: Number(count) } };
}

/**
 * What /healthz says when appends cannot go on from the recorded head (every decision then
 * answers 503), or undefined when they can. The reason is verify's to tell, to an audit:read key.
 */
export function appendProblem(s: StoredHead): string | undefined {
  return readStoredHead(s).ok
    ? undefined
    : 'the audit trail cannot be appended to: its recorded head is unreadable (GET /api/v1/audit/verify says why)';
}

/** The head of the chain for an append: as recorded, or an error when it cannot be read. */
export function headForAppend(s: StoredHead): ChainHead {
  const r = readStoredHead(s);
  if (!r.ok) throw new Error(`cannot append to the audit chain: ${r.reason}`);
  return r.head;
}

/** The stored rows as one snapshot sees them, with the head recorded in the same snapshot. */
export interface ChainExtent {
  /** null when there are no rows */
  minSeq: number | null;
  maxSeq: number | null;
  head: StoredHead;
}

/**
 * What verification concludes from the extent of the stored rows: every row must be an event of
 * the recorded chain, numbered 1…count. Rows outside it are served by every read path (the list,
 * a trace, a queue item's events) though no walk of the chain reaches them. Null when they are.
 */
export function extentProblem(x: ChainExtent): string | null {
  const recorded = readStoredHead(x.head);
  if (!recorded.ok) return recorded.reason;
  const count = recorded.head.count;
  // `seq` is the primary key: with the least at 1 and the greatest at most `count`, every row is
  // one of 1…count (no row count needed, whose scan of the whole table would cost a long pause).
  if (x.minSeq !== null && x.minSeq !== 1) {
    return `an event is stored at number ${String(x.minSeq)}, before the chain's first (1): it was inserted outside the chain`;
  }
  if (x.maxSeq !== null && x.maxSeq > count) {
    return `an event is stored at number ${x.maxSeq}, beyond the ${count} the chain records: it was inserted, or the recorded count lowered`;
  }
  return null;
}

/** The filterable columns of an event row (see AUDIT_EQUALITY_FILTERS, plus time). */
export interface AuditIndexColumns {
  time: string;
  kind: string;
  trace_id: string | null;
  request_id: string | null;
  agent_id: string | null;
  user_id: string | null;
  tenant_id: string | null;
  action: string | null;
  outcome: string | null;
}

/** One event ready to insert: its position, stored text, hash and index columns. */
export interface LinkedEvent {
  seq: number;
  body: string;
  hash: string;
  columns: AuditIndexColumns;
  event: AuditEvent;
}

export const sha256Hex = (text: string): string => createHash('sha256').update(text).digest('hex');

/** Fills in what a caller may leave out: id, time, and null for every absent field. */
export function completeEvent(e: NewAuditEvent, prevHash: string): Omit<AuditEvent, 'hash'> {
  return {
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
    prev_hash: prevHash,
  };
}

export function indexColumns(e: Omit<AuditEvent, 'hash'>): AuditIndexColumns {
  return {
    time: e.time,
    kind: e.kind,
    trace_id: e.trace_id,
    request_id: e.request_id,
    agent_id: e.agent_id,
    user_id: e.user_id,
    tenant_id: e.tenant_id,
    action: e.action,
    outcome: e.outcome,
  };
}

/** Links `events` after `head`, in order: each one's prev_hash is the hash before it. */
export function linkEvents(
  head: ChainHead,
  events: NewAuditEvent[],
): { linked: LinkedEvent[]; head: ChainHead } {
  let prev = head.hash;
  const linked = events.map((e, i): LinkedEvent => {
    const content = completeEvent(e, prev);
    const body = canonicalJson(content);
    const hash = sha256Hex(body);
    prev = hash;
    return {
      seq: head.count + i + 1,
      body,
      hash,
      columns: indexColumns(content),
      event: { ...content, hash },
    };
  });
  return { linked, head: { hash: prev, count: head.count + events.length } };
}

/** An event as served, from its stored body and hash. */
export function eventFromStored(body: string, hash: string): AuditEvent {
  return { ...(JSON.parse(body) as Omit<AuditEvent, 'hash'>), hash };
}

/** A stored row as verification reads it. */
export interface StoredEvent {
  seq: number;
  body: string;
  hash: string;
  columns: AuditIndexColumns;
}

export type ChainCheck = { ok: true; hash: string } | { ok: false; id: string | null; reason: string };

/**
 * Checks one stored event against the hash before it: it is number `seq` of the chain, its body
 * hashes to its hash, links to `prev`, and its index columns are the body's own values (so a filter cannot be made to hide it).
 */
export function checkStoredEvent(row: StoredEvent, prev: string, seq: number): ChainCheck {
  let parsed: unknown;
  try {
    parsed = JSON.parse(row.body);
  } catch {
    return { ok: false, id: null, reason: `event ${row.seq} has a body that is not JSON: it was modified` };
  }
  // Every stored body is an object (completeEvent's): anything else was written by someone else,
  // and reading its fields would fail the walk instead of reporting the event.
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    return {
      ok: false,
      id: null,
      reason: `event ${row.seq} has a body that is not a JSON object: it was modified`,
    };
  }
  const content = parsed as Omit<AuditEvent, 'hash'>;
  // The id a tampered body claims is reported only when it could be one.
  const id = typeof content.id === 'string' ? content.id : null;
  if (row.seq !== seq) {
    return {
      ok: false,
      id,
      reason: `event ${seq} is missing: the next stored event is number ${row.seq}, so an event was deleted or renumbered`,
    };
  }
  if (sha256Hex(row.body) !== row.hash) {
    return { ok: false, id, reason: 'event content does not match its hash: it was modified' };
  }
  if (content.prev_hash !== prev) {
    return {
      ok: false,
      id,
      reason: 'prev_hash does not match the event before it: an event was deleted, inserted or reordered',
    };
  }
  if (canonicalJson(indexColumns(content)) !== canonicalJson(row.columns)) {
    return {
      ok: false,
      id,
      reason: 'the indexed columns of this event differ from its hashed content: they were modified',
    };
  }
  return { ok: true, hash: row.hash };
}

/** The head as the `meta` rows `audit_head` and `audit_count` hold it (either may be missing). */
export function storedHeadOf(rows: { key: string; value: string }[]): StoredHead {
  const get = (k: string) => rows.find((r) => r.key === k)?.value;
  return { audit_head: get('audit_head'), audit_count: get('audit_count') };
}
