import {
  anchorOf,
  ingestBatchSchema,
  ingestEventSchema,
  OUTCOMES,
  parseAnchorCount,
  parseAnchorHead,
} from '../../audit/service.js';
import { HEX64 } from '../../audit/chain.js';
import { invalid } from '../../errors.js';
import { principalOf, type RouteDef } from '../context.js';
import { filterParam, PAGE_QUERY, queryOf, queryParam, timeParam } from '../query.js';
import type { RouteDeps } from './index.js';
import { auditEventSchema, exact, page } from '../schemas.js';
import { param, PLATFORM } from './shared.js';

const only = (field: string) => `only events with this ${field}`;

/** `?outcome=`: one of the outcomes events carry. */
const OUTCOME = queryParam({
  name: 'outcome',
  description: only('outcome'),
  schema: { type: 'string', enum: [...OUTCOMES] },
  parse: (raw: string): string => {
    if (!(OUTCOMES as readonly string[]).includes(raw)) {
      throw invalid(`query parameter outcome must be one of ${OUTCOMES.join(', ')}`);
    }
    return raw;
  },
});

/** The filters of GET /api/v1/audit: exact matches (each served by an index), a time window, paging. */
const AUDIT_QUERY = [
  ...PAGE_QUERY,
  filterParam('kind', only('kind')),
  filterParam('agent_id', only('agent_id')),
  filterParam('user_id', only('user_id')),
  filterParam('tenant_id', only('tenant_id')),
  filterParam('action', only('action')),
  OUTCOME,
  filterParam('request_id', only('request_id')),
  filterParam('trace_id', only('trace_id')),
  timeParam('since', 'RFC 3339 date-time'),
  timeParam('until', 'RFC 3339 date-time'),
] as const;

/** An anchor saved from an earlier verify (its `head` and `checked`); both or neither. */
const VERIFY_QUERY = [
  queryParam({
    name: 'head',
    description: 'a head an earlier verify answered, kept outside the database; needs count',
    schema: { type: 'string', pattern: HEX64.source },
    parse: parseAnchorHead,
  }),
  queryParam({
    name: 'count',
    description: 'the checked that verify answered with head: event number count must still hash to head',
    schema: { type: 'integer', minimum: 1, maximum: Number.MAX_SAFE_INTEGER },
    parse: parseAnchorCount,
  }),
] as const;

/** SPEC §8: the audit trail on the Platform API. */
export function auditRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/audit',
      template: '/api/v1/audit',
      ok: {
        status: 200,
        description:
          '{"events": [event], "next_cursor": string|null}, newest first. A page may be short, or empty, and still have a next_cursor (a key bound to nothing combining conditions examines at most 2 000 events a page): the list ends only at a null next_cursor',
        schema: page('events', auditEventSchema),
      },
      query: AUDIT_QUERY,
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Query audit events, newest first',
      handler: async (ctx) => {
        const page = await d.audit.query(principalOf(ctx), queryOf(ctx, AUDIT_QUERY));
        ctx.body = { events: page.items, next_cursor: page.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/audit/trace/:traceID',
      template: '/api/v1/audit/trace/{traceID}',
      ok: {
        status: 200,
        description: '{"trace_id", "events": [event], "next_cursor"}, oldest first; 404 when none',
        schema: page('events', auditEventSchema, { trace_id: { type: 'string' } }),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Every audit event of one trace, oldest first',
      handler: async (ctx) => {
        ctx.body = await d.audit.trace(principalOf(ctx), param(ctx, 'traceID'), queryOf(ctx, PAGE_QUERY));
      },
    },
    {
      method: 'POST',
      path: '/api/v1/audit/ingest',
      template: '/api/v1/audit/ingest',
      ok: {
        status: 202,
        description: '{"accepted": n, "ids": [...]}',
        schema: exact({
          accepted: { type: 'integer', minimum: 0 },
          ids: { type: 'array', items: { type: 'string' } },
        }),
      },
      requestSchema: { oneOf: [ingestEventSchema, ingestBatchSchema] },
      also: [
        {
          status: 413,
          description:
            `body larger than ${d.config.maxBodyBytes} bytes, or an event whose details (with its unknown ` +
            `fields) and resource are more than ${d.config.maxContextBytes} bytes as JSON together; ` +
            'nothing is stored',
        },
      ],
      apis: PLATFORM,
      scope: 'audit:write',
      body: 'object',
      summary: 'Append one event or {"events": [...]} (≤ 1000), all or nothing',
      handler: async (ctx) => {
        ctx.status = 202;
        ctx.body = await d.audit.ingest(principalOf(ctx), ctx.request.body, ctx.state.receivedBytes);
      },
    },
    {
      method: 'GET',
      path: '/api/v1/audit/verify',
      template: '/api/v1/audit/verify',
      ok: {
        status: 200,
        description: '{"ok": true, "checked", "head"} or {"ok": false, "checked", "first_bad", "reason"}',
        schema: {
          oneOf: [
            exact({ ok: { const: true }, checked: { type: 'integer' }, head: { type: 'string' } }),
            exact({
              ok: { const: false },
              checked: { type: 'integer' },
              first_bad: { type: ['string', 'null'] },
              reason: { type: 'string' },
            }),
          ],
        },
      },
      query: VERIFY_QUERY,
      apis: PLATFORM,
      scope: 'audit:read',
      // The chain's length and head count every tenant's events.
      global: "cannot verify the audit chain, which holds every tenant's events",
      body: 'none',
      summary: 'Verify the audit hash chain (and an anchored head); reports the first event that fails',
      handler: async (ctx) => {
        const q = queryOf(ctx, VERIFY_QUERY);
        ctx.body = await d.audit.verify(anchorOf(q.head, q.count));
      },
    },
  ];
}
