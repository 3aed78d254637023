/** One statement and its parameters, in the placeholder style of a backend. */
export interface Sql {
  sql: string;
  params: unknown[];
}

export type Style = 'sqlite' | 'postgres';

/**
 * The parameters of one statement: `p(v)` adds one and answers its placeholder. Call it in the
 * order the placeholders appear in the text: SQLite's `?` are numbered by position.
 */
export function binder(style: Style): { p: (v: unknown) => string; params: unknown[] } {
  const params: unknown[] = [];
  return {
    params,
    p: (v) => {
      params.push(v);
      return style === 'sqlite' ? '?' : `$${params.length}`;
    },
  };
}

/**
 * A bounded list's statements (the audit's and the queue's): `list` the matching rows in list
 * order and, when the list examines at most a fixed number of rows, `resume`, which reads the last
 * row it may have examined.
 */
export interface BoundedQuery {
  list: Sql;
  resume?: Sql | undefined;
}

/** A page of rows and, when a bounded list came up short, where it stopped (continue after it). */
export type BoundedRows<T, At> = T[] & { resumeAfter?: At };
