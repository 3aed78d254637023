import { impactRequestSchema, type LifecycleService } from '../../policy/lifecycle.js';
import type { PolicyService } from '../../policy/service.js';
import { principalOf, type RouteDef } from '../context.js';
import { etagOf } from './policies.js';
import { change, param, PLATFORM } from './shared.js';

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
    changes: { type: 'object', additionalProperties: { type: 'integer' } },
    samples: {
      type: 'array',
      maxItems: 20,
      items: {
        type: 'object',
        required: ['request_id', 'live', 'shadow'],
        properties: { request_id: { type: ['string', 'null'] }, live: STATUS_TEXT, shadow: STATUS_TEXT },
      },
    },
  },
};

const STATUS = { type: 'string', enum: ['allow', 'requires_approval', 'deny'] };

const impactSchema = {
  type: 'object',
  required: ['replayed', 'skipped', 'changed', 'changes', 'samples'],
  properties: {
    replayed: { type: 'integer', description: 'recorded decisions replayed' },
    skipped: { type: 'integer', description: 'recorded decisions without a stored policy input' },
    changed: { type: 'integer', description: 'replayed decisions whose status the candidate changes' },
    changes: {
      type: 'object',
      description: '"before→after" → count, e.g. {"allow→deny": 3}',
      additionalProperties: { type: 'integer' },
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

/** SPEC §11: before and after a change — impact replay and explanation, on the Platform API. */
export function lifecycleRoutes(lifecycle: LifecycleService, policies: PolicyService): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/shadow',
      template: '/api/v1/shadow',
      ok: {
        status: 200,
        description:
          'The shadow set and how its answers compared with the live ones since it last changed (latest 20 disagreements)',
        schema: shadowReportSchema,
      },
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'none',
      summary: 'Shadow set and its agreement with the live set',
      handler: async (ctx) => {
        ctx.body = await lifecycle.shadowReport();
      },
    },
    {
      method: 'POST',
      path: '/api/v1/policies/:name/promote',
      template: '/api/v1/policies/{name}/promote',
      ok: {
        status: 200,
        description: "200 updated or 201 created: the promoted policy's metadata and the new revision",
        schema: {
          type: 'object',
          required: ['name', 'description', 'sha256', 'version', 'updated_at', 'revision'],
          properties: {
            name: { type: 'string' },
            description: { type: 'string' },
            sha256: { type: 'string' },
            version: { type: 'integer' },
            updated_at: { type: 'string', format: 'date-time' },
            revision: { type: 'integer' },
          },
        },
      },
      apis: PLATFORM,
      scope: 'policies:write',
      body: 'none',
      summary: 'Make a shadow module live and drop it from the shadow set',
      handler: async (ctx) => {
        const r = await policies.promote(param(ctx, 'name'), change(ctx));
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
          'The recorded decisions replayed against the live set and the candidate set, and what changes; nothing is stored',
        schema: impactSchema,
      },
      requestSchema: impactRequestSchema,
      apis: PLATFORM,
      scope: 'policies:read',
      body: 'object',
      summary: 'Replay recorded decisions against a candidate policy set',
      handler: async (ctx) => {
        ctx.body = await lifecycle.impact(ctx.request.body);
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
