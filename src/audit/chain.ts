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
 * Checks one stored event against the hash before it: its body hashes to its hash, links to
 * `prev`, and its index columns are the body's own values (so a filter cannot be made to hide it).
 */
export function checkStoredEvent(row: StoredEvent, prev: string): ChainCheck {
  let content: Omit<AuditEvent, 'hash'>;
  try {
    content = JSON.parse(row.body) as Omit<AuditEvent, 'hash'>;
  } catch {
    return { ok: false, id: null, reason: `event ${row.seq} has a body that is not JSON: it was modified` };
  }
  if (sha256Hex(row.body) !== row.hash) {
    return { ok: false, id: content.id, reason: 'event content does not match its hash: it was modified' };
  }
  if (content.prev_hash !== prev) {
    return {
      ok: false,
      id: content.id,
      reason: 'prev_hash does not match the event before it: an event was deleted, inserted or reordered',
    };
  }
  if (canonicalJson(indexColumns(content)) !== canonicalJson(row.columns)) {
    return {
      ok: false,
      id: content.id,
      reason: 'the indexed columns of this event differ from its hashed content: they were modified',
    };
  }
  return { ok: true, hash: row.hash };
}
