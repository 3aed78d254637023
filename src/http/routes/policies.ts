import { pageOf } from '../../common/pagination.js';
import { compileSchema } from '../../common/validation.js';
import { metaOf, type PolicyMeta, type Precondition } from '../../policy/service.js';
import type { Ctx, HeaderParam, RouteDef } from '../context.js';
import { boolParam, PAGE_QUERY, queryOf } from '../query.js';
import type { RouteDeps } from './index.js';
import { DATE_TIME, exact, page } from '../schemas.js';
import { shadowDelete, shadowPut, SHADOW_MODE } from './shadow-mode.js';
import { change, param, PLATFORM } from './shared.js';

/** Optimistic concurrency on a policy: the write happens only if the policy is still as read. */
export const IF_MATCH: HeaderParam = {
  name: 'If-Match',
  description:
    'the ETag of GET /api/v1/policies/{name} (or a list of them, or *: the policy exists); otherwise 412 and nothing changes',
  schema: { type: 'string' },
};

export const IF_NONE_MATCH: HeaderParam = {
  name: 'If-None-Match',
  description:
    '*: create only, 412 if the policy exists; or a list of ETags: 412 if the current one is among them',
  schema: { type: 'string' },
};

/**
 * `If-None-Match` (RFC 9110 §13.1.2) on a PUT, beside `If-Match`: `*` holds when the policy does
 * not exist (create only: of concurrent creators one wins, the others get 412); a list of entity
 * tags when none of them is its ETag. Both headers: both must hold. An origin server must not
 * ignore it (RFC 9110 §13.2.1): ignored, a second "create only" overwrote the first.
 */
