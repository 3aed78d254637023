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
import { refuse, Refused } from './refused.js';

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
