/**
 * What the paired planner (paired.ts) reads of each rule of a set: from a module's parse tree and
 * its text, the rule's exact source, the paths under `data` it may read, the imports it uses and
 * the shape of its head. Whatever cannot be read with certainty (a text that does not match the
 * tree, a package or import that is not static) is refused as Unsupported: the planner would
 * otherwise copy a rule that means something else.
 */
import type { AstLocation, AstRule, AstTerm, ParsedPolicy } from './rego-ast.js';

/** A set this planner cannot pair; the shadow set is then evaluated on its own. */
export class Unsupported extends Error {}

export const unsupported = (why: string): never => {
  throw new Unsupported(why);
};

interface Import {
  /** `data`, `input`, or another root (`rego`, `future`): only `data` imports are resolved here. */
  root: string;
  path: string[];
  /** Whether the import names its alias (`as x`); `import input` may not name `input`. */
  explicit: boolean;
  alias: string;
}

export interface ParsedModule {
  name: string;
  /** key(pkg) */
  pkgKey: string;
  source: string;
  rules: AstRule[];
  lineStarts: number[];
  /**
   * By row, read once per line: the offset of each of its code points where it holds surrogate
   * pairs, null where it holds none (offsetOf).
   */
  astralLines: Map<number, number[] | null>;
  pkg: string[];
  imports: Import[];
}

/** A `data…` reference written in a rule, where the rewrite would insert the copy's root. */
interface DataRef {
  /** String offset just past the `data` that begins it. */
  after: number;
  path: string[];
}

export interface RuleInfo {
  module: ParsedModule;
  group: string;
  text: string;
  /** The rule's text together with the imports it uses: equal signatures mean equal rules. */
  signature: string;
  /** Every static path under `data` the rule may read (imports and rules of its package resolved). */
  reads: string[][];
  dataRefs: DataRef[];
  /** Per import alias, the paths the rule reads through it. */
  aliasReads: Map<string, string[][]>;
  /** Arity of a function; undefined for a document rule. */
  arity: number | undefined;
  /** `g contains x if …` */
  multiValue: boolean;
  /** A head of more than one term (`a.b := …`, `a[x] := …`). */
  refHead: boolean;
  /** A `with` whose target is not `input`. */
  withData: boolean;
  /**
   * Each `with` of the rule (what it reads is then evaluated with another input or document): the
   * name of the rule it sets the whole input to (`with input as delegated_input`), else `?`.
   */
  withs: string[];
  /** Whether the rule reads `data` as a whole (`data[x]`, `walk(data, …)`). */
  readsAllData: boolean;
}

/** A path as a map key: JSON, so that no segment (a quoted one may hold any text) can run into the next. */
export const key = (path: string[]) => JSON.stringify(path);
export const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The group a rule defines: the first term of its head. */
export function ruleGroup(r: AstRule): string {
  const first = r.head.ref?.[0];
  const name = first && first.type === 'var' && typeof first.value === 'string' ? first.value : r.head.name;
  if (typeof name !== 'string' || name === '') return unsupported('a rule has no name');
  return name;
}

export function parseModule(p: ParsedPolicy): ParsedModule {
  const path = p.ast.package?.path ?? [];
  const pkg = path
    .slice(1)
    .map((t) =>
      t.type === 'string' && typeof t.value === 'string'
        ? t.value
        : unsupported(`package of ${p.name} is not static`),
    );
  const lineStarts = [0];
  for (let i = 0; i < p.rego.length; i++) if (p.rego[i] === '\n') lineStarts.push(i + 1);
  const imports = (p.ast.imports ?? []).map((im): Import => {
    const terms = Array.isArray(im.path.value) ? (im.path.value as AstTerm[]) : [im.path];
    const root =
      terms[0]?.type === 'var'
        ? String(terms[0].value)
        : unsupported(`an import of ${p.name} is not a reference`);
    const rest = terms
      .slice(1)
      .map((t) =>
        t.type === 'string' && typeof t.value === 'string'
          ? t.value
          : unsupported(`an import of ${p.name} is not static`),
      );
    const alias = im.alias ?? rest[rest.length - 1] ?? root;
    return { root, path: rest, alias, explicit: im.alias !== undefined };
  });
  return {
    name: p.name,
    pkgKey: key(pkg),
    source: p.rego,
    rules: p.ast.rules ?? [],
    lineStarts,
    astralLines: new Map(),
    pkg,
    imports,
  };
}

