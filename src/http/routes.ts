import {
  ingestBatchSchema,
  ingestEventSchema,
  OUTCOMES,
  type AuditQuery,
  type AuditService,
} from '../audit/service.js';
import { AUDIT_QUERY_PARAMS } from '../audit/store.js';
import type { Config } from '../config.js';
import { agentRequestSchema, decisionResponseSchema, humanRequestSchema } from '../decisions/schemas.js';
import type { DecisionResult, DecisionService } from '../decisions/service.js';
import { badRequest } from '../errors.js';
import type { Metrics } from '../observability/metrics.js';
import { decideRequestSchema, parseWait, present, type QueueService } from '../queue/service.js';
import { introspectRequestSchema, mintRequestSchema, type TokenService } from '../tokens/service.js';
import { openApiDocument } from './openapi.js';
import { pageOf } from './pagination.js';
import { compileSchema } from './validation.js';
import { etagOf, metaOf, type ChangeContext, type PolicyService } from '../policy/service.js';
import { actorOf, principalOf, type Ctx, type RouteDef } from './context.js';

export interface RouteDeps {
  config: Config;
  version: string;
  /** Prometheus text: this process's registry, or the sum over all workers. */
  metricsText: () => Promise<string>;
  audit: AuditService;
  decisions: DecisionService;
  queue: QueueService;
  tokens: TokenService;
  policies: PolicyService;
  metrics: Metrics;
  health: () => { ok: boolean; revision: number | null; error?: string };
}

const BOTH = ['engine', 'platform'] as const;
const PAGE_QUERY = [
  {
    name: 'limit',
    description: 'page size, 1…1000 (default 100)',
    schema: { type: 'integer', minimum: 1, maximum: 1000 },
  },
  { name: 'cursor', description: 'next_cursor of the previous page', schema: { type: 'string' } },
];

const ENGINE = ['engine'] as const;
/** The two review routes: path verb and the status it moves a pending item to. */
const DECISIONS_BY_REVIEWERS = [
  ['approve', 'approved'],
  ['deny', 'denied'],
] as const;
const PLATFORM = ['platform'] as const;

function change(ctx: Ctx): ChangeContext {
  return { actor: actorOf(ctx), traceId: ctx.state.traceId, requestId: ctx.state.requestId };
}

function param(ctx: Ctx, name: string): string {
  return (ctx.params[name] as string | undefined) ?? '';
}

/**
 * The data path exactly as sent (not percent-decoded): `a%2Fb` must not become the two segments
 * `a/b`, and any escape is refused by the path rule.
 */
function dataPath(ctx: Ctx): string {
  return ctx.path.slice('/api/v1/data/'.length);
}

function query(ctx: Ctx, name: string): string | undefined {
  const v = ctx.query[name];
  if (Array.isArray(v)) throw badRequest(`query parameter ${name} must be given once`);
  return v;
}

