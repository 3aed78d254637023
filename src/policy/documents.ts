import { createHash } from 'node:crypto';
import { canonicalJson } from '../common/canonical-json.js';
import { invalid } from '../errors.js';
import type { RegoAst } from './rego-ast.js';
import type { DataDocument } from './types.js';

/**
 * What a policy set is made of, and the rules every way in (the API, a bundle, an impact
 * candidate, a policy directory) holds it to: policy names, Rego texts, data paths, the data
 * document they build, and their content addresses.
 */

export const POLICY_NAME = /^[a-z0-9][a-z0-9._-]{0,127}$/;
const DATA_SEGMENT = /^[A-Za-z0-9_][A-Za-z0-9_-]{0,127}$/;
const MAX_DATA_DEPTH = 16;
/** Names that would reach Object.prototype when the data tree is built. */
const RESERVED_SEGMENTS = new Set(['__proto__', 'constructor', 'prototype']);

/** A policy text's content address (what history stores it under). */
export const regoSha256 = (rego: string) => createHash('sha256').update(rego).digest('hex');
/** A data document's content address: the sha256 of its canonical JSON (what history stores). */
export const dataSha256 = (value: unknown) => regoSha256(canonicalJson(value));

export function checkName(name: string): void {
  if (!POLICY_NAME.test(name)) {
    throw invalid(`invalid policy name ${JSON.stringify(name)}: must match [a-z0-9][a-z0-9._-]{0,127}`);
  }
  if (name === 'authz') throw invalid('policy name authz is reserved for the built-in decision module');
}

/** A policy text the compiler is given at all; `of` names the policy where several are given. */
export function checkRego(rego: string, of?: string): void {
  const prefix = of === undefined ? '' : `policy ${of}: `;
  if (rego.trim() === '') throw invalid(`${prefix}rego must not be empty`);
  if (rego.includes('\0')) throw invalid(`${prefix}rego must not contain U+0000`);
}

export function checkDataPath(p: string): void {
  const segs = p.split('/');
  if (segs.length > MAX_DATA_DEPTH || !segs.every((s) => DATA_SEGMENT.test(s))) {
    throw invalid(
      `invalid data path ${JSON.stringify(p)}: 1 to ${MAX_DATA_DEPTH} segments of [A-Za-z0-9_-] separated by /`,
    );
  }
  if (segs[0] === 'authz') throw invalid('data path authz is reserved for policies (data.authz.*)');
  const bad = segs.find((s) => RESERVED_SEGMENTS.has(s));
  if (bad) throw invalid(`data path segment ${bad} is not allowed`);
}

/** Whether one data path lies below the other (two documents cannot both hold it). */
export function overlaps(a: string, b: string): boolean {
  return a.startsWith(b + '/') || b.startsWith(a + '/');
}

/** Builds the `data` document from stored documents placed at their paths. */
export function dataTree(docs: Pick<DataDocument, 'path' | 'value'>[]): Record<string, unknown> {
  // Null-prototype nodes and own-property checks: no path can reach Object.prototype.
  const root: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
  for (const d of docs) {
    const segs = d.path.split('/');
    let node = root;
    for (const s of segs.slice(0, -1)) {
      const next = Object.hasOwn(node, s) ? node[s] : undefined;
      if (typeof next !== 'object' || next === null || Array.isArray(next)) {
        node[s] = Object.create(null) as Record<string, unknown>;
      }
      node = node[s] as Record<string, unknown>;
    }
    node[segs[segs.length - 1] as string] = d.value;
  }
  return root;
}

/** Where a module defines a rule that the data also hold (ruleDataConflict). */
export interface RuleDataConflict {
  /** The rule's path below `data`, `/`-separated (as OPA names it). */
  path: string;
  policy: string;
  row: number;
  /** Where the data hold a value: the rule's path, or the prefix of it that holds a non-object. */
  held: string;
}

/**
 * The first rule of `modules` whose path the data also hold, as OPA's compiler finds it when it
 * is given data (`opa eval -d`, `opa run`: "conflicting rule for data path p found"): a rule's path
 * (its package and the ground prefix of its head, `x.y[z]` is `x/y`) conflicts when the data hold
 * any value there, or a value other than an object at the nearest prefix they hold. `opa build`
 * never sees Arbiter's data, and the compiled policy then read the rule through `data.x.flag` and
 * the document through `data.x`: two values for one path, where OPA refuses the set.
 */
export function ruleDataConflict(
  modules: { name: string; ast: RegoAst }[],
  data: Record<string, unknown>,
): RuleDataConflict | undefined {
  if (Object.keys(data).length === 0) return undefined;
  for (const { name, ast } of modules) {
    const pkg = groundStrings(ast.package.path.slice(1));
    if (pkg.length < ast.package.path.length - 1) continue;
    for (const rule of ast.rules ?? []) {
      const ref = rule.head.ref ?? [];
      if (ref[0]?.type !== 'var') continue;
      const segs = [...pkg, String(ref[0].value), ...groundStrings(ref.slice(1))];
      const held = heldAt(data, segs);
      if (held === undefined) continue;
      const row = rule.head.location?.row ?? rule.location?.row ?? 0;
      return { path: segs.join('/'), policy: name, row, held: segs.slice(0, held).join('/') };
    }
  }
  return undefined;
}

/** The leading string terms of a ref (up to its first variable or other term). */
function groundStrings(terms: { type: string; value: unknown }[]): string[] {
  const out: string[] = [];
  for (const t of terms) {
    if (t.type !== 'string' || typeof t.value !== 'string') break;
    out.push(t.value);
  }
  return out;
}

/**
 * OPA's storage.NonEmpty: how many of `segs` lead to where the data hold a value that conflicts
 * (all of them: a value at the path; fewer: a value other than an object on the way), or
 * undefined when an object on the way lacks the next key.
 */
function heldAt(data: unknown, segs: string[]): number | undefined {
  let node: unknown = data;
  for (const [i, s] of segs.entries()) {
    if (Array.isArray(node)) {
      // OPA's store reads an array by a decimal index; any other key is not found there.
      if (!/^(?:0|[1-9]\d*)$/.test(s) || Number(s) >= node.length) return i;
      node = node[Number(s)];
    } else if (typeof node === 'object' && node !== null) {
      if (!Object.hasOwn(node, s)) return undefined;
      node = (node as Record<string, unknown>)[s];
    } else {
      return i;
    }
  }
  return segs.length;
}
