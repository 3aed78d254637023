import { expect } from 'chai';
import fc from 'fast-check';
import { onEveryBackend } from './helpers/backends.js';
import { createHash } from 'node:crypto';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { sha256Hex } from '../src/audit/chain.js';
import { canonicalJson } from '../src/common/canonical-json.js';
import { isReservedKind } from '../src/audit/kinds.js';
import type { AuditEvent } from '../src/audit/types.js';
import { SCOPES } from '../src/keys/types.js';
import { ADMIN_KEY, AGENT, Arbiter, call, HUMAN } from './helpers/harness.js';
import { sealedCursor } from './helpers/cursors.js';
import { checkAnswer } from './helpers/openapi-check.js';
import {
  encodeRequest,
  NoResponse,
  rawRequest,
  type RawRequest,
  type RawResponse,
} from './helpers/raw-http.js';
import { intEnv } from './helpers/env.js';

/**
 * Fuzzes every route of the route table, as the service's own OpenAPI document lists them (so a new
 * route is covered without touching this file), on the listener(s) `x-arbiter-apis` names.
 *
 * Per route: systematic probes (every field of the request schema once with a value of another type,
 * once with a lone UTF-16 surrogate and, if numeric, once with 1e300, in an otherwise valid
 * request), then ARBITER_FUZZ_RUNS
 * generated requests (fast-check, fixed seed per operation): schema-shaped, mutated and garbage JSON
 * (deep nesting, huge numbers, NUL, lone surrogates), odd and missing Content-Type, Content-Encoding
 * with bodies that are and are not so encoded, Expect/Accept/Idempotency-Key/traceparent/If-Match,
 * query strings, path segments, methods, keys. About half the requests keep a clean envelope so the
 * body reaches the handler; the others vary every header and the request line too. Requests go over
 * a raw socket, so nothing a client library would normalize or refuse is lost.
 *
 * Asserted for every response: no 5xx; a 4xx/5xx is `application/json` and exactly
 * `{"error": "<non-empty>"}` (or a body the document gives for that status: a deny decision); an
 * X-Request-Id; WWW-Authenticate on 401, Allow on 405; a route without a request body serves no
 * body but none or `{}` (in a clean envelope). Every audit event appended during a route's
 * requests is re-hashed as `audit verify` does. After the run: the process is alive, every stored
 * policy still matches its sha256, and GET /api/v1/audit/verify is ok.
 *
 * Violations are collected rather than stopped at, grouped by kind (5xx by the server's logged
 * cause), and printed with the smallest request of each group, reduced to the headers, query and
 * body fields that still reproduce it.
 *
 * Environment: ARBITER_FUZZ_RUNS (generated requests per route, default 60, per route of the OpenAPI document),
 * ARBITER_FUZZ_SEED (default 20261123), ARBITER_FUZZ_CONCURRENCY (default 4),
 * ARBITER_FUZZ_TRACE (print requests and answers of routes whose "METHOD /template" contains it).
 */

const RUNS = intEnv('ARBITER_FUZZ_RUNS', 60);
const SEED = intEnv('ARBITER_FUZZ_SEED', 20261123);
const CONCURRENCY = Math.max(1, intEnv('ARBITER_FUZZ_CONCURRENCY', 4));
/** Print every request and answer of the routes whose "METHOD /template" contains this text. */
const TRACE = process.env.ARBITER_FUZZ_TRACE ?? '';
/** Violations kept in full (the rest are only counted). */
const KEEP = 20_000;

type ApiName = 'engine' | 'platform';

interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  enum?: unknown[];
  oneOf?: Schema[];
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  format?: string;
  $ref?: string;
}

interface Operation {
  operationId: string;
  parameters?: { name: string; in: string; schema?: Schema }[];
  requestBody?: { required: boolean; content: Record<string, { schema: Schema }> };
  responses: Record<string, { content?: Record<string, { schema?: Schema }> }>;
  'x-arbiter-apis': ApiName[];
}

interface Route {
  method: string;
  template: string;
  op: Operation;
}

/** JSON text inserted verbatim: numbers and nestings JSON.stringify cannot produce. */
class Raw {
  constructor(readonly text: string) {}
}

interface Spec {
  route: Route;
  api: ApiName;
  req: RawRequest;
  /** A clean envelope: method, path, listener and headers as the document gives them. */
  clean: boolean;
  /** The body before Content-Encoding, and what it is (for reports). */
  plain: Buffer | undefined;
  encoded: string | undefined;
  /** The compression actually applied to `plain` (gzip, br, deflate), if any. */
  compressed: string | undefined;
  note: string;
}

interface Violation {
  check: string;
  detail: string;
  status: number | null;
  requestId: string | null;
  spec: Spec;
}

interface Pools {
  keys: string[];
  params: Record<string, string[]>;
  fields: Record<string, unknown[]>;
  cursors: string[];
  etags: string[];
}

// ---------------------------------------------------------------------------------------------
// Values

/** Strings that have broken services before: lone surrogates, NUL, separators, BOM, long runs. */
const NASTY = [
  '\ud800',
  'a\udfffb',
  '\udc00\ud800',
  'x\udbff',
  '\u0000',
  'nul\u0000byte',
  '',
  ' ',
  ' padded ',
  'tab\there',
  'line\nbreak',
  '\u2028\u2029',
  '\ufeffbom',
  'é',
  'naïve-ünïcödé',
  '😀',
  '𝕏𝕐',
  '\\',
  '"',
  '%00',
  '%ED%A0%80',
  '../../etc/passwd',
  '<script>',
  '__proto__',
  'constructor',
  'null',
  '0',
  'x'.repeat(257),
  'y'.repeat(1025),
  'z'.repeat(5000),
];

const TOKENS = ['deploy-bot', 'read', 'repo/arbiter', 'acme', 'alice', 'p1', 'fuzz', 'a', 'A_B-c.d'];

const RAW_NUMBERS = [
  '1e400',
  '-1e400',
  '1e-400',
  '-0',
  '0.99999999999999999999',
  '1.0000000000000000001',
  '123456789012345678901234567890',
  '9007199254740993',
  '5e-324',
  '1E0',
  '0.0',
  '1.0',
  '-0.0',
].map((t) => new Raw(t));

const VALID_DATES = [
  '2026-01-01T00:00:00Z',
  '2026-01-01T00:00:00.123456789+05:30',
  '0000-01-01T00:00:00Z',
  '0000-01-01T00:00:00+00:01',
  '9999-12-31T23:59:59.999-23:59',
  '1970-01-01T00:00:00-23:59',
  '2026-01-01t00:00:00z',
];
const INVALID_DATES = [
  '2026-02-30T00:00:00Z',
  '2026-13-01T00:00:00Z',
  '2026-01-01',
  '2026-01-01T25:00:00Z',
  '+275760-09-13T00:00:00Z',
  'yesterday',
  '',
];
const DATES = [...VALID_DATES, ...INVALID_DATES];

/** Values of every JSON type, for "wrong type" mutations. */
const WRONG: unknown[] = [
  0,
  1,
  -1,
  0.5,
  1.5,
  new Raw('1e400'),
  new Raw('-0'),
  '',
  'x',
  '0.9',
  '1',
  'true',
  true,
  false,
  null,
  [],
  ['x'],
  [1, 'a'],
  {},
  { x: 1 },
  '\ud800',
  'a\u0000b',
];

const nest = (depth: number) => new Raw(`${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`);
const nestArrays = (depth: number) => new Raw(`${'['.repeat(depth)}${']'.repeat(depth)}`);

const MiB = 1024 * 1024;
/** Valid JSON just over the 1 MiB limit; and a small gzip that inflates past it. */
const BIG_JSON = Buffer.from(`{"pad":"${'x'.repeat(MiB)}"}`);
const GZIP_BOMB = gzipSync(Buffer.from(`{"pad":"${' '.repeat(2 * MiB)}"}`));

