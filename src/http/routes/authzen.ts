import { evaluationRequestSchema, evaluationsRequestSchema, type Outcome } from '../../authzen/service.js';
import type { DecisionBody } from '../../decisions/service.js';
import type { JsonSchema } from '../../common/validation.js';
import { statusOfKind } from '../errors.js';
import { principalOf, type Ctx, type HeaderParam, type RouteDef } from '../context.js';
import { IDEMPOTENCY_KEY, idempotencyKey } from './decisions.js';
import type { RouteDeps } from './index.js';
import { ENGINE } from './shared.js';
import { CALLER_REQUEST_ID } from '../middleware.js';
import { exact } from '../schemas.js';

/** The PEP's own request id, echoed as the AuthZEN HTTPS binding asks; bounded like ours. */
const X_REQUEST_ID: HeaderParam = {
  name: 'X-Request-ID',
  description: 'Echoed in the answer when it is 1 to 255 printable ASCII characters (spaces allowed inside)',
  schema: { type: 'string', pattern: CALLER_REQUEST_ID.source },
};

const decisionContextSchema: JsonSchema = {
  type: 'object',
  properties: {
    status: { type: 'string', enum: ['allow', 'requires_approval', 'deny'] },
    request_id: { type: 'string', description: 'the decision id (audit request_id; queue id if queued)' },
    reason: { type: 'string', description: 'why it was not allowed' },
    access_request: {
      type: 'object',
      description: 'requires_approval: the queue item a reviewer decides',
      required: ['id', 'status_endpoint', 'expires_at'],
      properties: {
        id: { type: 'string' },
        status_endpoint: { type: 'string', description: 'GET it (queue:read) to follow the review' },
        expires_at: { type: 'string', format: 'date-time' },
      },
    },
    error: {
      type: 'object',
      description: 'a batch item that could not be decided (its decision is false)',
      required: ['status', 'message'],
      properties: { status: { type: 'integer' }, message: { type: 'string' } },
    },
  },
};
const evaluationResponseSchema: JsonSchema = {
  type: 'object',
  required: ['decision', 'context'],
  properties: { decision: { type: 'boolean' }, context: decisionContextSchema },
};

/**
 * The base of absolute URLs: ARBITER_PUBLIC_URL, else the scheme and Host the caller used (the
 * Host header is the caller's word, so a deployment behind a proxy should set the variable).
 */
function baseUrl(d: RouteDeps, ctx: Ctx): string {
  return d.config.publicUrl ?? `${ctx.protocol}://${ctx.host}`;
}

/** A recorded decision as an AuthZEN response: only allow is `decision: true`. */
function present(base: string, d: DecisionBody) {
  return {
    decision: d.status === 'allow',
    context: {
      status: d.status,
      request_id: d.request_id,
      ...(d.message !== undefined ? { reason: d.message } : {}),
      ...(d.status === 'requires_approval' && d.expires_at !== undefined
        ? {
            access_request: {
              id: d.request_id,
              status_endpoint: `${base}/v1/queue/${encodeURIComponent(d.request_id)}`,
              expires_at: d.expires_at,
            },
          }
        : {}),
    },
  };
}

function presentOutcome(base: string, o: Outcome) {
  if ('decision' in o) return present(base, o.decision);
  return {
    decision: false,
    context: { error: { status: statusOfKind(o.error.kind), message: o.error.message } },
  };
}

/** What both evaluation routes share: an authorize call on the Engine API that echoes the PEP's id. */
const EVALUATION_ROUTE = {
  headers: [IDEMPOTENCY_KEY, X_REQUEST_ID],
  echoRequestId: true,
  also: [{ status: 422, description: 'Idempotency-Key reused with another body' }],
  apis: ENGINE,
  scope: 'authorize',
  body: 'object',
} as const satisfies Partial<RouteDef>;

