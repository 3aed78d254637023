import { createHash } from 'node:crypto';
import { AUDIT_FIELDS, type AuditEvent } from './types.js';

/** The hash that precedes the first event of the chain. */
export const GENESIS_HASH = '0'.repeat(64);

/** Fields covered by the hash: everything but the hash itself (prev_hash included). */
const HASHED_FIELDS = AUDIT_FIELDS.filter(
  (f): f is Exclude<(typeof AUDIT_FIELDS)[number], 'hash'> => f !== 'hash',
);

/** JSON with object keys sorted at every depth: the same content always gives the same bytes. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value ?? null);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(',')}}`;
}

/** sha256 over the canonical event content, which includes prev_hash. */
export function eventHash(e: Omit<AuditEvent, 'hash'>): string {
  const h = createHash('sha256');
  h.update(canonicalJson(Object.fromEntries(HASHED_FIELDS.map((f) => [f, e[f]]))));
  return h.digest('hex');
}