/** `limit` and `cursor`, and nothing else, for the simple lists. */
function listQuery(ctx: Ctx): { limit?: string; cursor?: string } {
  for (const k of Object.keys(ctx.query)) {
    if (k !== 'limit' && k !== 'cursor') throw badRequest(`unknown query parameter ${k}`);
  }
  return { limit: query(ctx, 'limit'), cursor: query(ctx, 'cursor') };
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
  const mintSchema = mintRequestSchema(d.config.tokenMaxTtlSeconds);
  const respond = (ctx: Ctx, r: DecisionResult) => {
    ctx.status = r.httpStatus;
    if (r.replayed) ctx.set('Idempotent-Replayed', 'true');
    ctx.body = r.body;
  };
  const idemKey = (ctx: Ctx) => ctx.get('idempotency-key') || undefined;
  const authorizeAgent = async (ctx: Ctx) =>
    respond(
      ctx,
      await d.decisions.authorizeAgent(ctx.request.body, principalOf(ctx), ctx.state, idemKey(ctx)),
    );
  const routes: RouteDef[] = [
    {
      method: 'GET',
      path: '/openapi.json',
      template: '/openapi.json',
      ok: { status: 200, description: 'This OpenAPI 3.1 document (any valid API key)' },
      apis: BOTH,
      // SPEC §2 exempts only /healthz and the JWKS from authentication.
      scope: 'authenticated',
      body: 'none',
      summary: 'The OpenAPI description of both APIs',
      handler: (ctx) => {
        ctx.body = document ??= openApiDocument(routes, d.config, d.version);
      },
    },
    {
      method: 'GET',
      path: '/healthz',
      template: '/healthz',
      ok: {
        status: 200,
        description:
          'Healthy: {"status":"ok","revision":N}; 503 when storage is unusable or no policy set is loaded',
      },
      apis: BOTH,
      scope: null,
      body: 'none',
      summary: 'Health check (public)',
      handler: (ctx) => {
        const h = d.health();
        ctx.status = h.ok ? 200 : 503;
        ctx.body = h.ok
          ? { status: 'ok', revision: h.revision }
          : { status: 'unavailable', error: h.error ?? 'unavailable' };
      },
    },
    {
      method: 'GET',
      path: '/metrics',
      template: '/metrics',
      ok: { status: 200, description: 'Prometheus text exposition format' },
      apis: BOTH,
      scope: d.config.metricsPublic ? null : 'metrics:read',
      body: 'none',
      summary: 'Prometheus metrics',
      handler: async (ctx) => {
        ctx.type = d.metrics.registry.contentType;
        ctx.body = await d.metricsText();
      },
    },
    // SPEC §5: both agent authorize paths, one contract, served by both APIs.
    ...['/v1/agent/authorize', '/api/v1/authorize'].map((path): RouteDef => ({
      method: 'POST',
      path,
      template: path,
      ok: {
        status: 200,
        description: 'allow (200), requires_approval (202) or deny (403)',
        schema: decisionResponseSchema,
      },
      requestSchema: agentRequestSchema,
      apis: BOTH,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize an AI agent action with confidence gates',
      handler: authorizeAgent,
    })),
    {
      method: 'POST',
      path: '/v1/authorize',
      template: '/v1/authorize',
      ok: {
        status: 200,
        description: 'allow (200), requires_approval (202) or deny (403)',
        schema: decisionResponseSchema,
      },
      requestSchema: humanRequestSchema,
      apis: ENGINE,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize a human user action',
      handler: async (ctx) => {
        respond(
          ctx,
          await d.decisions.authorizeHuman(ctx.request.body, principalOf(ctx), ctx.state, idemKey(ctx)),
        );
      },
    },
    {
      method: 'GET',
      path: '/.well-known/jwks.json',
      template: '/.well-known/jwks.json',
      ok: { status: 200, description: 'JWK Set with the Ed25519 public key' },
      apis: BOTH,
      scope: null,
      body: 'none',
      summary: 'Public keys that verify Arbiter tokens (public)',
      handler: (ctx) => {
        ctx.set('Cache-Control', 'public, max-age=300');
        ctx.body = d.tokens.jwks();
      },
    },
    {
      method: 'GET',
      path: '/v1/queue/pending',
      template: '/v1/queue/pending',
      ok: { status: 200, description: '{"items": [queue item], "next_cursor": string|null}' },
      query: [
        ...PAGE_QUERY,
        { name: 'agent_id', description: 'only this agent', schema: { type: 'string' } },
        { name: 'tenant_id', description: 'only this tenant', schema: { type: 'string' } },
        { name: 'action', description: 'only this action', schema: { type: 'string' } },
      ],
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'List pending human-review items, oldest first',
      handler: async (ctx) => {
        const list = await d.queue.listPending(principalOf(ctx), {
          agent_id: query(ctx, 'agent_id'),
          tenant_id: query(ctx, 'tenant_id'),
          action: query(ctx, 'action'),
          limit: query(ctx, 'limit'),
          cursor: query(ctx, 'cursor'),
        });
        ctx.body = { items: list.items.map(present), next_cursor: list.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/v1/queue/:id',
      template: '/v1/queue/{id}',
      ok: { status: 200, description: 'The queue item' },
      query: [
        {
          name: 'wait',
          description: 'hold up to N seconds (≤ 60) until the item leaves pending',
          schema: { type: 'number', minimum: 0, maximum: 60 },
        },
      ],
      apis: ENGINE,
      scope: 'queue:read',
      body: 'none',
      summary: 'Get one queue item; ?wait=N (≤ 60 s) holds until it leaves pending',
      handler: async (ctx) => {
        ctx.body = present(await d.queue.get(principalOf(ctx), param(ctx, 'id'), parseWait(ctx.query.wait)));
      },
    },
    ...DECISIONS_BY_REVIEWERS.map(([verb, to]): RouteDef => ({
      method: 'POST',
      path: `/v1/queue/:id/${verb}`,
      template: `/v1/queue/{id}/${verb}`,
      ok: { status: 200, description: `The ${to} item; 409 when not pending` },
      requestSchema: decideRequestSchema,
      apis: ENGINE,
      scope: 'queue:review',
      body: 'optional-object',
      summary: `${verb === 'approve' ? 'Approve' : 'Deny'} a pending item (optional {"note"})`,
      handler: async (ctx) => {
        ctx.body = present(await d.queue.decide(principalOf(ctx), param(ctx, 'id'), to, ctx.request.body));
      },
    })),
    {
      method: 'POST',
      path: '/v1/tokens/mint',
      template: '/v1/tokens/mint',
      ok: {
        status: 201,
        description:
          '{token_id, token, token_type, subject, scopes, expires_at}; 409 pending or already exchanged',
      },
      requestSchema: mintSchema,
      apis: ENGINE,
      scope: 'tokens:mint',
      body: 'object',
      summary: 'Exchange an allowed or approved request for a scoped token (once)',
      handler: async (ctx) => {
        ctx.status = 201;
        ctx.body = await d.tokens.mint(ctx.request.body, principalOf(ctx), ctx.state.traceId);
      },
    },
    {
      method: 'POST',
      path: '/v1/tokens/introspect',
      template: '/v1/tokens/introspect',
      ok: { status: 200, description: 'RFC 7662: {"active": true, …} or {"active": false}' },
      requestSchema: introspectRequestSchema,
      apis: ENGINE,
      scope: 'tokens:read',
      body: 'object',
      summary: 'RFC 7662 token introspection',
      handler: async (ctx) => {
        ctx.body = await d.tokens.introspect(ctx.request.body, principalOf(ctx));
      },
    },
    {
      method: 'DELETE',
      path: '/v1/tokens/:tokenID',
      template: '/v1/tokens/{tokenID}',
      ok: {
        status: 200,
        description: '{token_id, revoked: true, revoked_at}; repeating it answers the same',
      },
      apis: ENGINE,
      scope: 'tokens:revoke',
      body: 'none',
      summary: 'Revoke a token (idempotent)',
      handler: async (ctx) => {
        ctx.body = await d.tokens.revoke(param(ctx, 'tokenID'), principalOf(ctx), ctx.state.traceId);
      },
    },
    {
      method: 'GET',
      path: '/api/v1/audit',
      template: '/api/v1/audit',
      ok: { status: 200, description: '{"events": [event], "next_cursor": string|null}, newest first' },
      query: [
        ...PAGE_QUERY,
        ...AUDIT_QUERY_PARAMS.filter((n) => n !== 'limit' && n !== 'cursor').map((name) => ({
          name,
          description:
            name === 'since' || name === 'until' ? 'RFC 3339 date-time' : `only events with this ${name}`,
          schema:
            name === 'outcome'
              ? { type: 'string', enum: [...OUTCOMES] }
              : name === 'since' || name === 'until'
                ? { type: 'string', format: 'date-time' }
                : { type: 'string' },
        })),
      ],
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Query audit events, newest first',
      handler: async (ctx) => {
        const q: AuditQuery = {};
        for (const k of AUDIT_QUERY_PARAMS) q[k] = query(ctx, k);
        for (const k of Object.keys(ctx.query)) {
          if (!(AUDIT_QUERY_PARAMS as readonly string[]).includes(k))
            throw badRequest(`unknown query parameter ${k}`);
        }
        ctx.body = await d.audit.query(principalOf(ctx), q);
      },
    },
    {
      method: 'GET',
      path: '/api/v1/audit/trace/:traceID',
      template: '/api/v1/audit/trace/{traceID}',
      ok: {
        status: 200,
        description: '{"trace_id", "events": [event], "next_cursor"}, oldest first; 404 when none',
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Every audit event of one trace, oldest first',
      handler: async (ctx) => {
        ctx.body = await d.audit.trace(principalOf(ctx), param(ctx, 'traceID'), {
          limit: query(ctx, 'limit'),
          cursor: query(ctx, 'cursor'),
        });
      },
    },
    {
      method: 'POST',
      path: '/api/v1/audit/ingest',
      template: '/api/v1/audit/ingest',
      ok: { status: 202, description: '{"accepted": n, "ids": [...]}' },
      requestSchema: { oneOf: [ingestEventSchema, ingestBatchSchema] },
      apis: PLATFORM,
      scope: 'audit:write',
      body: 'object',
      summary: 'Append one event or {"events": [...]} (≤ 1000), all or nothing',
      handler: async (ctx) => {
        ctx.status = 202;
        ctx.body = await d.audit.ingest(principalOf(ctx), ctx.request.body);
      },
    },
    {
      method: 'GET',
      path: '/api/v1/audit/verify',
      template: '/api/v1/audit/verify',
      ok: {
        status: 200,
        description: '{"ok": true, "checked", "head"} or {"ok": false, "checked", "first_bad", "reason"}',
      },
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Verify the audit hash chain; reports the first event that fails',
      handler: async (ctx) => {
        ctx.body = await d.audit.verify(principalOf(ctx));
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies',
      template: '/api/v1/policies',
      ok: {
        status: 200,
        description:
          '{"policies": [{name, description, sha256, version, updated_at}], "revision", "next_cursor"}',
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List policies',
      handler: async (ctx) => {
        const { policies, revision } = await d.policies.list();
        const { page, next_cursor } = pageOf(policies, (p) => p.name, 'policies', listQuery(ctx));
        ctx.body = { policies: page, revision, next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies/:name',
      template: '/api/v1/policies/{name}',
      ok: { status: 200, description: 'Policy metadata plus rego, with ETag' },
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
      ok: {
        status: 200,
        description:
          '200 updated or 201 created: policy metadata and revision; 400 names policy, row and column',
      },
      requestSchema: policyRequestSchema,
      query: [
        { name: 'dry_run', description: 'compile and report without storing', schema: { type: 'boolean' } },
      ],
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
      ok: { status: 204, description: 'Deleted' },
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
      ok: { status: 200, description: '{"documents": [{path, updated_at}], "revision", "next_cursor"}' },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List data documents',
      handler: async (ctx) => {
        const { documents, revision } = await d.policies.listData();
        const { page, next_cursor } = pageOf(documents, (doc) => doc.path, 'data', listQuery(ctx));
        ctx.body = { documents: page, revision, next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      ok: { status: 200, description: '{path, value, updated_at}' },
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Get one data document',
      handler: async (ctx) => {
        const doc = await d.policies.getData(dataPath(ctx));
        ctx.body = { path: doc.path, value: doc.value, updated_at: doc.updated_at };
      },
    },
    {
      method: 'PUT',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      ok: { status: 200, description: '200 replaced or 201 created: {path, revision, updated_at}' },
      requestSchema: {},
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'json',
      summary: 'Create or replace a data document (any JSON value), live before the response',
      handler: async (ctx) => {
        const r = await d.policies.putData(dataPath(ctx), ctx.request.body, change(ctx));
        ctx.status = r.created ? 201 : 200;
        ctx.body = { path: r.path, revision: r.revision, updated_at: r.updated_at };
      },
    },
    {
      method: 'DELETE',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      ok: { status: 204, description: 'Deleted' },
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      summary: 'Delete a data document',
      handler: async (ctx) => {
        await d.policies.deleteData(dataPath(ctx), change(ctx));
        ctx.status = 204;
      },
    },
  ];
  let document: Record<string, unknown> | undefined;
  return routes;
}

/** Body of PUT /api/v1/policies/{name} as JSON (text/plain Rego is the other form). */
export const policyRequestSchema = {
  type: 'object',
  required: ['rego'],
  additionalProperties: false,
  properties: {
    rego: { type: 'string', description: 'one Rego module, OPA v1 syntax' },
    description: { type: 'string', maxLength: 1024 },
  },
};
const validatePolicyBody = compileSchema<{ rego: string; description?: string }>(policyRequestSchema);

/** A policy PUT body: `{"rego", "description"?}` as JSON, or the Rego itself as text/plain. */
function policyBody(body: unknown): { rego: string; description: string | undefined } {
  if (typeof body === 'string') return { rego: body, description: undefined };
  const b = validatePolicyBody(body);
  return { rego: b.rego, description: b.description };
}
