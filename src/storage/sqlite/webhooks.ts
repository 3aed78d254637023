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
        // As on PostgreSQL: a webhook's due deliveries are ranked after those it has in flight, and
        // ranks past its share are left. Ids only are ranked (in SQL, not by reading every due row's
        // payload here), then the chosen rows are read.
        const ids = this.db
          .prepare(
            `WITH busy (webhook, n) AS (SELECT key, value FROM json_each(@inFlight)),
             ranked AS (
               SELECT d.id, d.next_attempt_at, COALESCE(b.n, 0)
                 + row_number() OVER (PARTITION BY d.webhook ORDER BY d.next_attempt_at, d.id) AS slot
               FROM webhook_deliveries d JOIN webhooks w ON w.name = d.webhook
               LEFT JOIN busy b ON b.webhook = d.webhook
               WHERE d.status = 'pending' AND d.next_attempt_at <= @now
                 AND d.webhook NOT IN (SELECT webhook FROM busy WHERE n >= @perWebhook))
             SELECT id FROM ranked WHERE @perWebhook IS NULL OR slot <= @perWebhook
             ORDER BY next_attempt_at, id LIMIT @limit`,
          )
          .pluck()
          .all({
            now,
            limit,
            perWebhook: share?.perWebhook ?? null,
            inFlight: JSON.stringify(share?.inFlight ?? {}),
          }) as string[];
        const read = this.db.prepare(
          `SELECT d.*, w.url, w.format, w.secret FROM webhook_deliveries d JOIN webhooks w ON w.name = d.webhook
           WHERE d.id = ?`,
        );
        const lease = this.db.prepare('UPDATE webhook_deliveries SET next_attempt_at = ? WHERE id = ?');
        return ids.map((id) => {
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
