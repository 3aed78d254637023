import { appendProblem } from '../../audit/chain.js';
import { SILENT_FEED, type Stores } from '../stores.js';
import { AuditWriter, SqliteAuditStore } from './audit.js';
import { misplaced, openDatabase, schemaProblem, type Db } from './db.js';
import {
  DecisionWriter,
  inProcessCommitter,
  SqliteDecisionStore,
  SqliteLimitStore,
  type BatchCommitter,
} from './decisions.js';
import { SqliteKeyStore } from './keys.js';
import { SqlitePolicyStore } from './policies.js';
import { SqliteQueueStore } from './queue.js';
import { threadCommitter } from './thread-committer.js';
import { SqliteTokenStore } from './tokens.js';
import { SqliteWebhookStore } from './webhooks.js';

export interface SqliteOptions {
  dataDir: string;
  sync: 'full' | 'normal';
  /** Commit decision batches on a writer thread with its own connection (serving processes). */
  writerThread?: boolean;
  /** Bring an older schema up to date (the default); false: create a fresh one, refuse an older one. */
  upgrade?: boolean;
  /** Told the kinds of the audit events each append wrote (for the metric). */
  onAuditAppend?: (kinds: string[]) => void;
  onBatch?: (size: number, seconds: number) => void;
}

/** The embedded backend: one SQLite file in WAL mode under the data directory. */
export function openSqliteStores(opts: SqliteOptions): Stores {
  const onAppend = opts.onAuditAppend ?? (() => undefined);
  const db = openDatabase(opts.dataDir, opts.sync, { upgrade: opts.upgrade });
  const committer = opts.writerThread
    ? threadCommitter(opts.dataDir, opts.sync, (outcomes) => {
        const kinds = outcomes.flatMap((o) => ('recorded' in o ? [o.recorded.kind] : []));
        if (kinds.length > 0) onAppend(kinds);
      })
    : undefined;
  return sqliteStores(db, onAppend, committer, opts.onBatch);
}

/**
 * All SQLite-backed stores over one connection. `committer` takes decision batches elsewhere
 * (the writer thread); by default they commit on this connection.
 */
export function sqliteStores(
  db: Db,
  onAuditAppend: (kinds: string[]) => void = () => undefined,
  committer?: BatchCommitter,
  onBatch?: (size: number, seconds: number) => void,
): Stores {
  const writer = new AuditWriter(db, onAuditAppend);
  const decisions = committer ?? inProcessCommitter(new DecisionWriter(db, writer));
  return {
    backend: 'sqlite',
    audit: new SqliteAuditStore(db, writer),
    decisions: new SqliteDecisionStore(db, decisions, onBatch),
    limits: new SqliteLimitStore(db),
    queue: new SqliteQueueStore(db, writer),
    tokens: new SqliteTokenStore(db, writer),
    keys: new SqliteKeyStore(db, writer),
    policies: new SqlitePolicyStore(db, writer),
    webhooks: new SqliteWebhookStore(db, writer),
    changes: SILENT_FEED,
    ...(decisions.cpuSeconds
      ? { writerCpuSeconds: () => decisions.cpuSeconds?.() ?? Promise.resolve(undefined) }
      : {}),
    /**
     * Reads the chain head, so an unreadable file or a head no append can follow fails it, and
     * checks that the file is still the database at its path.
     */
    async health(): Promise<string | undefined> {
      try {
        return misplaced(db) ?? appendProblem(writer.readHead());
      } catch {
        return 'storage is unusable';
      }
    },
    async sharedSecret(name: string, ifNone: string): Promise<string> {
      db.prepare('INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)').run(name, ifNone);
      return (db.prepare('SELECT value FROM meta WHERE key = ?').get(name) as { value: string }).value;
    },
    schemaProblem: async () => schemaProblem(db),
    async close(): Promise<void> {
      await decisions.close();
      db.pragma('optimize');
      db.close();
    },
  };
}
