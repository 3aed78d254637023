import { eventUserId, type AuditEvent, type NewAuditEvent } from '../audit/types.js';
import { busy, conflict, forbidden, notFound, unauthenticated } from '../errors.js';
import { boundTo, checkBinding, isBound, narrowToBinding } from '../keys/binding.js';
import type { Principal } from '../keys/types.js';
import {
  decodeCursor,
  encodeCursor,
  fetchPage,
  readCursor,
  type Page,
  type PageQuery,
} from '../common/pagination.js';
import { compileSchema } from '../common/validation.js';
import type { DecidedStatus, QueueDriver, QueueRows, QueueStore } from './store.js';
import type { QueueItem, QueueItemView } from './types.js';
import { chargeAt, fromMicro } from '../decisions/limits.js';

export const MAX_WAIT_SECONDS = 60;

/**
 * The most queue items one page of GET /v1/queue (or /v1/queue/pending) examines when its index
 * does not serve every condition it has: its cost per request, whatever the queue's size.
 */
export const QUEUE_EXAMINE = 2_000;

/** A queue item as the API shows it (QueueItemView). */
export const present = ({ requested_by: _key, limits: _limits, ...view }: QueueItem): QueueItemView => ({
  ...view,
  request_digest: view.request_digest ?? null,
  policy_revision: view.policy_revision ?? null,
  on_behalf_of: view.on_behalf_of ?? null,
});

/** Body of POST /v1/queue/{id}/approve and /deny (optional). */
export const decideRequestSchema = {
  type: 'object',
  additionalProperties: false,
  properties: { note: { type: 'string', maxLength: 2000 } },
};
const validateDecideBody = compileSchema<{ note?: string }>(decideRequestSchema);
/**
 * How often a long-poll re-reads the store, to see decisions made by other processes: often when
 * nothing tells this process about them (SQLite workers), rarely when a change feed wakes it
 * (PostgreSQL's LISTEN/NOTIFY) and the re-read only covers a lost notice.
 */
const POLL_MS = { unnotified: 100, notified: 500 };

/** Every state an item can be in; `?status=` takes one, or several decided ones. */
export const QUEUE_STATUSES = ['pending', 'approved', 'denied', 'expired'] as const;
/** Pending pages share their cursor with GET /v1/queue/pending. */
const PENDING_CURSOR = 'queue';

/** What a queue list asks for; the edge has parsed and checked each value. */
export interface QueueListQuery extends PageQuery {
  /** One state, or several decided ones (default: pending). */
  statuses?: 'pending' | readonly DecidedStatus[] | undefined;
  agent_id?: string | undefined;
  tenant_id?: string | undefined;
  action?: string | undefined;
  /** created_at at or after this instant (ISO 8601, UTC) */
  since?: string | undefined;
  /** created_at before this instant (ISO 8601, UTC) */
  until?: string | undefined;
}

/**
 * Reads the audit events of one request of one tenant (the audit service's, so the queue needs no
 * audit store).
 */
export type RequestTrail = (
  requestId: string,
  only: { tenant_id: string | null; agent_id?: string | undefined },
  q: PageQuery,
) => Promise<Page<AuditEvent>>;

export interface QueueObserver {
  transitioned(to: 'approved' | 'denied' | 'expired'): void;
}

/**
 * The human-review queue. States: pending → approved | denied | expired, terminal states never
 * change. An item past expires_at reads as expired even before the sweeper has moved it.
 */
export class QueueService {
  private readonly waiters = new Map<string, Set<() => void>>();
  private sweeper: NodeJS.Timeout | undefined;
  private stopping = false;

  private longPolls = 0;
  /** Long-polls held per API key (a key appears while it holds one). */
  private readonly longPollsByKey = new Map<string, number>();

  constructor(
    private readonly store: QueueStore,
    private readonly observer: QueueObserver,
    private readonly opts: {
      /** Long-polls held at once in this process, and by one API key (src/config.ts). */
      maxLongPolls: number;
      maxLongPollsPerKey: number;
      trail?: RequestTrail;
      notified?: boolean;
      /**
       * Whether the key a principal authenticated with is still live (not revoked since): a
       * long-poll outlives the authentication that let it in.
       */
      keyLive?: (principal: Principal) => Promise<boolean>;
    },
  ) {}

