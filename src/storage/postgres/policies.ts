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
import { notify, type PgChain } from './chain.js';
import { one, rows, tx, type Client, type Pool } from './pool.js';

const revisionOf = async (c: Client | Pool) =>
  Number((await one<{ value: string }>(c, "SELECT value FROM meta WHERE key = 'revision'"))?.value);

export class PgPolicyStore implements PolicyStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  revision(): Promise<number> {
    return revisionOf(this.pool);
  }

  async snapshot(): Promise<PolicySnapshot> {
    // One REPEATABLE READ transaction: the set, its data and its revision as of one instant.
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      const meta = await rows<{ key: string; value: string }>(
        client,
        "SELECT key, value FROM meta WHERE key IN ('revision', 'seeded')",
      );
      const policies = await rows<PolicyRecord>(
        client,
        'SELECT name, description, rego, sha256, version, updated_at FROM policies ORDER BY name',
      );
      const data = (
        await rows<Row>(client, 'SELECT path, value, updated_at FROM data_documents ORDER BY path')
      ).map(dataFromRow);
      await client.query('COMMIT');
      const get = (k: string) => meta.find((m) => m.key === k)?.value;
      return { revision: Number(get('revision')), policies, data, seeded: get('seeded') === '1' };
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    } finally {
      client.release();
    }
  }

  async commit(change: PolicyChange, events: (revision: number) => NewAuditEvent[]): Promise<CommitOutcome> {
    return refusable(() => tx(this.pool, (c) => this.commitInTx(c, change, events)));
  }

  private async commitInTx(
    c: Client,
    ch: PolicyChange,
    events: (revision: number) => NewAuditEvent[],
  ): Promise<CommitOutcome> {
    // The chain head first (every writer's first lock), then the revision row: changes from
    // every process are serialized, and one compiled against another revision is refused.
    const head = await this.chain.lockHead(c);
    const current = Number(
      (await one<{ value: string }>(c, "SELECT value FROM meta WHERE key = 'revision' FOR UPDATE"))?.value,
    );
    if (current !== ch.expectedRevision) refuse({ ok: false, stale: true });
    if (ch.seed) {
      const seeded = await one<{ value: string }>(c, "SELECT value FROM meta WHERE key = 'seeded'");
      if (seeded?.value === '1') refuse({ ok: false, stale: true });
    }
    const liveRows = await rows<PolicyRecord>(c, 'SELECT * FROM policies');
    const live = new Map(liveRows.map((p) => [p.name, p]));
    for (const [name, version] of Object.entries(ch.ifVersions ?? {})) {
      if ((live.get(name)?.version ?? 0) !== version) refuse({ ok: false, conflict: name });
    }
    for (const name of ch.deletePolicies) if (!live.has(name)) refuse({ ok: false, absent: name });
    if (ch.deleteData.length > 0) {
      const present = new Set(
        (
          await rows<{ path: string }>(c, 'SELECT path FROM data_documents WHERE path = ANY($1::text[])', [
            ch.deleteData,
          ])
        ).map((r) => r.path),
      );
      for (const path of ch.deleteData) if (!present.has(path)) refuse({ ok: false, absent: path });
    }
    if (ch.promoteShadow) {
      const { name, sha256 } = ch.promoteShadow;
      const dropped = await c.query('DELETE FROM shadow_policies WHERE name = $1 AND sha256 = $2', [
        name,
        sha256,
      ]);
      if (!dropped.rowCount) refuse({ ok: false, absent: name });
    }

    const revision = current + 1;
    const time = new Date().toISOString();
    const changes: RevisionChange[] = [];
    const created: string[] = [];
    const policies: PolicyRecord[] = [];
    const touched = [...ch.putPolicies.map((p) => p.name), ...ch.deletePolicies];
    const last = new Map(
      (
        await rows<{ name: string; v: number }>(
          c,
          'SELECT name, max(version) AS v FROM policy_versions WHERE name = ANY($1::text[]) GROUP BY name',
          [touched],
        )
      ).map((r) => [r.name, r.v]),
    );
    const nextVersion = (name: string) => Math.max(last.get(name) ?? 0, live.get(name)?.version ?? 0) + 1;
    for (const p of ch.putPolicies) {
      if (!live.has(p.name)) created.push(p.name);
      const policy: PolicyRecord = { ...p, version: nextVersion(p.name), updated_at: time };
      await c.query(
        `INSERT INTO policies (name, description, rego, sha256, version, updated_at) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (name) DO UPDATE SET description = excluded.description, rego = excluded.rego,
           sha256 = excluded.sha256, version = excluded.version, updated_at = excluded.updated_at`,
        [policy.name, policy.description, policy.rego, policy.sha256, policy.version, time],
      );
      await c.query('INSERT INTO policy_blobs (sha256, rego) VALUES ($1, $2) ON CONFLICT DO NOTHING', [
        p.sha256,
        p.rego,
      ]);
      await c.query(
        `INSERT INTO policy_versions (name, version, revision, sha256, time, actor, deleted)
         VALUES ($1, $2, $3, $4, $5, $6, false)`,
        [p.name, policy.version, revision, p.sha256, time, ch.actor],
      );
      changes.push({ kind: 'policy', name: p.name, op: 'put' });
      policies.push(policy);
    }
    for (const name of ch.deletePolicies) {
      await c.query(
        `INSERT INTO policy_versions (name, version, revision, sha256, time, actor, deleted)
         VALUES ($1, $2, $3, $4, $5, $6, true)`,
        [name, nextVersion(name), revision, live.get(name)?.sha256, time, ch.actor],
      );
      await c.query('DELETE FROM policies WHERE name = $1', [name]);
      changes.push({ kind: 'policy', name, op: 'delete' });
    }
    const data: DataDocument[] = [];
    for (const d of ch.putData) {
      const value = JSON.stringify(d.value);
      await c.query(
        `INSERT INTO data_documents (path, value, sha256, updated_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (path) DO UPDATE SET value = excluded.value, sha256 = excluded.sha256,
           updated_at = excluded.updated_at`,
        [d.path, value, d.sha256, time],
      );
      await c.query('INSERT INTO data_blobs (sha256, value) VALUES ($1, $2) ON CONFLICT DO NOTHING', [
        d.sha256,
        value,
      ]);
      changes.push({ kind: 'data', name: d.path, op: 'put' });
      data.push({ path: d.path, value: d.value, updated_at: time });
    }
    if (ch.deleteData.length > 0) {
      await c.query('DELETE FROM data_documents WHERE path = ANY($1::text[])', [ch.deleteData]);
      for (const path of ch.deleteData) changes.push({ kind: 'data', name: path, op: 'delete' });
    }
    await c.query("UPDATE meta SET value = $1 WHERE key = 'revision'", [String(revision)]);
    const setPolicies = await rows(
      c,
      'SELECT name, sha256, version, description FROM policies ORDER BY name',
    );
    const setData = await rows(c, 'SELECT path, sha256 FROM data_documents ORDER BY path');
    await c.query(
      `INSERT INTO revisions (revision, time, actor, message, changes, policies, data)
       VALUES ($1, $2, $3, $4, $5, $6, $7)`,
      [
        revision,
        time,
        ch.actor,
        ch.message,
        JSON.stringify(changes),
        JSON.stringify(setPolicies),
        JSON.stringify(setData),
      ],
    );
    if (ch.seed) await c.query("UPDATE meta SET value = '1' WHERE key = 'seeded'");
    if (ch.promoteShadow || (await one(c, 'SELECT 1 FROM shadow_policies LIMIT 1')) !== undefined) {
      await this.shadowChanged(c, time);
    }
    await this.chain.appendAfter(c, head, events(revision));
    await notify(c, { topic: 'revision' });
    return { ok: true, revision, time, created, policies, data };
  }

  async shadow(): Promise<ShadowState> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      const meta = await rows<{ key: string; value: string }>(
        client,
        "SELECT key, value FROM meta WHERE key IN ('shadow_generation', 'shadow_changed_at')",
      );
      const policies = await rows<ShadowPolicy>(
        client,
        'SELECT name, rego, sha256, since FROM shadow_policies ORDER BY name',
      );
      await client.query('COMMIT');
      const get = (k: string) => meta.find((m) => m.key === k)?.value;
      return {
        generation: Number(get('shadow_generation') ?? 0),
        changed_at: get('shadow_changed_at') || null,
        policies,
      };
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    } finally {
      client.release();
    }
  }

  async shadowGeneration(): Promise<number> {
    return Number(
      (await one<{ value: string }>(this.pool, "SELECT value FROM meta WHERE key = 'shadow_generation'"))
        ?.value ?? 0,
    );
  }

  async putShadow(
    p: { name: string; rego: string; sha256: string },
    events: NewAuditEvent[],
  ): Promise<{ created: boolean; since: string }> {
    return tx(this.pool, async (c) => {
      // The chain head first, as every writer locks it first.
      const head = await this.chain.lockHead(c);
      const since = new Date().toISOString();
      const created =
        (await one(c, 'SELECT 1 FROM shadow_policies WHERE name = $1 FOR UPDATE', [p.name])) === undefined;
      await c.query(
        `INSERT INTO shadow_policies (name, rego, sha256, since) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO UPDATE SET rego = excluded.rego, sha256 = excluded.sha256, since = excluded.since`,
        [p.name, p.rego, p.sha256, since],
      );
      await this.shadowChanged(c, since);
      await this.chain.appendAfter(c, head, events);
      return { created, since };
    });
  }

  async dropShadow(name: string, sha256: string | undefined, events: NewAuditEvent[]): Promise<boolean> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const r = await c.query(
        'DELETE FROM shadow_policies WHERE name = $1 AND ($2::text IS NULL OR sha256 = $2)',
        [name, sha256 ?? null],
      );
      if (!r.rowCount) return false;
      await this.shadowChanged(c, new Date().toISOString());
      await this.chain.appendAfter(c, head, events);
      return true;
    });
  }

  /** Bumps the generation and tells every process to reload (as a revision notice does). */
  private async shadowChanged(c: Client, time: string): Promise<void> {
    await c.query("UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'shadow_generation'");
    await c.query("UPDATE meta SET value = $1 WHERE key = 'shadow_changed_at'", [time]);
    // The report reads only the current generation's tally: earlier ones go with the change.
    for (const table of ['shadow_tallies', 'shadow_samples']) {
      await c.query(
        `DELETE FROM ${table} WHERE generation < (SELECT value::bigint FROM meta WHERE key = 'shadow_generation')`,
      );
    }
    await notify(c, { topic: 'revision' });
  }

  async getCompiled(setHash: string): Promise<Buffer | undefined> {
    return (
      await one<{ wasm: Buffer }>(this.pool, 'SELECT wasm FROM compiled_sets WHERE set_hash = $1', [setHash])
    )?.wasm;
  }

  async putCompiled(setHash: string, wasm: Buffer): Promise<void> {
    await tx(this.pool, async (c) => {
      await c.query(
        'INSERT INTO compiled_sets (set_hash, wasm, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING',
        [setHash, wasm, new Date().toISOString()],
      );
      await c.query(
        `DELETE FROM compiled_sets WHERE set_hash NOT IN
         (SELECT set_hash FROM compiled_sets ORDER BY created_at DESC LIMIT $1)`,
        [KEEP_COMPILED_SETS],
      );
    });
  }

  async listRevisions(before: number | undefined, limit: number): Promise<RevisionSummary[]> {
    const r = await rows<Row>(
      this.pool,
      `SELECT ${REVISION_SUMMARY_COLUMNS} FROM revisions WHERE revision < $1::bigint ORDER BY revision DESC LIMIT $2`,
      [before ?? Number.MAX_SAFE_INTEGER, limit],
    );
    return r.map(revisionSummaryFromRow);
  }

  async getRevision(revision: number): Promise<RevisionRecord | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM revisions WHERE revision = $1', [revision]);
    return r && revisionFromRow(r);
  }

  async firstRevision(): Promise<number | undefined> {
    return (
      (await one<{ r: number | null }>(this.pool, 'SELECT min(revision) AS r FROM revisions'))?.r ?? undefined
    );
  }

  async blobs(policySha: string[], dataSha: string[]) {
    const rego = new Map(
      (
        await rows<{ sha256: string; rego: string }>(
          this.pool,
          'SELECT sha256, rego FROM policy_blobs WHERE sha256 = ANY($1::text[])',
          [policySha],
        )
      ).map((r) => [r.sha256, r.rego]),
    );
    const data = new Map<string, unknown>(
      (
        await rows<{ sha256: string; value: string }>(
          this.pool,
          'SELECT sha256, value FROM data_blobs WHERE sha256 = ANY($1::text[])',
          [dataSha],
        )
      ).map((r) => [r.sha256, JSON.parse(r.value) as unknown]),
    );
    return { rego, data };
  }

  async policyVersions(
    name: string,
    before: number | undefined,
    limit: number,
  ): Promise<PolicyVersionRecord[]> {
    return rows<PolicyVersionRecord>(
      this.pool,
      'SELECT * FROM policy_versions WHERE name = $1 AND version < $2::bigint ORDER BY version DESC LIMIT $3',
      [name, before ?? Number.MAX_SAFE_INTEGER, limit],
    );
  }
}
