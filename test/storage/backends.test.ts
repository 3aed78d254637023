import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config.js';
import { openStores } from '../../src/storage/index.js';
import { onceOnly } from '../helpers/backends.js';
import { createTestDatabase } from '../helpers/postgres.js';
import { storageContract } from './contract.js';

// The contract suite opens both backends itself, so it registers once (the PostgreSQL run of
// `npm test` repeats the HTTP suite, which reaches storage through the API).
onceOnly('the storage contract on every backend', () => {
  storageContract({
    name: 'SQLite',
    async fresh() {
      const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-contract-'));
      const config = loadConfig({ ARBITER_DATA_DIR: dir });
      return {
        stores: await openStores(config),
        second: () => openStores(config),
        dispose: async () => rmSync(dir, { recursive: true, force: true }),
      };
    },
  });

  storageContract({
    name: 'PostgreSQL',
    async fresh() {
      const db = await createTestDatabase();
      const config = loadConfig({ ARBITER_DATABASE_URL: db.url, ARBITER_DATABASE_POOL: '4' });
      return {
        stores: await openStores(config),
        second: () => openStores(config),
        dispose: () => db.drop(),
      };
    },
  });
});
