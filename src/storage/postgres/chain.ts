import type { AuditEvent, NewAuditEvent } from '../../audit/types.js';
import { append, appendAfter, lockHead } from './audit.js';
import type { Client } from './pool.js';

/** The chain as every PostgreSQL store appends to it, reporting what it wrote (for the metric). */
export class PgChain {
  constructor(private readonly onAppend: (kinds: string[]) => void) {}

  async append(c: Client, events: NewAuditEvent[]): Promise<AuditEvent[]> {
    const out = await append(c, events);
    this.onAppend(out.map((e) => e.kind));
    return out;
  }

  lockHead = lockHead;

  async appendAfter(c: Client, head: Awaited<ReturnType<typeof lockHead>>, events: NewAuditEvent[]) {
    const out = await appendAfter(c, head, events);
    this.onAppend(out.events.map((e) => e.kind));
    return out;
  }
}

/** Sends a change notice to every process LISTENing (delivered when the transaction commits). */
export async function notify(c: Client, payload: { topic: string; id?: string }): Promise<void> {
  await c.query("SELECT pg_notify('arbiter', $1)", [JSON.stringify(payload)]);
}