/** Serializes with Raw pieces verbatim and `__proto__` kept as an own key. */
function jsonText(v: unknown): string {
  if (v instanceof Raw) return v.text;
  if (v === undefined) return 'null';
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(jsonText).join(',')}]`;
  return `{${Object.keys(v)
    .map((k) => `${JSON.stringify(k)}:${jsonText((v as Record<string, unknown>)[k])}`)
    .join(',')}}`;
}

function setOwn(o: Record<string, unknown>, k: string, v: unknown): void {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}

type PathSeg = string | number;

/** A copy of `root` with `path` set to `value` (or removed), creating containers on the way. */
function setPath(root: unknown, path: PathSeg[], value: unknown, remove = false): unknown {
  if (path.length === 0) return remove ? undefined : value;
  const [head, ...rest] = path as [PathSeg, ...PathSeg[]];
  if (typeof head === 'number') {
    const arr = Array.isArray(root) ? [...(root as unknown[])] : [];
    if (remove && rest.length === 0) arr.splice(head, 1);
    else arr[head] = setPath(arr[head], rest, value, remove);
    return arr;
  }
  const obj: Record<string, unknown> = {};
  if (root !== null && typeof root === 'object' && !Array.isArray(root) && !(root instanceof Raw)) {
    for (const k of Object.keys(root)) setOwn(obj, k, (root as Record<string, unknown>)[k]);
  }
  if (remove && rest.length === 0) delete obj[head];
  else setOwn(obj, head, setPath(obj[head], rest, value, remove));
  return obj;
}

/** Mostly absent: `arb` with weight 1 against `absent` weight for undefined. */
function rarely<T>(arb: fc.Arbitrary<T>, absent = 9): fc.Arbitrary<T | undefined> {
  return fc.oneof({ weight: absent, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
}

const pick = <T>(xs: readonly T[]): fc.Arbitrary<T> => fc.constantFrom(...xs);

const LONE = fc.string({
  unit: fc.constantFrom('\ud800', '\udbff', '\udc00', '\udfff', 'a', '\u0000'),
  minLength: 1,
  maxLength: 4,
});

/** Characters of generated JSON strings: mostly plain, sometimes a lone surrogate, NUL or astral. */
const JSON_CHAR = fc.oneof(
  { weight: 30, arbitrary: fc.constantFrom(...'abcxyz019-_./: '.split('')) },
  {
    weight: 1,
    arbitrary: fc.constantFrom('\ud800', '\udbff', '\udc00', '\udfff', '\u0000', 'é', '😀', '"', '\\'),
  },
);

const anyJson: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 16, arbitrary: fc.jsonValue({ maxDepth: 3, stringUnit: JSON_CHAR }) },
  { weight: 4, arbitrary: pick(NASTY) },
  { weight: 2, arbitrary: LONE },
  { weight: 2, arbitrary: pick(RAW_NUMBERS) },
  { weight: 1, arbitrary: pick([nest(40), nest(62), nest(64), nest(65), nest(3000), nestArrays(100)]) },
  { weight: 2, arbitrary: fc.dictionary(fc.oneof(fc.string(), pick(NASTY)), pick(NASTY), { maxKeys: 3 }) },
);

function stringArb(field: string | undefined, s: Schema, pools: Pools): fc.Arbitrary<unknown> {
  const pool = (field && pools.fields[field]) || undefined;
  const token: fc.Arbitrary<unknown> =
    s.format === 'date-time' ? pick(VALID_DATES) : pool && pool.length > 0 ? pick(pool) : pick(TOKENS);
  const arbs: fc.WeightedArbitrary<unknown>[] = [
    // Mostly plain values, so that a body usually gets as far as the field a mutation broke.
    { weight: 24, arbitrary: token },
    {
      weight: 2,
      arbitrary: fc
        .tuple(pick(pool && pool.length > 0 ? pool : TOKENS), pick(NASTY))
        .map(([a, b]) => (typeof a === 'string' ? a + b : b)),
    },
    { weight: 2, arbitrary: pick(NASTY) },
    { weight: 1, arbitrary: LONE },
    { weight: 1, arbitrary: fc.string({ maxLength: 16 }) },
    { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 8 }) },
  ];
  if (s.maxLength !== undefined) {
    arbs.push({ weight: 1, arbitrary: pick(['x'.repeat(s.maxLength), 'x'.repeat(s.maxLength + 1)]) });
  }
  if (s.format === 'date-time') arbs.push({ weight: 2, arbitrary: pick(INVALID_DATES) });
  return fc.oneof(...arbs);
}

function numberArb(s: Schema, integer: boolean): fc.Arbitrary<unknown> {
  const min = s.minimum ?? -1e6;
  const max = s.maximum ?? 1e6;
  const edges = [min, max, min - 1, max + 1, 0, 1, -1, 0.5, 1.5, 2 ** 53, -(2 ** 53), 1e308];
  return fc.oneof(
    {
      weight: 5,
      arbitrary: integer
        ? fc.integer({ min: Math.max(min, -1e6), max: Math.min(max, 1e6) })
        : fc.double({ min, max, noNaN: true, noDefaultInfinity: true }),
    },
    { weight: 2, arbitrary: pick(edges) },
    { weight: 1, arbitrary: pick(RAW_NUMBERS) },
  );
}

/** A value shaped by the schema, with awkward strings and numbers inside the allowed types. */
function valueArb(
  s: Schema | undefined,
  field: string | undefined,
  pools: Pools,
  depth = 0,
): fc.Arbitrary<unknown> {
  if (!s || Object.keys(s).length === 0 || depth > 5) return anyJson;
  if (s.oneOf) return fc.oneof(...s.oneOf.map((alt) => valueArb(alt, field, pools, depth + 1)));
  if (s.enum) {
    return fc.oneof(
      { weight: 6, arbitrary: pick(s.enum) },
      { weight: 1, arbitrary: stringArb(field, { ...s, enum: undefined }, pools) },
    );
  }
  const types = s.type === undefined ? ['object'] : Array.isArray(s.type) ? s.type : [s.type];
  const arbs = types.map((t): fc.WeightedArbitrary<unknown> => {
    switch (t) {
      case 'string':
        return { weight: 4, arbitrary: stringArb(field, s, pools) };
      case 'number':
        return { weight: 4, arbitrary: numberArb(s, false) };
      case 'integer':
        return { weight: 4, arbitrary: numberArb(s, true) };
      case 'boolean':
        return { weight: 4, arbitrary: fc.boolean() };
      case 'null':
        return { weight: 1, arbitrary: fc.constant(null) };
      case 'array':
        return { weight: 4, arbitrary: arrayArb(s, field, pools, depth) };
      default:
        return { weight: 4, arbitrary: objectArb(s, pools, depth) };
    }
  });
  return fc.oneof(...arbs);
}

function arrayArb(s: Schema, field: string | undefined, pools: Pools, depth: number): fc.Arbitrary<unknown> {
  const item = valueArb(s.items, field, pools, depth + 1);
  const arbs: fc.WeightedArbitrary<unknown>[] = [
    {
      weight: 8,
      arbitrary: fc.array(item, { minLength: s.minItems ?? 0, maxLength: Math.min(s.maxItems ?? 4, 4) }),
    },
    { weight: 1, arbitrary: fc.constant([]) },
  ];
  if (s.maxItems !== undefined && s.maxItems <= 1000) {
    const over = s.maxItems + 1;
    arbs.push({ weight: 1, arbitrary: item.map((v) => Array.from({ length: over }, () => v)) });
  }
  return fc.oneof(...arbs);
}

function objectArb(s: Schema, pools: Pools, depth: number): fc.Arbitrary<unknown> {
  const props = Object.entries(s.properties ?? {});
  if (props.length === 0) {
    return fc.oneof(
      {
        weight: 10,
        arbitrary: fc.dictionary(pick(['a', 'b', 'ssn', 'amount', 'env']), anyJson, { maxKeys: 4 }),
      },
      { weight: 1, arbitrary: pick([nest(62), nest(64), nest(65), nest(5000)]) },
    );
  }
  const required = new Set(s.required ?? []);
  const req = Object.fromEntries(
    props.filter(([k]) => required.has(k)).map(([k, sub]) => [k, valueArb(sub, k, pools, depth + 1)]),
  );
  const opt = Object.fromEntries(
    props.filter(([k]) => !required.has(k)).map(([k, sub]) => [k, valueArb(sub, k, pools, depth + 1)]),
  );
  return fc
    .tuple(fc.record(req), fc.record(opt, { requiredKeys: [] }))
    .map(([a, b]) => ({ ...a, ...b }) as unknown);
}

type Mutation =
  | { op: 'set'; path: PathSeg[]; value: unknown }
  | { op: 'delete'; path: PathSeg[] }
  | { op: 'extra'; key: string; value: unknown };

function mutationArb(schema: Schema): fc.Arbitrary<Mutation> {
  const paths = schemaFields(schema).map((f) => f.path);
  const extra = fc.record({
    op: fc.constant('extra' as const),
    key: pick(['unknown', '__proto__', 'constructor', 'hash', 'prev_hash', 'id', 'seq', 'events', '']),
    value: anyJson,
  });
  if (paths.length === 0) return extra;
  return fc.oneof(
    {
      weight: 6,
      arbitrary: fc.record({ op: fc.constant('set' as const), path: pick(paths), value: pick(WRONG) }),
    },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('delete' as const), path: pick(paths) }) },
    { weight: 1, arbitrary: extra },
  );
}

/** A schema-shaped value and mutations of it (per oneOf alternative, so paths fit the value). */
function mutatedArb(schema: Schema, pools: Pools): fc.Arbitrary<[unknown, Mutation[]]> {
  if (schema.oneOf) return fc.oneof(...schema.oneOf.map((alt) => mutatedArb(alt, pools)));
  return fc.tuple(
    valueArb(schema, undefined, pools),
    fc.array(mutationArb(schema), { minLength: 1, maxLength: 2 }),
  );
}

function describeMutation(m: Mutation): string {
  if (m.op === 'set') return `${m.path.join('.')} := ${show(jsonText(m.value), 20)}`;
  if (m.op === 'delete') return `without ${m.path.join('.')}`;
  return `extra ${show(m.key, 20)}`;
}

function mutate(value: unknown, ms: Mutation[]): unknown {
  let v = value;
  for (const m of ms) {
    if (m.op === 'set') v = setPath(v, m.path, m.value);
    else if (m.op === 'delete') v = setPath(v, m.path, undefined, true);
    else v = setPath(v, [m.key], m.value);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Bodies

interface Body {
  bytes: Buffer | undefined;
  /** The Content-Type the body would normally be sent with. */
  type: string | undefined;
  note: string;
  /** A body already compressed, with the Content-Encoding header it needs. */
  encoding?: string;
}

/** Rego samples; the first (valid, with a lone surrogate in a comment) is the one probes send. */
const REGO = [
  'package fuzz.d\n\n# a lone surrogate in a comment: \ud800\nx := 1\n',
  'package fuzz.a\n\nx := 1\n',
  'package fuzz.b\n\nallow if input.x == "\\ud800"\n',
  'package authz.agent\n\ndeny contains "fuzzed" if input.action == "fuzz-action"\n',
  'package fuzz.c\n\ny := http.send({"method": "GET", "url": "http://127.0.0.1:1"})\n',
  'package authz\n\ndecision := {}\n',
  'package fuzz.e\n\nx := "\u0000"\n',
  'package',
  'package fuzz.f\n\nx := ',
  'package fuzz.g\nimport rego.v1\nx if true\n',
  '',
];

const GARBAGE: (string | Buffer)[] = [
  '{',
  '}',
  '{"a":1,}',
  '{"a":1}}',
  '{"a":1} trailing',
  "{'a':1}",
  '{a:1}',
  '{"a":NaN}',
  '{"a":Infinity}',
  '{"a":undefined}',
  '{"a":1 /* comment */}',
  '{"a":"\\x41"}',
  '{"a":"\\u12"}',
  '{"a":"unterminated',
  '{"a":"raw\u0000nul"}',
  '{"a":"raw\u0001control"}',
  '"\\ud800"',
  '{"\\ud800":1}',
  '{"a":1,"a":2}',
  '{"__proto__":{"polluted":true}}',
  '{"constructor":{"prototype":{"polluted":true}}}',
  '',
  ' ',
  '\n',
  'null',
  'true',
  '0',
  '"string"',
  '[]',
  '[{}]',
  '1e400',
  '\ufeff{}',
  Buffer.from([0xff, 0xfe, 0xfd]),
  Buffer.from('{"a":"\xe9"}', 'latin1'),
  Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xed, 0xa0, 0x80, 0x22, 0x7d]),
  Buffer.from('{"a":1}', 'utf16le'),
  Buffer.from('\ufeff{"a":1}', 'utf16le'),
  `{"a":${'['.repeat(100_000)}`,
  nest(64).text,
  nest(200).text,
  nestArrays(20_000).text,
];

function bodyArb(route: Route, pools: Pools): fc.Arbitrary<Body> {
  const content = route.op.requestBody?.content;
  const schema = content?.['application/json']?.schema;
  const takesText = content?.['text/plain'] !== undefined;
  const json =
    (note: string) =>
    (v: unknown): Body => ({
      bytes: Buffer.from(jsonText(v), 'utf8'),
      type: 'application/json',
      note,
    });
  const valid = valueArb(schema, undefined, pools);
  const garbage = pick(GARBAGE).map((g): Body => ({
    bytes: typeof g === 'string' ? Buffer.from(g, 'utf8') : g,
    type: 'application/json',
    note: 'garbage JSON',
  }));
  const truncated = fc.tuple(valid, fc.nat()).map(([v, n]): Body => {
    const t = jsonText(v);
    return {
      bytes: Buffer.from(t.slice(0, n % Math.max(1, t.length)), 'utf8'),
      type: 'application/json',
      note: 'truncated JSON',
    };
  });
  const special = pick([
    { bytes: BIG_JSON, type: 'application/json', note: 'JSON over 1 MiB' },
    { bytes: GZIP_BOMB, type: 'application/json', note: 'gzip inflating past 1 MiB', encoding: 'gzip' },
  ] as Body[]);
  const none = fc.constant<Body>({ bytes: undefined, type: undefined, note: 'no body' });
  const empty = fc.constant<Body>({ bytes: Buffer.alloc(0), type: 'application/json', note: 'empty body' });
  if (!schema) {
    // Routes without a body: mostly none, sometimes one anyway (refused cleanly unless it is {}:
    // `acceptedUnwantedBody`).
    return fc.oneof(
      { weight: 12, arbitrary: none },
      { weight: 2, arbitrary: anyJson.map(json('unexpected JSON body')) },
      { weight: 1, arbitrary: garbage },
      { weight: 1, arbitrary: empty },
    );
  }
  const arbs: fc.WeightedArbitrary<Body>[] = [
    { weight: 5, arbitrary: valid.map(json('schema-shaped JSON')) },
    {
      weight: 7,
      arbitrary: mutatedArb(schema, pools).map(([v, ms]) =>
        json(`mutated JSON: ${ms.map(describeMutation).join('; ')}`)(mutate(v, ms)),
      ),
    },
    { weight: 1, arbitrary: pick(WRONG).map(json('JSON of another type')) },
    { weight: 1, arbitrary: valid.map((v) => json('JSON array of a valid body')([v])) },
    { weight: 3, arbitrary: garbage },
    { weight: 1, arbitrary: truncated },
    { weight: 1, arbitrary: none },
    { weight: 1, arbitrary: empty },
    { weight: 1, arbitrary: special },
  ];
  if (takesText) {
    arbs.push({
      weight: 3,
      arbitrary: fc
        .oneof(pick(REGO), fc.string({ maxLength: 40 }), LONE)
        .map((t): Body => ({ bytes: Buffer.from(t, 'utf8'), type: 'text/plain', note: 'text/plain body' })),
    });
  }
  return fc.oneof(...arbs);
}

// ---------------------------------------------------------------------------------------------
// Systematic probes: every field of the request schema, once with a value of another type and once
// with a lone surrogate appended, on top of a plain valid body, in a clean request.

/** A plain value the schema accepts: pool values, minimums, every optional property present. */
function canonical(s: Schema | undefined, field: string | undefined, pools: Pools): unknown {
  if (!s || Object.keys(s).length === 0) return { a: 1 };
  if (s.oneOf) return canonical(s.oneOf[0], field, pools);
  if (s.enum) return s.enum.find((v) => v !== null);
  const types = s.type === undefined ? ['object'] : Array.isArray(s.type) ? s.type : [s.type];
  const t = types.find((x) => x !== 'null') ?? 'null';
  switch (t) {
    case 'string': {
      if (s.format === 'date-time') return '2026-01-01T00:00:00Z';
      const pooled = (field && pools.fields[field]?.find((v) => typeof v === 'string')) as string | undefined;
      return pooled ?? 'fuzz';
    }
    case 'number':
      return s.minimum !== undefined && s.maximum !== undefined
        ? (s.minimum + s.maximum) / 2
        : (s.minimum ?? 1);
    case 'integer':
      return s.minimum ?? 1;
    case 'boolean':
      return true;
    case 'null':
      return null;
    case 'array':
      return [canonical(s.items, field, pools)];
    default:
      return Object.fromEntries(
        Object.entries(s.properties ?? {}).map(([k, sub]) => [k, canonical(sub, k, pools)]),
      );
  }
}

/** Every property of a schema with its own schema (oneOf alternatives are probed separately). */
function schemaFields(s: Schema, prefix: PathSeg[] = [], depth = 0): { path: PathSeg[]; schema: Schema }[] {
  if (depth > 4) return [];
  const out: { path: PathSeg[]; schema: Schema }[] = [];
  for (const [k, sub] of Object.entries(s.properties ?? {})) {
    out.push({ path: [...prefix, k], schema: sub }, ...schemaFields(sub, [...prefix, k], depth + 1));
  }
  if (s.items) {
    out.push({ path: [...prefix, 0], schema: s.items }, ...schemaFields(s.items, [...prefix, 0], depth + 1));
  }
  return out;
}

function getPath(v: unknown, path: PathSeg[]): unknown {
  let x = v;
  for (const k of path) x = (x as Record<string | number, unknown> | undefined)?.[k];
  return x;
}

/** A value of another JSON type than the schema allows. */
function otherType(s: Schema): unknown {
  const types = s.type === undefined ? [] : Array.isArray(s.type) ? s.type : [s.type];
  if (types.includes('string') || s.enum) return 12345;
  if (types.includes('number') || types.includes('integer')) return '0.5';
  if (types.includes('array')) return { '0': 'x' };
  if (types.includes('object')) return 'x';
  if (types.includes('boolean')) return 'true';
  return undefined;
}

function probeSpecs(route: Route, pools: Pools): Spec[] {
  const schema = route.op.requestBody?.content['application/json']?.schema;
  if (!schema) return [];
  const paramNames = [...route.template.matchAll(/\{(\w+)\}/g)].map((m) => m[1] as string);
  const params = paramNames.map((n) => {
    const pool = pools.params[n] ?? [];
    const v =
      pool.find((x) => x.startsWith('fuzz')) ??
      pool[seedFor(route.op.operationId) % Math.max(1, pool.length)] ??
      'fuzz';
    return enc(v).replace(/%2F/g, '/');
  });
  const bodies: [string, unknown][] = [];
  for (const alt of schema.oneOf ?? [schema]) {
    const base = canonical(alt, undefined, pools);
    const fields = schemaFields(alt);
    if (fields.length === 0) {
      // Any JSON value (a data document): the value itself, and an object member.
      bodies.push(
        ['body := a lone surrogate', '\ud800'],
        ['body := {"a": "x" + a lone surrogate}', { a: 'x\ud800' }],
      );
    }
    for (const { path, schema: sub } of fields) {
      const current = getPath(base, path);
      const wrong = otherType(sub);
      if (wrong !== undefined)
        bodies.push([`${path.join('.')} := ${jsonText(wrong)}`, setPath(base, path, wrong)]);
      const types = Array.isArray(sub.type) ? sub.type : [sub.type];
      if (types.includes('integer') || types.includes('number')) {
        // Integral as far as JSON Schema goes, yet beyond every 64-bit integer.
        bodies.push([`${path.join('.')} := 1e300`, setPath(base, path, new Raw('1e300'))]);
      }
      bodies.push([
        `${path.join('.')} := ${typeof current === 'string' ? 'itself + ' : ''}a lone surrogate`,
        setPath(base, path, typeof current === 'string' ? current + '\ud800' : '\ud800'),
      ]);
    }
  }
  return bodies.map(([note, body]) =>
    build(route, {
      clean: true,
      api: route.op['x-arbiter-apis'][0] as ApiName,
      method: route.method,
      params,
      pathMutation: undefined,
      query: '',
      auth: [`Bearer ${ADMIN_KEY}`],
      body: { bytes: Buffer.from(jsonText(body), 'utf8'), type: 'application/json', note: `probe: ${note}` },
      contentType: 'default',
      encoding: undefined,
      chunked: false,
      expect: undefined,
      accept: undefined,
      idempotencyKey: undefined,
      traceparent: undefined,
      ifMatch: undefined,
      requestId: undefined,
      extra: undefined,
      upgrade: false,
      host: 'normal',
      version: 'HTTP/1.1',
    }),
  );
}

// ---------------------------------------------------------------------------------------------
// Request lines and headers

const CONTENT_TYPES = [
  'application/json; charset=utf-8',
  'application/json;charset=UTF-8',
  'Application/JSON',
  'APPLICATION/JSON; CHARSET=UTF-8',
  'application/json; charset="utf-8"',
  'application/json; charset=latin1',
  'application/json; charset=utf-16',
  'application/json; charset=bogus',
  'application/json; foo=bar',
  'application/json;',
  'application/json ; charset=utf-8',
  'application/json, text/plain',
  'text/plain',
  'text/plain; charset=utf-8',
  'text/json',
  'application/vnd.api+json',
  'application/merge-patch+json',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=----fuzz',
  'application/octet-stream',
  '*/*',
  'application/*',
  'garbage',
  ';;;',
  '',
];

const ENCODINGS = [
  'gzip',
  'br',
  'deflate',
  'x-gzip',
  'identity',
  'GZIP',
  'gzip, identity',
  'identity, gzip',
  'compress',
  'zstd',
  'garbage',
  '',
];

const compress = (how: string, b: Buffer): Buffer =>
  how === 'gzip' ? gzipSync(b) : how === 'br' ? brotliCompressSync(b) : deflateSync(b);

const SEGMENTS = [
  '.',
  '..',
  '...',
  '%2e',
  '%2e%2e',
  '%2E%2E%2F',
  '%00',
  '%ff',
  '%ED%A0%80',
  '%C0%AF',
  '%',
  '%zz',
  '%2F',
  'a%2Fb',
  '%20',
  '+',
  '~',
  "'",
  '%25',
  '%u0041',
  ';',
  ';a=b',
  '@',
  "!$&()*,=:'",
  '',
  'UPPER',
  '\u00e9', // a raw non-ASCII byte in the request line
];

/** Percent-encodes every byte of the UTF-8 form but the unreserved ones (lone surrogates → U+FFFD). */
const enc = (s: string): string =>
  [...Buffer.from(s, 'utf8')]
    .map((b) =>
      /[A-Za-z0-9\-._~]/.test(String.fromCharCode(b))
        ? String.fromCharCode(b)
        : `%${b.toString(16).toUpperCase().padStart(2, '0')}`,
    )
    .join('');

function segmentArb(name: string, pools: Pools): fc.Arbitrary<string> {
  const pool = pools.params[name] ?? [];
  const one = fc.oneof(
    {
      weight: 10,
      arbitrary: pool.length > 0 ? pick(pool).map((v) => enc(v).replace(/%2F/g, '/')) : pick(TOKENS),
    },
    { weight: 2, arbitrary: fc.string({ maxLength: 12 }).map(enc) },
    { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 6 }).map(enc) },
    { weight: 1, arbitrary: LONE.map(enc) },
    { weight: 3, arbitrary: pick(SEGMENTS) },
    { weight: 1, arbitrary: pick([3, 129, 300, 5000, 20_000]).map((n) => 'a'.repeat(n)) },
    { weight: 1, arbitrary: fc.uuid() },
  );
  if (name !== 'path') return one;
  return fc.oneof(
    { weight: 3, arbitrary: one },
    { weight: 1, arbitrary: fc.array(one, { minLength: 2, maxLength: 4 }).map((xs) => xs.join('/')) },
  );
}

const Q_JUNK = [
  '',
  '-1',
  '0',
  '1001',
  '1e3',
  '1.5',
  '0x10',
  '%201',
  'abc',
  'NaN',
  'Infinity',
  'true',
  '%',
  '%zz',
  '%ED%A0%80',
  '%00',
  '%FF',
  enc('😀'),
  'a+b',
  'a=b=c',
  'x'.repeat(2000),
];

const UNKNOWN_KEYS = [
  'foo',
  'LIMIT',
  'limit[]',
  'limit[a]',
  '__proto__',
  'constructor',
  'a.b',
  '',
  '%zz',
  '%00',
  'wait',
  'dry_run',
];

function queryValueArb(p: { name: string; schema?: Schema }, pools: Pools): fc.Arbitrary<string> {
  const s = p.schema ?? {};
  let valid: string[];
  if (p.name === 'wait')
    valid = ['0', '0.1', '0.2']; // real items may be pending: never hold for long
  else if (p.name === 'cursor') valid = pools.cursors;
  else if (s.enum) valid = s.enum.map(String);
  else if (s.type === 'integer') valid = ['1', '2', '50', '1000'];
  else if (s.type === 'boolean') valid = ['true', 'false', '1', '0'];
  else if (s.format === 'date-time') valid = DATES.map(enc);
  else valid = (pools.fields[p.name] ?? TOKENS).filter((v): v is string => typeof v === 'string').map(enc);
  if (valid.length === 0) valid = ['x'];
  return fc.oneof(
    { weight: 4, arbitrary: pick(valid) },
    { weight: 3, arbitrary: pick(Q_JUNK) },
    { weight: 1, arbitrary: fc.string({ maxLength: 12 }).map(enc) },
    { weight: 1, arbitrary: LONE.map(enc) },
  );
}

function queryArb(route: Route, pools: Pools): fc.Arbitrary<string> {
  const params = (route.op.parameters ?? []).filter((p) => p.in === 'query');
  const pair = fc.oneof(
    ...params.map((p) => ({
      weight: 4,
      arbitrary: fc.tuple(fc.constant(p.name), queryValueArb(p, pools)),
    })),
    { weight: 1, arbitrary: fc.tuple(pick(UNKNOWN_KEYS), pick(Q_JUNK)) },
  );
  return fc.oneof(
    { weight: 9, arbitrary: fc.constant('') },
    {
      weight: 5,
      arbitrary: fc
        .array(fc.tuple(pair, fc.boolean()), { minLength: 1, maxLength: 4 })
        .map((xs) => '?' + xs.map(([[k, v], bare]) => (bare && v === '' ? k : `${k}=${v}`)).join('&')),
    },
    {
      weight: 1,
      arbitrary: pick([
        '?',
        '?&',
        '?&&=&',
        '?=',
        '?=x',
        '??',
        '?a=1&a=2&a=3',
        '?%',
        '?%zz=%zz',
        '?limit=1&limit=2',
        '?a=' + 'b'.repeat(17_000),
      ]),
    },
  );
}

const TRACEPARENTS = [
  '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
  '00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01',
  'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
  '00-00000000000000000000000000000000-00f067aa0ba902b7-01',
  '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01',
  '01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra',
  '  00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01  ',
  '00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
  'garbage',
  '',
  '-'.repeat(300),
];

const AUTH_JUNK = [
  'Bearer arb_00000000000000000000',
  'Bearer',
  'Bearer ',
  'Basic dXNlcjpwYXNz',
  `bearer ${ADMIN_KEY}`,
  `Bearer  ${ADMIN_KEY}  `,
  `Bearer ${ADMIN_KEY}x`,
  `Bearer ${ADMIN_KEY} extra`,
  `Bearer ${'a'.repeat(5000)}`,
  'Bearer arb_\u00e9\u00ff',
  'Token abc',
  ADMIN_KEY,
  '',
];

function headerToken(): fc.Arbitrary<string> {
  return fc.string({
    unit: fc.constantFrom(...'abcdefxyz-_0123456789ABCXYZ!#$%&*+.^`|~'.split('')),
    minLength: 1,
    maxLength: 12,
  });
}

