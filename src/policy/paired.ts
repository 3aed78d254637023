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
 * This file only plans: it reads `opa parse` trees (paired-rules.ts) and writes the generated Rego. The plan is
 * refused (`Unsupported`) whenever the copy could read something other than the shadow set would:
 * a rule reading the whole of `data` (`data[x]`, `walk(data, …)`), or a whole package the copy
 * changes, `with` on anything but `input` in a copied rule, a rule or data document where a
 * package is, text whose positions do not match the tree. A refused plan leaves the shadow set
 * evaluated as before, on its own.
 */
import type { Module } from './compiler.js';
import {
  containsAll,
  difference,
  groupBy,
  IDENT,
  key,
  parseModule,
  type ParsedModule,
  ruleGroup,
  ruleInfo,
  type RuleInfo,
  sameRules,
  unsupported,
} from './paired-rules.js';
import type { ParsedPolicy } from './rego-ast.js';

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

interface Group {
  /** key([...pkg, name]) */
  key: string;
  pkg: string[];
  pkgKey: string;
  name: string;
  live: RuleInfo[];
  shadow: RuleInfo[];
}

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
  const copied = route(DECISION_PATH) === 'copy';
  const { compared, delegated } = copied ? comparable(set, changed, affected) : NOT_COMPARED;
  const deltas = compared.map((g, i) => deltaOf(set, g, i, route));
  const entry = entryModule(copied, deltas, delegated);
  const name = (g: Group) => [...g.pkg, g.name].join('.');
  const plan: PairedPlan = {
    modules: [
      ...copies,
      ...shared.modules,
      ...deltas.flatMap((d) => d.modules),
      { name: 'entry', rego: entry },
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

/**
 * The entry module: `both` answers the live decision, and the shadow decision unless it is the
 * live one (`same`). `copied`: whether the decision reads anything the shadow set changes;
 * `deltas`: the changed rules compared before the copy is evaluated (none: it always is);
 * `delegated`: whether they are compared with the builtin module's delegated input too.
 */
function entryModule(copied: boolean, deltas: Delta[], delegated: boolean): string {
  const decision = DECISION_PATH.join('.');
  const entry = [`package ${ENTRY_ROOT}`, '', `both["live"] := data.${decision}`, ''];
  if (!copied) {
    // The decision reads nothing the shadow set changes: the live decision is the shadow's too.
    entry.push('both["same"] := true');
  } else if (deltas.length === 0) {
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
  return entry.join('\n') + '\n';
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

/**
 * Reads both sets' modules (each module they share once) and groups their rules by package and
 * name. Refuses (Unsupported) reserved packages, rules reading the whole of `data` or the
 * generated roots, and names that clash.
 */
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
  refuseClashes(packages, groups);
  return { shadowModules, builtin: read(builtin), packages, groups };
}

/** Refuses (Unsupported) a rule where a package is, and a rule named like the generated ones. */
function refuseClashes(packages: Map<string, string[]>, groups: Map<string, Group>): void {
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

/** The rules the shadow set adds to the live rules of `g` (a multi-value rule it extends). */
const added = (g: Group): RuleInfo[] => difference(g.shadow, g.live);

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
