import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { DecisionRecord, RecordOutcome } from '../src/decisions/store.js';
import { openDatabase } from '../src/storage/sqlite/db.js';
import { SqliteDecisionStore, type BatchCommitter, type RecordArgs } from '../src/storage/sqlite/stores.js';
import { AGENT, Arbiter, call, readDb } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

const nested = (depth: number): unknown => {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = { a: v };
  return v;
};

describe('robustness against hostile bodies', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('refuses JSON nested deeper than 64 levels with 400, writing nothing', async () => {
    const count = () => readDb(a.dataDir, (db) => db.prepare('SELECT count(*) n FROM audit_events').get());
    const before = count();
    for (const depth of [64, 5000]) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        // Built as text: JSON.stringify itself recurses.
        raw: JSON.stringify(AGENT.allow).replace(
          /}$/,
          `,"context":${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}}`,
        ),
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400);
      expect(r.json.error).to.match(/deeper than 64/);
    }
    expect(count()).to.deep.equal(before);
    const data = await call('PUT', a.platform + '/api/v1/data/deep', { body: nested(100) });
    expectError(data, 400);
  });

  it('still answers a context nested 60 levels deep', async () => {
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: { ...AGENT.allow, context: nested(60) },
    });
    expect(r.status).to.equal(200);
  });
});

describe('decision batches', () => {
  it('isolate a decision that cannot be recorded: the others in its batch are still recorded', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-batch-'));
    const db = openDatabase(dir, 'normal');
    try {
      const committed: string[] = [];
      // A committer that refuses any batch holding the poisoned request, as a storage fault would.
      const committer: BatchCommitter = {
        commit: async (batch: RecordArgs[]): Promise<RecordOutcome[]> => {
          if (batch.some(([d]) => d.request_id === 'poison')) throw new Error('cannot record');
          committed.push(...batch.map(([d]) => d.request_id));
          return batch.map(([d]) => ({ replay: d }));
        },
        close: async () => undefined,
      };
      const store = new SqliteDecisionStore(db, committer);
      const record = (id: string) =>
        store.record({ request_id: id } as DecisionRecord, { kind: 'decision' }, undefined, '');
      const results = await Promise.allSettled(['a', 'b', 'poison', 'c'].map(record));
      expect(results.map((r) => r.status)).to.deep.equal(['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
      expect(committed.sort()).to.deep.equal(['a', 'b', 'c']);
    } finally {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
