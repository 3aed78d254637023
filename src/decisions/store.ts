import type { AuditEvent, NewAuditEvent } from '../audit/types.js';
import type { LimitUse, QueueItem } from '../queue/types.js';

/** What is kept of an answered decision: enough to replay it and to exchange it for a token. */
export interface DecisionRecord {
  request_id: string;
  kind: 'agent' | 'human';
  status: 'allow' | 'requires_approval' | 'deny';
  /** Id of the API key that asked. */
  key_id: string;
  tenant_id: string | null;
  /** agent_id or user_id */
  subject: string;
  action: string;
  resource: unknown;
  message: string | null;
  trace_id: string;
  created_at: string;
  expires_at: string | null;
  idem_key: string | null;
  body_hash: string | null;
  token_id: string | null;
  request_digest?: string | null;
  policy_revision?: number | null;
}

/** What the decision store records for one decision, atomically. */
export interface DecisionToRecord {
  decision: DecisionRecord;
  event: NewAuditEvent;
  /** The queue item of a requires_approval. */
  item?: QueueItem | undefined;
  /** An Idempotency-Key replays only decisions made at or after this instant. */
  idemSince: string;
  /**
   * Budgets an allow consumes. If any is exhausted, nothing is consumed and `denials[i]` (for the
   * first exhausted limit i) is recorded instead of `decision`.
   */
  charge?: LimitCharge | undefined;
}

export interface LimitCharge {
  limits: LimitUse[];
  denials: { decision: DecisionRecord; event: NewAuditEvent }[];
}

/**
 * What a store reports of a decision's audit event once it is in the trail: enough for metrics and
 * checks, not the event itself (which would cross back from the writer thread for nothing).
 */
export type RecordedEvent = Pick<AuditEvent, 'kind' | 'outcome' | 'hash'>;

export const recordedEvent = (e: AuditEvent): RecordedEvent => ({
  kind: e.kind,
  outcome: e.outcome,
  hash: e.hash,
});

/** The decision actually recorded (the denial when a budget was exhausted), or the replay. */
export type RecordOutcome =
  { recorded: RecordedEvent; decision: DecisionRecord; exhausted?: LimitUse } | { replay: DecisionRecord };

export interface DecisionStore {
  /**
   * Records a decision, its audit event and (for requires_approval) its queue item atomically,
   * consuming its budgets in the same transaction. When the decision carries an idempotency key
   * already used by the same API key since `idemSince`, nothing is written and the earlier
   * decision is returned to be replayed.
   */
  record(r: DecisionToRecord): Promise<RecordOutcome>;
  findByIdempotencyKey(keyId: string, idemKey: string, since: string): Promise<DecisionRecord | undefined>;
  get(requestId: string): Promise<DecisionRecord | undefined>;
}

/** Current budget counters (SPEC §13), for GET /api/v1/limits. */
export interface LimitCounter {
  key: string;
  window: string;
  windowMs: number;
  windowStart: string;
  /** Micro-units. */
  used: number;
  max: number;
}

export interface LimitStore {
  /** The newest counter of every (key, window), for one key or all. */
  latest(key: string | undefined): Promise<LimitCounter[]>;
  /** The window lengths (ms) counters exist for. */
  windowLengths(): Promise<number[]>;
  /**
   * Deletes up to `batch` counters of window length `windowMs` superseded by a newer window of
   * the same key that began before `since` (an ISO time, compared as window_start is stored):
   * nothing reads them any more (charges read the current window, `latest` the newest). Returns
   * how many it deleted.
   */
  pruneSuperseded(windowMs: number, since: string, batch: number): Promise<number>;
}
