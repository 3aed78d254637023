import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { asStorageFailure } from '../../src/storage/failure.js';
import { openDatabase } from '../../src/storage/sqlite/db.js';
import { threadCommitter } from '../../src/storage/sqlite/thread-committer.js';
import { isKind } from '../../src/errors.js';
import { onceOnly } from '../helpers/backends.js';

onceOnly('the SQLite decision writer thread', () => {
  it("passes on the driver's error code with a failed batch, so that it reads as a storage failure", async () => {
    // The thread posted the message alone: a file gone from under it (SQLITE_CANTOPEN) or a full
    // disk (SQLITE_FULL) read as an unknown error, and the batch was retried item by item.
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-writer-'));
    openDatabase(dir, 'normal').close();
    const committer = threadCommitter(dir, 'normal', () => undefined);
    try {
      expect(await committer.commit([])).to.deep.equal([]);
      rmSync(dir, { recursive: true, force: true });
      const failed = await committer.commit([]).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(failed).to.be.instanceOf(Error);
      expect((failed as { code?: string }).code).to.equal('SQLITE_CANTOPEN');
      expect(isKind(asStorageFailure(failed), 'unavailable')).to.equal(true);
    } finally {
      await committer.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
