import { agentRequestSchema, decisionResponseSchema, humanRequestSchema } from '../../decisions/schemas.js';
import type { DecisionResult } from '../../decisions/service.js';
import { invalid } from '../../errors.js';
import { principalOf, type Answer, type Ctx, type HeaderParam, type RouteDef } from '../context.js';
import { ERROR_REF } from '../schemas.js';
import type { RouteDeps } from './index.js';
import { BOTH, ENGINE } from './shared.js';

/** SPEC §5: the status of each answer. */
const STATUS = { allow: 200, requires_approval: 202, deny: 403 } as const;

/** Every answer of an authorize route besides 200 allow and the derived errors (SPEC §5). */
const decisionAnswers = (config: RouteDeps['config']): readonly Answer[] => [
  {
    status: 413,
    description:
      `body larger than ${config.maxBodyBytes} bytes, or a context more than ${config.maxContextBytes} ` +
      'bytes as JSON; nothing is decided or recorded (a retry whose Idempotency-Key has a recorded ' +
      'answer gets that answer)',
  },
  { status: 202, description: 'requires_approval: queued for human review', schema: decisionResponseSchema },
  {
    status: 403,
    description:
      "deny (a decision body: the policy's, an exhausted budget's" +
      (config.queueMaxPendingPerKey > 0
        ? `, or a requires_approval past the key's cap of ${config.queueMaxPendingPerKey} pending approvals`
        : '') +
      '), or an error body when the key lacks the scope or binding',
    schema: { oneOf: [decisionResponseSchema, ERROR_REF] },
  },
  { status: 422, description: 'Idempotency-Key reused with another body' },
  { status: 503, description: 'the decision could not be recorded, or storage is unavailable; never allow' },
];

/** Keys are opaque to us; bounded so they cannot be used to bloat the store. */
const IDEMPOTENCY_KEY_PATTERN = '^[\\x21-\\x7e]{1,255}$';
export const IDEMPOTENCY_KEY: HeaderParam = {
  name: 'Idempotency-Key',
  description:
    'Retrying with the same key (from the same API key, within 24 h) and the same body replays the first answer, with Idempotent-Replayed: true; another body is 422',
  schema: { type: 'string', pattern: IDEMPOTENCY_KEY_PATTERN },
};
const idempotencyKeyFormat = new RegExp(IDEMPOTENCY_KEY_PATTERN);

/** The request's Idempotency-Key, if it sent one; a malformed one is a 400. */
export function idempotencyKey(ctx: Ctx): string | undefined {
  // An empty header is a key the client meant to send, not its absence: refused, not ignored.
  if (ctx.request.headers['idempotency-key'] === undefined) return undefined;
  const k = ctx.get('idempotency-key');
  if (!idempotencyKeyFormat.test(k)) {
    throw invalid('Idempotency-Key must be 1 to 255 visible ASCII characters');
  }
  return k;
}

function respond(ctx: Ctx, r: DecisionResult): void {
  ctx.status = STATUS[r.decision.status];
  if (r.replayed) ctx.set('Idempotent-Replayed', 'true');
  ctx.body = r.decision;
}

/** SPEC §5: agent and human decisions. */
export function decisionRoutes(d: RouteDeps): RouteDef[] {
  const authorizeAgent = async (ctx: Ctx) =>
    respond(
      ctx,
      await d.decisions.authorizeAgent(ctx.request.body, principalOf(ctx), ctx.state, idempotencyKey(ctx)),
    );
  return [
    // Both agent authorize paths, one contract, served by both APIs.
    ...['/v1/agent/authorize', '/api/v1/authorize'].map((path): RouteDef => ({
      method: 'POST',
      path,
      template: path,
      ok: {
        status: 200,
        description: 'allow (200), requires_approval (202) or deny (403)',
        schema: decisionResponseSchema,
      },
      also: decisionAnswers(d.config),
      requestSchema: agentRequestSchema,
      headers: [IDEMPOTENCY_KEY],
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
      also: decisionAnswers(d.config),
      requestSchema: humanRequestSchema,
      headers: [IDEMPOTENCY_KEY],
      apis: ENGINE,
      scope: 'authorize',
      body: 'object',
      summary: 'Authorize a human user action',
      handler: async (ctx) => {
        respond(
          ctx,
          await d.decisions.authorizeHuman(
            ctx.request.body,
            principalOf(ctx),
            ctx.state,
            idempotencyKey(ctx),
          ),
        );
      },
    },
  ];
}
