import { canonicalJson } from '../common/canonical-json.js';
import { regoSha256 } from '../policy/documents.js';
import type { readPolicyDir } from '../policy/policy-dir.js';
import type { LiveSet } from './policy-server.js';

/** DIR as the service would seed it. */
export type LocalSet = Awaited<ReturnType<typeof readPolicyDir>>;

export interface Plan {
  revision: number;
  policies: { create: string[]; update: string[]; delete: string[]; keep: string[]; unchanged: string[] };
  data: { create: string[]; update: string[]; delete: string[]; keep: string[]; unchanged: string[] };
  bundle: { policies: Record<string, string>; data: Record<string, unknown>; prune: boolean };
}

/** What pushing DIR would change in the live set: per policy and per data document. */
export function planOf(local: LocalSet, live: LiveSet, prune: boolean): Plan {
  const plan: Plan = {
    revision: live.revision,
    policies: { create: [], update: [], delete: [], keep: [], unchanged: [] },
    data: { create: [], update: [], delete: [], keep: [], unchanged: [] },
    bundle: { policies: {}, data: {}, prune },
  };
  const localNames = new Set(local.modules.map((m) => m.name));
  for (const m of local.modules) {
    plan.bundle.policies[m.name] = m.rego;
    const current = live.policies.get(m.name);
    if (!current) plan.policies.create.push(m.name);
    else if (current.sha256 !== regoSha256(m.rego)) plan.policies.update.push(m.name);
    else plan.policies.unchanged.push(m.name);
  }
  for (const name of live.policies.keys()) {
    if (!localNames.has(name)) (prune ? plan.policies.delete : plan.policies.keep).push(name);
  }
  const localPaths = new Set(local.data.map((d) => d.path));
  for (const d of local.data) {
    const has = live.data.has(d.path);
    if (!has) plan.data.create.push(d.path);
    else if (canonicalJson(live.data.get(d.path)) !== canonicalJson(d.value)) plan.data.update.push(d.path);
    else {
      plan.data.unchanged.push(d.path);
      continue;
    }
    plan.bundle.data[d.path] = d.value;
  }
  for (const p of live.data.keys()) {
    if (localPaths.has(p)) continue;
    if (prune) {
      plan.data.delete.push(p);
      plan.bundle.data[p] = null;
    } else plan.data.keep.push(p);
  }
  for (const list of [...Object.values(plan.policies), ...Object.values(plan.data)]) list.sort();
  return plan;
}

export const changes = (p: Plan) =>
  p.policies.create.length +
  p.policies.update.length +
  p.policies.delete.length +
  p.data.create.length +
  p.data.update.length +
  p.data.delete.length;

/** The plan as a person reads it in a CI log. */
export function planText(p: Plan, server: string): string[] {
  const lines = [`plan against revision ${p.revision} of ${server}:`];
  for (const [verb, names] of [
    ['create', p.policies.create],
    ['update', p.policies.update],
    ['delete', p.policies.delete],
  ] as const) {
    for (const n of names) lines.push(`  ${verb.padEnd(6)} policy ${n}`);
  }
  for (const [verb, names] of [
    ['create', p.data.create],
    ['update', p.data.update],
    ['delete', p.data.delete],
  ] as const) {
    for (const n of names) lines.push(`  ${verb.padEnd(6)} data   ${n}`);
  }
  for (const n of p.policies.keep) lines.push(`  keep   policy ${n} (live only; --prune deletes it)`);
  for (const n of p.data.keep) lines.push(`  keep   data   ${n} (live only; --prune deletes it)`);
  if (changes(p) === 0) lines.push('  no changes');
  lines.push(
    `  unchanged: ${p.policies.unchanged.length} policies, ${p.data.unchanged.length} data documents`,
  );
  return lines;
}

export const planJson = ({ bundle: _b, ...rest }: Plan) => rest;
