import type { NewAuditEvent } from '../audit/types.js';
import type { LimitUse, QueueItem, QueueStatus } from './types.js';

/** The states an item leaves pending for; they share one ordering (newest decision first). */
export type DecidedStatus = Exclude<QueueStatus, 'pending'>;

interface ItemFilter {
  agent_id?: string | undefined;
  tenant_id?: string | undefined;
  action?: string | undefined;
  /** created_at at or after this instant (ISO 8601, UTC) */
  since?: string | undefined;
  /** created_at before this instant (ISO 8601, UTC) */
  until?: string | undefined;
  limit: number;
}

export interface PendingFilter extends ItemFilter {
  /** Cursor: only items with a larger id (ids are time-ordered UUIDv7). */
  after?: string | undefined;
  /** Items whose expires_at is at or before this instant are not pending any more. */
  now: string;
}

export interface DecidedFilter extends ItemFilter {
  /** One or more of approved, denied, expired. */
  statuses: readonly DecidedStatus[];
  /** Cursor: only items decided before this one, in (decided_at, id) order. */
  before?: { decided_at: string; id: string } | undefined;
}

export type DecideOutcome =
  | { won: true; item: QueueItem }
  /** `exhausted`: the approval was refused because a budget it consumes is used up. */
  | { won: false; item: QueueItem | undefined; exhausted?: LimitUse };

export interface QueueStore {
  get(id: string): Promise<QueueItem | undefined>;
  /** Pending and not yet due, oldest first. */
  listPending(f: PendingFilter): Promise<QueueItem[]>;
  /** Decided items, newest decision first: (decided_at, id) descending. */
  listDecided(f: DecidedFilter): Promise<QueueItem[]>;
  /**
   * The one conditional write: pending and not yet expired → approved | denied. Of any number of
   * concurrent callers exactly one wins; the others get the item as it now is.
   */
  decide(
    id: string,
    to: 'approved' | 'denied',
    by: string,
    note: string | null,
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
    /** Budgets an approval consumes, in the same transaction; none consumed if one is exhausted. */
    charge?: LimitUse[],
  ): Promise<DecideOutcome>;
  /** Moves every pending item due at `now` to expired, each with its audit event. */
  expireDue(now: string, event: (item: QueueItem) => NewAuditEvent, ids?: string[]): Promise<QueueItem[]>;
  countPending(now: string): Promise<number>;
}
