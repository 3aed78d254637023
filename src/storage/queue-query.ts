import {
  decidedScan,
  pendingExamine,
  type DecidedFilter,
  type DecidedStatus,
  type PendingFilter,
} from '../queue/store.js';
import type { Row } from './rows.js';
import { binder, type BoundedQuery, type Style } from './sql.js';

/** Where a bounded queue page stopped, from its resume statement's row (both backends). */
export const queueResumeAt = (last: Row): { id: string; decided_at: string | null } => ({
  id: last.id as string,
  decided_at: (last.decided_at as string | null | undefined) ?? null,
});

type Binder = ReturnType<typeof binder>;

/**
 * PostgreSQL's bounded page: the examined items' ids first, in list order (an index-only scan, an
 * init plan), then each of those rows by primary key, kept in that order when they pass `conds`.
 * Ordered by their place in the array, not by a column: asked for `ORDER BY id` (or decided_at),
 * the planner read an index in that order and checked `id = ANY (…)` on every row it passed,
 * every pending item for a filter that matched nothing.
 */
function byExaminedIds(examined: string, conds: string[], limit: string): string {
  return `SELECT q.* FROM unnest(ARRAY(${examined})) WITH ORDINALITY AS e (id, n)
    JOIN queue_items q ON q.id = e.id WHERE ${conds.join(' AND ')} ORDER BY e.n LIMIT ${limit}`;
}

/** Decided items in list order: newest decision first. */
const DECIDED_ORDER = (t: string) => `${t}decided_at DESC, ${t}id DESC`;

/**
 * The statements of a decided list (GET /v1/queue?status=approved…), the same on both backends:
 * `list` the matching items in list order, and for a bounded page (DecidedFilter.examine, when
 * its index does not serve every condition) `resume`, which reads the last item the list may
 * have examined (when there is one, the list stopped before the end of its index).
 *
 * The list reads one index in (decided_at, id) order (decidedScan): agent_id's or tenant_id's,
 * the single state's, (decided_at, id) for every state, or for two states each one's, merged (the
 * first `n` of the merge are among the first `n` of each). A bounded page reads at most `examine`
 * items there and checks the other conditions on those alone: without the bound, conditions that
 * match nothing (an action never used, a window of no item) read every decided item, O(store) for
 * each request on the thread that serves decisions (docs/performance.md).
 */
export function decidedQuerySql(f: DecidedFilter, style: Style): BoundedQuery {
  const { drive, rest, examine } = decidedScan(f);
  // Each arm of the index read, in list order from the cursor: one, or one per state of two.
  const arms: (DecidedStatus | undefined)[] =
    drive === 'status' && f.statuses.length === 1
      ? [f.statuses[0]]
      : drive === 'status' && f.statuses.length === 2
        ? [...f.statuses]
        : [undefined];
  const arm = (b: Binder, status: DecidedStatus | undefined): string[] => [
    // The literal term lets SQLite use the partial indexes (WHERE status <> 'pending'). Every state
    // at once needs no other: each row of those indexes is in one of them.
    "status <> 'pending'",
    ...(drive !== 'status' ? [`${drive} = ${b.p(f[drive])}`] : []),
    ...(status !== undefined ? [`status = ${b.p(status)}`] : []),
    ...(f.before === undefined
      ? []
      : [`(decided_at, id) < (${b.p(f.before.decided_at)}, ${b.p(f.before.id)})`]),
  ];
  // Checked on each row read. On SQLite the unary + keeps the planner off their indexes, on the
  // driving one, when nothing else does (an exact page, which has no subquery).
  const checks = (b: Binder, t: string, plus: string): string[] => [
    ...(rest.statuses ? [`${plus}${t}status IN (${rest.statuses.map((st) => b.p(st)).join(', ')})`] : []),
    ...(['agent_id', 'tenant_id', 'action'] as const)
      .filter((c) => rest[c] !== undefined)
      .map((c) => `${plus}${t}${c} = ${b.p(rest[c])}`),
    ...(f.since !== undefined ? [`${plus}${t}created_at >= ${b.p(f.since)}`] : []),
    ...(f.until !== undefined ? [`${plus}${t}created_at < ${b.p(f.until)}`] : []),
  ];
  /**
   * The index read, `cols` of each row, in list order (a merge of the arms), at most `n` rows; with
   * `last`, the `n`th row alone (where a bounded page that read `n` stopped). SQLite merges the
   * arms' index reads as they go (MERGE (UNION ALL) of two in-order scans) and stops at the limit;
   * on PostgreSQL each arm has the limit too, and at most 2·n rows are merged.
   */
  const read = (
    b: Binder,
    cols: string,
    n: number,
    opts: { extra?: (b: Binder) => string[]; last?: boolean } = {},
  ): string => {
    const limit = (last: boolean) => (last ? `LIMIT 1 OFFSET ${b.p(n - 1)}` : `LIMIT ${b.p(n)}`);
    const where = (st: DecidedStatus | undefined) =>
      [...arm(b, st), ...(opts.extra?.(b) ?? [])].join(' AND ');
    const one = (st: DecidedStatus | undefined, last: boolean) =>
      `SELECT ${cols} FROM queue_items WHERE ${where(st)} ORDER BY ${DECIDED_ORDER('')} ${limit(last)}`;
    if (arms.length === 1) return one(arms[0], opts.last ?? false);
    const merged = arms
      .map((st, i) =>
        style === 'sqlite'
          ? `SELECT ${cols} FROM queue_items WHERE ${where(st)}`
          : `SELECT ${cols} FROM (${one(st, false)}) a${i}`,
      )
      .join(' UNION ALL ');
    return `${merged} ORDER BY ${DECIDED_ORDER('')} ${limit(opts.last ?? false)}`;
  };

  if (examine === undefined) {
    const b = binder(style);
    const sql = read(b, '*', f.limit, { extra: (b) => checks(b, '', style === 'sqlite' ? '+' : '') });
    return { list: { sql, params: b.params } };
  }
  const b = binder(style);
  let list: string;
  if (style === 'sqlite') {
    // The outer query only filters what the inner one read, in its order (no join back to the
    // table, which the planner could turn the other way round: the audit list's lesson).
    const inner = read(b, '*', examine);
    const where = checks(b, 'w.', '');
    list = `SELECT * FROM (${inner}) w WHERE ${where.join(' AND ')}
      ORDER BY ${DECIDED_ORDER('w.')} LIMIT ${b.p(f.limit)}`;
  } else {
    const examined =
      arms.length === 1 ? read(b, 'id', examine) : `SELECT id FROM (${read(b, 'id, decided_at', examine)}) u`;
    list = byExaminedIds(examined, checks(b, 'q.', ''), b.p(f.limit));
  }
  const r = binder(style);
  const resume = read(r, 'decided_at, id', examine, { last: true });
  return { list: { sql: list, params: b.params }, resume: { sql: resume, params: r.params } };
}

