import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type {
  CommitOutcome,
  DataDocument,
  PolicyChange,
  PolicyRecord,
  PolicySnapshot,
  PolicyStore,
  PolicyVersionRecord,
  RevisionChange,
  RevisionRecord,
  RevisionSummary,
  ShadowPolicy,
  ShadowState,
} from '../../policy/types.js';
import { refusable, refuse } from '../refusal.js';
import { KEEP_COMPILED_SETS } from '../stores.js';
import {
  dataFromRow,
  REVISION_SUMMARY_COLUMNS,
  revisionFromRow,
  revisionSummaryFromRow,
  type Row,
} from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

export class SqlitePolicyStore implements PolicyStore {
  private readonly revisionStmt: Statement;
  private readonly st;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.revisionStmt = db.prepare("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'revision'").pluck();
    this.st = {
      seeded: db.prepare("SELECT value FROM meta WHERE key = 'seeded'").pluck(),
      shadowGeneration: db.prepare("SELECT value FROM meta WHERE key = 'shadow_generation'").pluck(),
      shadowChangedAt: db.prepare("SELECT value FROM meta WHERE key = 'shadow_changed_at'").pluck(),
      setSeeded: db.prepare("UPDATE meta SET value = '1' WHERE key = 'seeded'"),
      setRevision: db.prepare("UPDATE meta SET value = CAST(? AS TEXT) WHERE key = 'revision'"),
      policy: db.prepare('SELECT * FROM policies WHERE name = ?'),
      lastVersion: db.prepare('SELECT max(version) FROM policy_versions WHERE name = ?').pluck(),
      upsertPolicy: db.prepare(
        `INSERT INTO policies (name, description, rego, sha256, version, updated_at)
         VALUES (@name, @description, @rego, @sha256, @version, @updated_at)
         ON CONFLICT (name) DO UPDATE SET description = excluded.description, rego = excluded.rego,
           sha256 = excluded.sha256, version = excluded.version, updated_at = excluded.updated_at`,
      ),
      deletePolicy: db.prepare('DELETE FROM policies WHERE name = ?'),
      policyBlob: db.prepare('INSERT OR IGNORE INTO policy_blobs (sha256, rego) VALUES (?, ?)'),
      policyVersion: db.prepare(
        `INSERT INTO policy_versions (name, version, revision, sha256, time, actor, deleted)
         VALUES (@name, @version, @revision, @sha256, @time, @actor, @deleted)`,
      ),
      data: db.prepare('SELECT path FROM data_documents WHERE path = ?').pluck(),
      upsertData: db.prepare(
        `INSERT INTO data_documents (path, value, sha256, updated_at) VALUES (@path, @value, @sha256, @updated_at)
         ON CONFLICT (path) DO UPDATE SET value = excluded.value, sha256 = excluded.sha256,
           updated_at = excluded.updated_at`,
      ),
      deleteData: db.prepare('DELETE FROM data_documents WHERE path = ?'),
      dataBlob: db.prepare('INSERT OR IGNORE INTO data_blobs (sha256, value) VALUES (?, ?)'),
      livePolicies: db.prepare('SELECT name, sha256, version, description FROM policies ORDER BY name'),
      liveData: db.prepare('SELECT path, sha256 FROM data_documents ORDER BY path'),
      insertRevision: db.prepare(
        `INSERT INTO revisions (revision, time, actor, message, changes, policies, data)
         VALUES (@revision, @time, @actor, @message, @changes, @policies, @data)`,
      ),
    };
  }

  async revision(): Promise<number> {
    return this.revisionStmt.get() as number;
  }

  async snapshot(): Promise<PolicySnapshot> {
    return this.db.transaction(() => ({
      revision: this.revisionStmt.get() as number,
      policies: this.db.prepare('SELECT * FROM policies ORDER BY name').all() as PolicyRecord[],
      data: (this.db.prepare('SELECT * FROM data_documents ORDER BY path').all() as Row[]).map(dataFromRow),
      seeded: this.st.seeded.get() === '1',
    }))();
  }

  async commit(change: PolicyChange, events: (revision: number) => NewAuditEvent[]): Promise<CommitOutcome> {
    return refusable(() => this.db.transaction(() => this.commitInTx(change, events)).immediate());
  }

  private commitInTx(c: PolicyChange, events: (revision: number) => NewAuditEvent[]): CommitOutcome {
    const st = this.st;
    const current = this.revisionStmt.get() as number;
    if (current !== c.expectedRevision) refuse({ ok: false, stale: true });
    if (c.seed && st.seeded.get() === '1') refuse({ ok: false, stale: true });
    const live = (name: string) => st.policy.get(name) as PolicyRecord | undefined;
    for (const [name, version] of Object.entries(c.ifVersions ?? {})) {
      if ((live(name)?.version ?? 0) !== version) refuse({ ok: false, conflict: name });
    }
    for (const name of c.deletePolicies) if (!live(name)) refuse({ ok: false, absent: name });
    for (const path of c.deleteData) if (st.data.get(path) === undefined) refuse({ ok: false, absent: path });
    if (c.promoteShadow) {
      const { name, sha256 } = c.promoteShadow;
      const dropped = this.db
        .prepare('DELETE FROM shadow_policies WHERE name = ? AND sha256 = ?')
        .run(name, sha256);
      if (dropped.changes === 0) refuse({ ok: false, absent: name });
    }

    const revision = current + 1;
    const time = new Date().toISOString();
    const changes: RevisionChange[] = [];
    const created: string[] = [];
    const policies: PolicyRecord[] = [];
    const nextVersion = (name: string) =>
      Math.max((st.lastVersion.get(name) as number | null) ?? 0, live(name)?.version ?? 0) + 1;
    for (const p of c.putPolicies) {
      const before = live(p.name);
      if (!before) created.push(p.name);
      const policy: PolicyRecord = { ...p, version: nextVersion(p.name), updated_at: time };
      st.upsertPolicy.run(policy);
      st.policyBlob.run(p.sha256, p.rego);
      st.policyVersion.run({ ...policy, revision, time, actor: c.actor, deleted: 0 });
      changes.push({ kind: 'policy', name: p.name, op: 'put' });
      policies.push(policy);
    }
    for (const name of c.deletePolicies) {
      const before = live(name) as PolicyRecord;
      st.policyVersion.run({
        name,
        version: nextVersion(name),
        revision,
        sha256: before.sha256,
        time,
        actor: c.actor,
        deleted: 1,
      });
      st.deletePolicy.run(name);
      changes.push({ kind: 'policy', name, op: 'delete' });
    }
    const data: DataDocument[] = [];
    for (const d of c.putData) {
      const value = JSON.stringify(d.value);
      st.upsertData.run({ path: d.path, value, sha256: d.sha256, updated_at: time });
      st.dataBlob.run(d.sha256, value);
      changes.push({ kind: 'data', name: d.path, op: 'put' });
      data.push({ path: d.path, value: d.value, updated_at: time });
    }
    for (const path of c.deleteData) {
      st.deleteData.run(path);
      changes.push({ kind: 'data', name: path, op: 'delete' });
    }
    st.setRevision.run(revision);
    st.insertRevision.run({
      revision,
      time,
      actor: c.actor,
      message: c.message,
      changes: JSON.stringify(changes),
      policies: JSON.stringify(st.livePolicies.all()),
      data: JSON.stringify(st.liveData.all()),
    });
    if (c.seed) st.setSeeded.run();
    if (c.promoteShadow || this.db.prepare('SELECT 1 FROM shadow_policies LIMIT 1').get() !== undefined) {
      this.shadowChanged(time);
    }
    this.writer.appendInTx(events(revision));
    return { ok: true, revision, time, created, policies, data };
  }

  async getCompiled(setHash: string): Promise<Buffer | undefined> {
    return this.db.prepare('SELECT wasm FROM compiled_sets WHERE set_hash = ?').pluck().get(setHash) as
      Buffer | undefined;
  }

  async putCompiled(setHash: string, wasm: Buffer): Promise<void> {
    this.db
      .transaction(() => {
        this.db
          .prepare('INSERT OR IGNORE INTO compiled_sets (set_hash, wasm, created_at) VALUES (?, ?, ?)')
          .run(setHash, wasm, new Date().toISOString());
        this.db
          .prepare(
            `DELETE FROM compiled_sets WHERE set_hash NOT IN
             (SELECT set_hash FROM compiled_sets ORDER BY created_at DESC LIMIT ?)`,
          )
          .run(KEEP_COMPILED_SETS);
      })
      .immediate();
  }

  async listRevisions(before: number | undefined, limit: number): Promise<RevisionSummary[]> {
    const rows = this.db
      .prepare(
        `SELECT ${REVISION_SUMMARY_COLUMNS} FROM revisions WHERE revision < ? ORDER BY revision DESC LIMIT ?`,
      )
      .all(before ?? Number.MAX_SAFE_INTEGER, limit) as Row[];
    return rows.map(revisionSummaryFromRow);
  }

  async getRevision(revision: number): Promise<RevisionRecord | undefined> {
    const r = this.db.prepare('SELECT * FROM revisions WHERE revision = ?').get(revision) as Row | undefined;
    return r && revisionFromRow(r);
  }

  async firstRevision(): Promise<number | undefined> {
    return (
      (this.db.prepare('SELECT min(revision) FROM revisions').pluck().get() as number | null) ?? undefined
    );
  }

  async shadow(): Promise<ShadowState> {
    return this.db.transaction(() => ({
      generation: Number(this.st.shadowGeneration.get()),
      changed_at: (this.st.shadowChangedAt.get() as string) || null,
      policies: this.db
        .prepare('SELECT name, rego, sha256, since FROM shadow_policies ORDER BY name')
        .all() as ShadowPolicy[],
    }))();
  }

  async shadowGeneration(): Promise<number> {
    return Number(this.st.shadowGeneration.get());
  }

  async putShadow(
    p: { name: string; rego: string; sha256: string },
    events: NewAuditEvent[],
  ): Promise<{ created: boolean; since: string }> {
    return this.db
      .transaction(() => {
        const since = new Date().toISOString();
        const created =
          this.db.prepare('SELECT 1 FROM shadow_policies WHERE name = ?').get(p.name) === undefined;
        this.db
          .prepare(
            `INSERT INTO shadow_policies (name, rego, sha256, since) VALUES (@name, @rego, @sha256, @since)
             ON CONFLICT (name) DO UPDATE SET rego = excluded.rego, sha256 = excluded.sha256, since = excluded.since`,
          )
          .run({ ...p, since });
        this.shadowChanged(since);
        this.writer.appendInTx(events);
        return { created, since };
      })
      .immediate();
  }

  async dropShadow(name: string, sha256: string | undefined, events: NewAuditEvent[]): Promise<boolean> {
    return this.db
      .transaction(() => {
        const r = this.db
          .prepare('DELETE FROM shadow_policies WHERE name = ? AND (? IS NULL OR sha256 = ?)')
          .run(name, sha256 ?? null, sha256 ?? null);
        if (r.changes === 0) return false;
        this.shadowChanged(new Date().toISOString());
        this.writer.appendInTx(events);
        return true;
      })
      .immediate();
  }

  private shadowChanged(time: string): void {
    this.db
      .prepare(
        "UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'shadow_generation'",
      )
      .run();
    this.db.prepare("UPDATE meta SET value = ? WHERE key = 'shadow_changed_at'").run(time);
    // The report reads only the current generation's tally: earlier ones go with the change.
    for (const table of ['shadow_tallies', 'shadow_samples']) {
      this.db
        .prepare(
          `DELETE FROM ${table} WHERE generation < (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'shadow_generation')`,
        )
        .run();
    }
  }

  async blobs(
    policySha: string[],
    dataSha: string[],
  ): Promise<{ rego: Map<string, string>; data: Map<string, unknown> }> {
    const rego = new Map<string, string>();
    const data = new Map<string, unknown>();
    const p = this.db.prepare('SELECT rego FROM policy_blobs WHERE sha256 = ?').pluck();
    const d = this.db.prepare('SELECT value FROM data_blobs WHERE sha256 = ?').pluck();
    for (const sha of new Set(policySha)) {
      const text = p.get(sha) as string | undefined;
      if (text !== undefined) rego.set(sha, text);
    }
    for (const sha of new Set(dataSha)) {
      const text = d.get(sha) as string | undefined;
      if (text !== undefined) data.set(sha, JSON.parse(text) as unknown);
    }
    return { rego, data };
  }

  async policyVersions(
    name: string,
    before: number | undefined,
    limit: number,
  ): Promise<PolicyVersionRecord[]> {
    const rows = this.db
      .prepare('SELECT * FROM policy_versions WHERE name = ? AND version < ? ORDER BY version DESC LIMIT ?')
      .all(name, before ?? Number.MAX_SAFE_INTEGER, limit) as Row[];
    return rows.map((r) => ({ ...(r as unknown as PolicyVersionRecord), deleted: r.deleted === 1 }));
  }
}
