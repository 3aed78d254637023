/**
 * The console's only way to the server: the Engine API on this origin, with the reviewer's key
 * as a Bearer token. Errors carry the server's own `{"error"}` text.
 */

// The shapes the server serves, from the server's own type modules (types only: of the server,
// only src/audit/kinds.ts, which imports nothing, is bundled into the console).
import type { AuditEvent } from '../../src/audit/types.js';
import type { QueueItemView as QueueItem, QueueStatus } from '../../src/queue/types.js';

export type { AuditEvent, QueueItem, QueueStatus };

export interface Whoami {
  name: string;
  scopes: string[];
  tenant: string | null;
  agent: string | null;
}

export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** Server time minus local time, from each response's Date header (seconds precision). */
let clockSkewMs = 0;

/** Now, as the server's clock has it: time left is counted against the server's expires_at. */
export function serverNow(): number {
  return Date.now() + clockSkewMs;
}

export async function request<T>(
  key: string,
  method: 'GET' | 'POST',
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<T> {
  const headers: Record<string, string> = { Authorization: `Bearer ${key}`, Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
      signal,
    });
  } catch {
    throw new ApiError(0, 'cannot reach the Arbiter server');
  }
  const date = Date.parse(res.headers.get('Date') ?? '');
  if (!Number.isNaN(date)) clockSkewMs = date + 500 - Date.now();
  const text = await res.text();
  let json: unknown;
  try {
    json = text === '' ? undefined : JSON.parse(text);
  } catch {
    json = undefined;
  }
  if (!res.ok) {
    const error = (json as { error?: unknown } | undefined)?.error;
    throw new ApiError(res.status, typeof error === 'string' ? error : `HTTP ${res.status}`);
  }
  return json as T;
}

/** Whether the key holds `scope` (admin holds every scope). */
export function holds(me: Whoami, scope: string): boolean {
  return me.scopes.includes(scope) || me.scopes.includes('admin');
}

/**
 * Why the key can decide no request at all, or null when it may decide some. The server's rule
 * (QueueService.decide): deciding needs queue:review, and a key bound to an agent sees only that
 * agent's requests and may decide none of them. Buttons that could only ever answer 403 are not
 * shown. (Whether this key made a given request is the item view's to tell.)
 */
export function cannotReview(me: Whoami): 'scope' | 'agent' | null {
  if (!holds(me, 'queue:review')) return 'scope';
  if (me.agent !== null) return 'agent';
  return null;
}

export const api = {
  whoami: (key: string) => request<Whoami>(key, 'GET', '/v1/whoami'),
  list: (key: string, status: string, limit: number, cursor?: string | null) => {
    const q = new URLSearchParams({ status, limit: String(limit) });
    if (cursor) q.set('cursor', cursor);
    return request<Page<QueueItem>>(key, 'GET', `/v1/queue?${q.toString()}`);
  },
  item: (key: string, id: string) => request<QueueItem>(key, 'GET', `/v1/queue/${encodeURIComponent(id)}`),
  /** The item once it leaves pending, or as it is after `seconds` (SPEC §6 `?wait=`). */
  waitItem: (key: string, id: string, seconds: number, signal: AbortSignal) =>
    request<QueueItem>(key, 'GET', `/v1/queue/${encodeURIComponent(id)}?wait=${seconds}`, undefined, signal),
  events: (key: string, id: string) =>
    request<{ events: AuditEvent[]; next_cursor: string | null }>(
      key,
      'GET',
      `/v1/queue/${encodeURIComponent(id)}/events?limit=1000`,
    ),
  decide: (key: string, id: string, verb: 'approve' | 'deny', note: string) =>
    request<QueueItem>(
      key,
      'POST',
      `/v1/queue/${encodeURIComponent(id)}/${verb}`,
      note.trim() === '' ? {} : { note: note.trim() },
    ),
};