/** The string offset of a location (rows from 1, columns counted in code points from 1). */
function offsetOf(m: ParsedModule, loc: AstLocation | undefined): number {
  if (!loc) return unsupported(`a node of ${m.name} has no location`);
  const start = m.lineStarts[loc.row - 1];
  if (start === undefined) return unsupported(`a location of ${m.name} is outside its text`);
  const end = m.lineStarts[loc.row] ?? m.source.length + 1;
  // Columns count code points. A line without surrogate pairs (most) counts them as its UTF-16
  // units; a line with some has its code points' offsets listed once, not counted per location.
  let points = m.astralLines.get(loc.row);
  if (points === undefined) {
    const line = m.source.slice(start, end);
    points = null;
    if (/[\uD800-\uDFFF]/.test(line)) {
      points = [];
      for (let off = 0; off < line.length; off += line.codePointAt(off)! > 0xffff ? 2 : 1) {
        points.push(start + off);
      }
    }
    m.astralLines.set(loc.row, points);
  }
  if (points === null) {
    if (start + loc.col - 1 >= end) return unsupported(`a location of ${m.name} is outside its line`);
    return start + loc.col - 1;
  }
  const at = points[loc.col - 1];
  return at === undefined ? unsupported(`a location of ${m.name} is outside its line`) : at;
}

/** The source text at a location, checked against the text the parser recorded. */
function textAt(m: ParsedModule, loc: AstLocation | undefined): { start: number; text: string } {
  const start = offsetOf(m, loc);
  const text = Buffer.from(loc?.text ?? '', 'base64').toString('utf8');
  if (text === '' || m.source.slice(start, start + text.length) !== text) {
    unsupported(`the parse tree of ${m.name} does not match its text`);
  }
  return { start, text };
}

/**
 * What the planner knows of rule `r` of `m`; `packageRules` are the rule names of its package in
 * either set (a bare name in the rule may mean any of them).
 */
export function ruleInfo(m: ParsedModule, r: AstRule, packageRules: Set<string>): RuleInfo {
  const { start, text } = ruleText(m, r);
  const info: RuleInfo = {
    module: m,
    group: ruleGroup(r),
    text,
    signature: '',
    reads: [],
    dataRefs: [],
    aliasReads: new Map(),
    arity: r.head.args && r.head.args.length > 0 ? r.head.args.length : undefined,
    multiValue: r.head.key !== undefined && r.head.value === undefined,
    refHead: (r.head.ref?.length ?? 1) > 1,
    withData: false,
    withs: [],
    readsAllData: false,
  };
  const usedAliases = collectReads(m, r, start, packageRules, info);
  const imports = m.imports
    // What the rule's names mean: the imports it uses, and the language switches (rego.v1).
    .filter((i) => usedAliases.has(i.alias) || i.root === 'rego' || i.root === 'future')
    .map((i) => `${i.alias}=${key([i.root, ...i.path])}`)
    .sort();
  info.signature = `${key(m.pkg)}\u0001${imports.join('\u0001')}\u0001${text}`;
  return info;
}

/** The whole source text of rule `r` and its offset in `m`, checked against the parse tree. */
function ruleText(m: ParsedModule, r: AstRule): { start: number; text: string } {
  const at = textAt(m, r.location);
  const start = at.start;
  let text = at.text;
  if (r.default) {
    // A default rule's location covers the keyword only; its head holds the rest.
    const head = textAt(m, r.head.location);
    if (text !== 'default' || head.start < start)
      unsupported(`a default rule of ${m.name} is not where its head is`);
    text = m.source.slice(start, head.start + head.text.length);
  } else if (offsetOf(m, r.head.ref?.[0]?.location) !== start) {
    // A second body of a rule (`p if { … } { … }`) is a rule of its own, without its head's text.
    unsupported(`a rule of ${m.name} has a body apart from its head`);
  }
  return { start, text };
}

/**
 * Walks rule `r` (head, body and else branches) that begins at `start` in `m`, recording in `info`
 * each path under `data` it may read (`reads`, `dataRefs`, `aliasReads`, `readsAllData`) and each
 * `with` it uses; answers the import aliases it names.
 */
