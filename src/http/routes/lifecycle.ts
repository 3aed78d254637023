import { compileSchema, type JsonSchema } from '../../common/validation.js';
import { invalid } from '../../errors.js';
import { EXPLAIN_BOUNDS } from '../../policy/explain.js';
import { impactRequestSchema, type LifecycleService } from '../../policy/lifecycle.js';
import type { BundleRequest } from '../../policy/plans.js';
import type { PolicyService } from '../../policy/service.js';
import { principalOf, type Ctx, type HeaderParam, type RouteDef } from '../context.js';
import { boolParam, PAGE_QUERY, queryOf } from '../query.js';
import type { RouteDeps } from './index.js';
import { etagOf, IF_MATCH, ifMatch, PRECONDITION_FAILED } from './policies.js';
import { exact } from '../schemas.js';
import { change, param, PLATFORM } from './shared.js';

/** A revision's entity tag, as If-Match on POST /api/v1/bundle takes it. */
export const revisionTag = (revision: number) => `"rev-${revision}"`;

const IF_MATCH_REVISION: HeaderParam = {
  name: 'If-Match',
  description: '"rev-N": apply only if N is still the live revision; otherwise 412 and nothing changes',
  schema: { type: 'string', pattern: '^(W/)?"rev-[0-9]+"$' },
};

/** `If-Match: "rev-N"` → N; no header → undefined; anything else is a 400 naming the header. */
function ifMatchRevision(ctx: Ctx): number | undefined {
  const header = ctx.get('if-match').trim();
  if (header === '') return undefined;
  const m = /^(?:W\/)?"rev-(\d{1,15})"$/.exec(header);
  if (!m) throw invalid('If-Match must be "rev-N", the revision the bundle was planned against');
  return Number(m[1]);
}

/** A positive integer path parameter (a revision or version number), else a 400 naming it. */
function numberParam(ctx: Ctx, name: string): number {
  const raw = param(ctx, name);
  if (!/^[1-9]\d{0,14}$/.test(raw)) throw invalid(`path parameter ${name} must be a positive integer`);
  return Number(raw);
}

const DRY_RUN = [boolParam('dry_run', 'compile and report without storing (true or false)')] as const;

export const bundleRequestSchema = {
  type: 'object',
  required: ['policies'],
  additionalProperties: false,
  properties: {
    policies: {
      type: 'object',
      description: 'policy name → Rego module (OPA v1 syntax); created or updated',
      additionalProperties: { type: 'string' },
    },
    data: {
      type: 'object',
      description: 'data path → JSON value (created or replaced); null deletes the document',
    },
    delete: {
      type: 'array',
      description: 'policy names to delete (each must exist)',
      items: { type: 'string' },
      uniqueItems: true,
    },
    prune: { type: 'boolean', description: 'delete every live policy the bundle does not name' },
    message: { type: 'string', maxLength: 1024, description: 'kept with the revision in history' },
  },
};
const validateBundle = compileSchema<{
  policies: Record<string, string>;
  data?: Record<string, unknown>;
  delete?: string[];
  prune?: boolean;
  message?: string;
}>(bundleRequestSchema);

const names = { type: 'array', items: { type: 'string' } };
/** BundleChanges (policy/plans.ts): for the policies at the top, for the data documents in `data`. */
const bundleChanges = { created: names, updated: names, deleted: names, unchanged: names };
const bundleResultSchema: JsonSchema = exact({
  revision: { type: 'integer' },
  ...bundleChanges,
  data: exact(bundleChanges, 'the same for the data documents the bundle names, by path'),
  dry_run: { type: 'boolean' },
});

const changeSchema: JsonSchema = {
  type: 'object',
  properties: {
    kind: { type: 'string', enum: ['policy', 'data'] },
    name: { type: 'string' },
    op: { type: 'string', enum: ['put', 'delete'] },
  },
};
const revisionHead = {
  revision: { type: 'integer' },
  time: { type: 'string', format: 'date-time' },
  actor: { type: 'string' },
  message: { type: ['string', 'null'] },
};
const versionSchema: JsonSchema = {
  type: 'object',
  properties: {
    version: { type: 'integer' },
    revision: { type: 'integer' },
    sha256: { type: 'string' },
    time: { type: 'string', format: 'date-time' },
    actor: { type: 'string' },
    deleted: { type: 'boolean' },
  },
};
const cursor = { type: ['string', 'null'] };

