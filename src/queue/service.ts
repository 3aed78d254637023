import type { NewAuditEvent } from '../audit/types.js';
import { AppError, badRequest, forbidden, notFound } from '../errors.js';
import type { Principal } from '../keys/types.js';
import { decodeCursor, encodeCursor, parseLimit } from '../http/pagination.js';
import { compileSchema } from '../http/validation.js';
import type { QueueStore } from './store.js';
import type { QueueItem } from './types.js';

export const MAX_WAIT_SECONDS = 60;

/** A queue item as the API shows it (SPEC §6): which key asked is Arbiter's business only. */
export type QueueItemView = Omit<QueueItem, 'requested_by'>;
export const present = ({ requested_by: _key, ...view }: QueueItem): QueueItemView => view;

/** Body of POST /v1/queue/{id}/approve and /deny (optional). */
export const decideRequestSchema = {
  type: 'object',
  additionalProperties: false,
  properties: { note: { type: 'string', maxLength: 2000 } },
};
const validateDecideBody = compileSchema<{ note?: string }>(decideRequestSchema);
/** How often a long-poll re-reads the store, to see decisions made by other processes. */
const POLL_MS = 100;

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

  constructor(
    private readonly store: QueueStore,
    private readonly observer: QueueObserver,
    private readonly maxLongPolls = 1000,
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

  async listPending(
    principal: Principal,
    q: { agent_id?: string; tenant_id?: string; action?: string; limit?: string; cursor?: string },
  ): Promise<{ items: QueueItem[]; next_cursor: string | null }> {
    const limit = parseLimit(q.limit);
    const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor, 'queue');
    for (const f of ['agent_id', 'tenant_id', 'action'] as const) {
      if (q[f] !== undefined && (q[f] === '' || q[f].length > 256)) {
        throw badRequest(`query parameter ${f} must be 1 to 256 characters`);
      }
    }
    let tenant = q.tenant_id;
    if (principal.tenant !== null) {
      if (tenant !== undefined && tenant !== principal.tenant) {
        throw forbidden(`API key is bound to tenant ${principal.tenant}`);
      }
      tenant = principal.tenant;
    }
    let agent = q.agent_id;
    if (principal.agent !== null) {
      if (agent !== undefined && agent !== principal.agent)
        throw forbidden(`API key is bound to agent ${principal.agent}`);
      agent = principal.agent;
    }
    const rows = await this.store.listPending({
      agent_id: agent,
      tenant_id: tenant,
      action: q.action,
      after,
      limit: limit + 1,
      now: new Date().toISOString(),
    });
    const items = rows.slice(0, limit);
    const last = items[items.length - 1];
    return { items, next_cursor: rows.length > limit && last ? encodeCursor('queue', last.id) : null };
  }

  /** One item as it is now; with `waitSeconds`, held until it leaves pending or time runs out. */
  async get(principal: Principal, id: string, waitSeconds?: number): Promise<QueueItem> {
    let item = await this.visible(principal, id);
    if (waitSeconds === undefined || item.status !== 'pending') return item;
    // Each held request re-reads the store while it waits: their number is bounded.
    if (this.longPolls >= this.maxLongPolls) {
      throw new AppError(429, 'too many requests are waiting on the queue; retry shortly', {
        'Retry-After': '1',
      });
    }
    this.longPolls++;
    try {
      const deadline = Date.now() + waitSeconds * 1000;
      while (item.status === 'pending' && Date.now() < deadline && !this.stopping) {
        await this.sleepUntilWoken(id, Math.min(POLL_MS, deadline - Date.now()));
        item = await this.visible(principal, id);
      }
      return item;
    } finally {
      this.longPolls--;
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
    if (
      item.requested_by === principal.keyId ||
      (principal.agent !== null && item.agent_id === principal.agent)
    ) {
      throw forbidden('the API key that made a request, or any key bound to its agent, cannot decide it');
    }
    if (item.status !== 'pending') throw conflictFor(item);
    const now = new Date().toISOString();
    const r = await this.store.decide(id, to, principal.name, note, now, (it) => ({
      kind: to === 'approved' ? 'queue.approve' : 'queue.deny',
      time: now,
      trace_id: it.trace_id,
      request_id: it.id,
      actor: principal.name,
      agent_id: it.agent_id,
      user_id: it.user_id,
      tenant_id: it.tenant_id,
      action: it.action,
      resource: it.resource,
      outcome: to,
      message: note,
      details: { subject_kind: it.kind },
    }));
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
    if (principal.tenant !== null && item.tenant_id !== principal.tenant) {
      throw forbidden(`API key is bound to tenant ${principal.tenant}`);
    }
    if (principal.agent !== null && item.agent_id !== principal.agent) {
      throw forbidden(`API key is bound to agent ${principal.agent}`);
    }
    return this.settle(item);
  }

  /** A pending item past its expiry is expired: record that now rather than wait for the sweep. */
  private async settle(item: QueueItem): Promise<QueueItem> {
    if (item.status !== 'pending' || item.expires_at > new Date().toISOString()) return item;
    await this.expire([item.id]);
    const now = await this.store.get(item.id);
    return now ?? { ...item, status: 'expired', decided_at: item.expires_at };
  }

  private sleepUntilWoken(id: string, ms: number): Promise<void> {
    return new Promise((resolve) => {
      let set = this.waiters.get(id);
      if (!set) this.waiters.set(id, (set = new Set()));
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        if (set.size === 0) this.waiters.delete(id);
        resolve();
      };
      const timer = setTimeout(done, Math.max(ms, 1));
      set.add(done);
    });
  }

  private wake(id: string): void {
    for (const wake of [...(this.waiters.get(id) ?? [])]) wake();
  }
}

function conflictFor(item: QueueItem): AppError {
  return new AppError(409, `queue item ${item.id} is already ${item.status}`);
}

function expireEvent(it: QueueItem): NewAuditEvent {
  return {
    kind: 'queue.expire',
    time: it.expires_at,
    trace_id: it.trace_id,
    request_id: it.id,
    actor: 'system',
    agent_id: it.agent_id,
    user_id: it.user_id,
    tenant_id: it.tenant_id,
    action: it.action,
    resource: it.resource,
    outcome: 'expired',
    message: 'not decided before expires_at',
    details: { subject_kind: it.kind },
  };
}

/** Parses `?wait=`: whole or fractional seconds in [0, 60]. */
export function parseWait(raw: string | string[] | undefined): number | undefined {
  if (raw === undefined) return undefined;
  if (Array.isArray(raw) || !/^\d+(\.\d+)?$/.test(raw) || Number(raw) > MAX_WAIT_SECONDS) {
    throw badRequest(`query parameter wait must be a number of seconds between 0 and ${MAX_WAIT_SECONDS}`);
  }
  return Number(raw);
}