  /** Starts the periodic sweep that records expirations (reads never wait for it). */
  startSweeper(intervalMs: number): void {
    this.sweeper = setInterval(() => {
      this.expire().catch(() => undefined);
    }, intervalMs);
    this.sweeper.unref();
  }

  /** Ends every long-poll now (it answers with the item as it is), for graceful shutdown. */
  stop(): void {
    this.stopping = true;
    if (this.sweeper) clearInterval(this.sweeper);
    for (const set of this.waiters.values()) for (const wake of set) wake();
  }

  /** The pending list (GET /v1/queue/pending): `list` with status pending. */
  listPending(
    principal: Principal,
    q: Omit<QueueListQuery, 'statuses' | 'since' | 'until'>,
  ): Promise<Page<QueueItem>> {
    return this.list(principal, { ...q, statuses: 'pending' });
  }

  /**
   * Items in one state, or in several decided states at once (`approved,denied`): pending
   * oldest first, decided newest decision first. A bound key sees only its tenant and agent.
   */
  async list(principal: Principal, q: QueueListQuery): Promise<Page<QueueItem>> {
    const statuses = q.statuses ?? 'pending';
    const filter = {
      ...narrowToBinding(principal, q),
      action: q.action,
      since: q.since,
      until: q.until,
    };
    if (statuses === 'pending') {
      const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor, PENDING_CURSOR);
      const now = new Date().toISOString();
      // A bound key's pending pages are exact: they read every tenant's pending items through the
      // (status, id) index (no index by tenant or agent, which every requires_approval would
      // write), and a bounded page there would count the other tenants' (docs/decisions.md).
      const examine = isBound(principal) ? undefined : QUEUE_EXAMINE;
      return this.page(
        q,
        (limit) => this.store.listPending({ ...filter, after, limit, now, examine }),
        (at) => encodeCursor(PENDING_CURSOR, at.id),
      );
    }
    // A cursor names the states it pages through: replayed against other states it is refused.
    const kind = `queue-${statuses.join(',')}`;
    let before: { decided_at: string; id: string } | undefined;
    if (q.cursor !== undefined) {
      const m = readCursor(q.cursor, kind, /^(\d{4}-\d\d-\d\dT[\d:.]+Z)\|([^|]{1,128})$/);
      before = { decided_at: m[1] as string, id: m[2] as string };
    }
    // Items past their expiry are recorded as expired before they are listed as such.
    if (statuses.includes('expired')) await this.expire();
    const { drive, examine } = decidedReading(principal);
    return this.page(
      q,
      (limit) => this.store.listDecided({ ...filter, statuses, before, limit, drive, examine }),
      (at) => encodeCursor(kind, `${at.decided_at ?? ''}|${at.id}`),
    );
  }

  /**
   * One page from a store list that may be bounded: cut as every page is, and when the store
   * stopped early (a page short, or empty), continued after the last item it examined.
   */
  private async page(
    q: PageQuery,
    fetch: (limit: number) => Promise<QueueRows>,
    cursorAt: (at: { id: string; decided_at: string | null }) => string,
  ): Promise<Page<QueueItem>> {
    let found: QueueRows | undefined;
    const page = await fetchPage(q, async (limit) => (found = await fetch(limit)), cursorAt);
    const resume = found?.resumeAfter;
    return { items: page.items, next_cursor: page.next_cursor ?? (resume ? cursorAt(resume) : null) };
  }

  /**
   * The audit trail of one item, oldest first: its decision (with the policy's reasons), its
   * approval, denial or expiry, and the tokens minted for it, and events ingested about it for
   * its own tenant. Visible to whoever may see the item; a key bound to an agent sees the events
   * of its agent only (Arbiter's own events of the item all name it), not what other agents'
   * keys ingested about the request.
   */
  async events(
    principal: Principal,
    id: string,
    q: PageQuery,
  ): Promise<{
    id: string;
    trace_id: string;
    events: AuditEvent[];
    next_cursor: string | null;
  }> {
    const item = await this.visible(principal, id);
    if (!this.opts.trail) throw new Error('QueueService was built without an audit trail reader');
    const only = { tenant_id: item.tenant_id, agent_id: principal.agent ?? undefined };
    const trail = await this.opts.trail(item.id, only, q);
    return {
      id: item.id,
      trace_id: item.trace_id,
      events: trail.items,
      next_cursor: trail.next_cursor,
    };
  }

  /**
   * One item as it is now; with `waitSeconds`, held until it leaves pending, time runs out, or
   * `gone` aborts (the caller hung up: its place among the long-polls is free again at once).
   */
  async get(principal: Principal, id: string, waitSeconds?: number, gone?: AbortSignal): Promise<QueueItem> {
    let item = await this.visible(principal, id);
    if (waitSeconds === undefined || item.status !== 'pending') return item;
    // Each held request re-reads the store while it waits: their number is bounded, and so is
    // each key's share, so that one client cannot take every place.
    if (this.longPolls >= this.opts.maxLongPolls) {
      throw busy('too many requests are waiting on the queue; retry shortly');
    }
    const key = principal.keyId;
    const held = this.longPollsByKey.get(key) ?? 0;
    if (held >= this.opts.maxLongPollsPerKey) {
      throw busy(
        `this API key already holds ${held} waits on the queue, its limit per key ` +
          `(${this.opts.maxLongPollsPerKey}); retry shortly`,
      );
    }
    this.longPolls++;
    this.longPollsByKey.set(key, held + 1);
    try {
      // Measured on the monotonic clock: a wall clock stepped back (NTP) must not hold the
      // request, and its place among the long-polls, for the length of the step.
      const deadline = performance.now() + waitSeconds * 1000;
      while (item.status === 'pending' && performance.now() < deadline && !this.stopping && !gone?.aborted) {
        await this.sleepUntilWoken(
          id,
          Math.min(this.opts.notified ? POLL_MS.notified : POLL_MS.unnotified, deadline - performance.now()),
          gone,
        );
        if (gone?.aborted) break;
        item = await this.visible(principal, id);
      }
      // A key revoked while it waited gets nothing more, as a new request with it would not.
      if (this.opts.keyLive && !(await this.opts.keyLive(principal))) {
        throw unauthenticated('invalid or revoked API key: it was revoked while the request waited');
      }
      return item;
    } finally {
      this.longPolls--;
      const left = (this.longPollsByKey.get(key) ?? 1) - 1;
      if (left === 0) this.longPollsByKey.delete(key);
      else this.longPollsByKey.set(key, left);
    }
  }

  async decide(
    principal: Principal,
    id: string,
    to: 'approved' | 'denied',
    body: unknown,
  ): Promise<QueueItem> {
    const note = validateDecideBody(body).note ?? null;
    const item = await this.visible(principal, id);
    if (item.requested_by === principal.keyId || boundTo(principal, 'agent', item.agent_id)) {
      throw forbidden('the API key that made a request, or any key bound to its agent, cannot decide it');
    }
    if (item.status !== 'pending') throw conflictFor(item);
    const at = new Date();
    const now = at.toISOString();
    // An approval consumes the request's budgets (SPEC §13); a denial consumes nothing.
    const charge = to === 'approved' && item.limits ? chargeAt(item.limits, at.getTime()) : undefined;
    const r = await this.store.decide(
      id,
      to,
      principal.name,
      note,
      now,
      (it) => ({
        kind: to === 'approved' ? 'queue.approve' : 'queue.deny',
        time: now,
        trace_id: it.trace_id,
        request_id: it.id,
        actor: principal.name,
        agent_id: it.agent_id,
        user_id: eventUserId(it),
        tenant_id: it.tenant_id,
        action: it.action,
        resource: it.resource,
        outcome: to,
        message: note,
        details: {
          subject_kind: it.kind,
          // The call and the revision that decided it, as the minted token's audit event has them.
          ...(it.request_digest
            ? { request_digest: it.request_digest, policy_revision: it.policy_revision ?? null }
            : {}),
          ...(charge
            ? {
                limits_consumed: charge.map((l) => ({
                  key: l.key,
                  window: l.window,
                  cost: fromMicro(l.cost),
                })),
              }
            : {}),
        },
      }),
      charge,
    );
    if (!r.won && r.exhausted) {
      throw conflict(
        `budget exhausted: limit ${JSON.stringify(r.exhausted.key)} allows ${fromMicro(r.exhausted.max)} per ` +
          `${r.exhausted.window}; request ${id} stays pending`,
      );
    }
    if (!r.won) {
      if (!r.item) throw notFound(`queue item ${id} not found`);
      throw conflictFor(await this.settle(r.item));
    }
    this.observer.transitioned(to);
    this.wake(id);
    return r.item;
  }

  /** Records every due expiration (sweeper), or those of `ids` only. */
  async expire(ids?: string[]): Promise<QueueItem[]> {
    const expired = await this.store.expireDue(new Date().toISOString(), expireEvent, ids);
    for (const it of expired) {
      this.observer.transitioned('expired');
      this.wake(it.id);
    }
    return expired;
  }

  countPending(): Promise<number> {
    return this.store.countPending(new Date().toISOString());
  }

  /** The item if this principal may see it; a bound key outside its binding gets 403 (SPEC §2). */
  private async visible(principal: Principal, id: string): Promise<QueueItem> {
    const item = await this.store.get(id);
    if (!item) throw notFound(`queue item ${id} not found`);
    checkBinding(principal, item);
    return this.settle(item);
  }

  /** A pending item past its expiry is expired: record that now rather than wait for the sweep. */
  private async settle(item: QueueItem): Promise<QueueItem> {
    if (item.status !== 'pending' || item.expires_at > new Date().toISOString()) return item;
    await this.expire([item.id]);
    const now = await this.store.get(item.id);
    return now ?? { ...item, status: 'expired', decided_at: item.expires_at };
  }

  private sleepUntilWoken(id: string, ms: number, gone?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      let set = this.waiters.get(id);
      if (!set) this.waiters.set(id, (set = new Set()));
      const done = () => {
        clearTimeout(timer);
        gone?.removeEventListener('abort', done);
        set.delete(done);
        if (set.size === 0) this.waiters.delete(id);
        resolve();
      };
      const timer = setTimeout(done, Math.max(ms, 1));
      gone?.addEventListener('abort', done, { once: true });
      set.add(done);
    });
  }

  /** Ends the waits on item `id` (or on every item), so they re-read the store now. */
  wake(id?: string): void {
    const sets = id === undefined ? [...this.waiters.values()] : [this.waiters.get(id) ?? new Set()];
    for (const set of sets) for (const wake of [...set]) wake();
  }
}