function collectReads(
  m: ParsedModule,
  r: AstRule,
  start: number,
  packageRules: Set<string>,
  info: RuleInfo,
): Set<string> {
  const aliases = new Map(m.imports.filter((i) => i.root === 'data').map((i) => [i.alias, i.path]));
  const otherAliases = new Set(m.imports.filter((i) => i.root !== 'data').map((i) => i.alias));
  const usedAliases = new Set<string>();
  const ref = (terms: AstTerm[]) => {
    const head = terms[0];
    if (!head || head.type !== 'var' || typeof head.value !== 'string') return;
    const statics: string[] = [];
    for (const t of terms.slice(1)) {
      if (t.type === 'string' && typeof t.value === 'string') statics.push(t.value);
      else break;
    }
    const name = head.value;
    if (name === 'data') {
      if (statics.length === 0) info.readsAllData = true;
      const at = textAt(m, head.location);
      if (at.text !== 'data') unsupported(`the parse tree of ${m.name} does not match its text`);
      // OPA's tree holds a reference head's key twice (in the head's ref and as its key): once here.
      if (!info.dataRefs.some((d) => d.after === at.start + 4 - start)) {
        info.dataRefs.push({ after: at.start + 4 - start, path: statics });
      }
      info.reads.push(statics);
    } else if (aliases.has(name)) {
      usedAliases.add(name);
      const path = [...aliases.get(name)!, ...statics];
      info.reads.push(path);
      const list = info.aliasReads.get(name) ?? [];
      list.push(path);
      info.aliasReads.set(name, list);
    } else if (otherAliases.has(name)) {
      usedAliases.add(name);
    } else if (packageRules.has(name)) {
      info.reads.push([...m.pkg, name]);
    }
  };
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) {
      for (const n of node) walk(n);
      return;
    }
    if (!node || typeof node !== 'object') return;
    const t = node as Partial<AstTerm> & { with?: { target?: AstTerm; value?: AstTerm }[] };
    if (Array.isArray(t.with)) {
      for (const w of t.with) {
        const target = w.target;
        const root = target?.type === 'ref' ? (target.value as AstTerm[])[0]?.value : target?.value;
        if (root !== 'input') info.withData = true;
        const whole = target?.type === 'ref' && (target.value as AstTerm[]).length === 1 && root === 'input';
        info.withs.push(whole && w.value?.type === 'var' ? String(w.value.value) : '?');
      }
    }
    if (t.type === 'ref' && Array.isArray(t.value)) {
      const terms = t.value as AstTerm[];
      ref(terms);
      // A reference may start with a literal, a comprehension or a call ([data.x.v][0], f(x).y):
      // what that holds is read too. A var at its head is the reference's own name.
      walk(terms[0]?.type === 'var' ? terms.slice(1) : terms);
      return;
    }
    if (t.type === 'var' && typeof t.value === 'string') {
      ref([t as AstTerm]);
      return;
    }
    const o = node as Record<string, unknown>;
    for (const k in o) if (k !== 'location' && k !== 'text') walk(o[k]);
  };
  const walkRule = (x: AstRule) => {
    walk(x.head.ref?.slice(1));
    walk(x.head.args);
    walk(x.head.key);
    walk(x.head.value);
    walk(x.body);
    if (x.else) walkRule(x.else);
  };
  walkRule(r);
  return usedAliases;
}

/** `items` by `by`, each list in the order of `items` (linear: planning runs on the serving thread). */
export function groupBy<K, V>(items: Iterable<V>, by: (v: V) => K): Map<K, V[]> {
  const out = new Map<K, V[]>();
  for (const v of items) {
    const list = out.get(by(v));
    if (list) list.push(v);
    else out.set(by(v), [v]);
  }
  return out;
}

/** Whether two lists hold the same rules, as many times each. */
export function sameRules(a: RuleInfo[], b: RuleInfo[]): boolean {
  return a.length === b.length && containsAll(a, b);
}

/** Whether `outer` holds every rule of `inner`, as many times. */
export function containsAll(outer: RuleInfo[], inner: RuleInfo[]): boolean {
  const counts = new Map<string, number>();
  for (const r of outer) counts.set(r.signature, (counts.get(r.signature) ?? 0) + 1);
  for (const r of inner) {
    const n = counts.get(r.signature) ?? 0;
    if (n === 0) return false;
    counts.set(r.signature, n - 1);
  }
  return true;
}

/** The rules of `a` that `b` does not hold, each as many times more as `a` holds it. */
export function difference(a: RuleInfo[], b: RuleInfo[]): RuleInfo[] {
  const counts = new Map<string, number>();
  for (const r of b) counts.set(r.signature, (counts.get(r.signature) ?? 0) + 1);
  const out: RuleInfo[] = [];
  // Matched in the order of `a`, so each rule of `b` is matched once.
  for (const r of a) {
    const n = counts.get(r.signature) ?? 0;
    if (n > 0) counts.set(r.signature, n - 1);
    else out.push(r);
  }
  return out;
}
