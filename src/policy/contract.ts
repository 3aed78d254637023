/**
 * What the built-in decision module (rego/authz.rego) reads of the user's packages, and in what
 * shape (README "Writing policies"). A user rule of the wrong shape — `thresholds := 5`, `allow :=
 * "yes"`, `deny(x) := …` — compiles on its own, and OPA's type checker then complains where the
 * built-in module reads it: up to ten errors on rows of builtin/authz.rego, naming none of the
 * user's. `relocateContractErrors` turns those into one error per defining rule, at the user's row.
 */

/** The rules of `authz.agent` / `authz.human` the decision module reads, and the shape it needs. */
export const CONTRACT: Readonly<Record<string, string>> = {
  allow: 'must be true or undefined: `allow if …`',
  deny: 'must be a set of reasons (`deny contains reason if …`) or one value, not a function',
  require_approval:
    'must be a set of reasons (`require_approval contains reason if …`) or one value, not a function',
  thresholds:
    'must be an object of action -> {"deny_below": x, "approval_below": y}: `thresholds[action] := {…}`',
  limits: 'must be a set of limits: `limits contains {"key": k, "window": w, "max": n}`',
};

/** A reference of the decision module to a user rule, as OPA prints it in messages and source. */
const READS = /\bdata\.authz\.(agent|human)\.([A-Za-z_][A-Za-z0-9_]*)/;

/** One error of `opa check`, as the compiler sees it. */
export interface LocatedError {
  message: string;
  code?: string;
  location?: { file: string; row: number; col: number };
}

/** A user rule's definition: the policy module's file (as given to `opa`), row and column. */
export interface RuleSite {
  file: string;
  row: number;
  col: number;
}

/**
 * Finds where the user's modules define `data.authz.<kind>.<name>`: each rule whose package and
 * head together name that path, or a package at or below it (whose rules make up the document).
 * `parse` returns `opa parse --format json --json-include locations` of one file.
 */
export async function ruleSites(
  files: { file: string; text: string }[],
  kind: string,
  name: string,
  parse: (file: string) => Promise<ParsedModule | undefined>,
): Promise<RuleSite[]> {
  const word = new RegExp(`\\b${name}\\b`);
  const sites: RuleSite[] = [];
  // Only files that mention the name at all; at most 20 parses, on a path that already failed.
  for (const f of files.filter((x) => word.test(x.text)).slice(0, 20)) {
    const parsed = await parse(f.file);
    if (!parsed) continue;
    const pkg = termValues(parsed.package?.path?.slice(1) ?? []);
    const target = ['authz', kind, name];
    if (startsWith(pkg, target)) {
      const loc = parsed.package?.location;
      if (loc) sites.push({ file: f.file, row: loc.row, col: loc.col });
      continue;
    }
    for (const rule of parsed.rules ?? []) {
      const path = [...pkg, ...termValues(rule.head?.ref ?? [])];
      const loc = rule.head?.location ?? rule.location;
      if (loc && startsWith(path, target)) sites.push({ file: f.file, row: loc.row, col: loc.col });
    }
  }
  return sites;
}

/**
 * Replaces the errors OPA located in the built-in module that name a contract rule with one error
 * per user definition of that rule (message: the contract, then OPA's own words and row). When at
 * least one was relocated, the built-in module's other errors (its functions left undefined by the
 * same fault, `undefined function data.authz.threshold`) are dropped as consequences; when none
 * could be, every error is kept as OPA gave it.
 */
export async function relocateContractErrors(
  errors: LocatedError[],
  isBuiltin: (file: string) => boolean,
  builtinRego: string,
  sitesOf: (kind: string, name: string) => Promise<RuleSite[]>,
): Promise<LocatedError[]> {
  const lines = builtinRego.split('\n');
  // Up to a hundred errors may name the same few rules: find each rule's sites once.
  const found = new Map<string, Promise<RuleSite[]>>();
  const sites = (kind: string, name: string) => {
    const key = `${kind}.${name}`;
    let p = found.get(key);
    if (!p) found.set(key, (p = sitesOf(kind, name)));
    return p;
  };
  const relocated: LocatedError[] = [];
  const seen = new Set<string>();
  let builtinErrors = 0;
  for (const e of errors) {
    if (!e.location || !isBuiltin(e.location.file)) continue;
    builtinErrors++;
    const read = READS.exec(e.message) ?? READS.exec(lines[e.location.row - 1] ?? '');
    if (!read) continue;
    const [, kind = '', name = ''] = read;
    const shape = CONTRACT[name];
    if (shape === undefined) continue;
    for (const site of await sites(kind, name)) {
      const key = `${site.file}:${site.row}:${site.col}:${name}`;
      if (seen.has(key)) continue;
      seen.add(key);
      relocated.push({
        code: e.code,
        location: site,
        message:
          `${name} ${shape}; Arbiter's decision module reads data.authz.${kind}.${name} ` +
          `(OPA: ${e.message}, at builtin/authz.rego:${e.location.row})`,
      });
    }
  }
  if (builtinErrors === 0 || relocated.length === 0) return errors;
  // OPA's "error limit reached" counted the built-in module's errors, which are now one per rule.
  const kept = errors.filter((e) =>
    e.location ? !isBuiltin(e.location.file) : !/\berror limit reached\b/.test(e.message),
  );
  return [...relocated, ...kept];
}

/** The part of `opa parse --format json` this reads. */
export interface ParsedModule {
  package?: { path?: Term[]; location?: { row: number; col: number } };
  rules?: {
    head?: { ref?: Term[]; location?: { row: number; col: number } };
    location?: { row: number; col: number };
  }[];
}

interface Term {
  type: string;
  value: unknown;
}

/** A ref's leading names: the first term (a var) and the string keys after it, up to a variable key. */
function termValues(terms: Term[]): string[] {
  const out: string[] = [];
  for (const [i, t] of terms.entries()) {
    if ((t.type === 'string' || (i === 0 && t.type === 'var')) && typeof t.value === 'string')
      out.push(t.value);
    else break;
  }
  return out;
}

function startsWith(path: string[], prefix: string[]): boolean {
  return prefix.every((p, i) => path[i] === p);
}
