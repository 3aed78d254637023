/**
 * What a change of several documents makes of a snapshot, as plain data: the bundle (SPEC §11),
 * the restore of a past revision, the impact candidate, and the whole set a plan leaves. Nothing
 * here compiles, evaluates or stores: PolicyService does that with what these answer, so the
 * rules of each change (what is unchanged, what a prune deletes, what a restore puts back) can be
 * read apart from the serialized compile-and-commit around them.
 */
import { conflict, invalid, notFound } from '../errors.js';
import type { Module } from './compiler.js';
import {
  checkDataPath,
  checkName,
  checkRego,
  dataSha256,
  dataTree,
  overlaps,
  regoSha256,
} from './documents.js';
import { blobOf } from './history.js';
import type { PolicyChange, PolicySnapshot, RevisionRecord } from './types.js';

/** A bundle as POST /api/v1/bundle takes it (SPEC §11); a data value of null deletes the document. */
export interface BundleRequest {
  policies: Record<string, string>;
  data: Record<string, unknown>;
  delete: string[];
  prune: boolean;
  message: string | null;
}

/** What a bundle did (in a dry run: would do) to the policies, or the data documents, it names. */
export interface BundleChanges {
  created: string[];
  updated: string[];
  deleted: string[];
  unchanged: string[];
}

/** A bundle's answer: its policies' changes at the top (SPEC §11), its data documents' in `data`. */
export interface BundleResult extends BundleChanges {
  revision: number;
  data: BundleChanges;
  dry_run: boolean;
}

/** The documents a change puts and deletes, as the store commits them. */
export type Plan = Pick<PolicyChange, 'putPolicies' | 'deletePolicies' | 'putData' | 'deleteData'>;

/** Whether a plan changes nothing (then no revision is made). */
export const isEmptyPlan = (p: Plan) =>
  p.putPolicies.length + p.deletePolicies.length + p.putData.length + p.deleteData.length === 0;

/** Rules of a bundle that need no snapshot: names, texts, paths, and no name both put and deleted. */
export function checkBundle(b: BundleRequest): void {
  for (const [name, rego] of Object.entries(b.policies)) {
    checkName(name);
    checkRego(rego, name);
  }
  for (const name of b.delete) {
    checkName(name);
    if (Object.hasOwn(b.policies, name))
      throw invalid(`policy ${name} is both put and deleted by the bundle`);
  }
  for (const p of Object.keys(b.data)) checkDataPath(p);
}

/**
 * A bundle against `snap`: the plan (only what differs from the live set: a text or value already
 * live is `unchanged`, not put again) and the answer it makes, at the snapshot's revision. 404
 * when it deletes a policy or data document that is not live.
 */
export function planBundle(
  snap: PolicySnapshot,
  b: BundleRequest,
  dryRun: boolean,
): { plan: Plan; result: BundleResult } {
  const live = new Map(snap.policies.map((p) => [p.name, p]));
  for (const name of b.delete) if (!live.has(name)) throw notFound(`policy ${name} not found`);
  const result: BundleResult = {
    revision: snap.revision,
    created: [],
    updated: [],
    deleted: [],
    unchanged: [],
    data: { created: [], updated: [], deleted: [], unchanged: [] },
    dry_run: dryRun,
  };
  const putPolicies: Plan['putPolicies'][number][] = [];
  for (const [name, rego] of Object.entries(b.policies).sort(([x], [y]) => x.localeCompare(y))) {
    const existing = live.get(name);
    if (existing?.rego === rego) {
      result.unchanged.push(name);
      continue;
    }
    (existing ? result.updated : result.created).push(name);
    putPolicies.push({ name, rego, description: existing?.description ?? '', sha256: regoSha256(rego) });
  }
  const deletes = new Set(b.delete);
  if (b.prune) for (const name of live.keys()) if (!Object.hasOwn(b.policies, name)) deletes.add(name);
  result.deleted = [...deletes].sort();
  const liveData = new Map(snap.data.map((d) => [d.path, d]));
  const putData: Plan['putData'][number][] = [];
  for (const [p, value] of Object.entries(b.data).sort(([x], [y]) => x.localeCompare(y))) {
    const existing = liveData.get(p);
    if (value === null) {
      if (!existing) throw notFound(`data document ${p} not found`);
      result.data.deleted.push(p);
      continue;
    }
    const sha256 = dataSha256(value);
    if (existing && dataSha256(existing.value) === sha256) {
      result.data.unchanged.push(p);
      continue;
    }
    (existing ? result.data.updated : result.data.created).push(p);
    putData.push({ path: p, value, sha256 });
  }
  const plan = { putPolicies, deletePolicies: result.deleted, putData, deleteData: result.data.deleted };
  return { plan, result };
}

