import { randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { decodeCursor, encodeCursor, fetchPage, type PageQuery } from '../common/pagination.js';
import { maskPassword, maskPasswordsIn, urlForAudit } from '../common/urls.js';
import { compileSchema } from '../common/validation.js';
import { invalid, notFound } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { POLICY_NAME } from '../policy/documents.js';
import {
  WEBHOOK_EVENTS,
  type DeliveryRecord,
  type DeliveryResult,
  type DueDelivery,
  type WebhookEventType,
  type WebhookFormat,
  type WebhookRecord,
  type WebhookStore,
} from './types.js';

/** The longest webhook URL, as sent and as stored (checkUrl). */
const MAX_URL_LENGTH = 2048;

/** Body of PUT /api/v1/webhooks/{name}. */
export const webhookRequestSchema = {
  type: 'object',
  required: ['url', 'events'],
  additionalProperties: false,
  properties: {
    url: {
      type: 'string',
      minLength: 1,
      maxLength: MAX_URL_LENGTH,
      description: `http:// or https:// URL the deliveries are POSTed to (at most ${MAX_URL_LENGTH} characters, also as stored: normalised, non-ASCII percent-encoded)`,
    },
    events: {
      type: 'array',
      minItems: 1,
      maxItems: WEBHOOK_EVENTS.length,
      uniqueItems: true,
      items: { type: 'string', enum: [...WEBHOOK_EVENTS] },
    },
    format: { type: 'string', enum: ['json', 'slack'], description: 'default json' },
    secret: {
      type: 'string',
      // Canonical base64 only: Python's base64 and the Standard Webhooks libraries refuse a length
      // that is not a multiple of 4 or stray padding, which Node's decoder lets through.
      pattern: '^whsec_(?:[A-Za-z0-9+/]{4}){8,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$',
      description:
        'Standard Webhooks secret (whsec_ + canonical, padded base64 of at least 24 bytes); generated when absent',
    },
  },
};

interface WebhookRequest {
  url: string;
  events: WebhookEventType[];
  format?: WebhookFormat;
  secret?: string;
}

const validate = compileSchema<WebhookRequest>(webhookRequestSchema);

/** A webhook as the API shows it: never its secret (shown once, when Arbiter generates it). */
export type WebhookView = Omit<WebhookRecord, 'secret'>;
/**
 * A webhook as the API shows it: never its signing secret, nor a password in its URL (a URL with
 * credentials is refused since 2026-11-24; one stored before shows `***` in its place). Its path
 * and query are shown: only `admin` keys read webhooks, and they set them. The audit trail, which
 * less than admin reads, records the URL's origin and hash only (urlForAudit).
 */
export const webhookView = ({ secret: _secret, url, ...view }: WebhookRecord): WebhookView => ({
  ...view,
  url: maskPassword(url),
});

export type DeliveryView = Omit<DeliveryRecord, 'payload'>;
const deliveryView = ({ payload: _payload, ...view }: DeliveryRecord): DeliveryView => view;

export interface WebhookConfig {
  /** Base address of the Engine API for links to the console (ARBITER_PUBLIC_URL). */
  publicUrl: () => string;
  /** First retry delay; each further one doubles, up to an hour (ARBITER_WEBHOOK_RETRY_SECONDS). */
  retryBaseMs: number;
}

export interface DeliveryObserver {
  attempted(result: 'delivered' | 'retry' | 'failed'): void;
}

/** A delivery is retried for this long after the change that caused it, then given up (SPEC §12). */
export const GIVE_UP_AFTER_MS = 24 * 3600 * 1000;
/** A receiver has this long to answer one attempt. */
export const ATTEMPT_TIMEOUT_MS = 10_000;
const MAX_BACKOFF_MS = 3600 * 1000;
/**
 * Deliveries in flight at once in this process, and of any one webhook: a receiver that never
 * answers holds at most its own share for the 10 s of an attempt, while the others' deliveries
 * keep going out. Once MAX_IN_FLIGHT are in flight (eight such receivers are enough), a webhook
 * with none in flight may still send one (`sweep`), so that no number of them holds back another:
 * at most MAX_IN_FLIGHT plus one per webhook are in flight.
 */
export const MAX_IN_FLIGHT = 64;
export const MAX_IN_FLIGHT_PER_WEBHOOK = 8;

function checkName(name: string): void {
  if (!POLICY_NAME.test(name)) {
    throw invalid(`invalid webhook name ${JSON.stringify(name)}: must match [a-z0-9][a-z0-9._-]{0,127}`);
  }
}

/**
 * The pattern leaves one non-canonical form: unused bits of the last character that are not zero
 * (`…B=` for `…A=`), which some decoders refuse. Canonical is what encoding the key gives back.
 */
function checkSecret(secret: string): void {
  const b64 = secret.slice('whsec_'.length);
  if (Buffer.from(b64, 'base64').toString('base64') !== b64) {
    throw invalid(
      'secret must be whsec_ followed by canonical base64: its last character has unused bits set',
    );
  }
}

function checkUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw invalid('url must be an absolute http:// or https:// URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw invalid('url must be an absolute http:// or https:// URL');
  }
  // fetch refuses such a URL, so no delivery could ever be sent; and a password stored here would
  // be shown by every GET. Receivers verify the signature of each delivery instead.
  if (url.username !== '' || url.password !== '') {
    throw invalid(
      'url must not contain credentials (user:password@): receivers verify the webhook signature instead',
    );
  }
  // The stored form percent-encodes what is not ASCII (`é` becomes `%C3%A9`): the limit holds for
  // what is stored and sent, not only for what was received.
  const normalised = url.toString();
  if (normalised.length > MAX_URL_LENGTH) {
    throw invalid(
      `url must be at most ${MAX_URL_LENGTH} characters once normalised (${normalised.length}: ` +
        'characters beyond ASCII are percent-encoded)',
    );
  }
  return normalised;
}

