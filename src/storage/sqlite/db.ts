import Database from 'better-sqlite3';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { migrationFailed, unknownMigrations } from '../failure.js';
import { migrations } from './migrations.js';

export type Db = Database.Database;

/**
 * Opens (creating if needed) the SQLite database in `dataDir` in WAL mode and brings its schema
 * up to date (unless `migrate: false`, for a second connection of a process that already did). WAL lets readers run beside the single writer and survives a kill mid-write.
 */
export function openDatabase(dataDir: string, sync: 'full' | 'normal', opts: { migrate?: boolean } = {}): Db {
  makeDirectory(dataDir);
  const db = new Database(path.join(dataDir, 'arbiter.db'));
  db.pragma('journal_mode = WAL');
  db.pragma(`synchronous = ${sync === 'full' ? 'FULL' : 'NORMAL'}`);
  db.pragma('busy_timeout = 5000');
  db.pragma('foreign_keys = ON');
  if (opts.migrate !== false) migrate(db);
  // Keeps the planner's statistics current (cheap; SQLite decides what needs analysing), so
  // filtered audit queries pick the selective index.
  db.pragma('optimize=0x10002');
  return db;
}

/**
 * Creates `dir` and any missing parents, one at a time. (Node's recursive mkdirSync never returns
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
      mkdirSync(d);
    } catch (e) {
      // Another process starting at the same time made it first.
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || !statSync(d).isDirectory()) throw e;
    }
  }
}

function migrate(db: Db): void {
  db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT`);
  const newer = schemaProblem(db);
  if (newer !== undefined) throw new Error(newer);
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
      }).immediate();
    } catch (e) {
      throw migrationFailed(m, e);
    }
  }
}

/** Why this build must not use the database (see unknownMigrations), or undefined. */
export function schemaProblem(db: Db): string | undefined {
  const applied = db.prepare('SELECT version, name FROM schema_migrations ORDER BY version').all();
  return unknownMigrations(applied as { version: number; name: string }[], migrations);
}
