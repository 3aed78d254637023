/**
 * Go-faithful replacements for the builtins @open-policy-agent/opa-wasm implements in JavaScript
 * (sprintf, regex.split, yaml.*). OPA computes these in Go; the SDK's JS versions answer
 * differently on ordinary inputs (sprintf("%v", [{…}]) is "[object Object]", a duplicate YAML key
 * makes yaml.unmarshal undefined, …), so a policy's answer differed from `opa eval` / `opa test`.
 *
 * Each function here either computes exactly what OPA v1.22 computes or throws, which fails the
 * evaluation closed (the decision is a deny carrying `error`). Where the value the host receives
 * cannot tell what OPA would have seen (a set arrives as a JSON array; an integer beyond 2^53 has
 * already lost digits), it throws rather than guess. See docs/decisions.md.
 */
import { createRequire } from 'node:module';
import path from 'node:path';
import {
  isAlias,
  isMap,
  isScalar,
  isSeq,
  parseAllDocuments,
  Parser,
  Scalar,
  type Document,
  type Node,
} from 'yaml';

class Refused extends Error {}

function refuse(fn: string, why: string): never {
  throw new Refused(`${fn}: ${why} (Arbiter refuses rather than answer differently from OPA)`);
}

// ---------------------------------------------------------------------------------------------
// sprintf: OPA (topdown/strings.go builtinSprintf) converts each argument (ast.Number → int64 if
// it is one, else *big.Int, else float64; ast.String → string; anything else → its ast String()
// form as a Go string) and calls Go's fmt.Sprintf.

type GoArg =
  | { kind: 'int64'; n: number }
  | { kind: 'float64'; n: number }
  | { kind: 'string'; s: string }
  // An array, set or object: a Go string to OPA (its ast String()), whose text the host cannot know.
  | { kind: 'composite' };

function toGoArg(v: unknown): GoArg {
  if (typeof v === 'string') return { kind: 'string', s: v };
  if (v === null) return { kind: 'string', s: 'null' };
  if (typeof v === 'boolean') return { kind: 'string', s: String(v) };
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) refuse('sprintf', 'non-finite number');
    if (Object.is(v, -0)) refuse('sprintf', 'cannot tell -0 from -0.0');
    if (Number.isInteger(v)) {
      if (!Number.isSafeInteger(v))
        refuse('sprintf', 'an integer beyond 2^53 has lost digits on its way here');
      return { kind: 'int64', n: v };
    }
    return { kind: 'float64', n: v };
  }
  // Objects print as OPA's ast String(); arrays too, but a set reaches the host as an array too.
  return { kind: 'composite' };
}

function needText(a: GoArg): Exclude<GoArg, { kind: 'composite' }> {
  if (a.kind === 'composite') return refuse('sprintf', 'arrays, sets and objects are not formatted');
  return a;
}

/**
 * %T: the Go type of OPA's conversion (string for strings, booleans, null, arrays, sets and
 * objects; int64 or *big.Int for integers; float64 otherwise). An integral number cannot be told
 * from one written 1.0 or 1e6 (float64 to OPA), so only numbers with a fraction are answered.
 */
function goTypeName(a: GoArg): string {
  if (a.kind === 'string' || a.kind === 'composite') return 'string';
  if (a.kind === 'float64') return 'float64';
  return refuse('sprintf', '%T of an integral number (int64 for 1, float64 for 1.0 or 1e6 in OPA)');
}

/** Exact decimal digits of a finite double: value = 0.digits × 10^exp10 (digits without zeros at the end). */
function exactDecimal(x: number): { digits: string; point: number } {
  const buf = new DataView(new ArrayBuffer(8));
  buf.setFloat64(0, Math.abs(x));
  const bits = buf.getBigUint64(0);
  const expBits = Number((bits >> 52n) & 0x7ffn);
  let mant = bits & ((1n << 52n) - 1n);
  let e2: number;
  if (expBits === 0) e2 = -1074;
  else {
    mant |= 1n << 52n;
    e2 = expBits - 1075;
  }
  if (mant === 0n) return { digits: '0', point: 1 };
  let digits: string;
  let point: number;
  if (e2 >= 0) {
    digits = (mant << BigInt(e2)).toString();
    point = digits.length;
  } else {
    digits = (mant * 5n ** BigInt(-e2)).toString();
    point = digits.length + e2; // value = digits × 10^e2
  }
  const trimmed = digits.replace(/0+$/, '');
  return { digits: trimmed === '' ? '0' : trimmed, point };
}

