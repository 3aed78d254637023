import type { Row } from '../rows.js';
import type { BoundedQuery, BoundedRows } from '../sql.js';
import { rows, tx, type Pool } from './pool.js';

/**
 * A bounded list's page (the audit's, the queue's) and, when it came up short, the last row it
 * examined (`at` of the resume statement's row), from one snapshot: read apart, rows appended or
 * decided between the two reads moved the resume point back over rows the page had examined, and
 * the next page answered those again (review).
 */
export async function boundedPage<T, At>(
  pool: Pool,
  q: BoundedQuery,
  limit: number,
  fromRow: (r: Row) => T,
  at: (last: Row) => At,
): Promise<BoundedRows<T, At>> {
  const { list, resume } = q;
  if (!resume) return (await rows<Row>(pool, list.sql, list.params)).map(fromRow);
  return tx(
    pool,
    async (c) => {
      const found: BoundedRows<T, At> = (await rows<Row>(c, list.sql, list.params)).map(fromRow);
      if (found.length < limit) {
        const [last] = await rows<Row>(c, resume.sql, resume.params);
        if (last) found.resumeAfter = at(last);
      }
      return found;
    },
    'BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY',
  );
}