export function preconditionOf(ctx: Ctx): Precondition | undefined {
  const match = ifMatch(ctx);
  const header = ctx.get('if-none-match');
  if (header === '') return match;
  const none: Precondition =
    header.trim() === '*'
      ? { holds: (p) => p === undefined, failure: 'If-None-Match: * but the policy exists' }
      : (() => {
          const tags = header.split(',').map((t) => t.trim().replace(/^W\//, ''));
          return {
            holds: (p: PolicyMeta | undefined) => p === undefined || !tags.includes(etagOf(p)),
            failure: 'If-None-Match names the current ETag of this policy',
          };
        })();
  if (!match) return none;
  return {
    holds: (p) => match.holds(p) && none.holds(p),
    failure: `${match.failure}, or ${none.failure}`,
  };
}

/** A policy version's ETag: `"<version>-<sha256 prefix>"` (strong: it changes with every write). */
export const etagOf = (p: Pick<PolicyMeta, 'version' | 'sha256'>) =>
  `"${p.version}-${p.sha256.slice(0, 16)}"`;

/**
 * `If-Match` (RFC 9110 §13.1.1) as a precondition on the current policy: `*` holds when it
 * exists; a list of entity tags when one of them is its ETag (a weak `W/` tag compares by its
 * opaque part). No header: an unconditional write.
 */
export function ifMatch(ctx: Ctx): Precondition | undefined {
  const header = ctx.get('if-match');
  if (header === '') return undefined;
  if (header.trim() === '*') {
    return { holds: (p) => p !== undefined, failure: 'If-Match: * but the policy does not exist' };
  }
  const tags = header.split(',').map((t) => t.trim().replace(/^W\//, ''));
  return {
    holds: (p) => p !== undefined && tags.includes(etagOf(p)),
    failure: 'If-Match does not match the current ETag of this policy',
  };
}

const PUT_QUERY = [
  boolParam('dry_run', 'compile and report without storing (true or false)'),
  SHADOW_MODE,
] as const;
const DELETE_QUERY = [SHADOW_MODE] as const;

/** A policy's metadata, as every policy answer shows it. */
const POLICY_META = {
  name: { type: 'string' },
  description: { type: 'string' },
  sha256: { type: 'string', description: 'hex SHA-256 of the Rego source' },
  version: { type: 'integer', description: 'counts the writes of this policy' },
  updated_at: DATE_TIME,
};
const REVISION = { type: 'integer', description: 'the policy set revision' };
/** A policy write's answer: its metadata and the revision it made live. */
const policyWrittenSchema = exact({ ...POLICY_META, revision: REVISION });
export const PRECONDITION_FAILED = {
  status: 412,
  description: 'If-Match does not hold; nothing changed',
};

/** A shadow-mode write (`?mode=shadow`): the module in the shadow set, not the live one. */
const shadowWrittenSchema = {
  type: 'object',
  required: ['mode', 'name', 'sha256', 'since'],
  additionalProperties: false,
  properties: {
    dry_run: { const: true },
    compiled: { const: true },
    mode: { const: 'shadow' },
    name: { type: 'string' },
    sha256: { type: 'string' },
    since: DATE_TIME,
  },
};

const dataWrittenSchema = exact({ path: { type: 'string' }, revision: REVISION, updated_at: DATE_TIME });

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

/**
 * The data path exactly as sent (not percent-decoded): `a%2Fb` must not become the two segments
 * `a/b`, and any escape is refused by the path rule.
 */
function dataPath(ctx: Ctx): string {
  return ctx.path.slice('/api/v1/data/'.length);
}

/** SPEC §4: policies and data documents on the Platform API. */
export function policyRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/policies',
      template: '/api/v1/policies',
      ok: {
        status: 200,
        description:
          '{"policies": [{name, description, sha256, version, updated_at}], "revision", "next_cursor"}',
        schema: page('policies', exact(POLICY_META), { revision: REVISION }),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List policies',
      handler: async (ctx) => {
        const { policies, revision } = await d.policies.list();
        const page = pageOf(policies, (p) => p.name, 'policies', queryOf(ctx, PAGE_QUERY));
        ctx.body = { policies: page.items, revision, next_cursor: page.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies/:name',
      template: '/api/v1/policies/{name}',
      ok: {
        status: 200,
        description: 'Policy metadata plus rego, with ETag',
        schema: exact({ ...POLICY_META, rego: { type: 'string' } }),
      },
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
          '200 updated (or, with ?dry_run=true, compiled and not stored): policy metadata and revision; 400 names policy, row and column',
        schema: {
          oneOf: [
            policyWrittenSchema,
            exact({
              dry_run: { const: true },
              compiled: { const: true },
              ...POLICY_META,
              revision: { type: 'integer', description: 'the current revision (unchanged)' },
            }),
            shadowWrittenSchema,
          ],
        },
      },
      also: [
        {
          status: 201,
          description: 'created: policy metadata and revision (or the shadow module, with ?mode=shadow)',
          schema: { oneOf: [policyWrittenSchema, shadowWrittenSchema] },
        },
        PRECONDITION_FAILED,
      ],
      requestSchema: policyRequestSchema,
      query: PUT_QUERY,
      headers: [IF_MATCH, IF_NONE_MATCH],
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'policy',
      summary: 'Create or update a policy (compiled and live before the response)',
      handler: async (ctx) => {
        const { rego, description } = policyBody(ctx.request.body);
        if (queryOf(ctx, PUT_QUERY).mode === 'shadow')
          return shadowPut(d.policies, ctx, rego, queryOf(ctx, PUT_QUERY).dry_run ?? false);
        const r = await d.policies.put(
          param(ctx, 'name'),
          rego,
          description,
          { precondition: preconditionOf(ctx), dryRun: queryOf(ctx, PUT_QUERY).dry_run ?? false },
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
      also: [PRECONDITION_FAILED],
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      headers: [IF_MATCH],
      summary: 'Delete a policy',
      query: DELETE_QUERY,
      handler: async (ctx) => {
        if (queryOf(ctx, DELETE_QUERY).mode === 'shadow') return shadowDelete(d.policies, ctx);
        await d.policies.delete(param(ctx, 'name'), ifMatch(ctx), change(ctx));
        ctx.status = 204;
      },
    },
    {
      method: 'GET',
      path: '/api/v1/data',
      template: '/api/v1/data',
      ok: {
        status: 200,
        description: '{"documents": [{path, updated_at}], "revision", "next_cursor"}',
        schema: page('documents', exact({ path: { type: 'string' }, updated_at: DATE_TIME }), {
          revision: REVISION,
        }),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List data documents',
      handler: async (ctx) => {
        const { documents, revision } = await d.policies.listData();
        const page = pageOf(documents, (doc) => doc.path, 'data', queryOf(ctx, PAGE_QUERY));
        ctx.body = { documents: page.items, revision, next_cursor: page.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/data/*path',
      template: '/api/v1/data/{path}',
      ok: {
        status: 200,
        description: '{path, value, updated_at}',
        schema: exact({
          path: { type: 'string' },
          value: { description: 'any JSON value' },
          updated_at: DATE_TIME,
        }),
      },
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
      ok: { status: 200, description: 'replaced: {path, revision, updated_at}', schema: dataWrittenSchema },
      also: [
        { status: 201, description: 'created: {path, revision, updated_at}', schema: dataWrittenSchema },
        { status: 409, description: 'the path overlaps an existing document (a prefix of it, or under it)' },
      ],
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
}
