import { CONSOLE_HEADERS, type ConsoleFile } from '../console.js';
import { principalOf, type Ctx, type RouteDef } from '../context.js';
import { openApiDocument } from '../openapi.js';
import type { RouteDeps } from './index.js';
import { exact, NULLABLE_STRING } from '../schemas.js';
import { BOTH, ENGINE, param } from './shared.js';

/** A console file the client already holds (If-None-Match). */
const NOT_MODIFIED = { status: 304, description: 'not modified (If-None-Match holds)', schema: null };

/** Sends one console file with the console's security headers; 304 when the client has it. */
function sendConsoleFile(ctx: Ctx, file: () => ConsoleFile): void {
  ctx.set(CONSOLE_HEADERS);
  const f = file();
  ctx.status = 200;
  ctx.type = f.type;
  ctx.set('ETag', f.etag);
  ctx.set('Cache-Control', f.immutable ? 'public, max-age=31536000, immutable' : 'no-cache');
  if (ctx.fresh) {
    ctx.status = 304;
    return;
  }
  ctx.body = f.body;
}

/** Health, metrics, the OpenAPI document, the JWKS, whoami and the reviewer console. */
export function systemRoutes(d: RouteDeps, all: () => RouteDef[]): RouteDef[] {
  let document: Record<string, unknown> | undefined;
  return [
    {
      method: 'GET',
      path: '/openapi.json',
      template: '/openapi.json',
      ok: {
        status: 200,
        description: 'This OpenAPI 3.1 document (any valid API key)',
        schema: {
          type: 'object',
          required: ['openapi', 'info', 'paths'],
          properties: { openapi: { const: '3.1.0' } },
        },
      },
      apis: BOTH,
      // SPEC §2 exempts only /healthz and the JWKS from authentication.
      scope: 'authenticated',
      body: 'none',
      summary: 'The OpenAPI description of both APIs',
      handler: (ctx) => {
        ctx.body = document ??= openApiDocument(all(), d.config, d.version);
      },
    },
    {
      method: 'GET',
      path: '/healthz',
      template: '/healthz',
      ok: {
        status: 200,
        description:
          'Healthy: {"status":"ok","revision":N}; 503 when storage is unusable (unreachable, read-only, or its audit chain head unreadable) or no policy set is loaded',
        schema: exact({ status: { const: 'ok' }, revision: { type: ['integer', 'null'] } }),
      },
      also: [
        {
          status: 503,
          description:
            'storage is unusable (unreachable, read-only, its audit chain head unreadable, a schema a newer Arbiter migrated, or a SQLite file removed or replaced under it) or no policy set is loaded',
          schema: exact({ status: { const: 'unavailable' }, error: { type: 'string' } }),
        },
      ],
      apis: BOTH,
      scope: null,
      body: 'none',
      summary: 'Health check (public)',
      handler: async (ctx) => {
        const h = await d.health();
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
      produces: ['text/plain'],
      apis: BOTH,
      scope: d.config.metricsPublic ? null : 'metrics:read',
      // The counters and gauges sum every tenant's decisions, queue items, tokens and audit
      // events, as the chain's length does: not one tenant's (or agent's) to read. Public
      // metrics are the operator's choice, and then no key is asked for.
      ...(d.config.metricsPublic
        ? {}
        : { global: "cannot read the metrics, which count every tenant's decisions and events" }),
      body: 'none',
      summary: 'Prometheus metrics',
      handler: async (ctx) => {
        ctx.type = d.metrics.registry.contentType;
        ctx.body = await d.metricsText();
      },
    },
    {
      method: 'GET',
      path: '/.well-known/jwks.json',
      template: '/.well-known/jwks.json',
      ok: {
        status: 200,
        description:
          'JWK Set: the Ed25519 public keys that verify tokens (the active key and retired keys still verifying), newest first',
        schema: exact({
          keys: {
            type: 'array',
            items: exact({
              kty: { const: 'OKP' },
              crv: { const: 'Ed25519' },
              x: { type: 'string' },
              kid: { type: 'string' },
              alg: { const: 'EdDSA' },
              use: { const: 'sig' },
            }),
          },
        }),
      },
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
      path: '/v1/whoami',
      template: '/v1/whoami',
      ok: {
        status: 200,
        description: '{"name", "scopes": [scope], "tenant": string|null, "agent": string|null}',
        schema: exact({
          name: { type: 'string' },
          scopes: { type: 'array', items: { type: 'string' } },
          tenant: NULLABLE_STRING,
          agent: NULLABLE_STRING,
        }),
      },
      apis: ENGINE,
      scope: 'authenticated',
      body: 'none',
      summary: 'The calling API key: name, scopes and bindings (never the key)',
      handler: (ctx) => {
        const p = principalOf(ctx);
        ctx.body = { name: p.name, scopes: [...p.scopes].sort(), tenant: p.tenant, agent: p.agent };
      },
    },
    {
      method: 'GET',
      path: '/console/',
      template: '/console/',
      ok: { status: 200, description: 'The reviewer console page (public: it holds no data)' },
      also: [NOT_MODIFIED, { status: 404, description: 'the console is not built' }],
      produces: ['text/html'],
      apis: ENGINE,
      scope: null,
      body: 'none',
      ignoresQuery: true,
      summary: 'The reviewer console; every call it makes carries the reviewer’s key',
      handler: (ctx) => sendConsoleFile(ctx, () => d.console.index()),
    },
    {
      method: 'GET',
      path: '/console',
      template: '/console',
      // After /console/: the router lets /console match a trailing slash, not the other way.
      ok: { status: 308, description: 'Redirect to /console/' },
      apis: ENGINE,
      scope: null,
      body: 'none',
      ignoresQuery: true,
      summary: 'The reviewer console (redirect)',
      handler: (ctx) => {
        ctx.set(CONSOLE_HEADERS);
        ctx.status = 308;
        ctx.set('Location', '/console/');
        ctx.body = '';
        ctx.remove('Content-Type');
      },
    },
    {
      method: 'GET',
      path: '/console/*asset',
      template: '/console/{asset}',
      ok: { status: 200, description: 'A script, style sheet or image of the console' },
      also: [NOT_MODIFIED],
      produces: ['text/javascript', 'text/css', 'image/svg+xml'],
      apis: ENGINE,
      scope: null,
      body: 'none',
      ignoresQuery: true,
      summary: 'A file of the reviewer console (content-hashed names are immutable)',
      handler: (ctx) => sendConsoleFile(ctx, () => d.console.asset(param(ctx, 'asset'))),
    },
  ];
}
