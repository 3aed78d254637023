import { expect } from 'chai';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onEveryBackend, onSqliteOnly } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call, storedText } from './helpers/harness.js';

/** The permission bits of a file or directory. */
const modeOf = (p: string) => statSync(p).mode & 0o777;

// Where secrets must not end up: files others can read, logs, answers, the audit trail.

// The SQLite file holds the signing keys' private halves, webhook secrets, the cursor key and
// every decision: a directory Arbiter creates for it, and the file, are the service user's alone.
onSqliteOnly('files Arbiter creates for its state', () => {
  let parent: string;
  let a: Arbiter;
  before(async () => {
    parent = mkdtempSync(path.join(os.tmpdir(), 'arbiter-modes-'));
    // Not there yet: Arbiter creates it (and its parent `state`), as it does ./data by default.
    a = await Arbiter.start({}, path.join(parent, 'state', 'data'));
    // Something written, so that the WAL and its index exist.
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    expect(r.status, r.text).to.equal(200);
  });
  after(async () => {
    await a.close();
    rmSync(parent, { recursive: true, force: true });
  });

  it('creates the data directory (and its missing parents) readable by its owner only', () => {
    expect(modeOf(path.join(parent, 'state')).toString(8)).to.equal('700');
    expect(modeOf(a.dataDir).toString(8)).to.equal('700');
  });

  it('creates the database, its WAL and its shared-memory index readable by their owner only', () => {
    const files = readdirSync(a.dataDir).sort();
    expect(files).to.include.members(['arbiter.db', 'arbiter.db-wal', 'arbiter.db-shm']);
    for (const f of files) expect(`${f} ${modeOf(path.join(a.dataDir, f)).toString(8)}`).to.equal(`${f} 600`);
  });
});

// Masking happens before storage, so every stored row of either backend is searched.
onEveryBackend('masked fields inside arrays', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_AUDIT_MASK_FIELDS: 'context.cards.number,context.ssn' });
  });
  after(async () => {
    await a.close();
  });

  // `context.cards.number` names each card's number when `cards` is a list of cards, as it names
  // the one card's number when `cards` is an object: the agent chooses the shape, not the operator.
  it('masks the named member of every object of an array on the way, in every stored row', async () => {
    const context = {
      cards: [{ number: '4111-ARRAY-ONE', brand: 'visa' }, { number: '5500-ARRAY-TWO' }, 'not-a-card'],
      ssn: ['SSN-IN-A-LIST'],
      nested: [[{ cards: { number: 'NOT-NAMED' } }]],
    };
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: { ...AGENT.approval, context } });
    expect(r.status, r.text).to.equal(202);
    const everything = await storedText(a);
    expect(everything).to.include(r.json.request_id);
    for (const secret of ['4111-ARRAY-ONE', '5500-ARRAY-TWO', 'SSN-IN-A-LIST']) {
      expect(everything).to.not.include(secret);
    }
    const masked = {
      cards: [{ number: '[masked]', brand: 'visa' }, { number: '[masked]' }, 'not-a-card'],
      ssn: '[masked]',
      nested: [[{ cards: { number: 'NOT-NAMED' } }]],
    };
    const [event] = await auditEvents(a.platform, { request_id: r.json.request_id, kind: 'decision' });
    expect(event.details.context).to.deep.equal(masked);
    const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
    expect(item.json.context).to.deep.equal(masked);
  });
});
