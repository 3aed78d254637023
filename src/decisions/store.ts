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
  /**
   * The user it was for, as audit events name one: a human decision's user, or the user an agent
   * acted on behalf of (SPEC §13; the tenant is tenant_id). Null for an agent acting for itself.
   */
  user_id?: string | null;
}

/** The agent a decision was made for: its subject for an agent decision, none for a human one. */
export const decisionAgent = (d: Pick<DecisionRecord, 'kind' | 'subject'>): string | null =>
  d.kind === 'agent' ? d.subject : null;

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
  /**
   * The most pending approvals the requesting key may have, with a requires_approval's queue item:
   * when the key already has that many that have not expired at the item's `created_at`, nothing
   * is recorded and the outcome is `{capped: true}`; the caller records its deny next (ADR 0013).
   */
  pendingCap?: number | undefined;
  /** Set when a shadow set shadowed this decision (SPEC §11). */
  shadow?: ShadowedBy | undefined;
}

/** Which shadow set shadowed a decision, and against what. */
export interface ShadowedBy {
  /** The shadow generation that answered (its tally counts this decision). */
  generation: number;
  /**
   * The live policy set's answer the shadow's was compared with. It differs from the recorded
   * outcome only when a budget turned an allow into a deny, or the pending cap a requires_approval
   * (ADR 0013): shadow mode compares the policies' answers, so those count as the policy's.
   */
  live: 'allow' | 'requires_approval' | 'deny';
}

/** How many disagreements of a shadow generation a store keeps as samples (the newest). */
export const SHADOW_SAMPLES = 20;

/**
 * What the shadow report (GET /api/v1/shadow) keeps of a shadow generation, updated in each
 * decision's transaction so that the report never reads the trail: a count per (result, live
 * answer, shadow status), and the newest disagreements.
 */
export interface ShadowTally {
  counts: ShadowCount[];
  /** Newest first, at most SHADOW_SAMPLES. */
  samples: ShadowSample[];
}

/** Decisions of one shadow result, live policy answer (`live`, ShadowedBy.live) and shadow status. */
export interface ShadowCount {
  result: 'agree' | 'disagree' | 'error';
  live: string;
  shadow: string;
  n: number;
}

/** A disagreement kept as a sample. */
export interface ShadowSample {
  request_id: string;
  live: string;
  shadow: string;
}

/**
 * What a recorded decision event adds to its shadow generation's tally: its shadow result and the
 * shadow's status as the event says them, and `live`, the live policy set's answer they were
 * compared with (ShadowedBy.live). Undefined for an event that was not shadowed.
 */
function shadowMarkOf(
  e: NewAuditEvent,
  live: ShadowedBy['live'],
): (Omit<ShadowCount, 'n'> & { requestId: string }) | undefined {
  const result = e.details?.shadow_result;
  if (result !== 'agree' && result !== 'disagree' && result !== 'error') return undefined;
  const shadow = (e.details?.shadow as { status?: unknown } | undefined)?.status;
  return {
    result,
    live,
    shadow: typeof shadow === 'string' ? shadow : 'unknown',
    requestId: e.request_id ?? '',
  };
}

/**
 * The decisions of a batch that a shadow set shadowed, as recorded (replays and capped left out), with
 * their generation and live answer: what shadowMarksOf tallies. Empty, and nothing built, when
 * none was.
 */
export function shadowedOf(
  batch: DecisionToRecord[],
  recorded: ({ replay: unknown } | { capped: true } | { event: NewAuditEvent })[],
): ShadowedEvent[] {
  // Runs on the writer for every batch: a plain loop (flatMap and spreads cost it ~1 µs per
  // decision, docs/performance.md).
  const out: ShadowedEvent[] = [];
  for (let i = 0; i < recorded.length; i++) {
    const shadow = batch[i]?.shadow;
    const x = recorded[i] as { replay: unknown } | { capped: true } | { event: NewAuditEvent };
    // A capped decision is counted when its deny is recorded, in a later batch.
    if (shadow !== undefined && 'event' in x) {
      out.push({ generation: shadow.generation, live: shadow.live, event: x.event });
    }
  }
  return out;
}

/** A recorded event that a shadow set shadowed. */
export interface ShadowedEvent extends ShadowedBy {
  event: NewAuditEvent;
}

/** The marks of one batch: counts summed per (generation, result, live, shadow), and samples. */
export function shadowMarksOf(recorded: ShadowedEvent[]): {
  counts: (ShadowCount & { generation: number })[];
  samples: (ShadowSample & { generation: number })[];
} {
  // A batch has a handful of distinct marks at most: a linear search beats building a key per
  // decision (this runs on the writer for every batch).
  const counts: (ShadowCount & { generation: number })[] = [];
  const samples: (ShadowSample & { generation: number })[] = [];
  for (const { generation, live, event } of recorded) {
    const m = shadowMarkOf(event, live);
    if (!m) continue;
    const c = counts.find(
      (x) =>
        x.generation === generation && x.result === m.result && x.live === m.live && x.shadow === m.shadow,
    );
    if (c) c.n++;
    else counts.push({ generation, result: m.result, live: m.live, shadow: m.shadow, n: 1 });
    if (m.result === 'disagree') {
      samples.push({ generation, request_id: m.requestId, live: m.live, shadow: m.shadow });
    }
  }
  // Older disagreements of a generation than its newest SHADOW_SAMPLES in this batch would be
  // deleted in the same transaction: not written at all.
  const seen = new Map<number, number>();
  const newest = samples
    .reverse()
    .filter((x) => {
      const n = (seen.get(x.generation) ?? 0) + 1;
      seen.set(x.generation, n);
      return n <= SHADOW_SAMPLES;
    })
    .reverse();
  return { counts, samples: newest };
}

/** Whether a requires_approval is over `cap` when its key has `pending` unexpired items (both stores). */
export const overPendingCap = (cap: number, pending: number): boolean => pending >= cap;

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

/**
 * The decision actually recorded (the denial when a budget was exhausted), or the replay; or,
 * for a requires_approval over its key's pending cap, nothing recorded (`capped`).
 */
export type RecordOutcome =
  | { recorded: RecordedEvent; decision: DecisionRecord; exhausted?: LimitUse }
  | { replay: DecisionRecord }
  | { capped: true };

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
  /** The tally of one shadow generation (empty when nothing was shadowed by it). */
  shadowTally(generation: number): Promise<ShadowTally>;
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
  /**
   * The next `limit` counter keys after `after` (from the start when null), in key order, as a
   * range, with the window lengths counted under them; undefined past the last key.
   */
  counterKeys(
    after: string | null,
    limit: number,
  ): Promise<{ first: string; last: string; windowLengths: number[] } | undefined>;
  /**
   * Deletes the counters of window length `windowMs` with a key in [first, last] that a newer
   * window of the same key supersedes, one that began before `since` (an ISO time, compared as
   * window_start is stored): nothing reads them any more (charges read the current window,
   * `latest` the newest). Returns how many it deleted.
   */
  pruneSuperseded(range: { first: string; last: string }, windowMs: number, since: string): Promise<number>;
}
