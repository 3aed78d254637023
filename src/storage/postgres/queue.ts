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
import { decidedQuerySql, pendingQuerySql, type QueueSql } from '../queue-query.js';
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
    return this.page(pendingQuerySql(f, 'postgres'), f.limit);
  }

  async listDecided(f: DecidedFilter): Promise<QueueRows> {
    return this.page(decidedQuerySql(f, 'postgres'), f.limit);
  }

  /**
   * A page and, when it is bounded and came up short, the last item it examined, from one
   * snapshot: read apart, an item decided (or expired, at its past expires_at) between the two
   * reads moved the resume point back over items the page examined, and the next page answered
   * those again.
   */
  private async page(
    q: { list: QueueSql; resume?: QueueSql | undefined },
    limit: number,
  ): Promise<QueueRows> {
    const { list, resume } = q;
    if (!resume) return (await rows<Row>(this.pool, list.sql, list.params)).map(queueFromRow);
    return tx(
      this.pool,
      async (c) => {
        const found: QueueRows = (await rows<Row>(c, list.sql, list.params)).map(queueFromRow);
        if (found.length < limit) {
          const [last] = await rows<{ id: string; decided_at?: string | null }>(c, resume.sql, resume.params);
          if (last) found.resumeAfter = { id: last.id, decided_at: last.decided_at ?? null };
        }
        return found;
      },
      'BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY',
    );
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