interface Shape {
  /** A clean envelope (documented method, path and listener, admin key, usual headers): the body,
   * path parameters and query reach the handler. Otherwise every header and the request line vary. */
  clean: boolean;
  api: ApiName;
  method: string;
  params: string[];
  pathMutation: string | undefined;
  query: string;
  auth: readonly string[] | undefined;
  body: Body;
  contentType: readonly string[] | undefined | 'default';
  encoding: { header: string; encode: boolean } | undefined;
  chunked: boolean;
  expect: string | undefined;
  accept: string | undefined;
  idempotencyKey: string | undefined;
  traceparent: string | undefined;
  ifMatch: string | undefined;
  requestId: string | undefined;
  extra: [string, string] | undefined;
  upgrade: boolean;
  host: 'normal' | 'none' | 'twice';
  version: string;
}

function requestArb(route: Route, pools: Pools): fc.Arbitrary<Spec> {
  const apis = route.op['x-arbiter-apis'];
  const others = (['engine', 'platform'] as const).filter((x) => !apis.includes(x));
  const paramNames = [...route.template.matchAll(/\{(\w+)\}/g)].map((m) => m[1] as string);
  const shape: fc.Arbitrary<Shape> = fc.record({
    clean: fc.oneof(
      { weight: 5, arbitrary: fc.constant(true) },
      { weight: 4, arbitrary: fc.constant(false) },
    ),
    api:
      others.length > 0
        ? fc.oneof({ weight: 19, arbitrary: pick(apis) }, { weight: 1, arbitrary: pick(others) })
        : pick(apis),
    method: fc.oneof(
      { weight: 22, arbitrary: fc.constant(route.method) },
      { weight: 2, arbitrary: pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) },
      { weight: 1, arbitrary: pick(['TRACE', 'PROPFIND', 'CONNECT', 'SEARCH', 'get']) },
    ),
    params: fc.tuple(...paramNames.map((n) => segmentArb(n, pools))),
    pathMutation: rarely(
      pick([
        'trailing-slash',
        'double-slash',
        'dot-segment',
        'upper',
        'encoded-slash',
        'extra-segment',
        'fragment',
      ]),
    ),
    query: queryArb(route, pools),
    auth: fc.oneof(
      { weight: 16, arbitrary: fc.constant<string[]>([`Bearer ${ADMIN_KEY}`]) },
      { weight: 3, arbitrary: pick(pools.keys).map((k) => [`Bearer ${k}`]) },
      { weight: 1, arbitrary: fc.constant(undefined) },
      { weight: 2, arbitrary: pick(AUTH_JUNK).map((v) => [v]) },
      { weight: 1, arbitrary: pick(AUTH_JUNK).map((v) => [`Bearer ${ADMIN_KEY}`, v]) },
    ),
    body: bodyArb(route, pools),
    contentType: fc.oneof(
      { weight: 14, arbitrary: fc.constant('default' as const) },
      { weight: 5, arbitrary: pick(CONTENT_TYPES).map((t) => [t]) },
      { weight: 1, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: fc.tuple(pick(CONTENT_TYPES), pick(CONTENT_TYPES)).map(([x, y]) => [x, y]) },
    ),
    encoding: fc.oneof(
      { weight: 14, arbitrary: fc.constant(undefined) },
      { weight: 3, arbitrary: pick(ENCODINGS).map((header) => ({ header, encode: false })) },
      { weight: 3, arbitrary: pick(['gzip', 'br', 'deflate']).map((header) => ({ header, encode: true })) },
    ),
    chunked: fc.oneof(
      { weight: 9, arbitrary: fc.constant(false) },
      { weight: 1, arbitrary: fc.constant(true) },
    ),
    expect: rarely(pick(['100-continue', '100-Continue', 'foo', '', '200-ok', '100-continue, foo'])),
    accept: rarely(
      pick([
        'text/html',
        '*/*',
        'application/xml',
        'application/json;q=0',
        'image/*',
        ';;',
        'application/json, text/plain;q=0.5',
      ]),
      6,
    ),
    idempotencyKey: rarely(
      fc.oneof(
        pick(['fuzz-key-1', 'fuzz-key-2', 'fuzz-key-3', '', 'k'.repeat(300), '\u00e9\u00ff']),
        fc.string({ maxLength: 20 }),
      ),
      4,
    ),
    traceparent: rarely(pick(TRACEPARENTS), 4),
    ifMatch: rarely(
      fc.oneof(
        pick(['*', '"x"', 'W/"x"', '""', 'rev-1', '"rev-1"', 'garbage']),
        pick(pools.etags.length ? pools.etags : ['"e"']),
      ),
      4,
    ),
    requestId: rarely(pick(['forged-id', '', 'x'.repeat(500)])),
    extra: rarely(
      fc.oneof(
        fc.tuple(headerToken(), fc.string({ maxLength: 20 })),
        pick<[string, string]>([
          ['X-Long', 'v'.repeat(20_000)],
          ['X-Ctl', 'a\u0001b'],
          ['X-Latin1', '\u00e9\u00ff'],
          ['Bad Name', 'x'],
          ['Content-Length', '5'],
          ['Transfer-Encoding', 'gzip'],
          ['X-Forwarded-For', '1.2.3.4'],
        ]),
      ),
      5,
    ),
    upgrade: fc.oneof(
      { weight: 40, arbitrary: fc.constant(false) },
      { weight: 1, arbitrary: fc.constant(true) },
    ),
    host: fc.oneof(
      { weight: 60, arbitrary: fc.constant('normal' as const) },
      { weight: 1, arbitrary: fc.constant('none' as const) },
      { weight: 1, arbitrary: fc.constant('twice' as const) },
    ),
    version: fc.oneof(
      { weight: 60, arbitrary: fc.constant('HTTP/1.1') },
      { weight: 1, arbitrary: pick(['HTTP/1.0', 'HTTP/2.0', 'HTTP/1.2', 'HTTP/0.9']) },
    ),
  });
  return shape.map((s) => build(route, s));
}

