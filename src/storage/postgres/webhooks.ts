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
import type { PgChain } from './chain.js';
import { one, rows, tx, type Pool } from './pool.js';

/**
 * Leases due deliveries: each webhook's earliest ones, after those it has in flight, up to its
 * share ($4, none: $3), then the earliest $3 of those. Each webhook's are read from the claim index
 * (LATERAL … LIMIT), so a claim costs the same however large a webhook's backlog is: ranking every
 * due row on each claim slowed every decision once a hanging receiver had a large backlog (soak
 * probe). The leased rows are found by id (= ANY: the primary key, never a scan of the table's
 * history, which a join on the CTE was planned as). SKIP LOCKED: processes claiming at once take different deliveries; a row leased by
 * another process meanwhile is re-checked against the due condition when it is locked.
 */
export const CLAIM_SQL_POSTGRES = `WITH busy AS (
    SELECT key AS webhook, value::int AS n FROM jsonb_each_text($5::jsonb)),
  due AS (
    SELECT x.id FROM webhooks w LEFT JOIN busy b ON b.webhook = w.name
    CROSS JOIN LATERAL (
      SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
      WHERE d.webhook = w.name AND d.status = 'pending' AND d.next_attempt_at <= $1
      ORDER BY d.next_attempt_at, d.id
      LIMIT GREATEST(LEAST(COALESCE($4::int - COALESCE(b.n, 0), $3::int), $3::int), 0)
      FOR UPDATE OF d SKIP LOCKED) x
    ORDER BY x.next_attempt_at, x.id LIMIT $3)
  UPDATE webhook_deliveries d SET next_attempt_at = $2 FROM webhooks w
  WHERE d.id = ANY (ARRAY(SELECT id FROM due)) AND w.name = d.webhook
  RETURNING d.*, w.url, w.format, w.secret`;

export class PgWebhookStore implements WebhookStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  async put(w: WebhookRecord, event: NewAuditEvent): Promise<{ created: boolean }> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const existed = (await one(c, 'SELECT 1 FROM webhooks WHERE name = $1', [w.name])) !== undefined;
      await c.query(
        `INSERT INTO webhooks (name, url, events, format, secret, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (name) DO UPDATE SET url = excluded.url, events = excluded.events,
           format = excluded.format, secret = excluded.secret, updated_at = excluded.updated_at`,
        [w.name, w.url, JSON.stringify(w.events), w.format, w.secret, w.created_at, w.updated_at],
      );
      await this.chain.appendAfter(c, head, [event]);
      return { created: !existed };
    });
  }

  async get(name: string): Promise<WebhookRecord | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM webhooks WHERE name = $1', [name]);
    return r && hookFromRow(r);
  }

  async list(): Promise<WebhookRecord[]> {
    return (await rows<Row>(this.pool, 'SELECT * FROM webhooks ORDER BY name')).map(hookFromRow);
  }

  async delete(name: string, event: NewAuditEvent): Promise<boolean> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const gone = await c.query('DELETE FROM webhooks WHERE name = $1', [name]);
      if (gone.rowCount === 0) return false;
      await c.query('DELETE FROM webhook_deliveries WHERE webhook = $1', [name]);
      await this.chain.appendAfter(c, head, [event]);
      return true;
    });
  }

  async deliveries(name: string, before: string | undefined, limit: number): Promise<DeliveryRecord[]> {
    return rows<DeliveryRecord>(
      this.pool,
      `SELECT * FROM webhook_deliveries WHERE webhook = $1 AND ($2::text IS NULL OR id < $2) ORDER BY id DESC LIMIT $3`,
      [name, before ?? null, limit],
    );
  }

  async claimDue(now: string, leaseUntil: string, limit: number, share?: ClaimShare): Promise<DueDelivery[]> {
    return rows<DueDelivery>(this.pool, CLAIM_SQL_POSTGRES, [
      now,
      leaseUntil,
      limit,
      share?.perWebhook ?? null,
      JSON.stringify(Object.fromEntries(share?.inFlight ?? [])),
    ]);
  }

  async settle(id: string, r: DeliveryResult): Promise<void> {
    if (r.delivered) {
      await this.pool.query(
        `UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1, delivered_at = $1,
           last_status = $2, last_error = NULL, next_attempt_at = NULL WHERE id = $3`,
        [r.at, r.status, id],
      );
    } else {
      // Given up (no retryAt): no next attempt, rather than the lease of the last one.
      await this.pool.query(
        `UPDATE webhook_deliveries SET status = $1, attempts = attempts + 1, last_status = $2, last_error = $3,
           next_attempt_at = $4 WHERE id = $5`,
        [r.retryAt === null ? 'failed' : 'pending', r.status, r.error, r.retryAt, id],
      );
    }
  }

  async countPending(): Promise<number> {
    const r = await one<{ n: number }>(
      this.pool,
      "SELECT count(*)::int AS n FROM webhook_deliveries WHERE status = 'pending'",
    );
    return r?.n ?? 0;
  }
}
