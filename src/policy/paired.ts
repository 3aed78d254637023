/**
 * One pass for the live set and a proven shadow set (SPEC §11; docs/adr/0012).
 *
 * A shadow set is the live set with a few modules replaced or added, yet evaluating it beside the
 * live set ran every rule twice. Here the two are compiled into one wasm module whose entrypoint
 * answers both decisions: the live modules as they are, and a copy, under `data.__arbiter_shadow`,
 * of only the rules the shadow modules change and the rules that read them (the builtin decision
 * module's included). Every other rule the copy reads is an alias of the live rule
 * (`g := data.authz.agent.g`), and OPA's wasm memoizes a rule's value within one evaluation, so a
 * rule both sides share is evaluated once. A shadow module that only adds rules to a
 * multi-value set (`deny contains …`) copies only those rules, beside one rule holding the live
 * set's members.
 *
 * This file only plans: it reads `opa parse` trees and writes the generated Rego. The plan is
 * refused (`Unsupported`) whenever the copy could read something other than the shadow set would:
 * a rule reading the whole of `data` (`data[x]`, `walk(data, …)`), or a whole package the copy
 * changes, `with` on anything but `input` in a copied rule, a rule or data document where a
 * package is, text whose positions do not match the tree. A refused plan leaves the shadow set
 * evaluated as before, on its own.
 */
import type { Module } from './compiler.js';

/** The entrypoint of a paired module: `{"live": decision, "shadow": decision}`. */
export const PAIRED_ENTRYPOINT = '__arbiter_paired/both';
/** Where the copy lives under `data`, and the entry's package. Neither is open to policies here. */
const SHADOW_ROOT = '__arbiter_shadow';
const ENTRY_ROOT = '__arbiter_paired';
/** The decision both sides answer: data.authz.decision. */
const DECISION_PATH = ['authz', 'decision'];
/** The builtin module's package, and its rules deciding an agent's request as its user's. */
const BUILTIN_PACKAGE = ['authz'];
const DELEGATED = 'delegated';
const DELEGATED_INPUT = 'delegated_input';
/** Which changed rules the paired entrypoint compares first (comparable). */
interface Comparison {
  compared: Group[];
  /** Whether they are compared with the builtin module's delegated_input too. */
  delegated: boolean;
}
const NOT_COMPARED: Comparison = { compared: [], delegated: false };
/** Under the entry's package: each side's differing rules of a compared multi-value rule (deltaOf). */
const DELTA = 'changed';
/** Fresh variable names of the generated rules; a package defining a rule of such a name is refused. */
const FRESH = 'arbiter_shadow_v';

/** `opa parse --format json --json-include locations,-comments` of one module: what is read here. */
export interface RegoAst {
  package: { path: AstTerm[] };
  imports?: AstImport[];
  rules?: AstRule[];
}

export interface AstTerm {
  type: string;
  value: unknown;
  location?: AstLocation;
}

interface AstLocation {
  row: number;
  col: number;
  /** Base64 of the source text the node was parsed from. */
  text?: string;
}

interface AstImport {
  path: AstTerm;
  alias?: string;
}

interface AstRule {
  head: {
    name?: string;
    ref?: AstTerm[];
    args?: AstTerm[];
    key?: AstTerm;
    value?: AstTerm;
    location?: AstLocation;
  };
  body?: unknown;
  else?: AstRule;
  default?: boolean;
  location?: AstLocation;
}

/** A module with its parse tree. */
export interface ParsedPolicy {
  name: string;
  rego: string;
  ast: RegoAst;
}

/** What a plan generates, and how much the shadow side shares with the live side. */
export interface PairedPlan {
  /** The generated modules, compiled beside the live modules and the builtin decision module. */
  modules: Module[];
  /** The rules evaluated again for the shadow side, as `package.rule`. */
  copied: string[];
  /** Multi-value rules the shadow side extends: the live members plus its own rules. */
  extended: string[];
  /**
   * The changed rules held against their live rules first: where all have their live values, the
   * shadow side answers the live decision (`same`) without evaluating the copy. Empty when they
   * cannot all be compared, and when the decision reads nothing changed (always `same`).
   */
  compared: string[];
  /**
   * Of those, the multi-value rules held by the members of only the rules that differ between
   * the two sides (the rest of the rule is the same text over the same values, when every
   * changed rule is equal: see deltaOf).
   */
  comparedByChanges: string[];
}

