import { encodeCursor, fetchPage, readCursor, type Page, type PageQuery } from '../common/pagination.js';
import { internal, notFound } from '../errors.js';
import type { Module } from './compiler.js';
import { checkName, dataTree } from './documents.js';
import type { PolicyStore, PolicyVersionRecord, RevisionSummary } from './types.js';

/**
 * Policy history as it was (SPEC §11): every revision's whole set, content-addressed, and every
 * version of every policy. Read-only: making an old set live again is a change (PolicyService.restore).
 */
export class PolicyHistory {
  constructor(private readonly store: PolicyStore) {}

  /**
   * The policy modules and data of a past revision as history keeps them, or undefined when
   * history does not hold that revision (it predates history, or its texts are missing).
   */
  async revisionSet(
    revision: number,
  ): Promise<{ modules: Module[]; data: Record<string, unknown> } | undefined> {
    const r = await this.store.getRevision(revision);
    if (!r) return undefined;
    const blobs = await this.store.blobs(
      r.policies.map((p) => p.sha256),
      r.data.map((d) => d.sha256),
    );
    const modules: Module[] = [];
    for (const p of r.policies) {
      const rego = blobs.rego.get(p.sha256);
      if (rego === undefined) return undefined;
      modules.push({ name: p.name, rego });
    }
    const docs: { path: string; value: unknown }[] = [];
    for (const d of r.data) {
      if (!blobs.data.has(d.sha256)) return undefined;
      docs.push({ path: d.path, value: blobs.data.get(d.sha256) });
    }
    return { modules, data: dataTree(docs) };
  }

  /** Revisions newest first (SPEC §11 history). */
  async revisions(q: PageQuery): Promise<Page<RevisionSummary>> {
    const before =
      q.cursor === undefined ? undefined : Number(readCursor(q.cursor, 'revisions', /^(\d+)$/)[1]);
    return fetchPage(
      q,
      (rows) => this.store.listRevisions(before, rows),
      (last) => encodeCursor('revisions', String(last.revision)),
    );
  }

  /** One revision's whole set: its policies by content address and its data documents' values. */
  async revision(n: number): Promise<RevisionSet> {
    const r = await this.store.getRevision(n);
    if (!r) throw notFound(`revision ${n} not found`);
    const blobs = await this.store.blobs(
      [],
      r.data.map((d) => d.sha256),
    );
    const data: Record<string, unknown> = {};
    for (const d of r.data) data[d.path] = blobOf(blobs.data, d.sha256, `data document ${d.path}`);
    return {
      revision: r.revision,
      time: r.time,
      actor: r.actor,
      message: r.message,
      policies: r.policies.map((p) => ({ name: p.name, sha256: p.sha256 })),
      data,
    };
  }

  /** Versions of one policy, newest first; 404 when history has never seen the name. */
  async versions(name: string, q: PageQuery): Promise<Page<Omit<PolicyVersionRecord, 'name'>>> {
    checkName(name);
    const before =
      q.cursor === undefined ? undefined : Number(readCursor(q.cursor, 'versions', /^(\d+)$/)[1]);
    const page = await fetchPage(
      q,
      (rows) => this.store.policyVersions(name, before, rows),
      (last) => encodeCursor('versions', String(last.version)),
    );
    if (page.items.length === 0 && (await this.store.policyVersions(name, undefined, 1)).length === 0) {
      throw notFound(`policy ${name} has no history`);
    }
    return { items: page.items.map(({ name: _n, ...v }) => v), next_cursor: page.next_cursor };
  }

  /** One version of one policy with its text (a deletion's text is the text it deleted). */
  async version(
    name: string,
    version: number,
  ): Promise<Omit<PolicyVersionRecord, 'name'> & { rego: string }> {
    checkName(name);
    const [v] = await this.store.policyVersions(name, version + 1, 1);
    if (!v || v.version !== version) throw notFound(`policy ${name} has no version ${version}`);
    const blobs = await this.store.blobs([v.sha256], []);
    const { name: _n, ...rest } = v;
    return { ...rest, rego: blobOf(blobs.rego, v.sha256, `policy ${name} version ${version}`) };
  }
}

/** A revision's whole set as GET /api/v1/revisions/{n} shows it: data documents by path. */
export interface RevisionSet {
  revision: number;
  time: string;
  actor: string;
  message: string | null;
  policies: { name: string; sha256: string }[];
  data: Record<string, unknown>;
}

/** A content-addressed text or value history must hold; its absence is damage, never a guess. */
export function blobOf<T>(blobs: Map<string, T>, sha: string, what: string): T {
  if (!blobs.has(sha)) throw internal(`history has lost the content of ${what} (${sha})`);
  return blobs.get(sha) as T;
}
