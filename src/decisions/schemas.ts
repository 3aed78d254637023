import { NO_DOT_SEGMENTS, TOKEN_SAFE, type JsonSchema } from '../common/validation.js';

const shortString = { type: 'string', minLength: 1, maxLength: 256, pattern: TOKEN_SAFE };

const resourceString = {
  type: 'string',
  minLength: 1,
  maxLength: 1024,
  pattern: TOKEN_SAFE,
  ...NO_DOT_SEGMENTS,
};

/**
 * A request's context: any object, read by policies as input.context. The seed names two known
 * members, both strings: `reason` and `user_id`; a request that sends either as anything else is
 * refused (400 naming it), so a policy that reads them reads strings.
 */
const contextSchema = {
  type: 'object',
  properties: {
    reason: { type: 'string', description: 'why the caller asks (a known member of the seed)' },
    user_id: { type: 'string', description: 'the user the caller acts for (a known member of the seed)' },
  },
};

/** Body of POST /v1/agent/authorize and POST /api/v1/authorize. */
export const agentRequestSchema: JsonSchema = {
  type: 'object',
  required: ['agent_id', 'action', 'resource', 'confidence'],
  additionalProperties: false,
  properties: {
    agent_id: shortString,
    action: shortString,
    resource: resourceString,
    confidence: { type: 'number', minimum: 0, maximum: 1 },
    context: contextSchema,
    on_behalf_of: {
      type: 'object',
      description: 'the user the agent acts for: the stricter of both decisions applies (SPEC §13)',
      required: ['tenant_id', 'user_id'],
      additionalProperties: false,
      properties: { tenant_id: shortString, user_id: shortString },
    },
  },
};

/** Body of POST /v1/authorize (humans). */
export const humanRequestSchema: JsonSchema = {
  type: 'object',
  required: ['tenant_id', 'user_id', 'action', 'resource'],
  additionalProperties: false,
  properties: {
    tenant_id: shortString,
    user_id: shortString,
    action: shortString,
    resource: {
      type: 'object',
      required: ['type', 'id'],
      additionalProperties: false,
      properties: {
        type: { ...shortString, ...NO_DOT_SEGMENTS },
        id: resourceString,
      },
    },
    context: contextSchema,
  },
};

export interface AgentRequest {
  agent_id: string;
  action: string;
  resource: string;
  confidence: number;
  context?: Record<string, unknown>;
  on_behalf_of?: { tenant_id: string; user_id: string };
}

export interface HumanRequest {
  tenant_id: string;
  user_id: string;
  action: string;
  resource: { type: string; id: string };
  context?: Record<string, unknown>;
}

/** 200 allow / 202 requires_approval / 403 deny body. */
export const decisionResponseSchema: JsonSchema = {
  type: 'object',
  required: ['status', 'request_id', 'trace_id'],
  additionalProperties: false,
  properties: {
    status: { type: 'string', enum: ['allow', 'requires_approval', 'deny'] },
    request_id: { type: 'string', description: 'UUIDv7; also the queue item id for requires_approval' },
    trace_id: { type: 'string', description: 'W3C trace id (from traceparent when given)' },
    message: { type: 'string', description: 'present with requires_approval and deny' },
    expires_at: { type: 'string', format: 'date-time', description: 'present with requires_approval' },
    request_digest: {
      type: 'string',
      description:
        'base64url SHA-256 of the call as received (SPEC §13; see README, "Approvals bound to the call")',
    },
  },
};
