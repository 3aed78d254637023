import type { Middleware } from 'koa';
import { MAX_LIMIT, MAX_PAGE_BYTES, parseLimit } from '../common/pagination.js';
import { isRfc3339, isStorableString, millisecondAtOrAfter, type JsonSchema } from '../common/validation.js';
import { invalid } from '../errors.js';
import type { Ctx, RouteDef, State } from './context.js';

/**
 * One query parameter of a route: `schema` documents it (OpenAPI), `parse` reads it. Both sit in
 * the route table, so what is documented is what is accepted. `parse` throws an `invalid` error
 * that names the parameter.
 */
export interface QueryParam<N extends string = string, T = unknown> {
  name: N;
  description: string;
  schema: JsonSchema;
  parse: (raw: string) => T;
}

/** The parsed values of `Q`, each present only when the request gave it. */
export type QueryValues<Q extends readonly QueryParam[]> = {
  [P in Q[number] as P['name']]?: ReturnType<P['parse']>;
};

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Whether every run of %XX escapes in a raw query string decodes as UTF-8. Koa's parser (Node's
 * querystring) would turn bytes that are not UTF-8 into U+FFFD instead, so a filter would quietly
 * match nothing where a body of the same bytes is a 400.
 */
function percentEncodedUtf8(qs: string): boolean {
  for (const run of qs.match(/(?:%[0-9A-Fa-f]{2})+/g) ?? []) {
    try {
      utf8.decode(Buffer.from(run.replaceAll('%', ''), 'hex'));
    } catch {
      return false;
    }
  }
  return true;
}

/**
 * Reads the request's path parameters and query string against the route: a path or a query
 * string whose percent-escapes are not UTF-8 is a 400; a path parameter that
 * decodes to something no store can hold as received (a lone surrogate, U+0000) is a 400, as in a
 * body; an unknown query parameter or one given twice is a 400 naming it; each value is parsed by
 * its definition. A route that declares no parameters takes none, unless it ignores the query
 * string (the console's page and files).
 */
export function queryMiddleware(route: RouteDef): Middleware<State> {
  const defs = new Map((route.query ?? []).map((q) => [q.name, q]));
  return (ctx, next) => {
    const params = (ctx as { params?: Record<string, string> }).params ?? {};
    for (const [name, value] of Object.entries(params)) {
      if (!isStorableString(value)) {
        throw invalid(`path parameter ${name} holds a lone UTF-16 surrogate or a U+0000 character`);
      }
    }
    // A path parameter whose escapes are not UTF-8 reaches the route undecoded (the router keeps
    // what it cannot decode): it would be looked up as its literal text and not found.
    if (!percentEncodedUtf8(ctx.path)) throw invalid('the path is not percent-encoded UTF-8');
    if (route.ignoresQuery) {
      ctx.state.query = {};
      return next();
    }
    if (!percentEncodedUtf8(ctx.querystring)) throw invalid('the query string is not percent-encoded UTF-8');
    const values: Record<string, unknown> = {};
    for (const [name, raw] of Object.entries(ctx.query)) {
      const def = defs.get(name);
      if (!def) throw invalid(`unknown query parameter ${name}`);
      if (Array.isArray(raw)) throw invalid(`query parameter ${name} must be given once`);
      if (raw !== undefined && !isStorableString(raw)) {
        throw invalid(`query parameter ${name} holds a lone UTF-16 surrogate or a U+0000 character`);
      }
      if (raw !== undefined) values[name] = def.parse(raw);
    }
    ctx.state.query = values;
    return next();
  };
}

/** The parsed query of this request, typed by the parameters the route declares. */
export function queryOf<Q extends readonly QueryParam[]>(ctx: Ctx, _params: Q): QueryValues<Q> {
  return (ctx.state.query ?? {}) as QueryValues<Q>;
}

/** Declares a parameter, keeping its name's literal type (for `QueryValues`). */
export const queryParam = <N extends string, T>(p: QueryParam<N, T>): QueryParam<N, T> => p;

export const LIMIT = queryParam({
  name: 'limit',
  description:
    `page size, 1…${MAX_LIMIT} (default 100); a page also ends before its items would pass ` +
    `${MAX_PAGE_BYTES / 1024 / 1024} MiB as JSON (it always holds one), and is then shorter, with a next_cursor`,
  schema: { type: 'integer', minimum: 1, maximum: MAX_LIMIT, default: 100 },
  parse: parseLimit,
});

export const CURSOR = queryParam({
  name: 'cursor',
  description: 'next_cursor of the previous page',
  schema: { type: 'string' },
  // Only the list that made a cursor can read it: its service decodes it.
  parse: (raw: string) => raw,
});

/** `?limit=` and `?cursor=` of every list (SPEC §3). */
export const PAGE_QUERY = [LIMIT, CURSOR] as const;

/** An exact-match filter on a short text field: 1 to 256 characters. */
export function filterParam<N extends string>(name: N, description: string): QueryParam<N, string> {
  return queryParam({
    name,
    description,
    schema: { type: 'string', minLength: 1, maxLength: 256 },
    parse: (raw: string) => {
      if (raw === '' || raw.length > 256)
        throw invalid(`query parameter ${name} must be 1 to 256 characters`);
      return raw;
    },
  });
}

/**
 * An RFC 3339 date-time with a time zone, read as the instant it names (ISO 8601, UTC), as a
 * bound on stored times: digits past the millisecond take the next one (millisecondAtOrAfter).
 */
export function timeParam<N extends string>(name: N, description: string): QueryParam<N, string> {
  return queryParam({
    name,
    description,
    schema: { type: 'string', format: 'date-time' },
    parse: (raw: string) => {
      const bound = isRfc3339(raw) ? millisecondAtOrAfter(raw) : undefined;
      if (bound === undefined) {
        throw invalid(`query parameter ${name} must be an RFC 3339 date-time in years 0000-9999 (UTC)`);
      }
      return bound;
    },
  });
}

/** `true`/`1` or `false`/`0`. */
export function boolParam<N extends string>(name: N, description: string): QueryParam<N, boolean> {
  return queryParam({
    name,
    description,
    schema: { type: 'boolean' },
    parse: (raw: string) => {
      if (raw === 'true' || raw === '1') return true;
      if (raw === 'false' || raw === '0') return false;
      throw invalid(`query parameter ${name} must be true or false`);
    },
  });
}