function build(route: Route, shape: Shape): Spec {
  const s: Shape = shape.clean
    ? {
        ...shape,
        api: route.op['x-arbiter-apis'].includes(shape.api)
          ? shape.api
          : (route.op['x-arbiter-apis'][0] as ApiName),
        method: route.method,
        pathMutation: undefined,
        auth: [`Bearer ${ADMIN_KEY}`],
        contentType: 'default',
        encoding: undefined,
        expect: undefined,
        accept: undefined,
        requestId: undefined,
        extra: undefined,
        upgrade: false,
        host: 'normal',
        version: 'HTTP/1.1',
      }
    : shape;
  let i = 0;
  let path = route.template.replace(/\{\w+\}/g, () => s.params[i++] ?? '');
  switch (s.pathMutation) {
    case 'trailing-slash':
      path += '/';
      break;
    case 'double-slash':
      path = '/' + path;
      break;
    case 'dot-segment':
      path = path.replace(/\/([^/]*)$/, '/./$1');
      break;
    case 'upper':
      path = path.toUpperCase();
      break;
    case 'encoded-slash':
      path = '/' + path.slice(1).replace('/', '%2F');
      break;
    case 'extra-segment':
      path += '/extra';
      break;
    case 'fragment':
      path += '#frag';
      break;
  }
  const headers: [string, string][] = [];
  for (const v of s.auth ?? []) headers.push(['Authorization', v]);
  const ct = s.contentType === 'default' ? (s.body.type ? [s.body.type] : []) : (s.contentType ?? []);
  for (const v of ct) headers.push(['Content-Type', v]);
  let bytes = s.body.bytes;
  let encoded: string | undefined;
  let compressed: string | undefined;
  if (s.body.encoding) {
    headers.push(['Content-Encoding', s.body.encoding]);
    encoded = `${s.body.encoding}-encoded`;
  } else if (s.encoding) {
    headers.push(['Content-Encoding', s.encoding.header]);
    if (s.encoding.encode && bytes !== undefined) {
      bytes = compress(s.encoding.header, bytes);
      compressed = s.encoding.header;
      encoded = `${s.encoding.header}-encoded`;
    } else {
      encoded = 'not encoded';
    }
  }
  if (s.expect !== undefined) headers.push(['Expect', s.expect]);
  if (s.accept !== undefined) headers.push(['Accept', s.accept]);
  if (s.idempotencyKey !== undefined) headers.push(['Idempotency-Key', s.idempotencyKey]);
  if (s.traceparent !== undefined) headers.push(['traceparent', s.traceparent]);
  if (s.ifMatch !== undefined) headers.push(['If-Match', s.ifMatch]);
  if (s.requestId !== undefined) headers.push(['X-Request-Id', s.requestId]);
  if (s.extra !== undefined) headers.push(s.extra);
  if (s.host === 'twice') headers.push(['Host', 'evil.example']);
  if (s.upgrade) headers.push(['Connection', 'Upgrade'], ['Upgrade', 'websocket']);
  else headers.push(['Connection', 'close']);
  return {
    route,
    api: s.api,
    req: {
      method: s.method,
      target: path + s.query,
      headers,
      body: bytes,
      chunked: s.chunked,
      version: s.version,
      noHost: s.host === 'none',
    },
    clean: s.clean,
    plain: s.body.bytes,
    encoded,
    compressed,
    note: s.body.note,
  };
}