/** The live policy a promotion made: its metadata and the revision. */
const promotedSchema = {
  type: 'object',
  required: ['name', 'description', 'sha256', 'version', 'updated_at', 'revision'],
  additionalProperties: false,
  properties: {
    name: { type: 'string' },
    description: { type: 'string' },
    sha256: { type: 'string' },
    version: { type: 'integer' },
    updated_at: { type: 'string', format: 'date-time' },
    revision: { type: 'integer' },
  },
};

/** SPEC §11: bundles, history and restore on the Platform API. */
export function lifecycleRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'POST',
      path: '/api/v1/bundle',
      template: '/api/v1/bundle',
      ok: {
        status: 200,
        description:
          '{"revision", "created", "updated", "deleted", "unchanged", "data": {"created", "updated", "deleted", "unchanged"}, "dry_run"}: policies at the top, data documents under data; one compile, one revision, all or nothing; 400 names policy, row and column',
        schema: bundleResultSchema,
      },
      requestSchema: bundleRequestSchema,
      query: DRY_RUN,
      headers: [IF_MATCH_REVISION],
      also: [
        { status: 404, description: 'a policy or data document the bundle deletes does not exist' },
        { status: 409, description: 'a data path overlaps another data document' },
        { status: 412, description: 'If-Match names another revision than the live one; nothing changed' },
      ],
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'object',
      summary: 'Apply policies, data and deletions as one revision',
      handler: async (ctx) => {
        const b = validateBundle(ctx.request.body);
        const bundle: BundleRequest = {
          policies: b.policies,
          data: b.data ?? {},
          delete: b.delete ?? [],
          prune: b.prune ?? false,
          message: b.message ?? null,
        };
        const r = await d.policies.bundle(
          bundle,
          { expectedRevision: ifMatchRevision(ctx), dryRun: queryOf(ctx, DRY_RUN).dry_run ?? false },
          change(ctx),
        );
        if (!r.dry_run) ctx.set('ETag', revisionTag(r.revision));
        ctx.body = r;
      },
    },
    {
      method: 'GET',
      path: '/api/v1/revisions',
      template: '/api/v1/revisions',
      ok: {
        status: 200,
        description:
          '{"revisions": [{revision, time, actor, message, changes: [{kind, name, op}]}], "next_cursor"}, newest first',
        schema: exact({
          revisions: {
            type: 'array',
            items: {
              type: 'object',
              properties: { ...revisionHead, changes: { type: 'array', items: changeSchema } },
            },
          },
          next_cursor: cursor,
        }),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'List revisions of the policy set, newest first',
      handler: async (ctx) => {
        const page = await d.history.revisions(queryOf(ctx, PAGE_QUERY));
        ctx.body = { revisions: page.items, next_cursor: page.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/revisions/:n',
      template: '/api/v1/revisions/{n}',
      ok: {
        status: 200,
        description: '{revision, time, actor, message, policies: [{name, sha256}], data: {path: value}}',
        schema: {
          type: 'object',
          properties: {
            ...revisionHead,
            policies: {
              type: 'array',
              items: { type: 'object', properties: { name: { type: 'string' }, sha256: { type: 'string' } } },
            },
            data: { type: 'object' },
          },
        },
      },
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: "One revision's whole policy set",
      handler: async (ctx) => {
        ctx.body = await d.history.revision(numberParam(ctx, 'n'));
      },
    },
    {
      method: 'POST',
      path: '/api/v1/revisions/:n/restore',
      template: '/api/v1/revisions/{n}/restore',
      ok: {
        status: 200,
        description:
          '{"revision"}: revision n\'s set is live again as this new revision; 409 when it already is',
        schema: exact({ revision: { type: 'integer' } }),
      },
      also: [{ status: 409, description: "the revision's policy set is already live" }],
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      summary: "Make an earlier revision's set live again (a new, audited revision)",
      handler: async (ctx) => {
        const r = await d.policies.restore(numberParam(ctx, 'n'), change(ctx));
        ctx.set('ETag', revisionTag(r.revision));
        ctx.body = { revision: r.revision };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies/:name/versions',
      template: '/api/v1/policies/{name}/versions',
      ok: {
        status: 200,
        description:
          '{"versions": [{version, revision, sha256, time, actor, deleted}], "next_cursor"}, newest first',
        schema: exact({ versions: { type: 'array', items: versionSchema }, next_cursor: cursor }),
      },
      query: PAGE_QUERY,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Versions of one policy, newest first',
      handler: async (ctx) => {
        const page = await d.history.versions(param(ctx, 'name'), queryOf(ctx, PAGE_QUERY));
        ctx.body = { versions: page.items, next_cursor: page.next_cursor };
      },
    },
    {
      method: 'GET',
      path: '/api/v1/policies/:name/versions/:version',
      template: '/api/v1/policies/{name}/versions/{version}',
      ok: {
        status: 200,
        description: '{version, revision, sha256, time, actor, deleted, rego}',
        schema: {
          ...versionSchema,
          properties: { ...(versionSchema.properties as object), rego: { type: 'string' } },
        },
      },
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'One version of one policy with its Rego source',
      handler: async (ctx) => {
        ctx.body = await d.history.version(param(ctx, 'name'), numberParam(ctx, 'version'));
      },
    },
  ];
}

const STATUS_TEXT = { type: 'string' };

const shadowReportSchema = {
  type: 'object',
  required: ['policies', 'since', 'decisions', 'agree', 'disagree', 'errors', 'changes', 'samples'],
  properties: {
    policies: {
      type: 'array',
      items: {
        type: 'object',
        required: ['name', 'sha256', 'since'],
        properties: {
          name: { type: 'string' },
          sha256: { type: 'string' },
          since: { type: 'string', format: 'date-time' },
        },
      },
    },
    since: { type: ['string', 'null'], description: 'when the shadow set last changed' },
    decisions: { type: 'integer' },
    agree: { type: 'integer' },
    disagree: { type: 'integer' },
    errors: { type: 'integer' },
    changes: {
      type: 'object',
      additionalProperties: { type: 'integer' },
      description:
        'disagreements per "live→shadow" pair of answers; live is the live policy set\'s answer, so a budget\'s deny counts as the allow it replaced',
    },
    samples: {
      type: 'array',
      maxItems: 20,
      items: {
        type: 'object',
        required: ['request_id', 'live', 'shadow'],
        properties: {
          request_id: { type: ['string', 'null'] },
          live: {
            ...STATUS_TEXT,
            description: "the live policy set's answer (a budget's deny counts as the allow it replaced)",
          },
          shadow: STATUS_TEXT,
        },
      },
    },
  },
};

const STATUS = { type: 'string', enum: ['allow', 'requires_approval', 'deny'] };

const impactSchema = {
  type: 'object',
  required: ['replayed', 'skipped', 'changed', 'changes', 'errors', 'samples'],
  properties: {
    replayed: { type: 'integer', description: 'recorded decisions replayed' },
    skipped: { type: 'integer', description: 'recorded decisions without a stored policy input' },
    changed: { type: 'integer', description: 'replayed decisions whose status the candidate changes' },
    changes: {
      type: 'object',
      description: '"before→after" → count, e.g. {"allow→deny": 3}',
      additionalProperties: { type: 'integer' },
    },
    errors: {
      type: 'integer',
      description:
        'replayed decisions the candidate answered with an evaluation error (a deny; also in changes when the live answer was not a deny)',
    },
    samples: {
      type: 'array',
      maxItems: 50,
      items: {
        type: 'object',
        required: ['request_id', 'time', 'before', 'after'],
        properties: {
          request_id: { type: ['string', 'null'] },
          time: { type: 'string', format: 'date-time' },
          before: STATUS,
          after: STATUS,
          error: { type: 'string', description: "the candidate's evaluation error, when it failed" },
        },
      },
    },
  },
};

const explainSchema = {
  type: 'object',
  required: ['request_id', 'revision', 'recorded', 'replayed', 'fired'],
  properties: {
    request_id: { type: 'string' },
    revision: { type: 'integer' },
    recorded: { type: 'object', required: ['status'], properties: { status: { type: 'string' } } },
    replayed: {
      type: 'object',
      required: ['status'],
      properties: { status: { type: 'string', enum: ['allow', 'requires_approval', 'deny', 'error'] } },
    },
    fired: {
      type: 'array',
      items: {
        type: 'object',
        required: ['policy', 'row', 'rule', 'text'],
        properties: {
          policy: { type: 'string' },
          row: { type: 'integer' },
          rule: { type: 'string' },
          text: { type: 'string' },
        },
      },
    },
  },
};

/**
 * SPEC §11, before and after a change: shadow mode, impact replay and explanation, on the
 * Platform API (the shadow mode of the policy PUT and DELETE routes is in shadow-mode.ts).
 */
export function replayRoutes(lifecycle: LifecycleService, policies: PolicyService): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/shadow',
      template: '/api/v1/shadow',
      ok: {
        status: 200,
        description:
          "The shadow set and how its answers compared with the live ones since it last changed (latest 20 disagreements; a tenant-bound key sees only its own tenant's among them)",
        schema: shadowReportSchema,
      },
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Shadow set and its agreement with the live set',
      handler: async (ctx) => {
        ctx.body = await lifecycle.shadowReport(principalOf(ctx));
      },
    },
    {
      method: 'POST',
      path: '/api/v1/policies/:name/promote',
      template: '/api/v1/policies/{name}/promote',
      ok: {
        status: 200,
        description: "200 updated or 201 created: the promoted policy's metadata and the new revision",
        schema: promotedSchema,
      },
      also: [
        { status: 201, description: 'promoted a policy the live set did not hold', schema: promotedSchema },
        PRECONDITION_FAILED,
      ],
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      headers: [IF_MATCH],
      summary: 'Make a shadow module live and drop it from the shadow set',
      handler: async (ctx) => {
        const r = await policies.promote(param(ctx, 'name'), ifMatch(ctx), change(ctx));
        ctx.status = r.created ? 201 : 200;
        ctx.set('ETag', etagOf(r.policy));
        ctx.body = { ...r.policy, revision: r.revision };
      },
    },
    {
      method: 'POST',
      path: '/api/v1/impact',
      template: '/api/v1/impact',
      ok: {
        status: 200,
        description:
          "The recorded decisions (for a tenant-bound key, its tenant's only) replayed against the live set and the candidate set, and what changes; nothing is stored",
        schema: impactSchema,
      },
      requestSchema: impactRequestSchema,
      also: [{ status: 429, description: 'an impact replay is already running (Retry-After: 1)' }],
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'object',
      summary: 'Replay recorded decisions against a candidate policy set',
      handler: async (ctx) => {
        ctx.body = await lifecycle.impact(principalOf(ctx), ctx.request.body);
      },
    },
    {
      method: 'GET',
      path: '/api/v1/decisions/:request_id/explain',
      template: '/api/v1/decisions/{request_id}/explain',
      ok: {
        status: 200,
        description:
          "The recorded decision re-evaluated against its revision's set with OPA's explanation: the rules that fired",
        schema: explainSchema,
      },
      also: [
        {
          status: 409,
          description:
            'the decision cannot be replayed (no policy set, no recorded input, or its revision is no longer held), ' +
            `or cannot be explained: OPA's explanation needs more than ${EXPLAIN_BOUNDS.memoryMib} MiB of memory, ` +
            `its trace is larger than ${EXPLAIN_BOUNDS.traceMib} MiB, or OPA reports an error in the policy set (named by policy and row)`,
        },
        { status: 429, description: 'too many explanations are running (Retry-After: 1)' },
        {
          status: 503,
          description:
            `the explanation did not finish within ${EXPLAIN_BOUNDS.seconds} s, or OPA could not run it; ` +
            'or storage is unavailable (Retry-After: 1)',
        },
      ],
      apis: PLATFORM,
      scope: 'audit:read',
      body: 'none',
      summary: 'Explain a recorded decision',
      handler: async (ctx) => {
        ctx.body = await lifecycle.explain(principalOf(ctx), param(ctx, 'request_id'));
      },
    },
  ];
}