/** SPEC §14: the OpenID AuthZEN Authorization API 1.0 on the Engine API. */
export function authzenRoutes(d: RouteDeps): RouteDef[] {
  const authzen = d.authzen;
  return [
    {
      method: 'POST',
      path: '/access/v1/evaluation',
      template: '/access/v1/evaluation',
      ok: {
        status: 200,
        description: 'The decision (an audited decision like any other); deny is decision false, also 200',
        schema: evaluationResponseSchema,
      },
      requestSchema: evaluationRequestSchema,
      ...EVALUATION_ROUTE,
      also: [
        ...EVALUATION_ROUTE.also,
        {
          status: 413,
          description:
            `body larger than ${d.config.maxBodyBytes} bytes, or an evaluation (subject, action, resource ` +
            `and context together) more than ${d.config.maxContextBytes} bytes as JSON; nothing is ` +
            'decided (a retry whose Idempotency-Key has a recorded answer gets that answer)',
        },
      ],
      summary: 'AuthZEN access evaluation',
      handler: async (ctx) => {
        const r = await authzen.evaluate(ctx.request.body, principalOf(ctx), ctx.state, idempotencyKey(ctx));
        if (r.replayed) ctx.set('Idempotent-Replayed', 'true');
        ctx.body = present(baseUrl(d, ctx), r.decision);
      },
    },
    {
      method: 'POST',
      path: '/access/v1/evaluations',
      template: '/access/v1/evaluations',
      ok: {
        status: 200,
        description:
          'One result per evaluation, in order (fewer when a semantic stops early); without evaluations ' +
          '(absent or empty) the request is a single evaluation and is answered as one (AuthZEN 1.0 §7.1)',
        schema: {
          oneOf: [
            exact({ evaluations: { type: 'array', items: evaluationResponseSchema } }),
            evaluationResponseSchema,
          ],
        },
      },
      requestSchema: evaluationsRequestSchema,
      ...EVALUATION_ROUTE,
      also: [
        ...EVALUATION_ROUTE.also,
        {
          status: 413,
          description:
            `body larger than ${d.config.maxBodyBytes} bytes, a batch larger than that with its ` +
            'defaults applied to every evaluation (each is recorded whole), or an evaluation (subject, ' +
            `action, resource and context together, defaults applied) more than ${d.config.maxContextBytes} ` +
            'bytes as JSON; nothing is decided (an evaluation whose Idempotency-Key has a recorded ' +
            'answer gets that answer)',
        },
      ],
      summary: 'AuthZEN access evaluations (batch, at most 100)',
      handler: async (ctx) => {
        const out = await authzen.evaluateAll(
          ctx.request.body,
          principalOf(ctx),
          ctx.state,
          idempotencyKey(ctx),
        );
        const base = baseUrl(d, ctx);
        if ('single' in out) {
          if (out.single.replayed) ctx.set('Idempotent-Replayed', 'true');
          ctx.body = present(base, out.single.decision);
        } else {
          // A retried batch is replayed item by item; the header says so only if every item was.
          if (out.batch.length > 0 && out.batch.every((o) => 'decision' in o && o.replayed)) {
            ctx.set('Idempotent-Replayed', 'true');
          }
          ctx.body = { evaluations: out.batch.map((o) => presentOutcome(base, o)) };
        }
      },
    },
    {
      method: 'GET',
      path: '/.well-known/authzen-configuration',
      template: '/.well-known/authzen-configuration',
      ok: {
        status: 200,
        description: 'AuthZEN PDP metadata (absolute URLs from ARBITER_PUBLIC_URL, else the request host)',
        schema: {
          type: 'object',
          required: ['policy_decision_point', 'access_evaluation_endpoint', 'access_evaluations_endpoint'],
          properties: {
            policy_decision_point: { type: 'string' },
            access_evaluation_endpoint: { type: 'string' },
            access_evaluations_endpoint: { type: 'string' },
          },
        },
      },
      apis: ENGINE,
      scope: null,
      body: 'none',
      summary: 'AuthZEN PDP metadata',
      handler: (ctx) => {
        const base = baseUrl(d, ctx);
        ctx.body = {
          policy_decision_point: base,
          access_evaluation_endpoint: `${base}/access/v1/evaluation`,
          access_evaluations_endpoint: `${base}/access/v1/evaluations`,
        };
      },
    },
  ];
}