/** A set this planner cannot pair; the shadow set is then evaluated on its own. */
export class Unsupported extends Error {}

const unsupported = (why: string): never => {
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

interface ParsedModule {
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

interface RuleInfo {
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

interface Group {
  /** key([...pkg, name]) */
  key: string;
  pkg: string[];
  pkgKey: string;
  name: string;
  live: RuleInfo[];
  shadow: RuleInfo[];
}

/** A path as a map key: JSON, so that no segment (a quoted one may hold any text) can run into the next. */
const key = (path: string[]) => JSON.stringify(path);
const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Plans the paired module of `live` (the live set's modules) and `shadow` (the shadow set's:
 * the live set with each shadow module replacing or adding its name), both without the builtin
 * decision module `builtin`, over the live data `data`. Throws Unsupported.
 */
export function planPaired(
  live: ParsedPolicy[],
  shadow: ParsedPolicy[],
  builtin: ParsedPolicy,
  data: Record<string, unknown>,
): PairedPlan {
  const { plan, changedPackages } = planRules(live, shadow, builtin);
  checkPairedData(data, changedPackages);
  return plan;
}

/**
 * Refuses (Unsupported) a plan whose copy would meet data documents: one named like the copy's
 * or the entry's root, or one under a package whose rules the copy holds (`changedPackages`, as
 * planRules gives them). Apart from planRules so that the rules can be planned on another thread
 * (plan-thread.ts) while the data, which can be large, stays where it is.
 */
export function checkPairedData(data: Record<string, unknown>, changedPackages: string[][]): void {
  for (const root of [SHADOW_ROOT, ENTRY_ROOT]) {
    if (Object.hasOwn(data, root)) unsupported(`a data document is named ${root}`);
  }
  for (const pkg of changedPackages) {
    if (dataBeneath(data, pkg))
      unsupported(`data documents lie under package ${pkg.join('.')}, which the shadow set changes`);
  }
}

/** planRules' answer: the plan, and the packages whose rules its copy holds (for checkPairedData). */
export interface PlannedRules {
  plan: PairedPlan;
  changedPackages: string[][];
}

/**
 * planPaired without the data: the plan, and the packages whose rules the copy holds, which
 * checkPairedData holds against the data before the plan may be used. Throws Unsupported.
 */
export function planRules(live: ParsedPolicy[], shadow: ParsedPolicy[], builtin: ParsedPolicy): PlannedRules {
  const set = groupRules(live, shadow, builtin);
  const { changed, affected, readsAffected } = affectedGroups(set.groups);
  const extended = extendedGroups(set.groups, affected, readsAffected);
  const affectedPackages = new Map<string, string[]>();
  for (const k of affected) {
    const g = set.groups.get(k)!;
    affectedPackages.set(g.pkgKey, g.pkg);
  }
  for (const pkg of affectedPackages.values()) {
    if (!pkg.every((s) => IDENT.test(s)))
      unsupported(`package ${JSON.stringify(pkg)} has a segment that is not a name`);
  }
  const route = router(set.packages, affectedPackages);
  const copies = copyModules(set, affected, extended, route);
  const shared = sharedModules(set.groups, affectedPackages, affected, extended);
  const decision = DECISION_PATH.join('.');
  const copied = route(DECISION_PATH) === 'copy';
  const { compared, delegated } = copied ? comparable(set, changed, affected) : NOT_COMPARED;
  const deltas = compared.map((g, i) => deltaOf(set, g, i, route));
  const entry = [`package ${ENTRY_ROOT}`, '', `both["live"] := data.${decision}`, ''];
  if (!copied) {
    // The decision reads nothing the shadow set changes: the live decision is the shadow's too.
    entry.push('both["same"] := true');
  } else if (compared.length === 0) {
    entry.push(`both["shadow"] := data.${SHADOW_ROOT}.${decision}`);
  } else {
    // Where every changed rule has the value its live rule has, with the input and with each
    // input a rule between them and the decision evaluates them with, every rule reading them
    // does too (Rego has no recursion), and so does the decision: the copy is not evaluated.
    // `==` alone is not enough: it holds 1 equal to 1.0, 1e3 to 1000 and 0.5 to 0.50, which the
    // rules reading them can tell apart (json.marshal, sprintf write each as it is written), so
    // the values must also be written out the same. (json.marshal alone would hold a set equal
    // to an array of its members.)
    const equal = (d: Delta) => [
      `${d.shadow} == ${d.live}`,
      `json.marshal(${d.shadow}) == json.marshal(${d.live})`,
    ];
    entry.push('same if {', ...deltas.flatMap((d) => equal(d).map((e) => `\t${e}`)));
    if (delegated) entry.push(`\t${FRESH}_delegated_same`);
    entry.push('}', '');
    if (delegated) {
      // The builtin module's delegated decision evaluates them as the delegating user's.
      const [d, di] = [DELEGATED, DELEGATED_INPUT].map((r) => `data.${[...BUILTIN_PACKAGE, r].join('.')}`);
      entry.push(
        `${FRESH}_delegated_same if not ${d}`,
        '',
        `${FRESH}_delegated_same if {`,
        `\t${d}`,
        ...deltas.flatMap((d) => equal(d).map((e) => `\t${e} with input as ${di}`)),
        '}',
        '',
      );
    }
    entry.push(
      'both["same"] := true if same',
      '',
      `both["shadow"] := data.${SHADOW_ROOT}.${decision} if not same`,
    );
  }
  const name = (g: Group) => [...g.pkg, g.name].join('.');
  const plan: PairedPlan = {
    modules: [
      ...copies,
      ...shared.modules,
      ...deltas.flatMap((d) => d.modules),
      { name: 'entry', rego: entry.join('\n') + '\n' },
    ],
    copied: shared.copied.sort(),
    extended: [...extended].map((k) => (JSON.parse(k) as string[]).join('.')).sort(),
    compared: compared.map(name).sort(),
    comparedByChanges: compared
      .filter((_, i) => deltas[i]!.modules.length > 0)
      .map(name)
      .sort(),
  };
  return { plan, changedPackages: [...affectedPackages.values()] };
}

/** How `same` holds a changed rule against its live rule: two expressions, and what they need. */
interface Delta {
  shadow: string;
  live: string;
  modules: Module[];
}

/**
 * A changed rule's comparison. A multi-value rule (`g contains x if …`) is the union of its rules'
 * members, and the rules both sides hold (same text, same imports) give the same members where
 * everything they read has its live value. Rego has no recursion, so that is so once every
 * changed rule read on the way is equal: the rule is then equal on both sides when the rules only
 * the shadow side holds give the members of the rules only the live side holds. Those are
 * evaluated on their own, each side's in a package of its own under the entry's (`n` keeps the
 * rules of several changed rules of one package apart), where the names of their package mean
 * what they mean on that side: aliases of the copy's rules, or of the live ones. A rule of a
 * side without such rules is the empty set. Any other rule, and a multi-value rule whose live
 * rules use `with`, is compared whole.
 */
function deltaOf(set: RuleSets, g: Group, n: number, route: (path: string[]) => 'copy' | 'live'): Delta {
  const path = [...g.pkg, g.name].join('.');
  const whole = { shadow: `data.${SHADOW_ROOT}.${path}`, live: `data.${path}`, modules: [] };
  if (![...g.live, ...g.shadow].every((r) => r.multiValue) || g.live.some((r) => r.withs.length > 0)) {
    return whole;
  }
  const modules: Module[] = [];
  const side = (which: 'shadow' | 'live', rules: RuleInfo[]): string => {
    if (rules.length === 0) return 'set()';
    const pkg = [ENTRY_ROOT, DELTA, `d${n}`, which, ...g.pkg].join('.');
    const routeOf = which === 'shadow' ? route : () => 'live' as const;
    for (const [m, list] of groupBy(rules, (r) => r.module)) {
      const lines = [`package ${pkg}`, '', ...copyImports(m, list, routeOf)];
      for (const r of list) lines.push('', which === 'shadow' ? rewrite(r, route) : r.text);
      modules.push({
        name: `${DELTA}-${n}-${which}-${modules.length}-${m.name}`,
        rego: lines.join('\n') + '\n',
      });
    }
    // The package's rules these may read by name, as this side has them: the names they use that
    // are rules of the package on either side (and the rules they read by path, which then read
    // no alias). A name only the other side has a rule of stays a variable, as on this side.
    const names = new Set<string>();
    for (const r of rules) {
      for (const p of r.reads) {
        const name = p.at(-1)!;
        if (p.length === g.pkg.length + 1 && key(p.slice(0, -1)) === g.pkgKey && IDENT.test(name)) {
          names.add(name);
        }
      }
    }
    names.delete(g.name);
    const aliases = [`package ${pkg}`, ''];
    for (const name of [...names].sort()) {
      const read = set.groups.get(key([...g.pkg, name]))?.[which];
      if (!read || read.length === 0) continue;
      const target =
        which === 'shadow' ? `${SHADOW_ROOT}.${g.pkg.join('.')}.${name}` : `${g.pkg.join('.')}.${name}`;
      aliases.push(aliasOf(read, name, target));
    }
    modules.push({ name: `${DELTA}-${n}-${which}-names`, rego: aliases.join('\n') + '\n' });
    return `data.${pkg}.${g.name}`;
  };
  return {
    shadow: side('shadow', difference(g.shadow, g.live)),
    live: side('live', difference(g.live, g.shadow)),
    modules,
  };
}

/**
 * The changed rules, as `package.rule`, when each one's value can be held against its live rule's
 * (`==`) before the copy is evaluated; empty when any cannot: a function (a value per argument),
 * a rule only one side defines, a rule with a reference head, or one whose name is not a name.
 * Empty too when a rule of the copy uses `with`, which may evaluate a changed rule with another
 * input than the one its value was compared at; except the builtin module's delegated decision
 * (`with input as delegated_input`, `delegated`): they are then compared with that input too.
 */
function comparable(set: RuleSets, changed: Group[], affected: Set<string>): Comparison {
  let delegated = false;
  for (const k of affected) {
    for (const r of set.groups.get(k)!.shadow) {
      if (r.withs.length === 0) continue;
      if (r.module !== set.builtin || r.withs.some((w) => w !== DELEGATED_INPUT)) return NOT_COMPARED;
      delegated = true;
    }
  }
  // What the delegated decision evaluates them with is the same on both sides.
  if (delegated && [DELEGATED, DELEGATED_INPUT].some((r) => affected.has(key([...BUILTIN_PACKAGE, r])))) {
    return NOT_COMPARED;
  }
  // (The changed packages' segments are names: planPaired refuses the rest.)
  const ok = (g: Group) =>
    g.live.length > 0 &&
    g.shadow.length > 0 &&
    IDENT.test(g.name) &&
    [...g.live, ...g.shadow].every((r) => r.arity === undefined && !r.refHead);
  if (changed.length === 0 || !changed.every(ok)) return NOT_COMPARED;
  return { compared: changed, delegated };
}

/** Both sets' modules read, and their rules grouped by package and name. */
interface RuleSets {
  shadowModules: ParsedModule[];
  /** The builtin decision module, as both sets hold it. */
  builtin: ParsedModule;
  /** Every package either set declares, by key. */
  packages: Map<string, string[]>;
  /** Rule groups by key([...pkg, name]). */
  groups: Map<string, Group>;
}

function groupRules(live: ParsedPolicy[], shadow: ParsedPolicy[], builtin: ParsedPolicy): RuleSets {
  // A module both sets hold (most of them) is read once.
  const readOnce = new Map<string, ParsedModule>();
  const read = (p: ParsedPolicy) => {
    const k = `${p.name}\u0000${p.rego}`;
    let m = readOnce.get(k);
    if (!m) {
      m = parseModule(p);
      readOnce.set(k, m);
    }
    return m;
  };
  const liveModules = [...live, builtin].map(read);
  const shadowModules = [...shadow, builtin].map(read);
  const packages = new Map<string, string[]>();
  // The rule names of each package in either set: a bare name in a rule may mean any of them.
  const groupNames = new Map<string, Set<string>>();
  for (const m of [...liveModules, ...shadowModules]) {
    if (m.pkg[0] === SHADOW_ROOT || m.pkg[0] === ENTRY_ROOT) {
      unsupported(`package ${m.pkg.join('.')} is reserved`);
    }
    packages.set(m.pkgKey, m.pkg);
    const names = groupNames.get(m.pkgKey) ?? new Set<string>();
    for (const r of m.rules) names.add(ruleGroup(r));
    groupNames.set(m.pkgKey, names);
  }
  const groups = new Map<string, Group>();
  const infos = new Map<ParsedModule, RuleInfo[]>();
  const infosOf = (m: ParsedModule) => {
    let list = infos.get(m);
    if (!list) {
      list = m.rules.map((r) => ruleInfo(m, r, groupNames.get(m.pkgKey) ?? new Set()));
      for (const info of list) {
        if (info.readsAllData) unsupported(`a rule of ${m.name} reads the whole of data`);
        if (info.reads.some((p) => p[0] === SHADOW_ROOT || p[0] === ENTRY_ROOT)) {
          unsupported(`a rule of ${m.name} reads data.${SHADOW_ROOT} or data.${ENTRY_ROOT}`);
        }
      }
      infos.set(m, list);
    }
    return list;
  };
  for (const [modules, side] of [
    [liveModules, 'live'],
    [shadowModules, 'shadow'],
  ] as const) {
    for (const m of modules) {
      for (const info of infosOf(m)) {
        const k = key([...m.pkg, info.group]);
        let g = groups.get(k);
        if (!g) {
          g = { key: k, pkg: m.pkg, pkgKey: m.pkgKey, name: info.group, live: [], shadow: [] };
          groups.set(k, g);
        }
        g[side].push(info);
      }
    }
  }
  for (const p of packages.values()) {
    for (let n = 1; n <= p.length; n++) {
      if (groups.has(key(p.slice(0, n)))) {
        unsupported(`rule ${p.slice(0, n).join('.')} is where package ${p.join('.')} is`);
      }
    }
  }
  for (const g of groups.values()) {
    if (g.name.startsWith(FRESH))
      unsupported(`rule ${[...g.pkg, g.name].join('.')} has a name this planner uses`);
  }
  return { shadowModules, builtin: read(builtin), packages, groups };
}

/** The keys of a path's prefixes, shortest first, the path itself last. */
const prefixes = (path: string[]) => path.map((_, n) => key(path.slice(0, n + 1)));

/**
 * The rules the shadow set changes, and every rule that reads one of them, transitively. A read
 * of path p reaches rule g when one path starts with the other (p reads g's value or a document
 * holding g). Reads are indexed by path and by each shorter prefix of it, and changed rules by
 * each prefix of theirs, so that every step is a few lookups: thousands of rules are planned on
 * the serving thread, and nothing here may grow with their square.
 */
function affectedGroups(groups: Map<string, Group>): {
  /** The groups whose rules differ between the two sets. */
  changed: Group[];
  affected: Set<string>;
  /** Whether any of `rules` reads a changed rule. */
  readsAffected: (rules: RuleInfo[]) => boolean;
} {
  const readersAt = new Map<string, Set<Group>>();
  const readersUnder = new Map<string, Set<Group>>();
  const register = (index: Map<string, Set<Group>>, at: string, g: Group) => {
    const set = index.get(at) ?? new Set<Group>();
    set.add(g);
    index.set(at, set);
  };
  for (const g of groups.values()) {
    for (const r of g.shadow) {
      for (const p of r.reads) {
        register(readersAt, key(p), g);
        for (const q of prefixes(p).slice(0, -1)) register(readersUnder, q, g);
      }
    }
  }
  const affected = new Set<string>();
  const affectedUnder = new Set<string>();
  const pending: Group[] = [];
  const affect = (g: Group) => {
    if (affected.has(g.key)) return;
    affected.add(g.key);
    for (const q of prefixes([...g.pkg, g.name]).slice(0, -1)) affectedUnder.add(q);
    pending.push(g);
  };
  const changed = [...groups.values()].filter((g) => !sameRules(g.live, g.shadow));
  for (const g of changed) affect(g);
  for (let g = pending.pop(); g !== undefined; g = pending.pop()) {
    // Readers of a document holding g (a prefix of its path, or the path), and readers inside it.
    for (const q of prefixes([...g.pkg, g.name])) for (const reader of readersAt.get(q) ?? []) affect(reader);
    for (const reader of readersUnder.get(g.key) ?? []) affect(reader);
  }
  /** Whether a read of `p` reaches a changed rule: one at a prefix of it, or one under it. */
  const readsChanged = (p: string[]) => affectedUnder.has(key(p)) || prefixes(p).some((q) => affected.has(q));
  return { changed, affected, readsAffected: (rules) => rules.some((r) => r.reads.some(readsChanged)) };
}

/**
 * The changed multi-value rules to which the shadow set only adds rules, and whose live rules read
 * nothing changed: their live members are the live rule's, shared.
 */
function extendedGroups(
  groups: Map<string, Group>,
  affected: Set<string>,
  readsAffected: (rules: RuleInfo[]) => boolean,
): Set<string> {
  const extended = new Set<string>();
  for (const k of affected) {
    const g = groups.get(k)!;
    const all = [...g.live, ...g.shadow];
    if (
      g.live.length > 0 &&
      all.every((r) => r.multiValue && !r.refHead && r.arity === undefined) &&
      containsAll(g.shadow, g.live) &&
      !readsAffected(g.live)
    ) {
      extended.add(k);
    }
  }
  return extended;
}

/**
 * Where a path read by a copied rule is read from: the copy when the package it is in changed,
 * else the live set; refused when it reads data, or a changed package, whole.
 */
function router(
  packages: Map<string, string[]>,
  affectedPackages: Map<string, string[]>,
): (path: string[]) => 'copy' | 'live' {
  const holdsChanged = new Set<string>();
  for (const pkg of affectedPackages.values()) for (const q of prefixes(pkg)) holdsChanged.add(q);
  return (path) => {
    if (path.length === 0) unsupported('a copied rule reads the whole of data');
    if (holdsChanged.has(key(path))) {
      unsupported(`a copied rule reads the whole of data.${path.join('.')}, which holds a changed package`);
    }
    // The package the path is in: the longest one it starts with. It may be that package itself,
    // read whole, when it is not changed and holds no changed package: then the live one.
    for (let n = path.length; n > 0; n--) {
      const at = key(path.slice(0, n));
      if (packages.has(at)) return affectedPackages.has(at) ? 'copy' : 'live';
    }
    return 'live';
  };
}

/** One copy module per shadow-set module with copied rules: each keeps its own imports. */
function copyModules(
  set: RuleSets,
  affected: Set<string>,
  extended: Set<string>,
  route: (path: string[]) => 'copy' | 'live',
): Module[] {
  const copiedRules = groupBy(
    [...set.groups.values()]
      .filter((g) => affected.has(g.key))
      .flatMap((g) => (extended.has(g.key) ? added(g) : g.shadow)),
    (r) => r.module,
  );
  const out: Module[] = [];
  // A package's rules are evaluated in the order of their files' paths (compiler.ts writes the
  // builtin module to builtin/authz.rego, the others to policies/<name>.rego), and of two rules
  // giving values equal by == but written differently (1, 1.0) the first one's is kept. The
  // copies are named to sort as the set's own files do, so that the copy keeps the same one.
  const path = (m: ParsedModule) =>
    Buffer.from(m === set.builtin ? 'builtin/authz.rego' : `policies/${m.name}.rego`);
  const ordered = [...set.shadowModules].sort((a, b) => Buffer.compare(path(a), path(b)));
  const width = String(ordered.length).length;
  for (const m of ordered) {
    const rules = copiedRules.get(m);
    if (!rules) continue;
    const lines: string[] = [`package ${[SHADOW_ROOT, ...m.pkg].join('.')}`, ''];
    lines.push(...copyImports(m, rules, route));
    for (const r of rules) {
      if (r.withData) unsupported(`a copied rule of ${m.name} uses with on data`);
      lines.push('', rewrite(r, route));
    }
    const n = String(out.length).padStart(width, '0');
    out.push({ name: `copy-${n}-${m.name}`, rego: lines.join('\n') + '\n' });
  }
  return out;
}

/**
 * The rest of each changed package: aliases of the live rules it does not change, and the live
 * members of the multi-value rules it extends. `copied` names the rules copied instead.
 */
function sharedModules(
  groups: Map<string, Group>,
  affectedPackages: Map<string, string[]>,
  affected: Set<string>,
  extended: Set<string>,
): { modules: Module[]; copied: string[] } {
  const groupsOf = groupBy(groups.values(), (g) => g.pkgKey);
  const modules: Module[] = [];
  const copied: string[] = [];
  for (const [pkgKey, pkg] of affectedPackages) {
    const lines: string[] = [`package ${[SHADOW_ROOT, ...pkg].join('.')}`, ''];
    for (const g of groupsOf.get(pkgKey) ?? []) {
      if (g.shadow.length === 0) continue;
      const path = [...pkg, g.name].join('.');
      if (extended.has(g.key)) {
        lines.push(`${g.name} contains ${FRESH} if some ${FRESH} in data.${path}`);
      } else if (affected.has(g.key)) {
        copied.push(path);
      } else {
        lines.push(aliasOf(g.shadow, g.name, path));
      }
    }
    modules.push({ name: `shared-${modules.length}`, rego: lines.join('\n') + '\n' });
  }
  return { modules, copied };
}

/** `name := data.path`, or for a function `name(a, b) := data.path(a, b)`, of the rules `rules`. */
function aliasOf(rules: RuleInfo[], name: string, path: string): string {
  const arities = new Set(rules.map((r) => r.arity));
  if (arities.size !== 1) unsupported(`rule ${path} is both a function and a document`);
  const arity = rules[0]!.arity;
  if (arity === undefined) return `${name} := data.${path}`;
  if (rules.some((r) => r.refHead)) unsupported(`function ${path} has a reference head`);
  const args = Array.from({ length: arity }, (_, i) => `${FRESH}${i}`).join(', ');
  return `${name}(${args}) := data.${path}(${args})`;
}

/** The group a rule defines: the first term of its head. */
function ruleGroup(r: AstRule): string {
  const first = r.head.ref?.[0];
  const name = first && first.type === 'var' && typeof first.value === 'string' ? first.value : r.head.name;
  if (typeof name !== 'string' || name === '') return unsupported('a rule has no name');
  return name;
}

function parseModule(p: ParsedPolicy): ParsedModule {
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

function ruleInfo(m: ParsedModule, r: AstRule, packageRules: Set<string>): RuleInfo {
  const group = ruleGroup(r);
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
  const aliases = new Map(m.imports.filter((i) => i.root === 'data').map((i) => [i.alias, i.path]));
  const otherAliases = new Set(m.imports.filter((i) => i.root !== 'data').map((i) => i.alias));
  const info: RuleInfo = {
    module: m,
    group,
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
  const imports = m.imports
    // What the rule's names mean: the imports it uses, and the language switches (rego.v1).
    .filter((i) => usedAliases.has(i.alias) || i.root === 'rego' || i.root === 'future')
    .map((i) => `${i.alias}=${key([i.root, ...i.path])}`)
    .sort();
  info.signature = `${key(m.pkg)}\u0001${imports.join('\u0001')}\u0001${text}`;
  return info;
}

/** `items` by `by`, each list in the order of `items` (linear: planning runs on the serving thread). */
function groupBy<K, V>(items: Iterable<V>, by: (v: V) => K): Map<K, V[]> {
  const out = new Map<K, V[]>();
  for (const v of items) {
    const list = out.get(by(v));
    if (list) list.push(v);
    else out.set(by(v), [v]);
  }
  return out;
}

/** Whether two lists hold the same rules, as many times each. */
function sameRules(a: RuleInfo[], b: RuleInfo[]): boolean {
  return a.length === b.length && containsAll(a, b);
}

/** Whether `outer` holds every rule of `inner`, as many times. */
function containsAll(outer: RuleInfo[], inner: RuleInfo[]): boolean {
  const counts = new Map<string, number>();
  for (const r of outer) counts.set(r.signature, (counts.get(r.signature) ?? 0) + 1);
  for (const r of inner) {
    const n = counts.get(r.signature) ?? 0;
    if (n === 0) return false;
    counts.set(r.signature, n - 1);
  }
  return true;
}

/** The rules the shadow set adds to the live rules of `g` (a multi-value rule it extends). */
const added = (g: Group): RuleInfo[] => difference(g.shadow, g.live);

/** The rules of `a` that `b` does not hold, each as many times more as `a` holds it. */
function difference(a: RuleInfo[], b: RuleInfo[]): RuleInfo[] {
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

/** Whether `data` holds anything at or under `pkg` (a package's document would merge it). */
function dataBeneath(data: Record<string, unknown>, pkg: string[]): boolean {
  const isObject = (v: unknown): v is Record<string, unknown> =>
    typeof v === 'object' && v !== null && !Array.isArray(v);
  let node: unknown = data;
  for (const s of pkg) {
    // A value that is not an object on the way: the package and the document would conflict.
    if (!isObject(node)) return true;
    if (!Object.hasOwn(node, s)) return false;
    node = node[s];
  }
  return !(isObject(node) && Object.keys(node).length === 0);
}

/** The imports of `m` that `rules` use, each pointing at the copy or the live set as its uses do. */
function copyImports(m: ParsedModule, rules: RuleInfo[], route: (p: string[]) => 'copy' | 'live'): string[] {
  const out: string[] = [];
  for (const im of m.imports) {
    if (im.root === 'rego' || im.root === 'future') {
      // rego.v1 and future.keywords: language switches, never aliased.
      out.push(`import ${refText(im.root, im.path)}`);
      continue;
    }
    if (im.root !== 'data') {
      out.push(`import ${refText(im.root, im.path)}${im.explicit ? ` as ${im.alias}` : ''}`);
      continue;
    }
    const uses = rules.flatMap((r) => r.aliasReads.get(im.alias) ?? []);
    if (uses.length === 0) continue;
    const routes = new Set(uses.map(route));
    if (routes.size !== 1)
      unsupported(`import ${im.alias} of ${m.name} reads both changed and unchanged packages`);
    const root = routes.has('copy') ? ['data', SHADOW_ROOT] : ['data'];
    out.push(`import ${refText(root[0]!, [...root.slice(1), ...im.path])} as ${im.alias}`);
  }
  return out;
}

function refText(root: string, path: string[]): string {
  return root + path.map((s) => (IDENT.test(s) ? `.${s}` : `[${JSON.stringify(s)}]`)).join('');
}

/** A copied rule's text, each `data…` reference it makes into the copy's packages rewritten there. */
function rewrite(r: RuleInfo, route: (p: string[]) => 'copy' | 'live'): string {
  let text = r.text;
  for (const ref of [...r.dataRefs].sort((a, b) => b.after - a.after)) {
    if (route(ref.path) === 'copy')
      text = `${text.slice(0, ref.after)}.${SHADOW_ROOT}${text.slice(ref.after)}`;
  }
  return text;
}
