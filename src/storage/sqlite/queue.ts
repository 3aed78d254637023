import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type { DecidedFilter, DecideOutcome, PendingFilter, QueueStore } from '../../queue/store.js';
import type { LimitUse, QueueItem } from '../../queue/types.js';
import { LimitWriter } from './decisions.js';
import { queueFromRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

/** WHERE terms and parameters for the filters every queue list shares. */
function itemFilter(f: Omit<DecidedFilter, 'statuses' | 'before'>): { where: string[]; params: Row } {
  const where: string[] = [];
  const params: Row = { limit: f.limit };
  for (const c of ['agent_id', 'tenant_id', 'action'] as const) {
    if (f[c] !== undefined) {
      where.push(`${c} = @${c}`);
      params[c] = f[c];
    }
  }
  if (f.since !== undefined) {
    where.push('created_at >= @since');
    params.since = f.since;
  }
  if (f.until !== undefined) {
    where.push('created_at < @until');
    params.until = f.until;
  }
  return { where, params };
}

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

  async listPending(f: PendingFilter): Promise<QueueItem[]> {
    const { where, params } = itemFilter(f);
    where.unshift("status = 'pending'", 'expires_at > @now');
    params.now = f.now;
    if (f.after !== undefined) {
      where.push('id > @after');
      params.after = f.after;
    }
    const rows = this.db
      .prepare(`SELECT * FROM queue_items WHERE ${where.join(' AND ')} ORDER BY id LIMIT @limit`)
      .all(params) as Row[];
    return rows.map(queueFromRow);
  }

  async listDecided(f: DecidedFilter): Promise<QueueItem[]> {
    const { where, params } = itemFilter(f);
    // The literal term lets SQLite use the partial indexes (WHERE status <> 'pending').
    where.unshift("status <> 'pending'");
    const statuses = f.statuses.map((st, i) => {
      params[`s${i}`] = st;
      return `@s${i}`;
    });
    // One state: the (status, decided_at, id) index. Several: the unary + keeps the planner off
    // the status indexes (which would need a sort) and on (decided_at, id), read backwards.
    where.push(statuses.length === 1 ? `status = ${statuses[0]}` : `+status IN (${statuses.join(', ')})`);
    if (f.before !== undefined) {
      where.push('(decided_at, id) < (@beforeAt, @beforeId)');
      params.beforeAt = f.before.decided_at;
      params.beforeId = f.before.id;
    }
    const rows = this.db
      .prepare(
        `SELECT * FROM queue_items WHERE ${where.join(' AND ')}
         ORDER BY decided_at DESC, id DESC LIMIT @limit`,
      )
      .all(params) as Row[];
    return rows.map(queueFromRow);
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
