import { expect } from 'chai';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onSqliteOnly } from './helpers/backends.js';
import { AGENT, Arbiter, call } from './helpers/harness.js';

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