/** Rounds 0.digits×10^point to `n` significant digits, half to even (as strconv does on exact values). */
function roundDigits(d: { digits: string; point: number }, n: number): { digits: string; point: number } {
  if (n < 0) return { digits: '0', point: d.point };
  if (d.digits.length <= n) return { digits: d.digits.padEnd(n, '0'), point: d.point };
  const keep = d.digits.slice(0, n);
  const rest = d.digits.slice(n);
  const first = rest.charCodeAt(0) - 48;
  const up =
    first > 5 || (first === 5 && (/[1-9]/.test(rest.slice(1)) || Number(keep.at(-1) ?? '0') % 2 === 1));
  if (!up) return { digits: keep, point: d.point };
  const bumped = (BigInt(keep) + 1n).toString();
  if (bumped.length > keep.length) return { digits: bumped.slice(0, n), point: d.point + 1 };
  return { digits: bumped.padStart(n, '0'), point: d.point };
}

function expSuffix(exp: number, upper: boolean): string {
  const a = Math.abs(exp);
  return (upper ? 'E' : 'e') + (exp < 0 ? '-' : '+') + (a < 10 ? '0' + a : String(a));
}

function fmtE(x: number, prec: number, upper: boolean): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0.' + '0'.repeat(prec) + expSuffix(0, upper);
  const r = roundDigits(exactDecimal(x), prec + 1);
  return sign + r.digits[0] + (prec > 0 ? '.' + r.digits.slice(1) : '') + expSuffix(r.point - 1, upper);
}

function fmtF(x: number, prec: number): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0.' + '0'.repeat(prec);
  const d = exactDecimal(x);
  // Significant digits kept: those left of the point plus `prec` after it.
  const n = d.point + prec;
  let r: { digits: string; point: number };
  if (n < 0) r = { digits: '', point: d.point };
  else if (n === 0) {
    // Only the rounding of 0.digits to 0 or 1 unit of 10^-prec.
    const first = d.digits.charCodeAt(0) - 48;
    const up = first > 5 || (first === 5 && d.digits.length > 1);
    r = up ? { digits: '1', point: d.point + 1 } : { digits: '', point: d.point };
  } else r = roundDigits(d, n);
  // Lay the digits out on a fixed grid.
  let intPart: string;
  let frac: string;
  const digits = r.digits;
  if (r.point <= 0) {
    intPart = '0';
    frac = ('0'.repeat(-r.point) + digits).padEnd(prec, '0').slice(0, prec);
  } else {
    intPart = digits.slice(0, r.point).padEnd(r.point, '0');
    frac = digits.slice(r.point).padEnd(prec, '0').slice(0, prec);
  }
  return sign + intPart.replace(/^0+(?=\d)/, '') + (prec > 0 ? '.' + frac : '');
}

/** Go's %v of each kind, as in "%!d(float64=1.5)". */
function goV(arg: GoArg): string {
  const a = needText(arg);
  if (a.kind === 'string') return a.s;
  if (a.kind === 'int64') return String(a.n);
  return fmtGShortestV(a.n);
}

function fmtGShortestV(x: number): string {
  return fmtGShortestWith(x, false);
}

/**
 * fmt's %v and %g of a float64: strconv.AppendFloat(x, 'g', -1, 64), the shortest digits, in %e
 * form when exp < -4 || exp >= 6 (with the shortest precision strconv decides with eprec = 6).
 * Checked against `opa eval` (v1.22): 1e6 → "1e+06", 123456.5 → "123456.5",
 * 1234567.5 → "1.2345675e+06", 0.0001 → "0.0001", 1e-05 → "1e-05", 1.5e20 → "1.5e+20". (Not 21:
 * that threshold is encoding/json's, not fmt's.)
 */
function fmtGShortestWith(x: number, upper: boolean): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0';
  const [mant, e] = Math.abs(x).toExponential().split('e') as [string, string];
  const digits = mant.replace('.', '');
  const exp = Number(e);
  // strconv ftoa.go, %g: eprec := prec (-1 → shortest: digs.nd); if eprec > digs.nd && digs.nd >= digs.dp { eprec = digs.nd }; if shortest { eprec = 6 }
  if (exp < -4 || exp >= 6) {
    return sign + digits[0] + (digits.length > 1 ? '.' + digits.slice(1) : '') + expSuffix(exp, upper);
  }
  if (exp < 0) return sign + '0.' + '0'.repeat(-exp - 1) + digits;
  if (digits.length <= exp + 1) return sign + digits.padEnd(exp + 1, '0');
  return sign + digits.slice(0, exp + 1) + '.' + digits.slice(exp + 1);
}

