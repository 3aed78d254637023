import type { ChainExtent, StoredEvent, StoredHead } from './chain.js';
import type { AuditEvent, NewAuditEvent } from './types.js';

/** Filters that match a column exactly (each has an index ending in seq). */
export const AUDIT_EQUALITY_FILTERS = [
  'kind',
  'agent_id',
  'user_id',
  'tenant_id',
  'action',
  'outcome',
  'request_id',
  'trace_id',
] as const;

/** Every query parameter of GET /api/v1/audit. */
export const AUDIT_QUERY_PARAMS = [...AUDIT_EQUALITY_FILTERS, 'since', 'until', 'limit', 'cursor'] as const;

export interface AuditFilter {
  kind?: string;
  agent_id?: string;
  user_id?: string;
  tenant_id?: string;
  action?: string;
  outcome?: string;
  request_id?: string;
  trace_id?: string;
  /** RFC 3339, inclusive */
  since?: string;
  /** RFC 3339, exclusive */
  until?: string;
  /**
   * Cursor. Without since/until the list is in append order (seq) and the cursor is a seq;
   * with a time window it is in event-time order, (time, seq), which the time index serves
   * without sorting, and the cursor carries both.
   */
  before?: { seq: number; time?: string };
  limit: number;
  /**
   * With it, a query that combines conditions (two or more equality filters, or any with a time
   * window) examines at most this many events in list order: those of its first equality filter
   * in AUDIT_DRIVING_ORDER (no window), or those of the window. Without it every event that
   * matches is searched for, however many others are read on the way (impact replay).
   */
  examine?: number;
}

/**
 * Which equality filter drives a bounded query without a time window: the first present of these,
 * through its (column, seq) index; the others are checked on the events it reads.
 */
export const AUDIT_DRIVING_ORDER = [
  'request_id',
  'trace_id',
  'user_id',
  'agent_id',
  'tenant_id',
  'action',
  'kind',
  'outcome',
] as const;

/**
 * What a query answers: the matching events, newest first, and when a bounded query (`examine`)
 * stopped before the end, the last event it examined (its list position: continue after it).
 */
export type AuditRows = { seq: number; event: AuditEvent; length: number }[] & {
  resumeAfter?: { seq: number; time: string };
};

/**
 * How a bounded query reads (see AuditFilter.examine): undefined when it needs no bound (one
 * condition at most, each served exactly by an index in list order).
 */
export function boundedScan(
  f: AuditFilter,
): { examine: number; driving: (typeof AUDIT_DRIVING_ORDER)[number] | 'time' } | undefined {
  // A request's events are a handful, found exactly through request_id's index in one page (a
  // window with it would otherwise take a page per 2 000 events of the window to find them).
  if (f.examine === undefined || f.request_id !== undefined) return undefined;
  const byTime = f.since !== undefined || f.until !== undefined;
  const present = AUDIT_DRIVING_ORDER.filter((c) => f[c] !== undefined);
  if (present.length + (byTime ? 1 : 0) < 2) return undefined;
  return { examine: f.examine, driving: byTime ? 'time' : present[0]! };
}

/** Append-only audit storage. `append` is atomic: all events land, chained, or none do. */
export interface AuditStore {
  append(events: NewAuditEvent[]): Promise<AuditEvent[]>;
  /**
   * Newest first, with each event's sequence number (for cursors) and the length of its stored
   * JSON text (UTF-16 code units, its bytes when ASCII): what the event weighs, known without
   * serializing it again (an impact replay sizes its messages and pages by it).
   */
  query(f: AuditFilter): Promise<AuditRows>;
  /**
   * Up to `limit` events of one trace after sequence number `afterSeq`, oldest first; with `only`,
   * just those of that tenant and of that agent (each: when given). Filtered before the limit, so
   * that a page holds only events the caller may see.
   */
  trace(
    traceId: string,
    afterSeq: number,
    limit: number,
    only?: { tenant_id?: string | undefined; agent_id?: string | undefined },
  ): Promise<{ seq: number; event: AuditEvent }[]>;
  /**
   * Up to `limit` events of one request (its decision, queue transition, tokens) after `afterSeq`,
   * oldest first; with `only`, just those of that tenant (null: of no tenant) and, when
   * `agent_id` is given, of that agent.
   */
  byRequest(
    requestId: string,
    afterSeq: number,
    limit: number,
    only?: { tenant_id: string | null; agent_id?: string | undefined },
  ): Promise<{ seq: number; event: AuditEvent }[]>;
  /** Up to `limit` stored rows after sequence number `afterSeq`, in chain order (verification). */
  chunk(afterSeq: number, limit: number): Promise<StoredEvent[]>;
  /** The head hash and event count recorded with the last append, as stored. */
  head(): Promise<StoredHead>;
  /** The count and the lowest and highest sequence numbers of the stored rows, and the recorded
   * head, all read in one snapshot. */
  extent(): Promise<ChainExtent>;
}
