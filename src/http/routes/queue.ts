import { invalid } from '../../errors.js';
import {
  decideRequestSchema,
  MAX_WAIT_SECONDS,
  present,
  QUEUE_EXAMINE,
  QUEUE_STATUSES,
} from '../../queue/service.js';
import type { DecidedStatus } from '../../queue/store.js';
import { principalOf, type RouteDef } from '../context.js';
import { filterParam, PAGE_QUERY, queryOf, queryParam, timeParam } from '../query.js';
import type { RouteDeps } from './index.js';
import { auditEventSchema, DATE_TIME, exact, NULLABLE_DATE_TIME, NULLABLE_STRING, page } from '../schemas.js';
import { ENGINE, param } from './shared.js';

/** A queue item as the API shows it (`present`, SPEC §6). */
const queueItemSchema = exact({
  id: { type: 'string', description: 'the request_id of the decision that asked for review' },
  status: { type: 'string', enum: [...QUEUE_STATUSES] },
  kind: { type: 'string', enum: ['agent', 'human'] },
  agent_id: NULLABLE_STRING,
  user_id: NULLABLE_STRING,
  tenant_id: NULLABLE_STRING,
  action: { type: 'string' },
  resource: { description: 'a string (agents) or {type, id} (humans)' },
  confidence: { type: ['number', 'null'] },
  context: { type: 'object' },
  message: { type: 'string' },
  trace_id: { type: 'string' },
  created_at: DATE_TIME,
  expires_at: DATE_TIME,
  decided_at: NULLABLE_DATE_TIME,
  decided_by: NULLABLE_STRING,
  note: NULLABLE_STRING,
  request_digest: NULLABLE_STRING,
  policy_revision: { type: ['integer', 'null'] },
  on_behalf_of: {
    oneOf: [{ type: 'null' }, exact({ tenant_id: { type: 'string' }, user_id: { type: 'string' } })],
  },
});
const ITEMS = page('items', queueItemSchema);

const QUEUE_FILTERS = [
  filterParam('agent_id', 'only this agent'),
  filterParam('tenant_id', 'only this tenant'),
  filterParam('action', 'only this action'),
] as const;

/** What both queue lists say of their pages (QUEUE_EXAMINE). */
const SHORT_PAGES =
  'A page may be short, or empty, and still have a next_cursor (a page with filters its index does not serve ' +
  `alone examines at most ${QUEUE_EXAMINE} items, and continues after the last one it examined): the list ends ` +
  'only at a null next_cursor';

const DECIDED = QUEUE_STATUSES.filter((st): st is DecidedStatus => st !== 'pending');

/**
 * `?status=`: one state, or a comma-separated set of decided states (they share the
 * newest-decision-first order; pending has its own and stands alone).
 */
const STATUS = queryParam({
  name: 'status',
  description: 'pending (the default), or one or more of approved, denied, expired separated by commas',
  schema: { type: 'string', default: 'pending', examples: [...QUEUE_STATUSES, 'approved,denied,expired'] },
  parse: (raw: string): 'pending' | DecidedStatus[] => {
    if (raw === 'pending') return 'pending';
    const parts = raw.split(',');
    if (
      parts.some((p) => !(DECIDED as readonly string[]).includes(p)) ||
      new Set(parts).size !== parts.length
    ) {
      throw invalid(
        'query parameter status must be pending, or one or more of approved, denied, expired separated by commas',
      );
    }
    // One canonical order, so that a cursor names the same set however the states were listed.
    return DECIDED.filter((st) => parts.includes(st));
  },
});

const LIST_QUERY = [
  STATUS,
  ...QUEUE_FILTERS,
  timeParam('since', 'created at or after this RFC 3339 date-time'),
  timeParam('until', 'created before this RFC 3339 date-time'),
  ...PAGE_QUERY,
] as const;
const PENDING_QUERY = [...PAGE_QUERY, ...QUEUE_FILTERS] as const;

/** `?wait=`: whole or fractional seconds in [0, 60]. */
const WAIT = queryParam({
  name: 'wait',
  description: `hold up to N seconds (≤ ${MAX_WAIT_SECONDS}) until the item leaves pending`,
  schema: { type: 'number', minimum: 0, maximum: MAX_WAIT_SECONDS },
  parse: (raw: string): number => {
    if (!/^\d+(\.\d+)?$/.test(raw) || Number(raw) > MAX_WAIT_SECONDS) {
      throw invalid(`query parameter wait must be a number of seconds between 0 and ${MAX_WAIT_SECONDS}`);
    }
    return Number(raw);
  },
});
const ITEM_QUERY = [WAIT] as const;

