import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { invalid } from '../errors.js';
import { INVISIBLE_CLASS } from './invisible.js';
import { scanJson } from './json-scan.js';

/**
 * JSON Schemas are the single source for request validation (and for the OpenAPI document).
 * Failures become one 400 message that names the field.
 */
const ajv = new Ajv({ allErrors: false, strict: true, allowUnionTypes: true, verbose: true });
ajv.addFormat('date-time', { type: 'string', validate: isRfc3339 });

/**
 * Hours 00–23, minutes and seconds 00–59 (in the offset too). `24:00` is ISO 8601's end of day,
 * not RFC 3339, and Date.parse would read it as the next day's midnight. A leap second (`:60`) is
 * refused as well: JavaScript's clock has none, and reading it as `:59` would move the instant.
 */
const RFC3339 =
  /^\d{4}-\d{2}-\d{2}[Tt](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?([Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)$/;

/**
 * An RFC 3339 date-time with a time zone, that is also a real instant (no Feb 30) whose UTC form
 * is RFC 3339 too: `9999-12-31T23:59:59-23:59` is year 10000 in UTC, and `0000-01-01T00:00:00+01:00`
 * year -1, which toISOString writes as `+010000-…` / `-000001-…` (stored, compared as text and
 * put in cursors, all of which expect four digits).
 */
export function isRfc3339(s: string): boolean {
  if (!RFC3339.test(s)) return false;
  const t = Date.parse(s);
  if (Number.isNaN(t)) return false;
  const utcYear = new Date(t).getUTCFullYear();
  if (utcYear < 0 || utcYear > 9999) return false;
  const [y, m, d] = s.slice(0, 10).split('-').map(Number) as [number, number, number];
  return d <= new Date(Date.UTC(y, m, 0)).getUTCDate();
}

/**
 * The first whole millisecond at or after the instant an RFC 3339 text (isRfc3339) names, as
 * ISO 8601 UTC, or undefined when that is past year 9999. Times are stored to the millisecond, so
 * a bound finer than that selects exactly the stored times it should, `>=` and `<` alike, at its
 * next millisecond; cut to its millisecond (as Date.parse reads it) it selected the opposite.
 */
export function millisecondAtOrAfter(s: string): string | undefined {
  const beyondMs = /\.\d{3}(\d+)/.exec(s)?.[1] ?? '';
  const t = Date.parse(s) + (/[1-9]/.test(beyondMs) ? 1 : 0);
  return new Date(t).getUTCFullYear() > 9999 ? undefined : new Date(t).toISOString();
}

/**
 * Identifiers, actions and resources carry no whitespace or control characters: they end up in
 * token scopes (space-delimited, RFC 6749 §3.3) and in logs, where either would let one value
 * pass for several. Control characters are C0, DEL and C1 (U+0080–U+009F: NEL is a line break to
 * some log readers, CSI starts a terminal escape); JavaScript's `\s` covers none of C1. Nor do
 * they carry invisible characters (INVISIBLE_CLASS): they make a value read as another one to the
 * reviewer who approves it (`\u202Ebd/dorp` shows as "prod/db").
 */
export const TOKEN_SAFE = `^[^\\s\\x00-\\x1f\\x7f-\\x9f${INVISIBLE_CLASS}]+$`;
const TOKEN_SAFE_RE = new RegExp(TOKEN_SAFE, 'u');

/**
 * A name made of ASCII letters and digits, joined by `.`, `_`, `:` or `-` (`edge.decision`,
 * `aws:s3.put-object`), starting and ending with a letter or digit. Stricter than TOKEN_SAFE for
 * names that must not read as another one in any font: no look-alike letters of other scripts
 * (a Cyrillic `о` in `decisiоn`), no one-dot leader U+2024 for `.`, and nothing that hides at
 * either end. Ingested audit event kinds use it (src/audit/kinds.ts says why).
 */
export const ASCII_NAME = '^[A-Za-z0-9](?:[A-Za-z0-9._:-]*[A-Za-z0-9])?$';
export const ASCII_NAME_RULE =
  'ASCII letters and digits, joined by . _ : or - (starting and ending with a letter or digit)';

/** TOKEN_SAFE outside a JSON Schema (settings, key bindings). */
export const isTokenSafe = (s: string): boolean => TOKEN_SAFE_RE.test(s);

/**
 * A dot as some resource server reads one: `.`, percent-encoded once (`%2e`, which RFC 3986
 * decodes before it removes dot-segments) or twice (`%252e`, for a server that decodes twice), or
 * the overlong UTF-8 `%c0%ae` (old IIS), or a character that Unicode compatibility mapping (NFKC,
 * Windows' best-fit) turns into `.`: U+FF0E fullwidth, U+FE52 small, U+2024 one-dot leader (and
 * U+2025, the two-dot leader, into `..`: DOT_SEGMENT). (A JSON Schema pattern has no flags: `[eE]`;
 * those characters are in it as themselves, since RE2-based tools take no `\u` escape.)
 */
const DOT = '(?:\\.|%2[eE]|%252[eE]|%[cC]0%[aA][eE]|\uFF0E|\uFE52|\u2024)';
/**
 * A path separator as some resource server reads one: `/`, `\` (Windows, and servers that treat
 * it as `/`), either percent-encoded once or twice (`%2F`, `%5C`, `%252F`: a server that decodes
 * before it splits the path; `%c0%af` overlong), or its compatibility forms (U+FF0F, U+FF3C,
 * U+FE68).
 */
const SEP = '(?:/|\\\\|%2[fF]|%5[cC]|%252[fF]|%255[cC]|%[cC]0%[aA][fF]|\uFF0F|\uFF3C|\uFE68)';
/**
 * A `.` or `..` path segment: one or two dots (DOT) making up the whole value, or a run between
 * separators (SEP) or at either end (`..`, `./x`, `a/../b`, `a/.`, `x%2F..%2Fy`), also when the
 * run ends the path part at `;` (Tomcat's `..;/`, a path parameter), `?` or `#`. Other dots
 * (`logs.read`, `.hidden`, `...`, `..x`) are not segments.
 */
const DOT_SEGMENT = `(?:^|${SEP})(?:${DOT}{1,2}|\u2025)(?:${SEP}|[;?#]|$)`;

/**
 * Schema keywords of a resource, resource type or resource id: no dot-segment. Policies match
 * resources as written, by prefix or glob, while a resource server that normalises the path acts
 * on another one: `repo/../prod/db` passes a `repo/**` rule and names `prod/db`. Refusing the form
 * is the only answer that is right for every policy.
 */
export const NO_DOT_SEGMENTS = {
  not: { type: 'string', pattern: DOT_SEGMENT },
  description:
    'no "." or ".." path segment: between "/" or "\\" separators or at either end, also ended by ";", "?" or "#"; ' +
    'dots and separators also percent-encoded (once or twice) or in their Unicode compatibility forms',
} as const;

export type JsonSchema = Record<string, unknown>;

export function compileSchema<T>(schema: JsonSchema): (body: unknown) => T {
  const validate: ValidateFunction = ajv.compile(schema);
  return (body: unknown): T => {
    if (!validate(body)) throw invalid(describe(validate.errors?.[0], body));
    return body as T;
  };
}

function fieldOf(e: ErrorObject): string {
  const p = e.instancePath
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  return p.join('.');
}

function valueAt(body: unknown, e: ErrorObject): unknown {
  let v: unknown = body;
  for (const seg of e.instancePath.split('/').slice(1)) v = (v as Record<string, unknown>)?.[seg];
  return v;
}

function describe(e: ErrorObject | undefined, body: unknown): string {
  if (!e) return 'invalid request body';
  const field = fieldOf(e);
  const where = field === '' ? 'request body' : field;
  switch (e.keyword) {
    case 'required':
      return `missing required field: ${field ? field + '.' : ''}${(e.params as { missingProperty: string }).missingProperty}`;
    case 'additionalProperties':
      return `unknown field: ${field ? field + '.' : ''}${(e.params as { additionalProperty: string }).additionalProperty}`;
    case 'type': {
      const v = valueAt(body, e);
      const s = e.parentSchema as { minimum?: number; maximum?: number };
      if (typeof v === 'number' && !Number.isFinite(v) && s.minimum !== undefined) {
        return rangeMessage(where, s, String(v));
      }
      return `${where} must be ${article((e.params as { type: string | string[] }).type)}`;
    }
    case 'minLength':
      return (e.params as { limit: number }).limit === 1
        ? `${where} must not be empty`
        : `${where} must be at least ${(e.params as { limit: number }).limit} characters`;
    case 'maxLength':
      return `${where} must be at most ${(e.params as { limit: number }).limit} characters`;
    case 'minimum':
    case 'maximum':
      return rangeMessage(where, e.parentSchema as RangeSchema, String(valueAt(body, e)));
    case 'minItems':
      return `${where} must have at least ${(e.params as { limit: number }).limit} item(s)`;
    case 'maxItems':
      return `${where} must have at most ${(e.params as { limit: number }).limit} items`;
    case 'format':
      return `${where} must be an RFC 3339 date-time`;
    case 'pattern':
      switch ((e.params as { pattern: string }).pattern) {
        case TOKEN_SAFE:
          return `${where} must not contain whitespace, control or invisible characters`;
        case ASCII_NAME:
          return `${where} must be ${ASCII_NAME_RULE}`;
        default:
          return `${where} must match ${(e.params as { pattern: string }).pattern}`;
      }
    case 'not':
      return (e.parentSchema as { not?: { pattern?: string } }).not?.pattern === DOT_SEGMENT
        ? `${where} must not contain a "." or ".." path segment`
        : `${where} ${e.message ?? 'is invalid'}`;
    case 'enum':
      return `${where} must be one of ${((e.params as { allowedValues: unknown[] }).allowedValues ?? []).join(', ')}`;
    default:
      return `${where} ${e.message ?? 'is invalid'}`;
  }
}

interface RangeSchema {
  minimum?: number;
  maximum?: number;
  type?: string;
}

/** The one text of a number outside its range (SPEC §5: "confidence out of range: must be between 0.0 and 1.0, got 1.5"). */
function rangeMessage(where: string, s: RangeSchema, got: string): string {
  const f = s.type === 'integer' ? String : fmt;
  return `${where} out of range: must be between ${f(s.minimum)} and ${f(s.maximum)}, got ${got}`;
}

/** The schema `schema` gives its own top-level member `at` (never an inherited name), if any. */
function memberSchema(schema: JsonSchema, at: string): unknown {
  const properties = schema.properties as Record<string, unknown> | undefined;
  return properties !== undefined && Object.hasOwn(properties, at) ? properties[at] : undefined;
}

/**
 * The range error for the number a JSON object text holds at its top-level member `at`, when
 * `schema` gives that member a range and the number, exactly as written, lies outside it; else
 * undefined. For the numbers JSON.parse cannot hand on as written (1e999 becomes Infinity,
 * 1.00000000000000001 becomes 1, -1e-400 becomes -0): one that is out of range is told so, with
 * the number it sent, as any other out-of-range number is (the seed: out-of-range confidence is a
 * 400 naming the field as out of range), rather than that it is too large or inexact.
 */
export function rangeErrorAt(text: string, schema: JsonSchema, at: string): string | undefined {
  const s = memberSchema(schema, at) as RangeSchema | undefined;
  if (s?.minimum === undefined || s.maximum === undefined) return undefined;
  let literal: string | undefined;
  // The last number at that path: JSON.parse keeps the last of a repeated key.
  scanJson(text, {
    number: (l, place) => {
      if (place.path() === at && place.parentPath() === '') literal = l;
      return undefined;
    },
  });
  if (literal === undefined) return undefined;
  const inside =
    compareDecimal(literal, String(s.minimum)) >= 0 && compareDecimal(literal, String(s.maximum)) <= 0;
  if (inside) return undefined;
  return rangeMessage(at, s, literal.length > 48 ? `${literal.slice(0, 48)}…` : literal);
}

/**
 * Whether `schema` types its top-level member `at` as a number only, so that a caller told its
 * number is inexact cannot send it as a string and must be told to send fewer digits instead.
 */
export function isNumericMemberOf(schema: JsonSchema, at: string): boolean {
  const type = (memberSchema(schema, at) as { type?: unknown } | undefined)?.type;
  const types = Array.isArray(type) ? type : [type];
  return types.length > 0 && types.every((t) => t === 'number' || t === 'integer');
}

/** -1, 0 or 1 as JSON number literal `a` is below, equal to or above `b`, exactly, whatever their size. */
export function compareDecimal(a: string, b: string): number {
  const x = decimalParts(a);
  const y = decimalParts(b);
  if (x === undefined || y === undefined) throw new Error(`not a JSON number: ${x ? b : a}`);
  if (x.sign !== y.sign) return x.sign < y.sign ? -1 : 1;
  if (x.sign === 0) return 0;
  let magnitude: number;
  if (x.scale !== y.scale) magnitude = x.scale < y.scale ? -1 : 1;
  else {
    const n = Math.max(x.digits.length, y.digits.length);
    const dx = x.digits.padEnd(n, '0');
    const dy = y.digits.padEnd(n, '0');
    magnitude = dx === dy ? 0 : dx < dy ? -1 : 1;
  }
  return magnitude * x.sign;
}

/** A JSON number literal as sign, significant digits and the power of ten of its first digit (0 has sign 0); undefined for anything else. */
function decimalParts(literal: string): { sign: number; digits: string; scale: bigint } | undefined {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(literal);
  if (!m) return undefined;
  const [, minus = '', whole = '', fraction = '', exponent = '0'] = m;
  const all = whole + fraction;
  const lead = all.length - all.replace(/^0+/, '').length;
  const digits = all.slice(lead).replace(/0+$/, '');
  if (digits === '') return { sign: 0, digits: '', scale: 0n };
  return {
    sign: minus === '-' ? -1 : 1,
    digits,
    scale: BigInt(exponent) + BigInt(whole.length - 1 - lead),
  };
}

function fmt(n: number | undefined): string {
  if (n === undefined) return '?';
  return Number.isInteger(n) ? n.toFixed(1) : String(n);
}

function article(type: string | string[]): string {
  // ajv reports a union type (["string", "null"]) as an array or a comma-joined string.
  const t = (Array.isArray(type) ? type.join(',') : String(type)).replace(/,/g, ' or ');
  return /^[aeiou]/.test(t) ? `an ${t}` : `a ${t}`;
}

/**
 * Whether a string is storable as it was received: well-formed UTF-16 (no lone surrogate, which
 * UTF-8 storage would silently replace) and free of U+0000 (which PostgreSQL text cannot hold).
 * Refusing both at the edge means every stored string is the string that was hashed and answered.
 */
export function isStorableString(s: string): boolean {
  return s.isWellFormed() && !s.includes('\0');
}

/**
 * The first value in `value` that cannot be stored as received, with its dotted path: a string or
 * key holding a lone surrogate or U+0000, or a number JSON.parse turned into Infinity (1e400),
 * which would be written back as null. The caller may skip the walk when the raw JSON text
 * matches MAY_HOLD_UNSTORABLE.
 */
export function findUnstorable(value: unknown): { at: string; what: 'string' | 'number' } | undefined {
  const stack: [unknown, string][] = [[value, '']];
  while (stack.length > 0) {
    const [v, at] = stack.pop() as [unknown, string];
    if (typeof v === 'string') {
      if (!isStorableString(v)) return { at: at || 'request body', what: 'string' };
    } else if (typeof v === 'number') {
      if (!Number.isFinite(v)) return { at: at || 'request body', what: 'number' };
    } else if (typeof v === 'object' && v !== null) {
      for (const [k, child] of Object.entries(v)) {
        const here = at === '' ? k : `${at}.${k}`;
        if (!isStorableString(k)) return { at: `a key in ${at || 'request body'}`, what: 'string' };
        stack.push([child, here]);
      }
    }
  }
  return undefined;
}

/**
 * Raw JSON text that may decode to something unstorable: only escapes produce a lone surrogate or
 * U+0000. A number overflows a double (JSON.parse gives Infinity) only when the digits before its
 * point and its exponent together reach 309 (it is at least 10^(digits - 1 + exponent), and the
 * largest double is about 1.8e308): an exponent of three digits, or else (an exponent of 99 at
 * most) a run of at least 210 digits. A run of 309 digits alone, as this once required, let
 * `1` and 210 zeros `e99` (1e309) through as Infinity, stored and digested as null.
 */
// (?<!\d): a run is tried from its first digit only, not again from each digit inside it (a
// body of 209-digit runs took 0.55 s per MiB to scan without it).
export const MAY_HOLD_UNSTORABLE = /\\u(?:[dD][89a-fA-F]|0000)|[eE][+-]?\d{3}|(?<!\d)\d{210}/;

/**
 * Raw JSON text that may hold a number that does not come back as written: only one of 16
 * digits or more (2^53 has 16) or with an exponent of three digits (1e-400 underflows to 0) can.
 */
const MAY_HOLD_INEXACT = /[\d.]{16}|[eE][+-]?\d{3}/;

/** A number of a JSON text that would reach a policy as another number (findInexactNumber). */
export interface InexactNumber {
  at: string;
  literal: string;
  read: string;
}

/** The first number in valid JSON `text` that would reach a policy as another number, if any. */
export function inexactNumberIn(text: string): InexactNumber | undefined {
  return MAY_HOLD_INEXACT.test(text) ? findInexactNumber(text) : undefined;
}

/**
 * The first finite number in a JSON text (valid JSON: JSON.parse accepted it) whose value is not
 * the value of the shortest decimal of its double, which is what Arbiter passes on (JSON.parse,
 * then JSON.stringify to the policy, canonical JSON to the digest and the store):
 * `9007199254740993` (→ …992), `1.0000000000000000001` (→ 1), `1e-400` (→ 0), and 2^60 written
 * out (an exact double, but written back as 1152921504606847000). OPA reads every JSON number
 * exactly and compiled policies compare exactly, so a policy handed another number decides on a
 * number the caller did not send (a deny rule on account 9007199254740993 let that account
 * through). `at` is the dotted path as findUnstorable names it; `read` what is passed on. Numbers
 * that come back as written however they are written (0.1, 1.0, 1E5, 1e300, 1e23) are not reported.
 */
function findInexactNumber(text: string): InexactNumber | undefined {
  return scanJson<InexactNumber>(text, {
    number: (literal, place) => {
      if (literal.length < 16 && !/[eE]/.test(literal)) return undefined;
      const value = Number(literal);
      // Infinity (1e400) is findUnstorable's to report.
      if (!Number.isFinite(value) || holdsExactly(literal, value)) return undefined;
      return { at: place.path() || 'request body', literal, read: String(value) };
    },
  });
}

/** Whether `value` (finite) is exactly the number a JSON number literal writes. */
export function holdsExactly(literal: string, value: number): boolean {
  return decimalValue(literal) === decimalValue(String(value));
}

/** A JSON number literal's exact decimal value as `[-]digits e exponent`, digits without leading or trailing zeros. */
function decimalValue(literal: string): string {
  const parts = decimalParts(literal);
  if (parts === undefined) return literal;
  const { sign, digits, scale } = parts;
  if (sign === 0) return '0';
  return `${sign < 0 ? '-' : ''}${digits}e${scale - BigInt(digits.length - 1)}`;
}

/**
 * What a number that would not come back as written is told: `where` names it, `fix` what to do.
 * Numbers are read as doubles and passed on in their shortest decimal form.
 */
export function inexactNumberMessage(where: string, literal: string, read: string, fix: string): string {
  const shown = literal.length > 48 ? `${literal.slice(0, 48)}…` : literal;
  return (
    `${where} the number ${shown}, which would reach the policy as ${read} ` +
    `(numbers are read as doubles): ${fix}`
  );
}