function quoteGo(s: string): string {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0) as number;
    if (cp >= 0xd800 && cp <= 0xdfff) refuse('sprintf', 'a lone surrogate has no UTF-8 form');
    if (ch === '"' || ch === '\\') out += '\\' + ch;
    else if (cp >= 0x20 && cp < 0x7f) out += ch;
    else if (cp === 7) out += '\\a';
    else if (cp === 8) out += '\\b';
    else if (cp === 12) out += '\\f';
    else if (cp === 10) out += '\\n';
    else if (cp === 13) out += '\\r';
    else if (cp === 9) out += '\\t';
    else if (cp === 11) out += '\\v';
    else if (cp < 0x20 || cp === 0x7f) out += '\\x' + cp.toString(16).padStart(2, '0');
    else if (cp < 0xa0) out += '\\u' + cp.toString(16).padStart(4, '0');
    else if (cp > 0x24f) {
      // Go's unicode.IsPrint follows the Unicode version Go was built with, Node's \p{…} a newer
      // one: beyond Latin Extended-B (fully assigned long ago) they can disagree.
      refuse('sprintf', '%q of characters beyond U+024F');
    } else if (/^[\p{L}\p{M}\p{N}\p{P}\p{S}]$/u.test(ch)) out += ch;
    else out += '\\u' + cp.toString(16).padStart(4, '0');
  }
  return out + '"';
}

function hexBytes(s: string, upper: boolean): string {
  const h = Buffer.from(s, 'utf8').toString('hex');
  return upper ? h.toUpperCase() : h;
}

function badVerb(verb: string, a: GoArg): string {
  return `%!${verb}(${a.kind}=${goV(a)})`;
}

/** One verb applied to one argument, or a refusal. */
function formatOne(verb: string, arg: GoArg): string {
  const a = needText(arg);
  switch (a.kind) {
    case 'string':
      switch (verb) {
        case 'v':
        case 's':
          return a.s;
        case 'q':
          return quoteGo(a.s);
        case 'x':
        case 'X':
          return hexBytes(a.s, verb === 'X');
        case 'd': case 't': case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
          return badVerb(verb, a);
      } // prettier-ignore
      break;
    case 'int64':
      switch (verb) {
        case 'v':
        case 'd':
          return String(a.n);
        case 'x':
        case 'X': {
          const h = Math.abs(a.n).toString(16);
          return (a.n < 0 ? '-' : '') + (verb === 'X' ? h.toUpperCase() : h);
        }
        case 's': case 't': case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
          return badVerb(verb, a);
      } // prettier-ignore
      break;
    case 'float64':
      switch (verb) {
        case 'v':
        case 'g':
          return fmtGShortestWith(a.n, false);
        case 'G':
          return fmtGShortestWith(a.n, true);
        case 'e':
        case 'E':
          return fmtE(a.n, 6, verb === 'E');
        case 'f':
        case 'F':
          return fmtF(a.n, 6);
        case 's':
        case 't':
        case 'd':
        case 'q':
          return badVerb(verb, a);
      }
      break;
  }
  return refuse('sprintf', `%${verb} of a ${a.kind} is not implemented`);
}

function extraKind(arg: GoArg): string {
  const a = needText(arg);
  return `${a.kind}=${goV(a)}`;
}

