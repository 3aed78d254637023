import type { NewAuditEvent } from '../../audit/types.js';
import type {
  DecidedFilter,
  DecideOutcome,
  PendingFilter,
  QueueRows,
  QueueStore,
} from '../../queue/store.js';
import type { LimitUse, QueueItem } from '../../queue/types.js';
import { tryConsume } from './decisions.js';
import { notify, type PgChain } from './chain.js';
import { queueFromRow, type Row } from '../rows.js';
import { decidedQuerySql, pendingQuerySql, queueResumeAt } from '../queue-query.js';
import { boundedPage } from './bounded.js';
import { one, rows, tx, type Pool } from './pool.js';

export class PgQueueStore implements QueueStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  async get(id: string): Promise<QueueItem | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM queue_items WHERE id = $1', [id]);
    return r && queueFromRow(r);
  }

  async listPending(f: PendingFilter): Promise<QueueRows> {
    return boundedPage(this.pool, pendingQuerySql(f, 'postgres'), f.limit, queueFromRow, queueResumeAt);
  }

  async listDecided(f: DecidedFilter): Promise<QueueRows> {
    return boundedPage(this.pool, decidedQuerySql(f, 'postgres'), f.limit, queueFromRow, queueResumeAt);
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
