import type { Config } from '../config.js';
import type { RouteDef } from './context.js';
import { ERROR_REF, ERROR_SCHEMA } from './schemas.js';
import type { JsonSchema } from '../common/validation.js';

const err = (description: string) => ({
  description,
  content: { 'application/json': { schema: ERROR_REF } },
});

/** Our JSON Schemas use `format: date-time` only; they are valid OpenAPI 3.1 schemas as they are. */
const asSchema = (s: JsonSchema): JsonSchema => s;

/**
 * The OpenAPI 3.1 description of both APIs, generated from the route table: the same paths,
 * scopes and request schemas that route and validate requests, so the document cannot drift.
 * Error responses are derived from what each route can refuse.
 */
export function openApiDocument(
  routes: RouteDef[],
  config: Config,
  version: string,
): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  const host = config.host.includes(':') ? `[${config.host}]` : config.host;
  for (const r of routes) {
    const params = [...r.template.matchAll(/\{(\w+)\}/g)].map((m) => ({
      name: m[1],
      in: 'path',
      required: true,
      schema: { type: 'string' },
    }));
    const responses: Record<string, unknown> = {
      [String(r.ok.status)]: {
        description: r.ok.description,
        ...(r.ok.status === 204 || (r.ok.status >= 300 && r.ok.status < 400)
          ? {}
          : {
              content: r.produces
                ? Object.fromEntries(r.produces.map((t) => [t, { schema: { type: 'string' } }]))
                : // A JSON route without ok.schema documents no schema: live validation refuses it.
                  { 'application/json': r.ok.schema ? { schema: asSchema(r.ok.schema) } : {} },
            }),
      },
    };
    // Every route refuses a malformed request (an unknown query parameter, say) and can fail.
    const invalidRequest = 'invalid request; the message names the field, parameter or header';
    responses['400'] = err(
      r.body === 'none'
        ? `${invalidRequest}. The operation takes no body: one other than \`{}\` is refused (malformed ` +
            'JSON included), before anything is done'
        : invalidRequest,
    );
    if (r.scope !== null) {
      responses['401'] = err(
        'missing, malformed, unknown or revoked API key (with WWW-Authenticate: Bearer)',
      );
      responses['403'] = err(
        r.global !== undefined
          ? `API key lacks scope ${r.scope}, or is bound to a tenant or an agent: this route spans every tenant`
          : `API key lacks scope ${r.scope}, or the key's tenant/agent binding forbids it`,
      );
    }
    if (params.length > 0) responses['404'] = err('no such resource');
    responses['405'] = err('known path, other method (Allow lists the methods)');
    // A body is checked wherever one is sent, to a route that takes none too (and then refused).
    responses['413'] = err(`body larger than ${config.maxBodyBytes} bytes`);
    responses['415'] = err('unsupported Content-Type or Content-Encoding');
    // Answers of the HTTP layer itself, before any route: to any request.
    responses['408'] = err('the request was not received in time');
    responses['417'] = err('an Expect header other than 100-continue');
    responses['431'] = err('request headers too large');
    responses['500'] = err('internal failure');
    if (r.scope !== null) responses['503'] = err('storage is unavailable; retry (never an allow)');
    for (const a of r.also ?? []) {
      responses[String(a.status)] =
        a.schema === null
          ? { description: a.description }
          : a.schema === undefined
            ? err(a.description)
            : { description: a.description, content: { 'application/json': { schema: asSchema(a.schema) } } };
    }
    const op: Record<string, unknown> = {
      operationId: `${r.method.toLowerCase()}${r.template.replace(/[^A-Za-z0-9]+(\w)?/g, (_m, c: string = '') => c.toUpperCase())}`,
      summary: r.summary,
      tags: [...r.apis],
      'x-arbiter-apis': [...r.apis],
      'x-arbiter-scope': r.scope,
      ...(r.global !== undefined ? { 'x-arbiter-unbound-keys-only': true } : {}),
      security: r.scope === null ? [] : [{ apiKey: [] }],
      parameters: [
        ...params,
        ...(r.query ?? []).map((q) => ({
          name: q.name,
          in: 'query',
          description: q.description,
          schema: q.schema,
        })),
        ...(r.headers ?? []).map((h) => ({
          name: h.name,
          in: 'header',
          required: false,
          description: h.description,
          schema: h.schema,
        })),
      ],
      responses: Object.fromEntries(Object.entries(responses).sort(([a], [b]) => a.localeCompare(b))),
    };
    if (r.requestSchema) {
      const content: Record<string, unknown> = { 'application/json': { schema: asSchema(r.requestSchema) } };
      if (r.body === 'policy')
        content['text/plain'] = { schema: { type: 'string', description: 'Rego source' } };
      op.requestBody = {
        description:
          'UTF-8 (other bytes are 400). An empty body is no body, whether sent with Content-Length: 0 or chunked.',
        required: r.body !== 'optional-object',
        content,
      };
    }
    (paths[r.template] ??= {})[r.method.toLowerCase()] = op;
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'Arbiter',
      version,
      description:
        'Policy-as-code authorization for AI agents and humans. The Engine API answers decisions, ' +
        'runs the review queue and mints tokens; the Platform API manages policies, data and the audit trail. ' +
        'x-arbiter-apis says which listener serves each operation; x-arbiter-scope the API key scope it needs; ' +
        'x-arbiter-unbound-keys-only that a key bound to a tenant or an agent is refused (403).',
    },
    servers: [
      { url: `http://${host}:${config.enginePort}`, description: 'Engine API' },
      { url: `http://${host}:${config.platformPort}`, description: 'Platform API' },
    ],
    tags: [
      { name: 'engine', description: 'served by the Engine API' },
      { name: 'platform', description: 'served by the Platform API' },
    ],
    paths,
    components: {
      schemas: { Error: ERROR_SCHEMA },
      securitySchemes: { apiKey: { type: 'http', scheme: 'bearer', description: 'Arbiter API key (arb_…)' } },
    },
  };
}
