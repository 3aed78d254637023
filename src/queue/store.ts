import type { NewAuditEvent } from '../audit/types.js';
import type { QueueItem } from './types.js';

export interface PendingFilter {
  agent_id?: string | undefined;
  tenant_id?: string | undefined;
  action?: string | undefined;
  /** Cursor: only items with a larger id (ids are time-ordered UUIDv7). */
  after?: string | undefined;
  limit: number;
  /** Items whose expires_at is at or before this instant are not pending any more. */
  now: string;
}

export type DecideOutcome = { won: true; item: QueueItem } | { won: false; item: QueueItem | undefined };

export interface QueueStore {
  get(id: string): Promise<QueueItem | undefined>;
  listPending(f: PendingFilter): Promise<QueueItem[]>;
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
  ): Promise<DecideOutcome>;
  /** Moves every pending item due at `now` to expired, each with its audit event. */
  expireDue(now: string, event: (item: QueueItem) => NewAuditEvent, ids?: string[]): Promise<QueueItem[]>;
  countPending(now: string): Promise<number>;
}