// ---------------------------------------------------------------------------------------------
// Checks

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** Whether `body` is one of the non-error bodies the document gives for this status. */
function documentedBody(spec: Spec, status: number, body: unknown): boolean {
  if (spec.req.method !== spec.route.method) return false;
  const schema = spec.route.op.responses[String(status)]?.content?.['application/json']?.schema;
  const alts = (schema?.oneOf ?? (schema ? [schema] : [])).filter((a) => !a.$ref);
  return alts.some((a) => {
    if (typeof body !== 'object' || body === null || Array.isArray(body)) return false;
    const o = body as Record<string, unknown>;
    if (!(a.required ?? []).every((k) => k in o)) return false;
    return Object.entries(a.properties ?? {}).every(
      ([k, p]) => !(k in o) || !p.enum || p.enum.includes(o[k]),
    );
  });
}

/**
 * Whether `target` (path and query as sent) is a path of `template`. A generated path can land on
 * another route (an empty {asset} is /console/, a trailing slash on /console too): its success is
 * that route's, so the type this route documents does not apply to it.
 */
function servedByTemplate(template: string, target: string): boolean {
  const path = target.split(/[?#]/)[0] ?? '';
  const re = template
    .split(/(\{\w+\})/)
    .map((part) =>
      part === '{path}'
        ? '.+'
        : /^\{\w+\}$/.test(part)
          ? '[^/]+'
          : part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'),
    )
    .join('');
  return new RegExp(`^${re}$`).test(path);
}

const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Whether a route that takes no body (the document gives it no requestBody) served a request that
 * sent one: only none (or an empty one) and `{}` may be served; anything else is 400 or 415
 * (docs/decisions.md). Judged on clean envelopes only, where the body is framed as sent.
 */
function acceptedUnwantedBody(spec: Spec, r: RawResponse): boolean {
  if (!spec.clean || spec.route.op.requestBody !== undefined) return false;
  if (r.status < 200 || r.status > 299 || !servedByTemplate(spec.route.template, spec.req.target))
    return false;
  const plain = spec.plain;
  if (plain === undefined || plain.length === 0) return false;
  let value: unknown;
  try {
    // As the server reads it: UTF-8 without repair, a leading byte order mark dropped.
    value = JSON.parse(UTF8.decode(plain).replace(/^\ufeff/, ''));
  } catch {
    return true;
  }
  const isEmptyObject =
    typeof value === 'object' && value !== null && !Array.isArray(value) && Object.keys(value).length === 0;
  return !isEmptyObject;
}

function checkResponse(spec: Spec, r: RawResponse): { check: string; detail: string }[] {
  const out: { check: string; detail: string }[] = [];
  if (acceptedUnwantedBody(spec, r)) {
    out.push({ check: 'a route that takes no body served one', detail: `status ${r.status}, ${spec.note}` });
  }
  const ct = r.headers['content-type'] ?? '';
  const rid = r.headers['x-request-id'];
  // Routes that document an X-Request-ID header parameter (AuthZEN) echo the caller's id instead.
  const echoes = (spec.route.op.parameters ?? []).some(
    (p) => p.in === 'header' && p.name.toLowerCase() === 'x-request-id',
  );
  const sent = spec.req.headers.find(([k]) => k.toLowerCase() === 'x-request-id')?.[1];
  const echoed = echoes && sent !== undefined && rid === sent && /^[\x21-\x7e]{1,255}$/.test(sent);
  if (!rid || !(UUID_V7.test(rid) || echoed)) {
    out.push({ check: 'X-Request-Id missing', detail: `status ${r.status}` });
  }
  if (r.status >= 500) out.push({ check: '5xx', detail: `status ${r.status}` });
  const text = r.body.toString('utf8');
  let json: unknown;
  let parsed = false;
  try {
    json = JSON.parse(text);
    parsed = true;
  } catch {
    /* checked below */
  }
  if (r.status >= 400) {
    if (!/^application\/json\b/i.test(ct)) {
      out.push({
        check: 'error not application/json',
        detail: `status ${r.status}, Content-Type ${ct || 'none'}, body ${r.body.length === 0 ? 'empty' : 'not empty'}`,
      });
    } else {
      const exact =
        parsed &&
        typeof json === 'object' &&
        json !== null &&
        !Array.isArray(json) &&
        Object.keys(json).length === 1 &&
        typeof (json as { error?: unknown }).error === 'string' &&
        (json as { error: string }).error !== '';
      if (!exact && !(parsed && documentedBody(spec, r.status, json))) {
        out.push({
          check: 'error body not exactly {"error"}',
          detail: `status ${r.status}, ${parsed ? `JSON ${Array.isArray(json) ? 'array' : typeof json}${typeof json === 'object' && json !== null ? ` with keys ${Object.keys(json).join(',') || 'none'}` : ''}` : 'body not JSON'}`,
        });
      }
      if (exact && /node_modules|file:\/\/|\n\s+at /.test((json as { error: string }).error)) {
        out.push({ check: 'error leaks internals', detail: `status ${r.status}` });
      }
    }
    if (r.status === 401 && !/^Bearer\b/.test(r.headers['www-authenticate'] ?? '')) {
      out.push({ check: '401 without WWW-Authenticate: Bearer', detail: '' });
    }
    if (r.status === 405 && !r.headers['allow']) out.push({ check: '405 without Allow', detail: '' });
  } else if (
    r.status >= 200 &&
    r.status !== 204 &&
    spec.req.method !== 'HEAD' &&
    servedByTemplate(spec.route.template, spec.req.target)
  ) {
    // A success is JSON unless the operation documents another type for it (/metrics, the
    // console's pages) or documents no body at all (a redirect, a 304).
    const documented = spec.route.op.responses[String(r.status)];
    const types = Object.keys(documented?.content ?? {});
    const jsonDocumented = types.length === 0 ? documented === undefined : types.includes('application/json');
    if (jsonDocumented) {
      if (!/^application\/json\b/i.test(ct) || !parsed) {
        out.push({
          check: 'success body not JSON',
          detail: `status ${r.status}, Content-Type ${ct || 'none'}`,
        });
      }
    } else if (types.length > 0 && !types.some((t) => ct.toLowerCase().startsWith(t))) {
      out.push({
        check: 'success body of an undocumented type',
        detail: `status ${r.status}, Content-Type ${ct || 'none'}, documented ${types.join(', ')}`,
      });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reports

const show = (s: string, max = 240): string => {
  const j = JSON.stringify(s.length > max ? s.slice(0, max) : s).slice(1, -1);
  return s.length > max ? `${j}… (${s.length} chars)` : j;
};

function describeSpec(spec: Spec): string {
  const lines = [
    `${spec.api} listener: ${spec.req.method} ${show(spec.req.target, 160)} ${spec.req.version ?? 'HTTP/1.1'}`,
  ];
  if (spec.req.noHost) lines.push('  (no Host header)');
  for (const [k, v] of spec.req.headers) {
    if (k === 'Connection' && v === 'close') continue;
    lines.push(`  ${k}: ${show(v, 120)}`);
  }
  if (spec.req.chunked) lines.push('  Transfer-Encoding: chunked');
  if (spec.plain !== undefined) {
    const text = spec.plain.toString('utf8');
    const printable = Buffer.from(text, 'utf8').equals(spec.plain);
    lines.push(
      `  body (${spec.note}${spec.encoded ? `, ${spec.encoded}` : ''}, ${spec.plain.length} bytes): ` +
        (printable ? show(text) : `hex ${spec.plain.subarray(0, 64).toString('hex')}`),
    );
  }
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------------

/** Runs `fn` over `items` with at most `n` in flight, in order of issue. */
async function inPool<T>(items: T[], n: number, fn: (t: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const t = items[next++] as T;
      await fn(t);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

/** A stable 32-bit seed per operation, so adding a route leaves the others' requests unchanged. */
function seedFor(opId: string): number {
  let h = SEED >>> 0;
  for (const c of opId) h = Math.imul(h ^ c.charCodeAt(0), 0x01000193) >>> 0;
  return h | 0;
}

// ---------------------------------------------------------------------------------------------
// Reduction: the smallest request of a group, stripped of what the violation does not need

function withBody(spec: Spec, plain: Buffer | undefined, note = spec.note): Spec {
  const body = plain !== undefined && spec.compressed ? compress(spec.compressed, plain) : plain;
  return { ...spec, plain, note, req: { ...spec.req, body } };
}

/** Requests one step simpler than `spec`: a header, a query parameter or a body field fewer. */
function* simpler(spec: Spec): Generator<Spec> {
  const hs = spec.req.headers;
  for (let i = 0; i < hs.length; i++) {
    if ((hs[i] as [string, string])[0] === 'Connection') continue;
    yield { ...spec, req: { ...spec.req, headers: hs.filter((_, j) => j !== i) } };
  }
  if (spec.req.noHost) yield { ...spec, req: { ...spec.req, noHost: false } };
  if (spec.req.version !== 'HTTP/1.1') yield { ...spec, req: { ...spec.req, version: 'HTTP/1.1' } };
  if (spec.req.chunked) yield { ...spec, req: { ...spec.req, chunked: false } };
  if (spec.compressed) {
    yield {
      ...spec,
      compressed: undefined,
      encoded: undefined,
      req: { ...spec.req, body: spec.plain, headers: hs.filter(([k]) => k !== 'Content-Encoding') },
    };
  }
  const q = spec.req.target.indexOf('?');
  if (q >= 0) {
    const path = spec.req.target.slice(0, q);
    const parts = spec.req.target.slice(q + 1).split('&');
    yield { ...spec, req: { ...spec.req, target: path } };
    if (parts.length > 1) {
      for (let i = 0; i < parts.length; i++) {
        yield {
          ...spec,
          req: { ...spec.req, target: `${path}?${parts.filter((_, j) => j !== i).join('&')}` },
        };
      }
    }
  }
  if (spec.plain === undefined) return;
  yield withBody(spec, undefined, 'no body');
  let doc: unknown;
  try {
    doc = JSON.parse(spec.plain.toString('utf8'));
  } catch {
    return;
  }
  if (typeof doc !== 'object' || doc === null) return;
  // Every member down to four levels, shallow ones first (removing a parent saves most).
  const paths: PathSeg[][] = [];
  const walk = (v: unknown, at: PathSeg[]) => {
    if (typeof v !== 'object' || v === null || at.length >= 4) return;
    for (const k of Object.keys(v)) paths.push([...at, Array.isArray(v) ? Number(k) : k]);
    for (const [k, x] of Object.entries(v)) walk(x, [...at, Array.isArray(v) ? Number(k) : k]);
  };
  walk(doc, []);
  paths.sort((x, y) => x.length - y.length);
  for (const p of paths) {
    yield withBody(
      spec,
      Buffer.from(jsonText(setPath(doc, p, undefined, true)), 'utf8'),
      spec.note.endsWith(', reduced') ? spec.note : `${spec.note}, reduced`,
    );
  }
}

/** Greedy reduction: keep taking the first simpler request that still shows the violation. */
async function reduce(spec: Spec, still: (s: Spec) => Promise<boolean>, budget = 80): Promise<Spec> {
  let cur = spec;
  for (let changed = true; changed && budget > 0;) {
    changed = false;
    for (const c of simpler(cur)) {
      if (budget-- <= 0) break;
      if (await still(c)) {
        cur = c;
        changed = true;
        break;
      }
    }
  }
  return cur;
}

// ---------------------------------------------------------------------------------------------

interface Found {
  check: string;
  detail: string;
}

interface Sent {
  status: number | null;
  found: Found[];
  requestId: string | null;
  /** Ids the answer names (request, decision, event, token ids): to tie audit events to requests. */
  ids: string[];
  /** For statistics when there is no status. */
  outcome?: string;
}

function combine(found: Found[]): Found {
  const detail = found.map((f) => f.detail).reduce((x, y) => (y.length > x.length ? y : x), '');
  return { check: found.map((f) => f.check).join(' + '), detail };
}

const UUID_ANY = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function idsIn(r: RawResponse): string[] {
  const ids: string[] = [];
  const rid = r.headers['x-request-id'];
  if (rid) ids.push(rid);
  try {
    const walk = (v: unknown, depth: number) => {
      if (typeof v === 'string' && UUID_ANY.test(v)) ids.push(v);
      else if (typeof v === 'object' && v !== null && depth < 3)
        for (const x of Object.values(v)) walk(x, depth + 1);
    };
    walk(JSON.parse(r.body.toString('utf8')), 0);
  } catch {
    /* not JSON */
  }
  return ids;
}

// Every backend: what the fuzzer sends reaches storage (and the chain must stay verifiable).
onEveryBackend('fuzzing every route of the OpenAPI document', function () {
  let a: Arbiter;
  let routes: Route[] = [];
  let pools: Pools;
  const violations: Violation[] = [];
  let dropped = 0;
  const statusCounts = new Map<string, number>();
  const perRoute = new Map<string, { counts: Map<string, number>; ms: number }>();
  const undocumented = new Map<string, number>();
  const chainBad: { route: string; event: AuditEvent; spec: Spec | undefined }[] = [];
  let requests = 0;
  let lastEventId: string | undefined;
  /** Server-side causes of 5xx, from the process's error log, by request id. */
  const causes = new Map<string, string>();
  let logsRead = 0;

  const base = (api: ApiName) => (api === 'engine' ? a.engine : a.platform);

  function readLogs(): void {
    for (; logsRead < a.logs.length; logsRead++) {
      try {
        const rec = JSON.parse(a.logs[logsRead] as string) as {
          msg?: string;
          requestId?: string;
          err?: { type?: string; message?: string } | string;
          cause?: string;
        };
        if (rec.msg === 'request failed' && rec.requestId) {
          const e = rec.err;
          causes.set(
            rec.requestId,
            // An outage's repeats carry `cause` instead of the whole error (errorMiddleware).
            typeof e === 'string'
              ? e
              : e === undefined
                ? (rec.cause ?? '?')
                : `${e.type ?? 'Error'}: ${e.message ?? '?'}`,
          );
        }
      } catch {
        /* not JSON */
      }
    }
  }

  async function causeOf(requestId: string | null): Promise<string> {
    if (!requestId) return 'no request id';
    for (let i = 0; i < 20; i++) {
      readLogs();
      const c = causes.get(requestId);
      if (c) return c;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    return 'no error logged';
  }

  before(async function () {
    this.timeout(120_000);
    // A request that announces a body it never sends (an extra `Content-Length: 5`) is answered
    // when the request timeout ends it (408): every route reads a body sent to it, those that take
    // none included. Within the 20 s a raw request waits, not the default 30 s.
    a = await Arbiter.start({ ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS: '10' });
    const requester = a.createKey('fuzz-requester', ['authorize', 'queue:read']);
    // The strongest tenant-bound key there is: every scope but admin, which no bound key may hold.
    const tenantKey = a.createKey(
      'fuzz-tenant-all',
      SCOPES.filter((s) => s !== 'admin'),
      { tenant: 'acme' },
    );
    const agentKey = a.createKey('fuzz-agent', ['authorize', 'queue:read', 'tokens:mint'], {
      agent: 'deploy-bot',
    });
    const weak = a.createKey('fuzz-weak', ['metrics:read']);

    const doc = (await call('GET', a.platform + '/openapi.json')).json as {
      paths: Record<string, Record<string, Operation>>;
    };
    for (const [template, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item))
        routes.push({ method: method.toUpperCase(), template, op });
    }
    routes = routes.sort((x, y) => x.op.operationId.localeCompare(y.op.operationId));

    // Real ids, names and tokens, so that generated requests also reach past "not found".
    const pending: string[] = [];
    const allowed: string[] = [];
    const traces: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        key: requester,
        body: AGENT.approval,
      });
      pending.push(r.json.request_id as string);
      traces.push(r.json.trace_id as string);
    }
    for (let i = 0; i < 2; i++) {
      const r = await call('POST', a.engine + '/v1/authorize', { key: requester, body: HUMAN.approval });
      pending.push(r.json.request_id as string);
    }
    for (let i = 0; i < 8; i++) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
      allowed.push(r.json.request_id as string);
      traces.push(r.json.trace_id as string);
    }
    const tokens: string[] = [];
    const tokenIds: string[] = [];
    for (const id of allowed.slice(0, 3)) {
      const r = await call('POST', a.engine + '/v1/tokens/mint', { body: { request_id: id } });
      tokens.push(r.json.token as string);
      tokenIds.push(r.json.token_id as string);
    }
    const policies = (
      (await call('GET', a.platform + '/api/v1/policies')).json.policies as { name: string }[]
    ).map((p) => p.name);
    const etags: string[] = [];
    for (const name of policies) {
      const e = (await call('GET', `${a.platform}/api/v1/policies/${name}`)).headers.get('etag');
      if (e) etags.push(e);
    }
    const dataPaths = (
      (await call('GET', a.platform + '/api/v1/data')).json.documents as { path: string }[]
    ).map((d) => d.path);
    const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64url');
    pools = {
      keys: [requester, tenantKey, agentKey, weak],
      etags,
      params: {
        id: [...pending, ...allowed],
        tokenID: tokenIds,
        traceID: traces,
        name: ['fuzz-p1', 'fuzz-p2', ...policies, 'authz'],
        path: ['fuzz/a', 'fuzz/a/b', ...dataPaths, 'agents/deploy-bot'],
      },
      fields: {
        agent_id: ['deploy-bot', 'finance-bot', 'data-bot', 'unknown-agent'],
        action: ['read', 'deploy', 'delete', 'list', 'payments.transfer'],
        resource: ['repo/arbiter', 'prod/api', 'prod/db', 'prod/secrets/key'],
        type: ['project', 'repo'],
        id: ['p1', 'p2'],
        tenant_id: ['acme', 'globex'],
        user_id: ['alice', 'bob', 'carol'],
        request_id: [...allowed, ...pending],
        token: [...tokens, 'eyJhbGciOiJub25lIn0.e30.'],
        trace_id: traces,
        kind: ['fuzz.event', 'custom.thing', 'decision', 'policy.put'],
        subject: ['svc-fuzz'],
        scopes: ['read:repo/arbiter', 'deploy:prod/api'],
        note: ['looks fine'],
        audience: ['arbiter', 'other-service'],
        rego: REGO,
        description: ['fuzzed policy'],
        message: ['forwarded event'],
        actor: ['other-engine'],
      },
      // Sealed with the service's own key (cursors are sealed), so that each list's position
      // checks are reached, and a few the seal alone refuses.
      cursors: [
        ...(await Promise.all(
          [
            ['audit', '1'],
            ['audit', '999999'],
            ['audit', '0'],
            ['audit', 'x'],
            ['audit-t', '2026-01-01T00:00:00.000Z|1'],
            ['policies', 'agent'],
            ['data', 'agents'],
            ['revisions', '1'],
            ['queue', 'x'],
            ['trace', `${traces[0] ?? 'x'}|1`],
          ].map(([kind, position]) => sealedCursor(a, kind!, position!)),
        )),
        b64('audit:1'),
        b64('\ud800'),
        'not base64!',
        'A'.repeat(600),
      ],
    };
    const head = await call('GET', a.platform + '/api/v1/audit?limit=1');
    lastEventId = (head.json?.events?.[0] as AuditEvent | undefined)?.id;
  });

  after(async () => {
    await a?.close();
  });

  /** Events appended since the last look, re-hashed as `audit verify` does; returns those that fail. */
  async function newBadEvents(): Promise<AuditEvent[]> {
    const fresh: AuditEvent[] = [];
    let cursor: string | undefined;
    outer: for (;;) {
      const r = await call(
        'GET',
        `${a.platform}/api/v1/audit?limit=1000${cursor ? `&cursor=${cursor}` : ''}`,
      );
      if (r.status !== 200)
        throw new Error(`GET /api/v1/audit answered ${r.status}: ${r.text.slice(0, 200)}`);
      for (const e of r.json.events as AuditEvent[]) {
        if (e.id === lastEventId) break outer;
        fresh.push(e);
      }
      cursor = r.json.next_cursor as string | undefined;
      if (!cursor) break;
    }
    if (fresh.length > 0) lastEventId = (fresh[0] as AuditEvent).id;
    return fresh.reverse().filter((e) => {
      const { hash, ...content } = e;
      return sha256Hex(canonicalJson(content)) !== hash;
    });
  }

  async function send(spec: Spec): Promise<Sent> {
    try {
      const r = await rawRequest(base(spec.api), spec.req);
      if (TRACE && `${spec.route.method} ${spec.route.template}`.includes(TRACE)) {
        console.log(`${describeSpec(spec)}\n  → ${r.status} ${show(r.body.toString('utf8'), 200)}`);
      }
      const found = checkResponse(spec, r);
      // Every answer is also held to the OpenAPI document, as call() holds those of the suite
      // (a request-target that is not an origin-form path is left to the checks above).
      if (/^\/[^?#]*(\?.*)?$/.test(spec.req.target)) {
        const text = r.body.toString('utf8');
        let json: unknown;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        try {
          await checkAnswer(
            spec.req.method,
            base(spec.api) + spec.req.target,
            r.status,
            r.headers['content-type'] ?? null,
            text,
            json,
            true,
          );
        } catch (e) {
          found.push({
            check: 'answer off the OpenAPI document',
            detail: (e as Error).message.slice(0, 400),
          });
        }
      }
      return {
        status: r.status,
        found,
        requestId: r.headers['x-request-id'] ?? null,
        ids: r.status < 500 && spec.req.method !== 'GET' ? idsIn(r) : [],
      };
    } catch (err) {
      const why = err instanceof NoResponse ? err.message : String(err);
      const code = err instanceof NoResponse ? err.code : undefined;
      if (
        (code === 'EPIPE' || code === 'ECONNRESET') &&
        (spec.req.body?.length ?? 0) > 256 * 1024 &&
        spec.req.method !== 'CONNECT'
      ) {
        // The server answered before reading the body (413, 401, a bad query parameter…) and closed
        // while a large body was still being written (more than the socket buffers hold); the reset
        // can destroy the answer before it is read. A race of the client, counted, not failed.
        return { status: null, found: [], requestId: null, ids: [], outcome: 'reset during a large upload' };
      }
      return { status: null, found: [{ check: 'no HTTP response', detail: why }], requestId: null, ids: [] };
    }
  }

  const titleOf = async (check: string, detail: string, requestId: string | null) => {
    const cause = check === '5xx' ? ` — ${await causeOf(requestId)}` : '';
    return `${check}${detail ? `: ${detail}` : ''}${cause}`;
  };

  it('answers every generated request with a JSON error or a documented success, never a 5xx', async function () {
    this.timeout(60_000 + RUNS * routes.length * 40);
    const started = Date.now();
    for (const route of routes) {
      const key = `${route.method} ${route.template}`;
      const specs = [
        ...(RUNS > 0 ? probeSpecs(route, pools) : []),
        ...fc.sample(requestArb(route, pools), { seed: seedFor(route.op.operationId), numRuns: RUNS }),
      ];
      const counts = new Map<string, number>();
      const routeStarted = Date.now();
      const byId = new Map<string, Spec>();
      await inPool(specs, CONCURRENCY, async (spec) => {
        const { status, found, requestId, ids, outcome } = await send(spec);
        requests++;
        const s = status === null ? (outcome ?? 'none') : String(status);
        statusCounts.set(s, (statusCounts.get(s) ?? 0) + 1);
        counts.set(s, (counts.get(s) ?? 0) + 1);
        if (status !== null && spec.clean && !(String(status) in spec.route.op.responses) && status !== 404) {
          const u = `${key} → ${status}`;
          undocumented.set(u, (undocumented.get(u) ?? 0) + 1);
        }
        for (const id of ids) byId.set(id, spec);
        // One violation per response: its checks together (a bare 417 lacks a body AND a request id).
        if (found.length > 0) {
          const v = found.length === 1 ? (found[0] as Found) : combine(found);
          if (violations.length < KEEP) violations.push({ ...v, status, requestId, spec });
          else dropped++;
        }
      });
      perRoute.set(key, { counts, ms: Date.now() - routeStarted });
      try {
        for (const event of await newBadEvents()) {
          const d = event.details as { token_id?: unknown } | null;
          const spec = [event.id, event.request_id, d?.token_id]
            .map((id) => byId.get(String(id)))
            .find(Boolean);
          chainBad.push({ route: key, event, spec });
        }
      } catch (err) {
        violations.push({
          check: 'audit trail unreadable',
          detail: String(err),
          status: null,
          requestId: null,
          spec: specs[0] as Spec,
        });
      }
    }
    const seconds = (Date.now() - started) / 1000;

    // Grouped by what went wrong, not by route: one transport defect shows on every route.
    const host = new URL(a.engine).host;
    interface Group {
      title: string;
      count: number;
      routes: Map<string, number>;
      smallest: Violation;
      size: number;
    }
    const groups = new Map<string, Group>();
    for (const v of violations) {
      const title = await titleOf(v.check, v.detail, v.requestId);
      const size = encodeRequest(host, v.spec.req).length;
      const routeKey = `${v.spec.req.method} ${v.spec.route.template}`;
      const g = groups.get(title);
      if (!g) groups.set(title, { title, count: 1, routes: new Map([[routeKey, 1]]), smallest: v, size });
      else {
        g.count++;
        g.routes.set(routeKey, (g.routes.get(routeKey) ?? 0) + 1);
        if (size < g.size) {
          g.smallest = v;
          g.size = size;
        }
      }
    }
    const chainGroups = new Map<
      string,
      { count: number; event: AuditEvent; spec: Spec | undefined; size: number }
    >();
    for (const c of chainBad) {
      const kind = isReservedKind(c.event.kind) ? JSON.stringify(c.event.kind) : '(ingested)';
      const k = `${c.route}, event kind ${kind}`;
      const size = c.spec ? encodeRequest(host, c.spec.req).length : Infinity;
      const g = chainGroups.get(k);
      if (!g) chainGroups.set(k, { count: 1, event: c.event, spec: c.spec, size });
      else {
        g.count++;
        if (size < g.size) Object.assign(g, { event: c.event, spec: c.spec, size });
      }
    }

    const out: string[] = [];
    out.push(
      `fuzz: ${requests} requests over ${routes.length} routes (${RUNS} each, seed ${SEED}, concurrency ${CONCURRENCY}) in ${seconds.toFixed(1)} s`,
    );
    const fmt = (m: Map<string, number>) =>
      [...m.entries()]
        .sort(([x], [y]) => x.localeCompare(y))
        .map(([k, n]) => `${k}×${n}`)
        .join(' ');
    out.push(`statuses: ${fmt(statusCounts)}`);
    for (const [k, { counts, ms }] of perRoute)
      out.push(`  ${k} (${(ms / 1000).toFixed(1)} s): ${fmt(counts)}`);
    if (undocumented.size > 0) {
      out.push(
        'statuses of clean requests that the OpenAPI document does not list (information, not failures):',
      );
      for (const [k, n] of [...undocumented.entries()].sort()) out.push(`  ${k} ×${n}`);
    }
    const sorted = [...groups.values()].sort((x, y) => y.count - x.count || x.title.localeCompare(y.title));
    out.push(
      `violations: ${violations.length + dropped} in ${sorted.length} groups; audit events failing their hash: ${chainBad.length}`,
    );
    // Each group's smallest request, reduced to what still reproduces it (sent again, one by one).
    const reducing = Date.now();
    for (const g of sorted) {
      const v = g.smallest;
      const reduced = await reduce(v.spec, async (c) => {
        const r = await send(c);
        if (r.found.length === 0) return false;
        const f = r.found.length === 1 ? (r.found[0] as Found) : combine(r.found);
        return (await titleOf(f.check, f.detail, r.requestId)) === g.title;
      });
      out.push(`\n[${g.count}×] ${g.title}`);
      out.push(`  routes: ${[...g.routes.entries()].map(([r, n]) => `${r} (${n})`).join(', ')}`);
      out.push(`  reproduction (status ${v.status ?? 'none'}):`);
      out.push(describeSpec(reduced).replace(/^/gm, '    '));
    }
    for (const [k, g] of chainGroups) {
      const e = g.event;
      const broken = Object.entries(e)
        .filter(([, val]) => JSON.stringify(val ?? null).includes('\ufffd'))
        .map(([f]) => f);
      out.push(`\n[${g.count}×] audit event fails its hash: ${k}`);
      out.push(`  fields holding U+FFFD as stored: ${broken.join(', ') || 'none'}`);
      const { hash: _h, prev_hash: _p, time: _t, ...rest } = e;
      out.push(`  event: ${show(JSON.stringify(rest), 500)}`);
      if (g.spec) {
        // Events written by earlier reductions are not this request's doing: skip past them first.
        await newBadEvents();
        const reduced = await reduce(g.spec, async (c) => {
          await send(c);
          return (await newBadEvents()).length > 0;
        });
        out.push('  reproduction:');
        out.push(describeSpec(reduced).replace(/^/gm, '    '));
      }
    }
    out.push(`\n(reductions took ${((Date.now() - reducing) / 1000).toFixed(1)} s)`);
    console.log(out.join('\n'));

    expect(
      sorted
        .map((g) => `${g.count}× ${g.title}`)
        .concat([...chainGroups.entries()].map(([k, g]) => `${g.count}× audit event fails its hash: ${k}`)),
      'violations (see the report above)',
    ).to.deep.equal([]);
  });

  it('leaves the process alive: /healthz answers 200 on both listeners', async () => {
    for (const api of ['engine', 'platform'] as const) {
      const r = await call('GET', base(api) + '/healthz', { key: null });
      expect(r.status, r.text).to.equal(200);
    }
  });

  it('leaves every stored policy matching its own sha256', async () => {
    const mismatched: string[] = [];
    let cursor: string | undefined;
    do {
      const r = await call(
        'GET',
        `${a.platform}/api/v1/policies?limit=1000${cursor ? `&cursor=${cursor}` : ''}`,
      );
      expect(r.status, r.text).to.equal(200);
      for (const p of r.json.policies as { name: string }[]) {
        const g = await call('GET', `${a.platform}/api/v1/policies/${encodeURIComponent(p.name)}`);
        const actual = createHash('sha256').update(String(g.json?.rego), 'utf8').digest('hex');
        if (g.status !== 200 || actual !== g.json.sha256) {
          mismatched.push(
            `${p.name}: sha256 ${String(g.json?.sha256)}, source hashes to ${actual}: ${show(String(g.json?.rego), 120)}`,
          );
        }
      }
      cursor = r.json.next_cursor ?? undefined;
    } while (cursor);
    expect(mismatched, 'policies whose stored source no longer matches their sha256').to.deep.equal([]);
  });

  it('leaves the audit chain intact: GET /api/v1/audit/verify is ok', async () => {
    const r = await call('GET', a.platform + '/api/v1/audit/verify');
    expect(r.status, r.text).to.equal(200);
    expect(r.json, r.text).to.include({ ok: true });
  });
});
