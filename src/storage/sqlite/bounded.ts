import type { Row } from '../rows.js';
import type { BoundedQuery, BoundedRows } from '../sql.js';
import type { Db } from './db.js';

/**
 * A bounded list's page (the audit's, the queue's) and, when it came up short, the last row it
 * examined (`at` of the resume statement's row), in one read transaction: read apart, a row the
 * writer thread commits between the two reads could move the resume point over rows the page
 * examined, and the next page would answer those again.
 */
export function boundedPage<T, At>(
  db: Db,
  q: BoundedQuery,
  limit: number,
  fromRow: (r: Row) => T,
  at: (last: Row) => At,
): BoundedRows<T, At> {
  const list = (): BoundedRows<T, At> => (db.prepare(q.list.sql).all(...q.list.params) as Row[]).map(fromRow);
  const { resume } = q;
  if (!resume) return list();
  return db.transaction(() => {
    const found = list();
    if (found.length < limit) {
      const last = db.prepare(resume.sql).get(...resume.params) as Row | undefined;
      if (last) found.resumeAfter = at(last);
    }
    return found;
  })();
}
