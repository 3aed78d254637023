import type { NewAuditEvent } from '../../audit/types.js';
import type {
  ClaimShare,
  DeliveryRecord,
  DeliveryResult,
  DueDelivery,
  WebhookRecord,
  WebhookStore,
} from '../../webhooks/types.js';
import { hookFromRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

/** One webhook's earliest due deliveries (webhook, now, how many), read from the claim index. */
export const CLAIM_EARLIEST_SQLITE = `SELECT id, next_attempt_at FROM webhook_deliveries
  WHERE webhook = ? AND status = 'pending' AND next_attempt_at <= ?
  ORDER BY next_attempt_at, id LIMIT ?`;

export class SqliteWebhookStore implements WebhookStore {
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {}

  async put(w: WebhookRecord, event: NewAuditEvent): Promise<{ created: boolean }> {
    return this.db
      .transaction(() => {
        const existed = this.db.prepare('SELECT 1 FROM webhooks WHERE name = ?').get(w.name) !== undefined;
        this.db
          .prepare(
            `INSERT INTO webhooks (name, url, events, format, secret, created_at, updated_at)
             VALUES (@name, @url, @events, @format, @secret, @created_at, @updated_at)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, events = excluded.events,
               format = excluded.format, secret = excluded.secret, updated_at = excluded.updated_at`,
          )
          .run({ ...w, events: JSON.stringify(w.events) });
        this.writer.appendInTx([event]);
        return { created: !existed };
      })
      .immediate();
  }

  async get(name: string): Promise<WebhookRecord | undefined> {
    const r = this.db.prepare('SELECT * FROM webhooks WHERE name = ?').get(name) as Row | undefined;
    return r && hookFromRow(r);
  }

  async list(): Promise<WebhookRecord[]> {
    return (this.db.prepare('SELECT * FROM webhooks ORDER BY name').all() as Row[]).map(hookFromRow);
  }

  async delete(name: string, event: NewAuditEvent): Promise<boolean> {
    return this.db
      .transaction(() => {
        if (this.db.prepare('DELETE FROM webhooks WHERE name = ?').run(name).changes === 0) return false;
        this.db.prepare('DELETE FROM webhook_deliveries WHERE webhook = ?').run(name);
        this.writer.appendInTx([event]);
        return true;
      })
      .immediate();
  }

  async deliveries(name: string, before: string | undefined, limit: number): Promise<DeliveryRecord[]> {
    return this.db
      .prepare(
        `SELECT * FROM webhook_deliveries WHERE webhook = ? AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?`,
      )
      .all(name, before ?? null, before ?? null, limit) as DeliveryRecord[];
  }

  async claimDue(now: string, leaseUntil: string, limit: number, share?: ClaimShare): Promise<DueDelivery[]> {
    return this.db
      .transaction(() => {
        // As on PostgreSQL: each webhook's earliest due deliveries, after those it has in flight,
        // up to its share; then the earliest of those. One indexed read per webhook
        // (webhook_deliveries_claim), so a claim costs the same however large a webhook's backlog
        // is: ranking every due row in SQL blocked decisions for 100+ ms a claim once a hanging
        // receiver had 100 000 due (soak probe).
        const earliest = this.db.prepare(CLAIM_EARLIEST_SQLITE);
        const due: { id: string; next_attempt_at: string }[] = [];
        for (const webhook of this.db.prepare('SELECT name FROM webhooks').pluck().all() as string[]) {
          const room = share ? share.perWebhook - (share.inFlight.get(webhook) ?? 0) : limit;
          if (room <= 0) continue;
          due.push(...(earliest.all(webhook, now, Math.min(room, limit)) as typeof due));
        }
        const order = (x: string, y: string) => (x < y ? -1 : x > y ? 1 : 0);
        due.sort((a, b) => order(a.next_attempt_at, b.next_attempt_at) || order(a.id, b.id));
        const read = this.db.prepare(
          `SELECT d.*, w.url, w.format, w.secret FROM webhook_deliveries d JOIN webhooks w ON w.name = d.webhook
           WHERE d.id = ?`,
        );
        const lease = this.db.prepare('UPDATE webhook_deliveries SET next_attempt_at = ? WHERE id = ?');
        return due.slice(0, limit).map(({ id }) => {
          lease.run(leaseUntil, id);
          return read.get(id) as DueDelivery;
        });
      })
      .immediate();
  }

  async settle(id: string, r: DeliveryResult): Promise<void> {
    if (r.delivered) {
      this.db
        .prepare(
          `UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1, delivered_at = ?,
             last_status = ?, last_error = NULL, next_attempt_at = NULL WHERE id = ?`,
        )
        .run(r.at, r.status, id);
    } else {
      // Given up (no retryAt): no next attempt, rather than the lease of the last one.
      this.db
        .prepare(
          `UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, last_status = ?, last_error = ?,
             next_attempt_at = ? WHERE id = ?`,
        )
        .run(r.retryAt === null ? 'failed' : 'pending', r.status, r.error, r.retryAt, id);
    }
  }

  async countPending(): Promise<number> {
    return this.db
      .prepare("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")
      .pluck()
      .get() as number;
  }
}