/**
 * The statements of a pending list (GET /v1/queue/pending, oldest first by id), as
 * decidedQuerySql's: a bounded page (PendingFilter.examine, with any filter) reads at most
 * `examine` pending items through the (status, id) index and checks the filters and the expiry
 * on those alone; `resume` reads the last one it examined.
 */
export function pendingQuerySql(f: PendingFilter, style: Style): BoundedQuery {
  const examine = pendingExamine(f);
  // Pending items in id order come from the (status, id) index. On PostgreSQL the state is asked
  // for as a range of one value, ordered by (status, id): `status = 'pending'` made status a
  // constant of the ordering, so the primary key gave the same order, and the planner, taking
  // pending items to be spread evenly among the ids, walked it from the oldest id, through every
  // decided item (they are older: ids are time-ordered) before the first pending one.
  const [state, order] =
    style === 'sqlite'
      ? ["status = 'pending'", 'id']
      : ["status >= 'pending' AND status <= 'pending'", 'status, id'];
  const driven = (b: Binder) => [state, ...(f.after !== undefined ? [`id > ${b.p(f.after)}`] : [])];
  const checks = (b: Binder, t: string) => [
    `${t}expires_at > ${b.p(f.now)}`,
    ...(['agent_id', 'tenant_id', 'action'] as const)
      .filter((c) => f[c] !== undefined)
      .map((c) => `${t}${c} = ${b.p(f[c])}`),
    ...(f.since !== undefined ? [`${t}created_at >= ${b.p(f.since)}`] : []),
    ...(f.until !== undefined ? [`${t}created_at < ${b.p(f.until)}`] : []),
  ];
  const b = binder(style);
  if (examine === undefined) {
    const sql = `SELECT * FROM queue_items WHERE ${[...driven(b), ...checks(b, '')].join(' AND ')}
      ORDER BY ${order} LIMIT ${b.p(f.limit)}`;
    return { list: { sql, params: b.params } };
  }
  const read = (b: Binder, cols: string) =>
    `SELECT ${cols} FROM queue_items WHERE ${driven(b).join(' AND ')} ORDER BY ${order} LIMIT ${b.p(examine)}`;
  const list =
    style === 'sqlite'
      ? `SELECT * FROM (${read(b, '*')}) w WHERE ${checks(b, 'w.').join(' AND ')} ORDER BY w.id LIMIT ${b.p(f.limit)}`
      : byExaminedIds(read(b, 'id'), checks(b, 'q.'), b.p(f.limit));
  const r = binder(style);
  const resume = `SELECT id FROM queue_items WHERE ${driven(r).join(' AND ')}
    ORDER BY ${order} LIMIT 1 OFFSET ${r.p(examine - 1)}`;
  return { list: { sql: list, params: b.params }, resume: { sql: resume, params: r.params } };
}