/**
 * A failed fetch's message with its cause: fetch says only "fetch failed" for a refused
 * connection, an unknown host or a certificate it rejects, and keeps the reason (its code, e.g.
 * ECONNREFUSED or ENOTFOUND, and message) in `cause`. A connection tried on several addresses
 * fails with an AggregateError, whose own message is empty.
 */
function withCause(err: Error): string {
  const cause = err.cause as { code?: unknown; message?: unknown; errors?: unknown } | undefined;
  if (typeof cause !== 'object' || cause === null) return err.message;
  const code = typeof cause.code === 'string' ? cause.code : '';
  let detail = typeof cause.message === 'string' ? cause.message : '';
  if (detail === '' && Array.isArray(cause.errors)) {
    detail = [...new Set(cause.errors.map((x) => String((x as { message?: unknown }).message)))].join('; ');
  }
  const said = detail.includes(code) ? detail : `${code} ${detail}`.trim();
  return said === '' ? err.message : `${err.message}: ${said}`;
}

/**
 * Webhooks (SPEC §12): their configuration, and the sender that works through the outbox. A
 * delivery row is written by the storage layer in the transaction of the change that causes it
 * (src/webhooks/events.ts); this service only sends: signed per Standard Webhooks, retried with
 * exponential backoff for 24 hours, at least once. Nothing here runs on the decision path.
 */
export class WebhookService {
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;
  /** A poke came while a sweep was running: sweep again when it ends. */
  private again = false;
  private stopped = false;
  /** Attempts under way, each with its webhook's name. */
  private readonly inFlight = new Map<Promise<void>, string>();

  constructor(
    private readonly store: WebhookStore,
    private readonly cfg: WebhookConfig,
    private readonly observer: DeliveryObserver,
    private readonly log?: Logger,
  ) {}

