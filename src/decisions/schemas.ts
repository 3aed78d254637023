import type { JsonSchema } from '../http/validation.js';

const shortString = { type: 'string', minLength: 1, maxLength: 256 };

/** Body of POST /v1/agent/authorize and POST /api/v1/authorize. */
export const agentRequestSchema: JsonSchema = {
  type: 'object',
  required: ['agent_id', 'action', 'resource', 'confidence'],
  additionalProperties: false,
  properties: {
    agent_id: shortString,
    action: shortString,
    resource: { type: 'string', minLength: 1, maxLength: 1024 },
    confidence: { type: 'number', minimum: 0, maximum: 1 },
    context: { type: 'object' },
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
      properties: { type: shortString, id: { type: 'string', minLength: 1, maxLength: 1024 } },
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
}

export interface HumanRequest {
  tenant_id: string;
  user_id: string;
  action: string;
  resource: { type: string; id: string };
  context?: Record<string, unknown>;
}
