import { AUDIT_EQUALITY_FILTERS, boundedScan, type AuditFilter } from '../audit/store.js';
import type { Row } from './rows.js';
import { binder, type BoundedQuery, type Style } from './sql.js';

/** Where a bounded audit page stopped, from its resume statement's row (both backends). */
export const auditResumeAt = (last: Row): { seq: number; time: string } => ({
  seq: Number(last.seq),
  time: (last.time as string | undefined) ?? '',
});

/**
 * The statements of an audit query (GET /api/v1/audit), the same on both backends: `list` the
 * matching events in list order, and for a bounded query (AuditFilter.examine) `resume`, which
 * reads the last event the list may have examined (when there is one, the list stopped before the
 * end of what it drives through).
 *
 * A bounded query reads at most `examine` events through one index in list order (its driving
 * equality filter's (column, seq), or (time, seq) for a window) and checks the other filters on
 * those alone: without the bound, two conditions that together match nothing (kind=decision with
 * an action never used, or a window with an agent that has few events) read every event that
 * matches one of them, O(trail) for each request (soak probe: 100 ms over 53 000 events on
 * SQLite's serving thread, stalling every decision meanwhile; seconds over millions).
 */
export function auditQuerySql(f: AuditFilter, style: Style): BoundedQuery {
  const byTime = f.since !== undefined || f.until !== undefined;
  const order = (t: string) => (byTime ? `${t}time DESC, ${t}seq DESC` : `${t}seq DESC`);
  const window = (b: ReturnType<typeof binder>, t: string): string[] => [
    ...(f.since !== undefined ? [`${t}time >= ${b.p(f.since)}`] : []),
    ...(f.until !== undefined ? [`${t}time < ${b.p(f.until)}`] : []),
  ];
  const cursor = (b: ReturnType<typeof binder>, t: string): string[] =>
    f.before === undefined
      ? []
      : [
          byTime
            ? `(${t}time, ${t}seq) < (${b.p(f.before.time ?? '')}, ${b.p(f.before.seq)})`
            : `${t}seq < ${b.p(f.before.seq)}`,
        ];
  const where = (conds: string[]) => (conds.length ? `WHERE ${conds.join(' AND ')}` : '');
  const bound = boundedScan(f);
  if (bound === undefined) {
    const b = binder(style);
    const conds = [
      ...AUDIT_EQUALITY_FILTERS.filter((c) => f[c] !== undefined).map((c) => `${c} = ${b.p(f[c])}`),
      ...window(b, ''),
      ...cursor(b, ''),
    ];
    const sql = `SELECT seq, body, hash FROM audit_events ${where(conds)} ORDER BY ${order('')} LIMIT ${b.p(f.limit)}`;
    return { list: { sql, params: b.params } };
  }
  const { driving, examine } = bound;
  const drive = (b: ReturnType<typeof binder>): string[] =>
    driving === 'time' ? window(b, '') : [`${driving} = ${b.p(f[driving])}`];
  const b = binder(style);
  const rest = AUDIT_EQUALITY_FILTERS.filter((c) => c !== driving && f[c] !== undefined);
  let list: string;
  if (style === 'sqlite') {
    // No join: the outer query can only filter what the inner one read, in its order (a join back
    // to audit_events was planned the other way round, through another filter's index).
    const inner = `SELECT ${['seq', 'time', 'body', 'hash', ...rest].join(', ')} FROM audit_events
      ${where([...drive(b), ...cursor(b, '')])} ORDER BY ${order('')} LIMIT ${b.p(examine)}`;
    list = `SELECT seq, body, hash FROM (${inner}) w
      ${where(rest.map((c) => `w.${c} = ${b.p(f[c])}`))} ORDER BY ${order('w.')} LIMIT ${b.p(f.limit)}`;
  } else {
    // The examined events' seqs first (an index-only scan in list order, an init plan), then those
    // rows by primary key: reading the rows in the scan was planned as a bitmap scan of every
    // event of the driving filter, sorted.
    const examined = `SELECT seq FROM audit_events ${where([...drive(b), ...cursor(b, '')])}
      ORDER BY ${order('')} LIMIT ${b.p(examine)}`;
    const conds = [`seq = ANY (ARRAY(${examined}))`, ...rest.map((c) => `${c} = ${b.p(f[c])}`)];
    list = `SELECT seq, body, hash FROM audit_events ${where(conds)} ORDER BY ${order('')} LIMIT ${b.p(f.limit)}`;
  }
  const r = binder(style);
  const resume = `SELECT seq${byTime ? ', time' : ''} FROM audit_events ${where([...drive(r), ...cursor(r, '')])}
    ORDER BY ${order('')} LIMIT 1 OFFSET ${r.p(examine - 1)}`;
  return { list: { sql: list, params: b.params }, resume: { sql: resume, params: r.params } };
}
