import { encodeCursor, useCursorKey } from '../../src/common/pagination.js';
import type { Arbiter } from './harness.js';

/**
 * A cursor of list `kind` at `position`, sealed with `a`'s own key (read from its store), as the
 * service would hand one out: for cursors no page hands out (a position of the wrong shape), so
 * that a test reaches the list's own checks and not only the seal.
 */
export async function sealedCursor(a: Arbiter, kind: string, position: string): Promise<string> {
  const [row] = await a.stored<{ value: string }>("SELECT value FROM meta WHERE key = 'cursor_key'");
  if (!row) throw new Error('the store has no cursor_key');
  useCursorKey(Buffer.from(row.value, 'base64url'));
  return encodeCursor(kind, position);
}
