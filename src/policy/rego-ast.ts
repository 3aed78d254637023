/**
 * The parse trees of Rego modules as `opa parse` gives them (compiler.ts asks for them): the part
 * of the JSON this project reads, for the rule/data conflict check (documents.ts) and the paired
 * planner (paired.ts, paired-rules.ts).
 */

/** `opa parse --format json --json-include locations,-comments` of one module: what is read of it. */
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

export interface AstLocation {
  row: number;
  col: number;
  /** Base64 of the source text the node was parsed from. */
  text?: string;
}

export interface AstImport {
  path: AstTerm;
  alias?: string;
}

export interface AstRule {
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