/**
 * How a decided list reads for this key. A key bound to a tenant reads through the index of its
 * tenant's items, one bound to an agent through its agent's: every item such a page examines is
 * one the key may see, so its page is bounded as an unbound key's is, and how many it examined
 * beside those it answered tells it only of its own items. A key bound to both would examine,
 * through either index, items of the other binding that it may not see (another agent of its
 * tenant, or its agent in another tenant): counted, they would tell it how many lie between its
 * own, which sealed cursors exist to hide; its pages are exact.
 */
function decidedReading(principal: Principal): {
  drive: QueueDriver | undefined;
  examine: number | undefined;
} {
  const { tenant, agent } = principal;
  if (tenant !== null && agent !== null) return { drive: undefined, examine: undefined };
  return {
    drive: tenant !== null ? 'tenant_id' : agent !== null ? 'agent_id' : undefined,
    examine: QUEUE_EXAMINE,
  };
}

function conflictFor(item: QueueItem): Error {
  return conflict(`queue item ${item.id} is already ${item.status}`);
}

function expireEvent(it: QueueItem): NewAuditEvent {
  return {
    kind: 'queue.expire',
    time: it.expires_at,
    trace_id: it.trace_id,
    request_id: it.id,
    actor: 'system',
    agent_id: it.agent_id,
    user_id: eventUserId(it),
    tenant_id: it.tenant_id,
    action: it.action,
    resource: it.resource,
    outcome: 'expired',
    message: 'not decided before expires_at',
    details: { subject_kind: it.kind },
  };
}
