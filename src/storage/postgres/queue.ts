import type { NewAuditEvent } from '../../audit/types.js';
import type { DecidedFilter, DecideOutcome, PendingFilter, QueueStore } from '../../queue/store.js';
import type { LimitUse, QueueItem } from '../../queue/types.js';
import { tryConsume } from './decisions.js';
import { notify, type PgChain } from './chain.js';
import { queueFromRow, type Row } from '../rows.js';
import { one, rows, tx, type Pool } from './pool.js';

/** Builds numbered parameters ($1, $2, …) for a statement whose WHERE depends on the filters. */
class Params {
  readonly values: unknown[] = [];
  add(v: unknown): string {
    this.values.push(v);
    return `$${this.values.length}`;
  }
}

function itemFilter(f: Omit<DecidedFilter, 'statuses' | 'before'>, p: Params): string[] {
  const where: string[] = [];
  for (const c of ['agent_id', 'tenant_id', 'action'] as const) {
    if (f[c] !== undefined) where.push(`${c} = ${p.add(f[c])}`);
  }
  if (f.since !== undefined) where.push(`created_at >= ${p.add(f.since)}`);
  if (f.until !== undefined) where.push(`created_at < ${p.add(f.until)}`);
  return where;
}

export class PgQueueStore implements QueueStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  async get(id: string): Promise<QueueItem | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM queue_items WHERE id = $1', [id]);
    return r && queueFromRow(r);
  }

  async listPending(f: PendingFilter): Promise<QueueItem[]> {
    const p = new Params();
    const where = ["status = 'pending'", `expires_at > ${p.add(f.now)}`, ...itemFilter(f, p)];
    if (f.after !== undefined) where.push(`id > ${p.add(f.after)}`);
    const sql = `SELECT * FROM queue_items WHERE ${where.join(' AND ')} ORDER BY id LIMIT ${p.add(f.limit)}`;
    return (await rows<Row>(this.pool, sql, p.values)).map(queueFromRow);
  }

  async listDecided(f: DecidedFilter): Promise<QueueItem[]> {
    const p = new Params();
    const where = ["status <> 'pending'", `status = ANY(${p.add(f.statuses)}::text[])`, ...itemFilter(f, p)];
    if (f.before !== undefined) {
      where.push(`(decided_at, id) < (${p.add(f.before.decided_at)}, ${p.add(f.before.id)})`);
    }
    const sql = `SELECT * FROM queue_items WHERE ${where.join(' AND ')}
      ORDER BY decided_at DESC, id DESC LIMIT ${p.add(f.limit)}`;
    return (await rows<Row>(this.pool, sql, p.values)).map(queueFromRow);
  }

  async decide(
    id: string,
    to: 'approved' | 'denied',
    by: string,
    note: string | null,
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
    charge?: LimitUse[],
  ): Promise<DecideOutcome> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      if (charge && charge.length > 0) {
        // Under the chain head: nobody decides or consumes between this check and the update.
        const current = await one<Row>(c, 'SELECT * FROM queue_items WHERE id = $1', [id]);
        const pending = current && current.status === 'pending' && (current.expires_at as string) > now;
        if (!pending) return { won: false, item: current && queueFromRow(current) };
        const exhausted = await tryConsume(c, charge);
        if (exhausted) return { won: false, item: queueFromRow(current), exhausted };
      }
      const won = await one<Row>(
        c,
        `UPDATE queue_items SET status = $1, decided_at = $2, decided_by = $3, note = $4
         WHERE id = $5 AND status = 'pending' AND expires_at > $2 RETURNING *`,
        [to, now, by, note, id],
      );
      if (!won) {
        const r = await one<Row>(c, 'SELECT * FROM queue_items WHERE id = $1', [id]);
        return { won: false, item: r && queueFromRow(r) };
      }
      const item = queueFromRow(won);
      await this.chain.appendAfter(c, head, [event(item)]);
      await notify(c, { topic: 'queue', id });
      return { won: true, item };
    });
  }

  async expireDue(
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
    ids?: string[],
  ): Promise<QueueItem[]> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const expired = (
        await rows<Row>(
          c,
          `UPDATE queue_items SET status = 'expired', decided_at = expires_at
           WHERE status = 'pending' AND expires_at <= $1 AND ($2::text[] IS NULL OR id = ANY($2::text[]))
           RETURNING *`,
          [now, ids ?? null],
        )
      )
        .map(queueFromRow)
        .sort((a, b) => (a.id < b.id ? -1 : 1));
      if (expired.length === 0) return [];
      await this.chain.appendAfter(c, head, expired.map(event));
      for (const it of expired) await notify(c, { topic: 'queue', id: it.id });
      return expired;
    });
  }

  async countPending(now: string): Promise<number> {
    const r = await one<{ n: number }>(
      this.pool,
      "SELECT count(*)::int AS n FROM queue_items WHERE status = 'pending' AND expires_at > $1",
      [now],
    );
    return r?.n ?? 0;
  }
}