  async put(
    name: string,
    body: unknown,
    actor: string,
    ids: { traceId: string; requestId: string },
  ): Promise<{ webhook: WebhookView; created: boolean; secret?: string }> {
    checkName(name);
    const req = validate(body);
    const url = checkUrl(req.url);
    if (req.secret !== undefined) checkSecret(req.secret);
    const existing = await this.store.get(name);
    const generated =
      req.secret === undefined && !existing ? `whsec_${randomBytes(32).toString('base64')}` : undefined;
    const now = new Date().toISOString();
    const record: WebhookRecord = {
      name,
      url,
      events: [...req.events],
      format: req.format ?? 'json',
      secret: req.secret ?? existing?.secret ?? (generated as string),
      created_at: existing?.created_at ?? now,
      updated_at: now,
    };
    const { created } = await this.store.put(record, {
      kind: 'webhook.put',
      actor,
      trace_id: ids.traceId,
      request_id: ids.requestId,
      resource: name,
      outcome: 'success',
      details: {
        ...urlForAudit(url),
        events: record.events,
        format: record.format,
        secret: req.secret !== undefined ? 'set' : generated ? 'generated' : 'kept',
      },
    });
    return { webhook: webhookView(record), created, ...(generated ? { secret: generated } : {}) };
  }

  async get(name: string): Promise<WebhookView> {
    checkName(name);
    const w = await this.store.get(name);
    if (!w) throw notFound(`webhook ${name} not found`);
    return webhookView(w);
  }

  async list(): Promise<WebhookView[]> {
    return (await this.store.list()).map(webhookView);
  }

  async delete(name: string, actor: string, ids: { traceId: string; requestId: string }): Promise<void> {
    checkName(name);
    const gone = await this.store.delete(name, {
      kind: 'webhook.delete',
      actor,
      trace_id: ids.traceId,
      request_id: ids.requestId,
      resource: name,
      outcome: 'success',
    });
    if (!gone) throw notFound(`webhook ${name} not found`);
  }

  async deliveries(
    name: string,
    q: PageQuery,
  ): Promise<{ deliveries: DeliveryView[]; next_cursor: string | null }> {
    await this.get(name);
    const before = q.cursor === undefined ? undefined : decodeCursor(q.cursor, 'deliveries');
    // Cut on what is answered: the payload each record holds is not shown.
    const page = await fetchPage(
      q,
      async (n) => (await this.store.deliveries(name, before, n)).map(deliveryView),
      (last) => encodeCursor('deliveries', last.id),
    );
    return { deliveries: page.items, next_cursor: page.next_cursor };
  }

  countPending(): Promise<number> {
    return this.store.countPending();
  }

  /** Sends due deliveries every `intervalMs` (and at once when `poke`d). */
  start(intervalMs: number): void {
    this.timer = setInterval(() => this.poke(), intervalMs);
    this.timer.unref();
    this.poke();
  }

  /** Runs a sweep now, or once more after the one running (which may have missed what is due now). */
  poke(): void {
    if (this.stopped) return;
    if (this.sweeping) {
      this.again = true;
      return;
    }
    this.again = false;
    this.sweeping = this.sweep()
      .catch((err: unknown) => this.log?.warn({ err }, 'webhook delivery sweep failed'))
      .finally(() => {
        this.sweeping = undefined;
        if (this.again) this.poke();
      });
  }

  /** Stops taking deliveries; those in flight finish (or are retried after their lease). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.sweeping;
    await Promise.all(this.inFlight.keys());
  }

  /**
   * Takes due deliveries while there is room in flight, and starts each at once without waiting
   * for the others: an attempt that ends makes room and pokes, so one receiver's 10 s timeout never
   * holds back another's deliveries. The lease keeps a delivery from being taken twice meanwhile.
   */
  private async sweep(): Promise<void> {
    while (!this.stopped) {
      const room = MAX_IN_FLIGHT - this.inFlight.size;
      // The allowance spent, each webhook with nothing in flight still gets one (MAX_IN_FLIGHT):
      // a claim with a share of 1 takes nothing of a webhook that has one under way.
      const [limit, perWebhook] = room > 0 ? [room, MAX_IN_FLIGHT_PER_WEBHOOK] : [MAX_IN_FLIGHT, 1];
      const now = Date.now();
      // A lease longer than one attempt: a process that dies mid-send leaves it to be retried.
      const due = await this.store.claimDue(
        new Date(now).toISOString(),
        new Date(now + ATTEMPT_TIMEOUT_MS * 3).toISOString(),
        limit,
        { perWebhook, inFlight: this.inFlightByWebhook() },
      );
      // Stopped while claiming: what was claimed stays leased and is retried after the lease.
      if (due.length === 0 || this.stopped) return;
      for (const d of due) this.send(d);
    }
  }

