import type { Config } from '../config.js';
import type { DecisionService } from '../decisions/service.js';
import { AppError, badRequest } from '../errors.js';
import type { Metrics } from '../observability/metrics.js';
import { etagOf, metaOf, type ChangeContext, type PolicyService } from '../policy/service.js';
import { actorOf, principalOf, type Ctx, type RouteDef } from './context.js';

export interface RouteDeps {
  config: Config;
  decisions: DecisionService;
  policies: PolicyService;
  metrics: Metrics;
  health: () => { ok: boolean; revision: number | null; error?: string };
}

const BOTH = ['engine', 'platform'] as const;
const ENGINE = ['engine'] as const;
const PLATFORM = ['platform'] as const;

function change(ctx: Ctx): ChangeContext {
  return { actor: actorOf(ctx), traceId: ctx.state.traceId, requestId: ctx.state.requestId };
}

function param(ctx: Ctx, name: string): string {
  const v = ctx.params[name];
  return Array.isArray(v) ? v.join('/') : (v ?? '');
}

function boolQuery(ctx: Ctx, name: string): boolean {
  const v = ctx.query[name];
  if (v === undefined) return false;
  if (v === 'true' || v === '1') return true;
  if (v === 'false' || v === '0') return false;
  throw badRequest(`query parameter ${name} must be true or false`);
}

/**
 * Every route of both APIs, the scope each needs, and its handler. Handlers only translate
 * HTTP ↔ service calls; the rules live in the services.
 */
export function routeTable(d: RouteDeps): RouteDef[] {
  const authorizeAgent = async (ctx: Ctx) => {
    const r = await d.decisions.authorizeAgent(ctx.request.body, principalOf(ctx), ctx.state);
    ctx.status = r.httpStatus;
    ctx.body = r.body;
  };
  return [
    {
      method: 'GET',
      path: '/healthz',
      template: '/healthz',
      apis: BOTH,
      scope: null,
      body: 'none',
      summary: 'Health check (public)',
      handler: (ctx) => {
        const h = d.health();
        ctx.status = h.ok ? 200 : 503;
        ctx.body = h.ok
          ? { status: 'ok', revision: h.revision }
          : { status: 'unavailable', error: h.error ?? 'unavailable', revision: h.revision };
      },
    },
    {
      method: 'GET',
      path: '/metrics',
      template: '/metrics',
      apis: BOTH,
      scope: d.config.metricsPublic ? null : 'metrics:read',
      body: 'none',
      summary: 'Prometheus metrics',
      handler: async (ctx) => {
        ctx.type = d.metrics.registry.contentType;
        ctx.body = await d.metrics.registry.metrics();
      },
    },
    {
      method: 'POST',
      path: '/v1/agent/authorize',
      template: '/v1/agent/authorize',
      apis: ENGINE,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize an AI agent action with confidence gates',
      handler: authorizeAgent,
    },
    {
      method: 'POST',
      path: '/api/v1/authorize',
      template: '/api/v1/authorize',
      apis: BOTH,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize an AI agent action (same contract as /v1/agent/authorize)',
      handler: authorizeAgent,
    },
    {
      method: 'POST',
      path: '/v1/authorize',
      template: '/v1/authorize',
      apis: ENGINE,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize a human user action',
      handler: async (ctx) => {
        const r = await d.decisions.authorizeHuman(ctx.request.body, principalOf(ctx), ctx.state);
        ctx.status = r.httpStatus;
        ctx.body = r.body;
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies',
      template: '/api/v1/policies',
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List policies',
      handler: async (ctx) => {
        ctx.body = await d.policies.list();
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies/:name',
      template: '/api/v1/policies/{name}',
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Get one policy with its Rego source',
      handler: async (ctx) => {
        const p = await d.policies.get(param(ctx, 'name'));
        ctx.set('ETag', etagOf(p));
        ctx.body = { ...metaOf(p), rego: p.rego };
      },
    },
    {
      method: 'PUT',
      path: '/api/v1/policies/:name',
      template: '/api/v1/policies/{name}',
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'policy',
      summary: 'Create or update a policy (compiled and live before the response)',
      handler: async (ctx) => {
        const { rego, description } = policyBody(ctx.request.body);
        const ifMatch = ctx.get('if-match') || undefined;
        const r = await d.policies.put(
          param(ctx, 'name'),
          rego,
          description,
          { ifMatch, dryRun: boolQuery(ctx, 'dry_run') },
          change(ctx),
        );
        if (r.dryRun) {
          ctx.status = 200;
          ctx.body = { dry_run: true, compiled: true, ...r.policy, revision: r.revision };
          return;
        }
        ctx.status = r.created ? 201 : 200;
        ctx.set('ETag', etagOf(r.policy));
        ctx.body = { ...r.policy, revision: r.revision };
      },
    },
    {
      method: 'DELETE',
      path: '/api/v1/policies/:name',
      template: '/api/v1/policies/{name}',
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      summary: 'Delete a policy',
      handler: async (ctx) => {
        await d.policies.delete(param(ctx, 'name'), ctx.get('if-match') || undefined, change(ctx));
        ctx.status = 204;
      },
    },
    {
      method: 'GET',
      path: '/api/v1/data',
      template: '/api/v1/data',
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List data documents',
      handler: async (ctx) => {
        ctx.body = await d.policies.listData();
      },
    },
    {
      method: 'GET',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Get one data document',
      handler: async (ctx) => {
        const doc = await d.policies.getData(param(ctx, 'path'));
        ctx.body = { path: doc.path, value: doc.value, updated_at: doc.updated_at };
      },
    },
    {
      method: 'PUT',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'json',
      summary: 'Create or replace a data document (any JSON value), live before the response',
      handler: async (ctx) => {
        const r = await d.policies.putData(param(ctx, 'path'), ctx.request.body, change(ctx));
        ctx.status = r.created ? 201 : 200;
        ctx.body = { path: r.path, revision: r.revision, updated_at: r.updated_at };
      },
    },
    {
      method: 'DELETE',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      summary: 'Delete a data document',
      handler: async (ctx) => {
        await d.policies.deleteData(param(ctx, 'path'), change(ctx));
        ctx.status = 204;
      },
    },
  ];
}

/** A policy PUT body: `{"rego", "description"?}` as JSON, or the Rego itself as text/plain. */
function policyBody(body: unknown): { rego: string; description: string | undefined } {
  if (typeof body === 'string') return { rego: body, description: undefined };
  const b = body as Record<string, unknown>;
  for (const k of Object.keys(b)) {
    if (k !== 'rego' && k !== 'description') throw badRequest(`unknown field: ${k}`);
  }
  if (b.rego === undefined) throw badRequest('missing required field: rego');
  if (typeof b.rego !== 'string') throw badRequest('rego must be a string');
  if (b.description !== undefined && typeof b.description !== 'string') {
    throw badRequest('description must be a string');
  }
  if (typeof b.description === 'string' && b.description.length > 1024) {
    throw new AppError(400, 'description must be at most 1024 characters');
  }
  return { rego: b.rego, description: b.description as string | undefined };
}
