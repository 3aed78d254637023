import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { badRequest } from '../errors.js';

/**
 * JSON Schemas are the single source for request validation (and for the OpenAPI document).
 * Failures become one 400 message that names the field.
 */
const ajv = new Ajv({ allErrors: false, strict: true, allowUnionTypes: true, verbose: true });
ajv.addFormat('date-time', { type: 'string', validate: isRfc3339 });

const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$/;

/** An RFC 3339 date-time with a time zone, that is also a real instant (no Feb 30). */
export function isRfc3339(s: string): boolean {
  if (!RFC3339.test(s)) return false;
  const t = Date.parse(s);
  if (Number.isNaN(t)) return false;
  const [y, m, d] = s.slice(0, 10).split('-').map(Number) as [number, number, number];
  return d <= new Date(Date.UTC(y, m, 0)).getUTCDate();
}

/**
 * Identifiers, actions and resources carry no whitespace or control characters: they end up in
 * token scopes (space-delimited, RFC 6749 §3.3) and in logs, where either would let one value
 * pass for several.
 */
export const TOKEN_SAFE = '^[^\\s\\u0000-\\u001f\\u007f]+$';

export type JsonSchema = Record<string, unknown>;

export function compileSchema<T>(schema: JsonSchema): (body: unknown) => T {
  const validate: ValidateFunction = ajv.compile(schema);
  return (body: unknown): T => {
    if (!validate(body)) throw badRequest(describe(validate.errors?.[0], body));
    return body as T;
  };
}

function fieldOf(e: ErrorObject): string {
  const p = e.instancePath
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  return p.join('.');
}

function valueAt(body: unknown, e: ErrorObject): unknown {
  let v: unknown = body;
  for (const seg of e.instancePath.split('/').slice(1)) v = (v as Record<string, unknown>)?.[seg];
  return v;
}

function describe(e: ErrorObject | undefined, body: unknown): string {
  if (!e) return 'invalid request body';
  const field = fieldOf(e);
  const where = field === '' ? 'request body' : field;
  switch (e.keyword) {
    case 'required':
      return `missing required field: ${field ? field + '.' : ''}${(e.params as { missingProperty: string }).missingProperty}`;
    case 'additionalProperties':
      return `unknown field: ${field ? field + '.' : ''}${(e.params as { additionalProperty: string }).additionalProperty}`;
    case 'type': {
      const v = valueAt(body, e);
      const s = e.parentSchema as { minimum?: number; maximum?: number };
      if (typeof v === 'number' && !Number.isFinite(v) && s.minimum !== undefined) {
        return `${where} out of range: must be between ${fmt(s.minimum)} and ${fmt(s.maximum)}, got ${String(v)}`;
      }
      return `${where} must be ${article((e.params as { type: string }).type)}`;
    }
    case 'minLength':
      return (e.params as { limit: number }).limit === 1
        ? `${where} must not be empty`
        : `${where} must be at least ${(e.params as { limit: number }).limit} characters`;
    case 'maxLength':
      return `${where} must be at most ${(e.params as { limit: number }).limit} characters`;
    case 'minimum':
    case 'maximum': {
      const s = e.parentSchema as { minimum?: number; maximum?: number; type?: string };
      const f = s.type === 'integer' ? String : fmt;
      return `${where} out of range: must be between ${f(s.minimum)} and ${f(s.maximum)}, got ${String(valueAt(body, e))}`;
    }
    case 'minItems':
      return `${where} must have at least ${(e.params as { limit: number }).limit} item(s)`;
    case 'maxItems':
      return `${where} must have at most ${(e.params as { limit: number }).limit} items`;
    case 'format':
      return `${where} must be an RFC 3339 date-time`;
    case 'pattern':
      return (e.params as { pattern: string }).pattern === TOKEN_SAFE
        ? `${where} must not contain whitespace or control characters`
        : `${where} must match ${(e.params as { pattern: string }).pattern}`;
    case 'enum':
      return `${where} must be one of ${((e.params as { allowedValues: unknown[] }).allowedValues ?? []).join(', ')}`;
    default:
      return `${where} ${e.message ?? 'is invalid'}`;
  }
}

function fmt(n: number | undefined): string {
  if (n === undefined) return '?';
  return Number.isInteger(n) ? n.toFixed(1) : String(n);
}

function article(type: string): string {
  const t = type.replace(/,/g, ' or ');
  return /^[aeiou]/.test(t) ? `an ${t}` : `a ${t}`;
}