/**
 * What makes revision `target`'s whole set live again over `snap`, with the texts and values
 * from `blobs` (history's; a missing one is damage, a 500). Empty when that set is live already.
 */
export function planRestore(
  snap: PolicySnapshot,
  target: RevisionRecord,
  blobs: { rego: Map<string, string>; data: Map<string, unknown> },
): Plan {
  const live = new Map(snap.policies.map((p) => [p.name, p]));
  const wanted = new Set(target.policies.map((p) => p.name));
  // A description is part of what the revision recorded (docs/decisions.md): a policy whose
  // text is live but whose description has changed since is put again with the recorded one.
  const putPolicies = target.policies
    .filter((p) => {
      const current = live.get(p.name);
      return current?.sha256 !== p.sha256 || current.description !== p.description;
    })
    .map((p) => ({
      name: p.name,
      rego: blobOf(blobs.rego, p.sha256, `policy ${p.name}`),
      description: p.description,
      sha256: p.sha256,
    }));
  const deletePolicies = snap.policies.filter((p) => !wanted.has(p.name)).map((p) => p.name);
  const liveData = new Map(snap.data.map((d) => [d.path, dataSha256(d.value)]));
  const wantedData = new Set(target.data.map((d) => d.path));
  const putData = target.data
    .filter((d) => liveData.get(d.path) !== d.sha256)
    .map((d) => ({
      path: d.path,
      value: blobOf(blobs.data, d.sha256, `data ${d.path}`),
      sha256: d.sha256,
    }));
  const deleteData = snap.data.filter((d) => !wantedData.has(d.path)).map((d) => d.path);
  return { putPolicies, deletePolicies, putData, deleteData };
}

/**
 * The whole set `snap` with `plan` applied holds: its modules and data documents, each sorted.
 * 409 when two of its data paths overlap.
 */
export function setAfter(
  snap: PolicySnapshot,
  plan: Plan,
): { modules: Module[]; docs: { path: string; value: unknown }[] } {
  const gone = new Set([...plan.deletePolicies, ...plan.putPolicies.map((p) => p.name)]);
  const modules: Module[] = [
    ...snap.policies.filter((p) => !gone.has(p.name)).map(({ name, rego }) => ({ name, rego })),
    ...plan.putPolicies.map(({ name, rego }) => ({ name, rego })),
  ].sort((x, y) => x.name.localeCompare(y.name));
  const goneData = new Set([...plan.deleteData, ...plan.putData.map((d) => d.path)]);
  const docs = [
    ...snap.data.filter((d) => !goneData.has(d.path)),
    ...plan.putData.map((d) => ({ path: d.path, value: d.value })),
  ].sort((x, y) => x.path.localeCompare(y.path));
  // Every proper prefix of every path against the set of paths: sorted neighbours are not
  // enough ("roles-x" sorts between "roles" and "roles/admins").
  const paths = new Set(docs.map((d) => d.path));
  for (const { path } of docs) {
    const parts = path.split('/');
    for (let n = 1; n < parts.length; n++) {
      const prefix = parts.slice(0, n).join('/');
      if (paths.has(prefix)) throw conflict(`data path ${path} overlaps data document ${prefix}`);
    }
  }
  return { modules, docs };
}

/**
 * The impact candidate's set (SPEC §11): `snap`'s modules with each of `policies` put (a string)
 * or removed (null), and its data with each of `data` put or removed. 400 for a bad name, text or
 * path, a removal of something not live, or overlapping data paths.
 */
export function candidateSet(
  snap: PolicySnapshot,
  policies: Record<string, string | null>,
  data: Record<string, unknown>,
): { modules: Module[]; data: Record<string, unknown> } {
  const modules = new Map(snap.policies.map((p) => [p.name, p.rego]));
  for (const [name, rego] of Object.entries(policies)) {
    checkName(name);
    if (rego === null) {
      if (!modules.delete(name)) throw invalid(`policy ${name} is not live: it cannot be removed`);
      continue;
    }
    checkRego(rego, name);
    modules.set(name, rego);
  }
  const docs = new Map(snap.data.map((d) => [d.path, d.value]));
  for (const [dataPath, value] of Object.entries(data)) {
    checkDataPath(dataPath);
    if (value === null) {
      if (!docs.delete(dataPath))
        throw invalid(`data document ${dataPath} does not exist: it cannot be removed`);
    } else {
      docs.set(dataPath, value);
    }
  }
  const paths = [...docs.keys()];
  for (const a of paths) {
    const clash = paths.find((b) => overlaps(a, b));
    if (clash) throw invalid(`data path ${a} overlaps data document ${clash}`);
  }
  return {
    modules: [...modules].map(([name, rego]) => ({ name, rego })),
    data: dataTree([...docs].map(([path, value]) => ({ path, value }))),
  };
}
