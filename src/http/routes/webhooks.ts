import { pageOf } from '../../common/pagination.js';
import { webhookRequestSchema, type WebhookService } from '../../webhooks/service.js';
import { actorOf, type RouteDef } from '../context.js';
import { PAGE_QUERY, queryOf } from '../query.js';
import { WEBHOOK_EVENTS } from '../../webhooks/types.js';
import { DATE_TIME, exact, NULLABLE_DATE_TIME, NULLABLE_STRING, page } from '../schemas.js';
import { param, PLATFORM } from './shared.js';

const webhookSchema = {
  type: 'object',
  required: ['name', 'url', 'events', 'format', 'created_at', 'updated_at'],
  additionalProperties: false,
  properties: {
    name: { type: 'string' },
    url: { type: 'string' },
    events: { type: 'array', items: { type: 'string', enum: [...WEBHOOK_EVENTS] } },
    format: { type: 'string', enum: ['json', 'slack'] },
    created_at: DATE_TIME,
    updated_at: DATE_TIME,
  },
};
const webhookWithSecretSchema = {
  ...webhookSchema,
  properties: {
    ...webhookSchema.properties,
    secret: { type: 'string', description: 'only when Arbiter generated it, and only in this answer' },
  },
};

/** One delivery as the API shows it (its payload aside). */
const deliverySchema = exact({
  id: { type: 'string', description: 'the message id (webhook-id), the same on every attempt' },
  webhook: { type: 'string' },
  type: { type: 'string', enum: [...WEBHOOK_EVENTS] },
  status: { type: 'string', enum: ['pending', 'delivered', 'failed'] },
  attempts: { type: 'integer' },
  next_attempt_at: {
    ...NULLABLE_DATE_TIME,
    description: 'when it is tried next (while pending); null once delivered or failed',
  },
  last_status: { type: ['integer', 'null'] },
  last_error: NULLABLE_STRING,
  created_at: DATE_TIME,
  delivered_at: NULLABLE_DATE_TIME,
});

/** A webhook receives every tenant's events: no key bound to one tenant or agent may manage one. */
const WEBHOOKS_ARE_GLOBAL = "cannot manage webhooks, which receive every tenant's events";

/** The webhook routes of SPEC §12 (Platform API, `admin`, keys bound to no tenant or agent). */
export function webhookRoutes(webhooks: WebhookService): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/webhooks',
      template: '/api/v1/webhooks',
      ok: {
        status: 200,
        description: '{"webhooks": [webhook], "next_cursor"} by name (never their secrets)',
        schema: page('webhooks', webhookSchema),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'admin',
      global: WEBHOOKS_ARE_GLOBAL,
      body: 'none',
      summary: 'List webhooks',
      handler: async (ctx) => {
        const p = pageOf(await webhooks.list(), (w) => w.name, 'webhooks', queryOf(ctx, PAGE_QUERY));
        ctx.body = { webhooks: p.items, next_cursor: p.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/webhooks/:name',
      template: '/api/v1/webhooks/{name}',
      ok: { status: 200, description: 'The webhook (never its secret)', schema: webhookSchema },
      apis: PLATFORM,
      scope: 'admin',
      global: WEBHOOKS_ARE_GLOBAL,
      body: 'none',
      summary: 'Get one webhook',
      handler: async (ctx) => {
        ctx.body = await webhooks.get(param(ctx, 'name'));
      },
    },
    {
      method: 'PUT',
      path: '/api/v1/webhooks/:name',
      template: '/api/v1/webhooks/{name}',
      ok: {
        status: 200,
        description: 'replaced: the webhook, plus `secret` once when Arbiter generated it',
        schema: webhookWithSecretSchema,
      },
      also: [
        {
          status: 201,
          description: 'created: the webhook, plus `secret` once when Arbiter generated it',
          schema: webhookWithSecretSchema,
        },
      ],
      requestSchema: webhookRequestSchema,
      apis: PLATFORM,
      scope: 'admin',
      global: WEBHOOKS_ARE_GLOBAL,
      body: 'object',
      summary: 'Create or replace a webhook (signed with Standard Webhooks)',
      handler: async (ctx) => {
        const r = await webhooks.put(param(ctx, 'name'), ctx.request.body, actorOf(ctx), ctx.state);
        ctx.status = r.created ? 201 : 200;
        ctx.body = r.secret ? { ...r.webhook, secret: r.secret } : r.webhook;
      },
    },
    {
      method: 'DELETE',
      path: '/api/v1/webhooks/:name',
      template: '/api/v1/webhooks/{name}',
      ok: { status: 204, description: 'Deleted, with its pending deliveries' },
      apis: PLATFORM,
      scope: 'admin',
      global: WEBHOOKS_ARE_GLOBAL,
      body: 'none',
      summary: 'Delete a webhook',
      handler: async (ctx) => {
        await webhooks.delete(param(ctx, 'name'), actorOf(ctx), ctx.state);
        ctx.status = 204;
      },
    },
    {
      method: 'GET',
      path: '/api/v1/webhooks/:name/deliveries',
      template: '/api/v1/webhooks/{name}/deliveries',
      ok: {
        status: 200,
        description:
          '{"deliveries": [{id, webhook, type, status, attempts, last_status, last_error, next_attempt_at, created_at, delivered_at}], "next_cursor"}, newest first',
        schema: page('deliveries', deliverySchema),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'admin',
      global: WEBHOOKS_ARE_GLOBAL,
      body: 'none',
      summary: "A webhook's deliveries: attempts, last status, next attempt",
      handler: async (ctx) => {
        ctx.body = await webhooks.deliveries(param(ctx, 'name'), queryOf(ctx, PAGE_QUERY));
      },
    },
  ];
}
