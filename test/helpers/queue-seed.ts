import type { Arbiter } from './harness.js';

/**
 * Queue items in bulk, inserted straight into the database as an earlier version (or an operator)
 * would have left them, on either backend: thousands in one statement, for the tests of what a
 * queue page reads (test/queue-history.test.ts, test/console.test.ts). Item `i` was created (and,
 * if it is decided, decided) at second `i` of 2026-01-01.
 */

const SEED_BASE = Date.parse('2026-01-01T00:00:00.000Z');
/** created_at (and decided_at) of seeded item `i`. */
export const seedAt = (i: number) => new Date(SEED_BASE + i * 1000).toISOString();
/** The id of seeded item `i` with `prefix`: ids of one prefix sort as their numbers. */
export const seedId = (prefix: string, i: number) => `${prefix}-${String(i).padStart(6, '0')}`;
/** `e` (an integer SQL expression) zero-padded to `n` digits, in SQL both backends run. */
const padSql = (e: string, n: number) => {
  const z = `'${'0'.repeat(n)}' || (${e})`;
  return `substr(${z}, length(${z}) - ${n - 1})`;
};
/** seedAt(i) in SQL (i below 86 400). */
const AT_SQL = `'2026-01-01T' || ${padSql('i / 3600', 2)} || ':' || ${padSql('(i / 60) % 60', 2)} || ':' || ${padSql('i % 60', 2)} || '.000Z'`;

/**
 * Inserts queue items i = 1…`upTo` for which `where` holds (SQL over i), directly, as an earlier
 * version or an operator would have left them: thousands in one statement (a recursive CTE both
 * backends run). `status` and `action` are SQL expressions over i.
 */
export async function seedItems(
  a: Arbiter,
  s: {
    prefix: string;
    upTo: number;
    where: string;
    status: string;
    tenant: string;
    agent: string;
    action: string;
  },
): Promise<void> {
  const pending = s.status === "'pending'";
  await a.alter(
    `WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${s.upTo})
     INSERT INTO queue_items (id, status, kind, agent_id, user_id, tenant_id, action, resource, confidence,
       context, message, trace_id, created_at, expires_at, decided_at, decided_by, note, requested_by)
     SELECT '${s.prefix}-' || ${padSql('i', 6)}, ${s.status}, 'agent', $1, NULL, $2, ${s.action}, '"seeded"', 0.5,
       '{}', 'seeded', 'trace-${s.prefix}-' || i, ${AT_SQL}, ${pending ? "'2999-01-01T00:00:00.000Z'" : AT_SQL},
       ${pending ? 'NULL' : AT_SQL}, ${pending ? 'NULL' : `CASE WHEN ${s.status} = 'expired' THEN NULL ELSE 'seed-reviewer' END`},
       NULL, 'seed-key'
     FROM n WHERE ${s.where}`,
    [s.agent, s.tenant],
  );
}
