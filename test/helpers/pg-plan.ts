/** One node of a PostgreSQL plan (EXPLAIN (ANALYZE, FORMAT JSON)), as the tests read it. */
export interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Actual Rows'?: number;
  'Actual Loops'?: number;
  'Rows Removed by Filter'?: number;
  Plans?: PlanNode[];
}

/** The scans of one table in a PostgreSQL plan, however deep. */
export const scansOf = (n: PlanNode, table: string): PlanNode[] => [
  ...(n['Relation Name'] === table && /Scan/.test(n['Node Type']) ? [n] : []),
  ...(n.Plans ?? []).flatMap((p) => scansOf(p, table)),
];