  /** Starts one attempt, counted in flight until it is settled. */
  private send(d: DueDelivery): void {
    const sending: Promise<void> = this.attempt(d)
      .catch((err: unknown) => this.log?.warn({ err, delivery: d.id }, 'webhook delivery attempt failed'))
      .finally(() => {
        this.inFlight.delete(sending);
        this.poke();
      });
    this.inFlight.set(sending, d.webhook);
  }

  /** How many attempts each webhook has under way. */
  private inFlightByWebhook(): Map<string, number> {
    const n = new Map<string, number>();
    for (const webhook of this.inFlight.values()) n.set(webhook, (n.get(webhook) ?? 0) + 1);
    return n;
  }

  private async attempt(d: DueDelivery): Promise<void> {
    const result = await this.post(d);
    await this.store.settle(d.id, result);
    this.observer.attempted(result.delivered ? 'delivered' : result.retryAt === null ? 'failed' : 'retry');
  }

  /**
   * One POST of `d` and what came of it. Whatever goes wrong is a failed attempt, settled like a
   * receiver's 500 (recorded, counted, retried with backoff, given up after 24 h), never a thrown
   * error: that would leave the delivery leased, to be taken again every lease, forever.
   */
  private async post(d: DueDelivery): Promise<DeliveryResult> {
    const sentAt = new Date();
    let body: string;
    let signature: string;
    try {
      body = this.render(d);
      signature = new Webhook(d.secret).sign(d.id, sentAt, body);
    } catch (e) {
      // A stored message this version cannot render (or a secret it cannot sign with).
      this.log?.warn({ err: e, delivery: d.id }, 'webhook message could not be prepared');
      return this.failure(d, null, `the message could not be prepared: ${(e as Error).message}`);
    }
    try {
      const res = await fetch(d.url, {
        method: 'POST',
        redirect: 'manual',
        signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS),
        headers: {
          'content-type': 'application/json',
          'user-agent': 'arbiter-webhooks',
          'webhook-id': d.id,
          'webhook-timestamp': String(Math.floor(sentAt.getTime() / 1000)),
          'webhook-signature': signature,
        },
        body,
      });
      await res.body?.cancel().catch(() => undefined);
      return res.ok
        ? { delivered: true, at: new Date().toISOString(), status: res.status }
        : this.failure(d, res.status, `receiver answered ${res.status}`);
    } catch (e) {
      const err = e as Error;
      // fetch names the URL in some of its errors: the deliveries list (admin) shows it as the
      // webhook's own answer does, never with a password.
      const reason =
        err.name === 'TimeoutError' ? `no answer within ${ATTEMPT_TIMEOUT_MS / 1000} s` : withCause(err);
      return this.failure(d, null, maskPasswordsIn(reason.split(d.url).join(maskPassword(d.url))));
    }
  }

  /** The next attempt after `d.attempts + 1` failures, or give up 24 h after the change. */
  private failure(d: DueDelivery, status: number | null, error: string): DeliveryResult {
    const backoff = Math.min(this.cfg.retryBaseMs * 2 ** d.attempts, MAX_BACKOFF_MS);
    const next = Date.now() + backoff;
    const giveUp = next > Date.parse(d.created_at) + GIVE_UP_AFTER_MS;
    return {
      delivered: false,
      status,
      error: error.slice(0, 500),
      retryAt: giveUp ? null : new Date(next).toISOString(),
    };
  }

  /** The body sent: the message itself, or a Slack incoming-webhook message linking to the console. */
  private render(d: DueDelivery): string {
    if (d.format !== 'slack') return d.payload;
    return JSON.stringify(slackMessage(JSON.parse(d.payload) as SlackInput, this.cfg.publicUrl()));
  }
}

type SlackInput = { id: string; type: WebhookEventType; time: string; data: Record<string, unknown> };

/** Slack refuses a message whose section text passes 3 000 characters (400 invalid_blocks). */
export const SLACK_SECTION_MAX = 3000;
/**
 * How much of the section one value may take, escaped: names (agents, users, actions, keys,
 * policies) and the resource or the note and message. The longest message (a decision with its
 * reviewer's name, subject, action, resource and note) stays within SLACK_SECTION_MAX; the
 * console shows each value whole.
 */