export function goSprintf(format: unknown, values: unknown): string {
  if (typeof format !== 'string') return refuse('sprintf', 'the format must be a string');
  if (!Array.isArray(values)) return refuse('sprintf', 'the values must be an array');
  const args = values.map(toGoArg);
  let out = '';
  let argNum = 0;
  for (let i = 0; i < format.length;) {
    const pct = format.indexOf('%', i);
    if (pct < 0) {
      out += format.slice(i);
      break;
    }
    out += format.slice(i, pct);
    i = pct + 1;
    if (i >= format.length) {
      out += '%!(NOVERB)';
      break;
    }
    const cp = format.codePointAt(i) as number;
    const verb = String.fromCodePoint(cp);
    i += verb.length;
    if (verb === '%') {
      out += '%';
      continue;
    }
    if (/[-+# 0-9.*[]/.test(verb))
      refuse('sprintf', 'flags, width, precision and argument indexes are not supported');
    if (!/^[a-zA-Z]$/.test(verb)) refuse('sprintf', `the verb %${verb} is not supported`);
    if (argNum >= args.length) {
      out += `%!${verb}(MISSING)`;
      continue;
    }
    const a = args[argNum++] as GoArg;
    if (verb === 'T') out += goTypeName(a);
    else if ('vsqxXdtfFeEgG'.includes(verb)) out += formatOne(verb, a);
    else if ('bcoOUp'.includes(verb)) refuse('sprintf', `the verb %${verb} is not implemented`);
    else out += badVerb(verb, a);
  }
  if (argNum < args.length) out += '%!(EXTRA ' + args.slice(argNum).map(extraKind).join(', ') + ')';
  return out;
}

// ---------------------------------------------------------------------------------------------
// yaml.*: OPA uses sigs.k8s.io/yaml over go-yaml v3 (checked against `opa eval`: yes/no/on/off
// stay strings; 012 is 10, 0b101 is 5, 1_000 is 1000; a duplicate key keeps the last value;
// timestamps stay strings; only the first document counts, but every document must parse).

const NULLS = new Set(['', '~', 'null', 'Null', 'NULL']);
const TRUES = new Set(['true', 'True', 'TRUE']);
const FALSES = new Set(['false', 'False', 'FALSE']);
const SPECIAL_FLOATS = /^(?:[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$/;
const YAML_STYLE_FLOAT = /^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$/;

/** Go's strconv.ParseInt/ParseUint(s, 0, 64) on text without underscores: base prefixes, leading-0 octal. */
function goParseIntBase0(s: string): bigint | undefined {
  let t = s;
  let neg = false;
  if (t[0] === '+' || t[0] === '-') {
    neg = t[0] === '-';
    t = t.slice(1);
  }
  let base = 10;
  let body = t;
  const prefix = /^0[xXbBoO]/.test(t) ? t[1]!.toLowerCase() : /^0./.test(t) ? '0' : '';
  if (prefix !== '') {
    base = { x: 16, b: 2, o: 8, '0': 8 }[prefix] as number;
    body = t.slice(prefix === '0' ? 1 : 2);
  }
  const digitRe =
    base === 16 ? /^[0-9a-fA-F]+$/ : base === 8 ? /^[0-7]+$/ : base === 2 ? /^[01]+$/ : /^[0-9]+$/;
  if (!digitRe.test(body)) return undefined;
  let v = 0n;
  for (const c of body.toLowerCase()) v = v * BigInt(base) + BigInt(parseInt(c, 16));
  return neg ? -v : v;
}

const INT64_MIN = -(2n ** 63n);
const UINT64_MAX = 2n ** 64n - 1n;

/** go-yaml v3 resolve() of a plain scalar with no tag. */
function resolvePlain(s: string): unknown {
  if (NULLS.has(s)) return null;
  if (TRUES.has(s)) return true;
  if (FALSES.has(s)) return false;
  if (SPECIAL_FLOATS.test(s)) refuse('yaml.unmarshal', 'infinities and NaN have no JSON form');
  if (s.startsWith('.')) {
    // strconv.ParseFloat(s): with underscores its rules are not reproduced here.
    if (s.includes('_')) refuse('yaml.unmarshal', `the number-like scalar ${JSON.stringify(s)}`);
    return /^\.[0-9]+(?:[eE][-+]?[0-9]+)?$/.test(s) ? Number(s) : s;
  }
  if (/^[-+0-9]/.test(s)) {
    // Every underscore is dropped first (YAML 1.1 digit separators), then ParseInt/ParseUint(…, 0, 64).
    const plain = s.replace(/_/g, '');
    const i = goParseIntBase0(plain);
    if (i !== undefined && i >= INT64_MIN && i <= UINT64_MAX) return exactInt(i);
    if (YAML_STYLE_FLOAT.test(plain)) {
      const f = Number(plain);
      if (Number.isFinite(f)) return f;
      return s; // out of float64 range: go-yaml keeps the string
    }
  }
  return s;
}

function exactInt(i: bigint): number {
  const n = Number(i);
  if (!Number.isSafeInteger(n))
    refuse('yaml.unmarshal', 'an integer beyond 2^53 cannot be passed on exactly');
  return n;
}

/**
 * go-yaml's guard against alias bombs (decode.go, decoder.unmarshal): every node decoded counts,
 * and every node decoded under an alias counts as aliased too; past 100 aliased nodes and 1000 in
 * all, a ratio of aliased to all above allowedAliasRatio is "yaml: document contains excessive
 * aliasing". The walk below decodes in go-yaml's order (document node, then depth first, key
 * before value), so it trips where go-yaml trips.
 */
const ALIAS_RATIO_RANGE_LOW = 400_000;
const ALIAS_RATIO_RANGE_HIGH = 4_000_000;

function allowedAliasRatio(decodeCount: number): number {
  if (decodeCount <= ALIAS_RATIO_RANGE_LOW) return 0.99;
  if (decodeCount >= ALIAS_RATIO_RANGE_HIGH) return 0.1;
  return (
    0.99 - 0.89 * ((decodeCount - ALIAS_RATIO_RANGE_LOW) / (ALIAS_RATIO_RANGE_HIGH - ALIAS_RATIO_RANGE_LOW))
  );
}

/** go-yaml refuses the text (is_valid false, unmarshal an error). */
class YamlInvalid extends Error {}

/** Beyond this many decoded nodes or characters of scalars, Arbiter refuses outright (fails closed). */
const MAX_DECODED_NODES = 1_000_000;
const MAX_DECODED_CHARS = 16 * 1024 * 1024;

interface Walk {
  doc: Document;
  decodeCount: number;
  aliasCount: number;
  aliasDepth: number;
  chars: number;
  targets: Map<Node, Node | undefined>;
}

function countNode(w: Walk): void {
  w.decodeCount++;
  if (w.aliasDepth > 0) w.aliasCount++;
  if (
    w.aliasCount > 100 &&
    w.decodeCount > 1000 &&
    w.aliasCount / w.decodeCount > allowedAliasRatio(w.decodeCount)
  )
    throw new YamlInvalid('yaml: document contains excessive aliasing');
  if (w.decodeCount > MAX_DECODED_NODES) refuse('yaml.unmarshal', 'more than 1000000 nodes');
}

function yamlToJson(node: Node | null, w: Walk, depth = 0): unknown {
  if (depth > 1000) refuse('yaml.unmarshal', 'too deeply nested');
  // A missing value ("? a", "a:" in flow) is an empty scalar node to go-yaml: it counts too.
  countNode(w);
  if (node === null) return null;
  if (isAlias(node)) {
    let target = w.targets.get(node);
    if (target === undefined) {
      target = node.resolve(w.doc) as Node | undefined;
      w.targets.set(node, target);
    }
    if (!target) refuse('yaml.unmarshal', 'unresolved alias');
    w.aliasDepth++;
    const v = yamlToJson(target as Node, w, depth + 1);
    w.aliasDepth--;
    return v;
  }
  if (isScalar(node)) {
    const tag = node.tag;
    const src = String(node.source ?? node.value ?? '');
    w.chars += src.length;
    if (w.chars > MAX_DECODED_CHARS) refuse('yaml.unmarshal', 'more than 16 MiB of scalars');
    const plain = node.type === Scalar.PLAIN;
    if (tag === undefined) return plain ? resolvePlain(src) : src;
    if (tag === 'tag:yaml.org,2002:str') return src;
    if (tag === 'tag:yaml.org,2002:null' && NULLS.has(src)) return null;
    if (tag === 'tag:yaml.org,2002:bool' && (TRUES.has(src) || FALSES.has(src))) return TRUES.has(src);
    return refuse('yaml.unmarshal', `the tag ${tag} is not supported`);
  }
  if (isSeq(node)) {
    if (node.tag !== undefined && node.tag !== 'tag:yaml.org,2002:seq')
      refuse('yaml.unmarshal', `the tag ${node.tag} is not supported`);
    return node.items.map((n) => yamlToJson(n as Node, w, depth + 1));
  }
  if (isMap(node)) {
    if (node.tag !== undefined && node.tag !== 'tag:yaml.org,2002:map')
      refuse('yaml.unmarshal', `the tag ${node.tag} is not supported`);
    const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
    for (const pair of node.items) {
      const k = pair.key as Node | null;
      if (isScalar(k) && k.type === Scalar.PLAIN && k.tag === undefined && k.source === '<<') {
        refuse('yaml.unmarshal', 'merge keys (<<) are not supported');
      }
      const key = yamlToJson(k, w, depth + 1);
      let name: string;
      if (typeof key === 'string') name = key;
      else if (typeof key === 'boolean' || (typeof key === 'number' && Number.isInteger(key)))
        name = String(key);
      else return refuse('yaml.unmarshal', 'a key that is not a string, integer or boolean');
      out[name] = yamlToJson(pair.value as Node | null, w, depth + 1);
    }
    return { ...out };
  }
  return refuse('yaml.unmarshal', 'an unsupported node');
}

/**
 * What go-yaml decides before (or besides) the grammar the yaml package reads: false when go-yaml
 * certainly refuses the text, true when the rest is up to the parse; throws where the two readers
 * differ in ways not reproduced here.
 */
function goYamlStreamOk(s: string, fn: string): boolean {
  // The reader (readerc.go): only these characters; anything else is "control characters are
  // not allowed", wherever it is (every document is read).
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdfff) {
      const d = s.charCodeAt(i + 1);
      if (c <= 0xdbff && d >= 0xdc00 && d <= 0xdfff) {
        i++;
        continue;
      }
      return refuse(fn, 'a lone surrogate has no UTF-8 form');
    }
    const ok =
      c === 0x09 ||
      c === 0x0a ||
      c === 0x0d ||
      (c >= 0x20 && c <= 0x7e) ||
      c === 0x85 ||
      (c >= 0xa0 && c <= 0xfffd); // surrogates are handled above
    if (!ok) return false;
  }
  // go-yaml (YAML 1.1) also breaks lines at a lone CR, NEL, LS and PS; the yaml package (1.2) does not.
  if (/[\u0085\u2028\u2029]|\r(?!\n)/.test(s))
    refuse(fn, 'line breaks other than LF and CRLF (CR, U+0085, U+2028, U+2029)');
  // Directives (scannerc.go, parserc.go): only %YAML 1.1 (once) and %TAG (each handle once) per
  // document; any other name, version or a repeat is an error.
  const directiveAt = new Set<number>();
  let version = false;
  const handles = new Set<string>();
  for (const t of new Parser().parse(s)) {
    if (t.type === 'document') {
      version = false;
      handles.clear();
    }
    if (t.type !== 'directive') continue;
    directiveAt.add(t.offset);
    const m = /^%([^ \t]*)(.*)$/.exec(t.source);
    const name = m?.[1] ?? '';
    const args = (m?.[2] ?? '').split(/[ \t]+/).filter((a) => a !== '');
    if (name === 'YAML') {
      const v = args.length === 1 ? /^(\d+)\.(\d+)$/.exec(args[0] as string) : null;
      if (!v) return refuse(fn, `the directive ${JSON.stringify(t.source)}`);
      if (version) return false;
      version = true;
      const [major, minor] = [v[1] as string, v[2] as string];
      if (major.length > 9 || minor.length > 9) return false;
      if (Number(major) !== 1 || Number(minor) !== 1) return false;
    } else if (name === 'TAG') {
      if (args.length !== 2) return refuse(fn, `the directive ${JSON.stringify(t.source)}`);
      if (handles.has(args[0] as string)) return false;
      handles.add(args[0] as string);
    } else return false;
  }
  // go-yaml's scanner takes a % at the start of any line for a directive; the yaml package may not.
  for (let i = 0; i < s.length; i = s.indexOf('\n', i) + 1) {
    if (s[i] === '%' && !directiveAt.has(i)) refuse(fn, 'a line starting with % that is not a directive');
    if (s.indexOf('\n', i) < 0) break;
  }
  return true;
}

/** { ok: false } for text go-yaml refuses; throws for text Arbiter will not judge. */
function parseYaml(s: unknown, fn: string): { ok: true; value: unknown } | { ok: false } {
  if (typeof s !== 'string') return refuse(fn, 'expected a string');
  if (!goYamlStreamOk(s, fn)) return { ok: false };
  let docs: Document[];
  try {
    docs = parseAllDocuments(s, {
      version: '1.2',
      schema: 'failsafe',
      uniqueKeys: false,
      merge: false,
      strict: true,
      prettyErrors: false,
      intAsBigInt: false,
    }) as Document[];
  } catch (e) {
    return refuse(fn, `unparsable: ${(e as Error).message}`);
  }
  if (!Array.isArray(docs)) return { ok: false };
  for (const d of docs) if (d.errors.length > 0) return { ok: false };
  // After "...", only "---", directives or the end may follow: go-yaml takes an implicit document
  // (no "---") only at the start of the stream ("did not find expected <document start>").
  for (const d of docs.slice(1)) if (d.directives?.docStart !== true) return { ok: false };
  const first = docs[0];
  if (!first) return { ok: true, value: null };
  if (first.directives?.docStart === undefined && first.contents === null) return { ok: true, value: null };
  // The document node counts as one decode in go-yaml.
  const w: Walk = { doc: first, decodeCount: 1, aliasCount: 0, aliasDepth: 0, chars: 0, targets: new Map() };
  try {
    return { ok: true, value: yamlToJson(first.contents as Node | null, w) };
  } catch (e) {
    if (e instanceof YamlInvalid) return { ok: false };
    throw e;
  }
}

export const goYaml = {
  'yaml.unmarshal': (s: unknown): unknown => {
    const r = parseYaml(s, 'yaml.unmarshal');
    if (!r.ok) throw new Refused('yaml.unmarshal: invalid YAML');
    return r.value;
  },
  'yaml.is_valid': (s: unknown): boolean => {
    if (typeof s !== 'string') return false;
    return parseYaml(s, 'yaml.is_valid').ok;
  },
  'yaml.marshal': (): never => refuse('yaml.marshal', 'go-yaml output formatting is not reproduced'),
};

// ---------------------------------------------------------------------------------------------
// regex.split: Go's regexp (RE2) Split(s, -1). The pattern is translated to an equivalent JS
// RegExp for a conservative subset of RE2 syntax; anything else is refused.

const SYNTAX_CHARS = '^$\\.*+?()[]{}|/';
const GO_SPACE = '\\t\\n\\f\\r ';

function translateRe2(p: string): string {
  let out = '';
  let i = 0;
  const fail = (why: string): never => refuse('regex.split', `${why} in ${JSON.stringify(p)}`);
  const escape = (inClass: boolean): string => {
    const c = p[i + 1];
    if (c === undefined) return fail('a trailing backslash');
    i += 2;
    if (c === 'd' || c === 'D' || c === 'w' || c === 'W') return '\\' + c;
    if (c === 's') return inClass ? GO_SPACE : `[${GO_SPACE}]`;
    if (c === 'S') return inClass ? fail('\\S inside a class') : `[^${GO_SPACE}]`;
    if ((c === 'b' || c === 'B') && !inClass) return '\\' + c;
    if ('tnrfv'.includes(c)) return '\\' + c;
    if (SYNTAX_CHARS.includes(c) || (inClass && c === '-')) return '\\' + c;
    return fail(`the escape \\${c} is not supported`);
  };
  // RE2 is linear; JS backtracks. A repeated group that itself repeats or alternates ((a+)+,
  // (a|a)*, (?:\s*,\s*)+) can take exponential time on JS: refused. One stack entry per open
  // group: whether it contains a repetition or an alternation.
  const groups: boolean[] = [false];
  let closed: boolean | undefined; // the group that just closed, if the last token was ")"
  const mark = (): void => {
    groups[groups.length - 1] = true;
  };
  const repeat = (group: boolean | undefined, bounded01: boolean): void => {
    if (group === true && !bounded01) fail('a repeated group that repeats or alternates inside');
    mark();
  };
  while (i < p.length) {
    const c = p[i] as string;
    const after = closed;
    closed = undefined;
    if (c === '\\') out += escape(false);
    else if (c === '.') {
      out += '[^\\n]';
      i++;
    } else if (c === '(') {
      if (p[i + 1] === '?') {
        if (!p.startsWith('(?:', i)) return fail('flags, named groups and lookarounds are not supported');
        out += '(?:';
        i += 3;
      } else {
        // A capturing group: Go's Split ignores captures, JS's split would insert them.
        out += '(?:';
        i++;
      }
      groups.push(false);
    } else if (c === '[') {
      out += '[';
      i++;
      if (p[i] === '^') {
        out += '^';
        i++;
      }
      if (p[i] === ']') return fail('a ] first in a class');
      let closed = false;
      while (i < p.length) {
        const d = p[i] as string;
        if (d === ']') {
          out += ']';
          i++;
          closed = true;
          break;
        }
        if (d === '[') return fail('[ inside a class');
        if (d === '\\') out += escape(true);
        else {
          out += d;
          i++;
        }
      }
      if (!closed) return fail('an unclosed class');
    } else if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(p.slice(i));
      if (!m) return fail('a { that is not a repetition');
      if (Number(m[1]) > 1000 || (m[3] !== undefined && m[3] !== '' && Number(m[3]) > 1000))
        return fail('a repetition above 1000');
      repeat(after, m[2] === undefined ? Number(m[1]) <= 1 : m[3] !== '' && Number(m[3]) <= 1);
      out += m[0];
      i += m[0].length;
    } else if (c === '}' || c === ']') return fail(`a lone ${c}`);
    else {
      if (c === ')') {
        const inner = groups.length > 1 ? (groups.pop() as boolean) : false;
        if (inner) mark();
        closed = inner;
      } else if (c === '|') mark();
      else if (c === '*' || c === '+' || c === '?') {
        // A ? right after a repetition makes it lazy; it repeats nothing itself.
        const lazy = c === '?' && i > 0 && '*+?}'.includes(p[i - 1] as string) && after === undefined;
        if (!lazy) repeat(after, c === '?');
      }
      out += c;
      i++;
    }
  }
  return out;
}

export function goRegexSplit(pattern: unknown, s: unknown): string[] {
  if (typeof pattern !== 'string' || typeof s !== 'string')
    return refuse('regex.split', 'expected two strings');
  let re: RegExp;
  try {
    re = new RegExp(translateRe2(pattern), 'gu');
  } catch (e) {
    if (e instanceof Refused) throw e;
    return refuse(
      'regex.split',
      `the pattern ${JSON.stringify(pattern)} is not supported: ${(e as Error).message}`,
    );
  }
  if (pattern.length > 0 && s.length === 0) return [''];
  // regexp.FindAllStringIndex(s, -1), then Split's assembly.
  const matches: [number, number][] = [];
  let pos = 0;
  let prevEnd = -1;
  while (pos <= s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) break;
    const start = m.index;
    const end = start + m[0].length;
    let accept = true;
    if (end === start) {
      if (start === prevEnd) accept = false;
      const cp = s.codePointAt(start);
      pos = start + (cp !== undefined && cp > 0xffff ? 2 : 1);
    } else pos = end;
    prevEnd = end;
    if (accept) matches.push([start, end]);
  }
  const out: string[] = [];
  let beg = 0;
  let end = 0;
  for (const [a, b] of matches) {
    end = a;
    if (b !== 0) out.push(s.slice(beg, end));
    beg = b;
  }
  if (end !== s.length) out.push(s.slice(beg));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Installing them. opa.js dispatches `builtinFuncs[name] || customBuiltins[name]`, where
// builtinFuncs is the very object ./builtins/index.js exports (a plain CommonJS object): the
// SDK's JS builtins win over anything passed to loadPolicy. So we replace its entries in place.

export const GO_BUILTINS: Record<string, (...args: unknown[]) => unknown> = {
  sprintf: goSprintf as (...args: unknown[]) => unknown,
  'regex.split': goRegexSplit as (...args: unknown[]) => unknown,
  ...(goYaml as Record<string, (...args: unknown[]) => unknown>),
};

let installed = false;

/**
 * Replaces the SDK's JS builtins with GO_BUILTINS in the object opa.js dispatches through, and
 * checks that it is that object (the module opa.js required), so that a future SDK layout change
 * fails loudly here instead of silently running the JS versions again.
 */
export function installGoBuiltins(): void {
  if (installed) return;
  const req = createRequire(import.meta.url);
  const entry = req.resolve('@open-policy-agent/opa-wasm'); // …/src/index.cjs ("exports" hides the rest)
  const dir = path.dirname(entry);
  const opaPath = path.join(dir, 'opa.js');
  const builtinsPath = path.join(dir, 'builtins', 'index.js');
  const pkgReq = createRequire(opaPath);
  pkgReq(opaPath); // the same module instance the ESM entry imports (CommonJS cache)
  const table = pkgReq(builtinsPath) as Record<string, unknown>;
  const opaModule = req.cache[opaPath];
  const child = opaModule?.children.find((m) => m.filename === builtinsPath);
  if (!child || child.exports !== table) {
    throw new Error('@open-policy-agent/opa-wasm: cannot find the builtins table opa.js dispatches through');
  }
  for (const name of Object.keys(GO_BUILTINS)) {
    if (!(name in table)) throw new Error(`@open-policy-agent/opa-wasm no longer implements ${name} itself`);
  }
  for (const name of Object.keys(table)) {
    // json.is_valid: compiled natively to wasm (capabilities.ts), so the JS entry is not reached.
    if (!(name in GO_BUILTINS) && name !== 'json.is_valid')
      throw new Error(`@open-policy-agent/opa-wasm implements ${name}, which Arbiter has not reviewed`);
  }
  Object.assign(table, GO_BUILTINS);
  installed = true;
}
