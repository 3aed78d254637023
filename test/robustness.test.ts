import { expect } from 'chai';
import { GroupCommit } from '../src/storage/group-commit.js';
import { AppError } from '../src/errors.js';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditCount, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

const nested = (depth: number): unknown => {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = { a: v };
  return v;
};

// A refused body must store nothing: run on every backend.
onEveryBackend('robustness against hostile bodies', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('refuses JSON nested deeper than 64 levels with 400, writing nothing', async () => {
    const count = async () => ({
      audit: await auditCount(a.platform),
      decisions: await a.count('decisions'),
    });
    const before = await count();
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
    expect(await count()).to.deep.equal(before);
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

// GroupCommit in memory, with no database: once.
onceOnly('group commit', () => {
  it('isolates an item that cannot be committed: the others in its batch are still committed', async () => {
    const committed: string[] = [];
    // A commit that refuses any batch holding the poisoned item, as a storage fault would.
    const group = new GroupCommit<string, string>(async (batch) => {
      if (batch.includes('poison')) throw new Error('cannot record');
      committed.push(...batch);
      return batch.map((id) => `ok:${id}`);
    });
    const results = await Promise.allSettled(['a', 'b', 'poison', 'c'].map((id) => group.submit(id)));
    expect(results.map((r) => r.status)).to.deep.equal(['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : 'x'))).to.deep.equal([
      'ok:a',
      'ok:b',
      'x',
      'ok:c',
    ]);
    expect(committed.sort()).to.deep.equal(['a', 'b', 'c']);
  });

  it('fails a whole batch at once when the database cannot serve, instead of retrying item by item', async () => {
    const attempts: string[][] = [];
    // As node-postgres fails when no connection comes within connectionTimeoutMillis.
    const group = new GroupCommit<string, string>(async (batch) => {
      attempts.push(batch);
      throw new Error('timeout exceeded when trying to connect');
    });
    const results = await Promise.allSettled(['a', 'b', 'c'].map((id) => group.submit(id)));
    expect(attempts).to.deep.equal([['a', 'b', 'c']]);
    for (const r of results) {
      expect(r.status).to.equal('rejected');
      const reason = (r as PromiseRejectedResult).reason as AppError;
      expect(reason).to.be.instanceOf(AppError);
      expect(reason.kind).to.equal('unavailable');
    }
  });

  it('commits items that arrive during a commit together, in the next batch', async () => {
    const batches: string[][] = [];
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const group = new GroupCommit<string, string>(async (batch) => {
      batches.push(batch);
      if (batches.length === 1) await gate;
      return batch;
    });
    const first = group.submit('a');
    await new Promise((resolve) => setImmediate(resolve));
    const rest = ['b', 'c', 'd'].map((id) => group.submit(id));
    release();
    await Promise.all([first, ...rest]);
    expect(batches).to.deep.equal([['a'], ['b', 'c', 'd']]);
  });
});
