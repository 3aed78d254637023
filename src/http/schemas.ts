import { AUDIT_FIELDS } from '../audit/types.js';
import type { JsonSchema } from '../common/validation.js';

/**
 * JSON Schemas of the bodies the routes answer with, shared by more than one route. Each is the
 * exact shape the handler builds (additionalProperties: false), so the OpenAPI document and the
 * live-validation of the test harness hold the service to it.
 */

export const DATE_TIME: JsonSchema = { type: 'string', format: 'date-time' };
export const NULLABLE_STRING: JsonSchema = { type: ['string', 'null'] };
export const NULLABLE_DATE_TIME: JsonSchema = {
  oneOf: [{ type: 'string', format: 'date-time' }, { type: 'null' }],
};

/** `next_cursor` of every list (SPEC §3): null on the last page. */
export const NEXT_CURSOR: JsonSchema = {
  type: ['string', 'null'],
  description: 'pass as ?cursor= for the next page; null on the last page',
};

/** An object of exactly these properties, every one of them present. */
export function exact(properties: Record<string, JsonSchema>, description?: string): JsonSchema {
  return {
    type: 'object',
    ...(description === undefined ? {} : { description }),
    required: Object.keys(properties),
    additionalProperties: false,
    properties,
  };
}

/** One page of a list: `{<name>: [item], next_cursor}` plus any fields of the list itself. */
export function page(name: string, item: JsonSchema, extra: Record<string, JsonSchema> = {}): JsonSchema {
  return exact({ ...extra, [name]: { type: 'array', items: item }, next_cursor: NEXT_CURSOR });
}

const AUDIT_FIELD_SCHEMAS: Record<(typeof AUDIT_FIELDS)[number], JsonSchema> = {
  id: { type: 'string' },
  time: DATE_TIME,
  kind: { type: 'string' },
  trace_id: NULLABLE_STRING,
  request_id: NULLABLE_STRING,
  actor: NULLABLE_STRING,
  agent_id: NULLABLE_STRING,
  user_id: NULLABLE_STRING,
  tenant_id: NULLABLE_STRING,
  action: NULLABLE_STRING,
  resource: { description: 'a string, an object, or null, as the event was recorded' },
  outcome: NULLABLE_STRING,
  message: NULLABLE_STRING,
  confidence: { type: ['number', 'null'] },
  policy_revision: { type: ['integer', 'null'] },
  latency_us: { type: ['integer', 'null'] },
  details: { type: 'object' },
  hash: { type: 'string' },
  prev_hash: { type: 'string' },
};

/** One audit event as stored and served (SPEC §8): every field, in canonical order. */
export const auditEventSchema: JsonSchema = exact(
  Object.fromEntries(AUDIT_FIELDS.map((f) => [f, AUDIT_FIELD_SCHEMAS[f]])),
);

/** The `{"error"}` body of every error answer (components/schemas/Error of the document). */
export const ERROR_SCHEMA: JsonSchema = {
  type: 'object',
  required: ['error'],
  additionalProperties: false,
  properties: { error: { type: 'string', description: 'human-readable text' } },
};
export const ERROR_REF: JsonSchema = { $ref: '#/components/schemas/Error' };
