import type { NewAuditEvent } from '../audit/types.js';

/** The events a webhook can subscribe to (SPEC §12). */
export const WEBHOOK_EVENTS = [
  'queue.pending',
  'queue.approved',
  'queue.denied',
  'queue.expired',
  'policy.changed',
] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENTS)[number];

export type WebhookFormat = 'json' | 'slack';

export interface WebhookRecord {
  name: string;
  url: string;
  events: WebhookEventType[];
  format: WebhookFormat;
  /** `whsec_` + base64 key (Standard Webhooks); kept to sign, never shown after creation. */
  secret: string;
  created_at: string;
  updated_at: string;
}

export type DeliveryStatus = 'pending' | 'delivered' | 'failed';

export interface DeliveryRecord {
  /** Also the message id: `webhook-id` and the body's `id`, the same on every attempt. */
  id: string;
  webhook: string;
  type: WebhookEventType;
  /** The message `{id, type, time, data}` as JSON text, fixed when the change commits. */
  payload: string;
  status: DeliveryStatus;
  attempts: number;
  /** When it is due (or leased until, while an attempt runs); null once delivered or given up. */
  next_attempt_at: string | null;
  last_status: number | null;
  last_error: string | null;
  created_at: string;
  delivered_at: string | null;
}

/** A delivery handed to the sender, with what it needs of its webhook. */
export type DueDelivery = DeliveryRecord & Pick<WebhookRecord, 'url' | 'format' | 'secret'>;

/** How many deliveries of one webhook a claim may take: `perWebhook` less those already in flight. */
export interface ClaimShare {
  perWebhook: number;
  /**
   * Deliveries in flight per webhook name (absent: none). A Map: any name a webhook may have
   * (`constructor` included) is a key of its own, never an inherited member.
   */
  inFlight: ReadonlyMap<string, number>;
}

export type DeliveryResult =
  | { delivered: true; at: string; status: number }
  | { delivered: false; status: number | null; error: string; retryAt: string | null };

export interface WebhookStore {
  /** Creates or replaces a webhook with its audit event; tells whether it was created. */
  put(w: WebhookRecord, event: NewAuditEvent): Promise<{ created: boolean }>;
  get(name: string): Promise<WebhookRecord | undefined>;
  list(): Promise<WebhookRecord[]>;
  /** Removes a webhook and its deliveries with its audit event; false if there was none. */
  delete(name: string, event: NewAuditEvent): Promise<boolean>;
  /** Deliveries of one webhook, newest first, those with an id below `before` when given. */
  deliveries(name: string, before: string | undefined, limit: number): Promise<DeliveryRecord[]>;
  /**
   * Takes up to `limit` pending deliveries due at `now` for sending, longest due first, leasing
   * each until `leaseUntil` (a sender that dies mid-send leaves it to be retried then); with
   * `share`, no more of one webhook than its share allows. On PostgreSQL two processes never take
   * the same delivery at once.
   */
  claimDue(now: string, leaseUntil: string, limit: number, share?: ClaimShare): Promise<DueDelivery[]>;
  /** Records an attempt: delivered or given up (no next attempt), or due again at `retryAt`. */
  settle(id: string, result: DeliveryResult): Promise<void>;
  countPending(): Promise<number>;
}
