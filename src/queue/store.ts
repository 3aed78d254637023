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
  /**
   * With it, a page with any filter (agent_id, tenant_id, action, since, until) examines at most
   * this many pending items in list order, through the (status, id) index, and checks the filters
   * and the expiry on those alone. Without it pending items are read until the page is full.
   */
  examine?: number | undefined;
}

/** The filters of a queue list that name a column an index of decided items leads with. */
export type QueueDriver = 'agent_id' | 'tenant_id';

export interface DecidedFilter extends ItemFilter {
  /** One or more of approved, denied, expired. */
  statuses: readonly DecidedStatus[];
  /** Cursor: only items decided before this one, in (decided_at, id) order. */
  before?: { decided_at: string; id: string } | undefined;
  /**
   * The index the list reads in (decided_at, id) order: that of this filter, which must be given
   * (a bound key's binding). Default: agent_id's if given, else tenant_id's, else the states'.
   */
  drive?: QueueDriver | undefined;
  /**
   * With it, a page whose conditions its index does not serve alone examines at most this many
   * items in list order, through that index, and checks the other conditions on those alone.
   * Without it every item of the index is read until the page is full.
   */
  examine?: number | undefined;
}

/**
 * What a list answers: the matching items in list order, and when a bounded page (`examine`)
 * stopped before the end of its index, the last item it examined (continue after it).
 */
export type QueueRows = QueueItem[] & { resumeAfter?: { id: string; decided_at: string | null } };

/** Every decided state: a list of all three is every row of the decided indexes. */
const EVERY_DECIDED = 3;

/**
 * How a decided list reads: through which index (`status`: the one of its single state, the
 * (decided_at, id) one for every state, or each of two states' merged), the conditions that index
 * does not serve (checked on each row it reads), and `examine` when the page is bounded (there
 * are such conditions, and the caller allowed it).
 */
export function decidedScan(f: DecidedFilter): {
  drive: QueueDriver | 'status';
  rest: { statuses?: readonly DecidedStatus[]; agent_id?: string; tenant_id?: string; action?: string };
  examine: number | undefined;
} {
  const drive =
    f.drive ?? (f.agent_id !== undefined ? 'agent_id' : f.tenant_id !== undefined ? 'tenant_id' : 'status');
  if (drive !== 'status' && f[drive] === undefined)
    throw new Error(`a list driven by ${drive} needs its value`);
  const rest = {
    ...(drive !== 'status' && f.statuses.length < EVERY_DECIDED ? { statuses: f.statuses } : {}),
    ...(drive !== 'agent_id' && f.agent_id !== undefined ? { agent_id: f.agent_id } : {}),
    ...(drive !== 'tenant_id' && f.tenant_id !== undefined ? { tenant_id: f.tenant_id } : {}),
    ...(f.action !== undefined ? { action: f.action } : {}),
  };
  const checks = Object.keys(rest).length > 0 || f.since !== undefined || f.until !== undefined;
  return { drive, rest, examine: checks ? f.examine : undefined };
}

/** Whether a pending page is bounded: it has filters to check, and the caller allowed it. */
export function pendingExamine(f: PendingFilter): number | undefined {
  const filtered = (['agent_id', 'tenant_id', 'action', 'since', 'until'] as const).some(
    (c) => f[c] !== undefined,
  );
  return filtered ? f.examine : undefined;
}

export type DecideOutcome =
  | { won: true; item: QueueItem }
  /** `exhausted`: the approval was refused because a budget it consumes is used up. */
  | { won: false; item: QueueItem | undefined; exhausted?: LimitUse };

export interface QueueStore {
  get(id: string): Promise<QueueItem | undefined>;
  /** Pending and not yet due, oldest first. */
  listPending(f: PendingFilter): Promise<QueueRows>;
  /** Decided items, newest decision first: (decided_at, id) descending. */
  listDecided(f: DecidedFilter): Promise<QueueRows>;
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
