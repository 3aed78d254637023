import Database from 'better-sqlite3';
import { closeSync, existsSync, mkdirSync, openSync, statSync } from 'node:fs';
import path from 'node:path';
import {
  migrationFailed,
  newestVersion,
  refusedAtStart,
  SCHEMA_VERSION,
  unknownMigrations,
} from '../failure.js';
import { migrations } from './migrations.js';

export type Db = Database.Database;

/**
 * Opens (creating if needed) the SQLite database in `dataDir` in WAL mode and brings its schema
 * up to date (unless `migrate: false`, for a second connection of a process that already did;
 * with `upgrade: false`, the CLI's, a fresh schema is created and an older one refused). WAL lets
 * readers run beside the single writer and survives a kill mid-write.
 */
export function openDatabase(
  dataDir: string,
  sync: 'full' | 'normal',
  opts: { migrate?: boolean; upgrade?: boolean } = {},
): Db {
  makeDirectory(dataDir);
  const file = path.join(dataDir, 'arbiter.db');
  createPrivately(file);
  const db = new Database(file);
  const { dev, ino } = statSync(file);
  opened.set(db, { file, dev, ino });
  db.pragma('journal_mode = WAL');
  db.pragma(`synchronous = ${sync === 'full' ? 'FULL' : 'NORMAL'}`);
  db.pragma('busy_timeout = 5000');
  db.pragma('foreign_keys = ON');
  if (opts.migrate !== false) migrate(db, opts.upgrade !== false);
  // Keeps the planner's statistics current (cheap; SQLite decides what needs analysing), so
  // filtered audit queries pick the selective index.
  db.pragma('optimize=0x10002');
  return db;
}

/** The file each connection opened: its path, device and inode. */
const opened = new WeakMap<Db, { file: string; dev: number; ino: number }>();

/**
 * Why nothing can be recorded through `db` when the file it writes is no longer the database at
 * its path (removed, moved or replaced under the running process: SQLite notices none of these
 * and keeps writing to the file it holds open, which the next start would not find); undefined
 * while it is in place, again once it is back.
 */
export function misplaced(db: Db): string | undefined {
  const was = opened.get(db);
  if (!was) return undefined;
  try {
    const now = statSync(was.file);
    if (now.dev === was.dev && now.ino === was.ino) return undefined;
  } catch {
    // Gone: as below.
  }
  return 'storage is unusable: the database file was removed, moved or replaced while open; nothing can be recorded';
}

/** Throws a storage failure (SQLITE_CANTOPEN: 503, never an answer) when `db` is misplaced. */
export function checkInPlace(db: Db): void {
  const problem = misplaced(db);
  if (problem) throw Object.assign(new Error(problem), { code: 'SQLITE_CANTOPEN' });
}

/**
 * The database holds the signing keys' private halves, webhook secrets, the cursor key and every
 * decision: what Arbiter creates for it is readable by the service's user only, whatever the umask
 * (0700 directories, a 0600 file; SQLite gives the WAL and its index the database file's mode).
 * What exists already keeps the mode its owner gave it.
 */
const PRIVATE_DIR = 0o700;
const PRIVATE_FILE = 0o600;

/** Creates the empty database file `file` with PRIVATE_FILE, unless it exists. */
function createPrivately(file: string): void {
  try {
    closeSync(openSync(file, 'wx', PRIVATE_FILE));
  } catch (e) {
    // There already (another process starting at the same time may have made it).
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  }
}

/**
 * Creates `dir` and any missing parents, one at a time, with PRIVATE_DIR. (Node's recursive mkdirSync never returns
 * for a path under /proc, where mkdir answers ENOENT though the parent exists; this answers the
 * error.)
 */
function makeDirectory(dir: string): void {
  const missing: string[] = [];
  for (let d = path.resolve(dir); !existsSync(d); d = path.dirname(d)) {
    missing.unshift(d);
    if (path.dirname(d) === d) break;
  }
  for (const d of missing) {
    try {
      mkdirSync(d, PRIVATE_DIR);
    } catch (e) {
      // Another process starting at the same time made it first.
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || !statSync(d).isDirectory()) throw e;
    }
  }
}

/**
 * Brings the schema up to date, one transaction per migration. Each records the version it
 * reached in meta `schema_version` (never lowered), and a last transaction records this build's
 * newest when there was nothing to do (a store an earlier build left has no row): an append of an
 * older build, waiting for the write lock while a newer build migrates, reads it with the chain
 * head once it has the lock and refuses (AuditWriter), rather than writing rows without what the
 * migration added.
 */
function migrate(db: Db, upgrade: boolean): void {
  db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT`);
  const applied = appliedMigrations(db);
  const refused = refusedAtStart(applied, recordedVersion(db), migrations, upgrade);
  if (refused !== undefined) throw new Error(refused);
  const isApplied = db.prepare('SELECT 1 FROM schema_migrations WHERE version = ?').pluck();
  for (const m of migrations) {
    // Checked inside the write transaction so that processes starting together apply it once. A
    // migration that fails rolls back whole: the schema stays as the previous one left it.
    try {
      db.transaction(() => {
        if (isApplied.get(m.version)) return;
        db.exec(m.sql);
        m.up?.(db);
        db.prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)').run(
          m.version,
          m.name,
          new Date().toISOString(),
        );
        recordVersion(db, m.version);
      }).immediate();
    } catch (e) {
      throw migrationFailed(m, e);
    }
  }
  db.transaction(() => recordVersion(db, newestVersion(migrations))).immediate();
}

/** The schema version recorded in meta, as rows for refusedAtStart (none before meta exists). */
function recordedVersion(db: Db): { key: string; value: string }[] {
  const hasMeta = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").get();
  if (!hasMeta) return [];
  return db.prepare('SELECT key, value FROM meta WHERE key = ?').all(SCHEMA_VERSION) as {
    key: string;
    value: string;
  }[];
}

/** Records `version` in meta `schema_version`, unless a greater one is recorded there. */
function recordVersion(db: Db, version: number): void {
  db.prepare(
    `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value
     WHERE CAST(meta.value AS INTEGER) < CAST(excluded.value AS INTEGER)`,
  ).run(SCHEMA_VERSION, String(version));
}

/** Why this build must not use the database (see unknownMigrations), or undefined. */
export function schemaProblem(db: Db): string | undefined {
  return unknownMigrations(appliedMigrations(db), migrations);
}

function appliedMigrations(db: Db): { version: number; name: string }[] {
  return db.prepare('SELECT version, name FROM schema_migrations ORDER BY version').all() as {
    version: number;
    name: string;
  }[];
}
