import { TOKEN_SAFE, type JsonSchema } from '../common/validation.js';
import { invalid } from '../errors.js';

const shortString = { type: 'string', minLength: 1, maxLength: 256, pattern: TOKEN_SAFE };

/**
 * A `.` or `..` segment: the whole value, or a run between `/` separators or at either end
 * (`..`, `./x`, `a/../b`, `a/.`), also with its dots percent-encoded (`%2e%2e`, `.%2E`), which
 * RFC 3986 decodes before it removes dot-segments. Other dots (`logs.read`, `.hidden`, `...`)
 * are not segments.
 */
const DOT_SEGMENT = /(?:^|\/)(?:\.|%2e){1,2}(?:\/|$)/i;

/** What the resource fields promise beyond their schema (the OpenAPI document shows this). */
export const NO_DOT_SEGMENTS =
  'no "." or ".." path segment (between "/" separators or at either end; its dots may be written %2e)';

/**
 * Refuses a resource (or resource type or id) with a dot-segment. Policies match resources as
 * written, by prefix or glob, while a resource server that normalises the path acts on another
 * one: `repo/../prod/db` passes a `repo/**` rule and names `prod/db`. Refusing the form is the
 * only answer that is right for every policy. Checked after the schema (which cannot say this
 * in a message that names the rule), before anything is evaluated or recorded.
 */
export function refuseDotSegments(field: string, value: string): void {
  if (DOT_SEGMENT.test(value)) throw invalid(`${field} must not contain a "." or ".." path segment`);
}

const resourceString = {
  type: 'string',
  minLength: 1,
  maxLength: 1024,
  pattern: TOKEN_SAFE,
  description: NO_DOT_SEGMENTS,
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
    context: { type: 'object' },
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
        type: { ...shortString, description: NO_DOT_SEGMENTS },
        id: resourceString,
      },
    },
    context: { type: 'object' },
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
