import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type {
  DecidedFilter,
  DecideOutcome,
  PendingFilter,
  QueueRows,
  QueueStore,
} from '../../queue/store.js';
import type { LimitUse, QueueItem } from '../../queue/types.js';
import { LimitWriter } from './decisions.js';
import { queueFromRow, type Row } from '../rows.js';
import { decidedQuerySql, pendingQuerySql, queueResumeAt } from '../queue-query.js';
import { boundedPage } from './bounded.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

export class SqliteQueueStore implements QueueStore {
  private readonly byId: Statement;
  private readonly limits: LimitWriter;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM queue_items WHERE id = ?');
    this.limits = new LimitWriter(db);
  }

  async get(id: string): Promise<QueueItem | undefined> {
    const r = this.byId.get(id) as Row | undefined;
    return r && queueFromRow(r);
  }

  async listPending(f: PendingFilter): Promise<QueueRows> {
    return boundedPage(this.db, pendingQuerySql(f, 'sqlite'), f.limit, queueFromRow, queueResumeAt);
  }

  async listDecided(f: DecidedFilter): Promise<QueueRows> {
    return boundedPage(this.db, decidedQuerySql(f, 'sqlite'), f.limit, queueFromRow, queueResumeAt);
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
    return this.db
      .transaction((): DecideOutcome => {
        if (charge && charge.length > 0) {
          // Within the write lock: nobody decides or consumes between this check and the update.
          const current = this.byId.get(id) as Row | undefined;
          const pending = current && current.status === 'pending' && (current.expires_at as string) > now;
          if (!pending) return { won: false, item: current && queueFromRow(current) };
          const exhausted = this.limits.tryConsume(charge);
          if (exhausted) return { won: false, item: queueFromRow(current), exhausted };
        }
        const changed = this.db
          .prepare(
            `UPDATE queue_items SET status = ?, decided_at = ?, decided_by = ?, note = ?
             WHERE id = ? AND status = 'pending' AND expires_at > ?`,
          )
          .run(to, now, by, note, id, now).changes;
        const r = this.byId.get(id) as Row | undefined;
        const item = r && queueFromRow(r);
        if (changed !== 1 || !item) return { won: false, item };
        this.writer.appendInTx([event(item)]);
        return { won: true, item };
      })
      .immediate();
  }

  async expireDue(
    now: string,
    event: (item: QueueItem) => NewAuditEvent,
    ids?: string[],
  ): Promise<QueueItem[]> {
    return this.db
      .transaction(() => {
        const due = (
          ids
            ? ids.map((id) => this.byId.get(id) as Row | undefined).filter((r): r is Row => r !== undefined)
            : (this.db
                .prepare("SELECT * FROM queue_items WHERE status = 'pending' AND expires_at <= ?")
                .all(now) as Row[])
        )
          .map(queueFromRow)
          .filter((i) => i.status === 'pending' && i.expires_at <= now);
        const upd = this.db.prepare(
          "UPDATE queue_items SET status = 'expired', decided_at = expires_at WHERE id = ? AND status = 'pending'",
        );
        const out: QueueItem[] = [];
        for (const item of due) {
          if (upd.run(item.id).changes !== 1) continue;
          const expired = { ...item, status: 'expired' as const, decided_at: item.expires_at };
          this.writer.appendInTx([event(expired)]);
          out.push(expired);
        }
        return out;
      })
      .immediate();
  }

  async countPending(now: string): Promise<number> {
    return this.db
      .prepare("SELECT count(*) FROM queue_items WHERE status = 'pending' AND expires_at > ?")
      .pluck()
      .get(now) as number;
  }
}