const NAME_MAX = 300;
const LONG_MAX = 900;

/** A Slack message (text plus blocks) for one webhook message; queue items link to the console. */
export function slackMessage(m: SlackInput, publicUrl: string): { text: string; blocks: unknown[] } {
  const d = m.data;
  let text: string;
  let link: string | undefined;
  if (m.type === 'policy.changed') {
    // The live set changed: which revision, who, by which change of what (and why, if said).
    const revision = typeof d.revision === 'number' ? String(d.revision) : literal(d.revision, NAME_MAX);
    const change = clip(escapeSlack(String(d.change ?? '')), NAME_MAX);
    text =
      `:scroll: Policy set changed to revision ${revision} by ${literal(d.actor, NAME_MAX)} ` +
      `(${change} ${literal(d.name, LONG_MAX)})${d.message ? ` — ${literal(d.message, LONG_MAX)}` : ''}`;
  } else {
    const who = literal(d.agent_id ?? d.user_id ?? 'someone', NAME_MAX);
    const resource = typeof d.resource === 'string' ? d.resource : JSON.stringify(d.resource ?? null);
    const what = `${literal(d.action, NAME_MAX)} on ${literal(resource, LONG_MAX)}`;
    link = typeof d.id === 'string' ? `${publicUrl.replace(/\/$/, '')}/console/#/item/${d.id}` : undefined;
    switch (m.type) {
      case 'queue.pending':
        text = `:hourglass: Approval needed: ${who} wants to ${what}${typeof d.confidence === 'number' ? ` (confidence ${d.confidence})` : ''}${d.message ? ` — ${literal(d.message, LONG_MAX)}` : ''}`;
        break;
      case 'queue.approved':
      case 'queue.denied':
        text = `${m.type === 'queue.approved' ? ':white_check_mark: Approved' : ':no_entry: Denied'} by ${literal(d.decided_by, NAME_MAX)}: ${who} — ${what}${d.note ? ` (${literal(d.note, LONG_MAX)})` : ''}`;
        break;
      default:
        text = `:alarm_clock: Expired without a decision: ${who} — ${what}`;
    }
  }
  // Each value is escaped and cut already; this only guards the sum.
  const safe = clip(text, SLACK_SECTION_MAX);
  // verbatim: Slack turns no URL or name in it into a link (the console link below is the one).
  const blocks: unknown[] = [{ type: 'section', text: { type: 'mrkdwn', text: safe, verbatim: true } }];
  if (link) {
    blocks.push({
      type: 'actions',
      elements: [{ type: 'button', text: { type: 'plain_text', text: 'Open in Arbiter' }, url: link }],
    });
  }
  return { text: link ? `${safe} <${link}|Open in Arbiter>` : safe, blocks };
}

/**
 * What an agent, a policy or a reviewer wrote, escaped for mrkdwn and shown as inline code: Slack
 * applies no formatting inside it (an agent's `*urgent*` or `_x_` stays literal). A backtick would
 * end the span, so it is shown as U+02CB, which looks like one; the console shows the value as it
 * is. At most `max` characters, escapes counted, cut with "…".
 */
function literal(v: unknown, max: number): string {
  const s = typeof v === 'string' ? v : v === undefined || v === null ? '' : JSON.stringify(v);
  return `\`${clip(escapeSlack(s).replace(/`/g, '\u02cb'), max - 2)}\``;
}

/** Slack mrkdwn treats &, < and > as control characters. */
function escapeSlack(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/**
 * Escaped mrkdwn cut to at most `max` characters ending with "…", never inside an escape (`&lt;`)
 * or a surrogate pair.
 */
function clip(s: string, max: number): string {
  if (s.length <= max) return s;
  let cut = s.slice(0, max - 1);
  const amp = cut.lastIndexOf('&');
  if (amp !== -1 && !cut.includes(';', amp)) cut = cut.slice(0, amp);
  if (/[\ud800-\udbff]$/.test(cut)) cut = cut.slice(0, -1);
  return `${cut}…`;
}