/** The two review routes: path verb and the status it moves a pending item to. */
const DECISIONS_BY_REVIEWERS = [
  ['approve', 'approved'],
  ['deny', 'denied'],
] as const;

/** SPEC §6 and §12: the human-review queue on the Engine API. */
export function queueRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/v1/queue/pending',
      template: '/v1/queue/pending',
      ok: {
        status: 200,
        description: `{"items": [queue item], "next_cursor": string|null}, oldest first. ${SHORT_PAGES}`,
        schema: ITEMS,
      },
      query: PENDING_QUERY,
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'List pending human-review items, oldest first',
      handler: async (ctx) => {
        const list = await d.queue.listPending(principalOf(ctx), queryOf(ctx, PENDING_QUERY));
        ctx.body = { items: list.items.map(present), next_cursor: list.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/v1/queue',
      template: '/v1/queue',
      ok: {
        status: 200,
        description: `{"items": [queue item], "next_cursor": string|null}: pending oldest first, decided items newest decision first. ${SHORT_PAGES}`,
        schema: ITEMS,
      },
      query: LIST_QUERY,
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'List queue items in any state, with decided_by and note',
      handler: async (ctx) => {
        const { status, ...q } = queryOf(ctx, LIST_QUERY);
        const list = await d.queue.list(principalOf(ctx), { ...q, statuses: status });
        ctx.body = { items: list.items.map(present), next_cursor: list.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/v1/queue/:id',
      template: '/v1/queue/{id}',
      ok: { status: 200, description: 'The queue item', schema: queueItemSchema },
      also: [
        {
          status: 429,
          description:
            'too many requests are waiting on the queue, in this process or from this API key (Retry-After: 1)',
        },
      ],
      query: ITEM_QUERY,
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'Get one queue item; ?wait=N (≤ 60 s) holds until it leaves pending',
      handler: async (ctx) => {
        const { wait } = queryOf(ctx, ITEM_QUERY);
        // A client that hangs up before its answer gives its long-poll place back at once.
        const gone = new AbortController();
        const hungUp = () => {
          if (!ctx.res.writableFinished) gone.abort();
        };
        ctx.res.once('close', hungUp);
        try {
          ctx.body = present(await d.queue.get(principalOf(ctx), param(ctx, 'id'), wait, gone.signal));
        } finally {
          ctx.res.off('close', hungUp);
        }
      },
    },
    {
      method: 'GET',
      path: '/v1/queue/:id/events',
      template: '/v1/queue/{id}/events',
      ok: {
        status: 200,
        description:
          '{"id", "trace_id", "events": [event], "next_cursor"}: the decision (details.reasons), its approval, denial or expiry, its tokens and events ingested for it, oldest first; only events of the item\'s tenant',
        schema: page('events', auditEventSchema, { id: { type: 'string' }, trace_id: { type: 'string' } }),
      },
      query: PAGE_QUERY,
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'The audit trail of one queue item, oldest first',
      handler: async (ctx) => {
        ctx.body = await d.queue.events(principalOf(ctx), param(ctx, 'id'), queryOf(ctx, PAGE_QUERY));
      },
    },
    ...DECISIONS_BY_REVIEWERS.map(([verb, to]): RouteDef => ({
      method: 'POST',
      path: `/v1/queue/:id/${verb}`,
      template: `/v1/queue/{id}/${verb}`,
      ok: { status: 200, description: `The ${to} item`, schema: queueItemSchema },
      also: [
        {
          status: 409,
          description:
            'the item is not pending (already decided or expired), or approving it would exceed a budget',
        },
      ],
      requestSchema: decideRequestSchema,
      apis: ENGINE,
      scope: 'queue:review',
      body: 'optional-object',
      summary: `${verb === 'approve' ? 'Approve' : 'Deny'} a pending item (optional {"note"})`,
      handler: async (ctx) => {
        ctx.body = present(await d.queue.decide(principalOf(ctx), param(ctx, 'id'), to, ctx.request.body));
      },
    })),
  ];
}
