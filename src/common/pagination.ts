import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { invalid } from '../errors.js';

export const DEFAULT_LIMIT = 100;
export const MAX_LIMIT = 1000;

/** What a caller asks of a list: a page size (default 100) and where the previous page ended. */
export interface PageQuery {
  limit?: number | undefined;
  cursor?: string | undefined;
}

/** One page of a list and the cursor of the next (null on the last page). */
export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

/** `?limit=`: an integer in 1…1000; anything else is a 400 naming it. */
export function parseLimit(raw: string): number {
  if (!/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_LIMIT) {
    throw invalid(`query parameter limit must be an integer between 1 and ${MAX_LIMIT}`);
  }
  return Number(raw);
}

/**
 * The key that seals cursors: every process of a deployment shares it (startArbiter installs the
 * store's, useCursorKey), so a cursor handed out by one engine pages on another and after a
 * restart. Until then (the CLI, a process of its own) a key of this process alone.
 */
let cursorKey: Buffer = randomBytes(32);

/** Seals cursors with `key` (32 bytes, AES-256-GCM) from now on. */
export function useCursorKey(key: Buffer): void {
  if (key.length !== 32) throw new Error('a cursor key is 32 bytes');
  cursorKey = key;
}

const IV_BYTES = 12;
const TAG_BYTES = 16;
/**
 * A sealed text keeps its length, so the text is padded (with NULs, which no position holds) to a
 * multiple of this: an audit cursor of event 9 and one of event 10 000 are as long.
 */
const PAD_BYTES = 64;

/**
 * Cursors are opaque and sealed: base64url of AES-256-GCM over `<kind>:<position>` (a fresh IV
 * each, then the tag). A position can be a row's place in a list every tenant shares (an audit
 * event's number in the one chain), which a tenant-bound key must not read: two of its cursors
 * would tell how many other tenants' events came between (docs/decisions.md). The kind stops a
 * cursor of one list being replayed against another; one that does not open is a 400 naming it.
 */
export function encodeCursor(kind: string, position: string): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', cursorKey, iv);
  const text = Buffer.from(`${kind}:${position}`, 'utf8');
  const padded = Buffer.alloc(Math.ceil(text.length / PAD_BYTES) * PAD_BYTES);
  text.copy(padded);
  const sealed = Buffer.concat([cipher.update(padded), cipher.final()]);
  return Buffer.concat([iv, sealed, cipher.getAuthTag()]).toString('base64url');
}

/** The 400 for a cursor that is not one this list handed out. */
export const badCursor = () => invalid('query parameter cursor is not a valid cursor for this list');

/** The position a cursor of list `kind` carries. */
export function decodeCursor(raw: string, kind: string): string {
  if (!/^[A-Za-z0-9_-]{1,1200}$/.test(raw)) throw badCursor();
  const bytes = Buffer.from(raw, 'base64url');
  if (bytes.length <= IV_BYTES + TAG_BYTES) throw badCursor();
  let text: string;
  try {
    const decipher = createDecipheriv('aes-256-gcm', cursorKey, bytes.subarray(0, IV_BYTES));
    decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES));
    text = Buffer.concat([
      decipher.update(bytes.subarray(IV_BYTES, bytes.length - TAG_BYTES)),
      decipher.final(),
    ])
      .toString('utf8')
      .replace(/\0+$/, '');
  } catch {
    // Not sealed with this deployment's key: forged, altered, or from another deployment.
    throw badCursor();
  }
  const prefix = `${kind}:`;
  if (!text.startsWith(prefix) || text.length === prefix.length) throw badCursor();
  return text.slice(prefix.length);
}

/** A cursor of list `kind` whose position has the form `shape`: the match, else a 400. */
export function readCursor(raw: string, kind: string, shape: RegExp): RegExpExecArray {
  const m = shape.exec(decodeCursor(raw, kind));
  if (!m) throw badCursor();
  return m;
}

/**
 * The most a page's items may be as JSON (UTF-8 bytes): rows hold free-form objects (a request's
 * context, an event's details, a data document), and a page of `limit` large ones must not become
 * one answer of hundreds of megabytes (or a string past V8's limit, which cannot be sent at all).
 */
export const MAX_PAGE_BYTES = 4 * 1024 * 1024;

/**
 * The one paging rule: rows come in list order, up to one more than the page holds. The page
 * takes up to `limit` of them, and stops before the row that would bring its JSON past
 * MAX_PAGE_BYTES (it always takes the first). A next page exists exactly when a row was left
 * over, and its cursor names the page's last row, so the next page starts right after it.
 */
export function cutPage<T>(rows: T[], limit: number, cursorAfter: (last: T) => string): Page<T> {
  const most = Math.min(limit, rows.length);
  let taken = 0;
  let bytes = 0;
  while (taken < most) {
    bytes += Buffer.byteLength(JSON.stringify(rows[taken]) ?? '');
    if (taken > 0 && bytes > MAX_PAGE_BYTES) break;
    taken++;
  }
  const items = rows.slice(0, taken);
  const last = items[items.length - 1];
  return { items, next_cursor: rows.length > taken && last !== undefined ? cursorAfter(last) : null };
}

/** One page from a store: asks `fetch` for limit + 1 rows and cuts them with `cutPage`. */
export async function fetchPage<T>(
  q: PageQuery,
  fetch: (rows: number) => Promise<T[]>,
  cursorAfter: (last: T) => string,
): Promise<Page<T>> {
  const limit = q.limit ?? DEFAULT_LIMIT;
  return cutPage(await fetch(limit + 1), limit, cursorAfter);
}

/**
 * One page of a list keyed by a unique string (policy names, data paths, webhook names): items
 * after the cursor's key, at most `limit` of them, in UTF-16 code-unit order of their keys. The
 * list is put in that order here, whatever order it came in: the cursor compares keys in it, and
 * a database's `ORDER BY` follows its collation (PostgreSQL with ICU `en-US` puts `a_b` before
 * `a1`), so a page cut in the store's order could skip or repeat items.
 */
export function pageOf<T>(items: T[], key: (t: T) => string, kind: string, q: PageQuery): Page<T> {
  const after = q.cursor === undefined ? undefined : decodeCursor(q.cursor, kind);
  // Code units, as `>` compares below (not localeCompare, which is a collation too).
  const ordered = items
    .map((t) => ({ t, k: key(t) }))
    .sort((x, y) => Number(x.k > y.k) - Number(x.k < y.k))
    .map((x) => x.t);
  const rest = after === undefined ? ordered : ordered.filter((t) => key(t) > after);
  return cutPage(rest, q.limit ?? DEFAULT_LIMIT, (last) => encodeCursor(kind, key(last)));
}
