import { badRequest } from '../errors.js';

export const DEFAULT_LIMIT = 100;
export const MAX_LIMIT = 1000;

/** `?limit=`: an integer in 1…1000, default 100; anything else is a 400 naming it. */
export function parseLimit(raw: string | string[] | undefined): number {
  if (raw === undefined) return DEFAULT_LIMIT;
  if (Array.isArray(raw) || !/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_LIMIT) {
    throw badRequest(`query parameter limit must be an integer between 1 and ${MAX_LIMIT}`);
  }
  return Number(raw);
}

/**
 * Cursors are opaque: base64url of `<kind>:<position>`. The kind stops a cursor of one list being
 * replayed against another; a cursor that does not decode is a 400 naming it.
 */
export function encodeCursor(kind: string, position: string): string {
  return Buffer.from(`${kind}:${position}`, 'utf8').toString('base64url');
}

export function decodeCursor(raw: string | string[], kind: string): string {
  const bad = () => badRequest('query parameter cursor is not a valid cursor for this list');
  if (Array.isArray(raw) || !/^[A-Za-z0-9_-]{1,512}$/.test(raw)) throw bad();
  const text = Buffer.from(raw, 'base64url').toString('utf8');
  const prefix = `${kind}:`;
  if (!text.startsWith(prefix) || text.length === prefix.length) throw bad();
  return text.slice(prefix.length);
}

/**
 * One page of an already-ordered list keyed by a unique, sortable string (policy names, data
 * paths): items after the cursor's key, at most `limit` of them.
 */
export function pageOf<T>(
  items: T[],
  key: (t: T) => string,
  kind: string,
  q: { limit?: string | undefined; cursor?: string | undefined },
): { page: T[]; next_cursor: string | null } {
  const limit = parseLimit(q.limit);
  const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor, kind);
  const rest = after === undefined ? items : items.filter((t) => key(t) > after);
  const page = rest.slice(0, limit);
  const last = page[page.length - 1];
  return { page, next_cursor: rest.length > limit && last ? encodeCursor(kind, key(last)) : null };
}
