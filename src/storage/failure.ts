import { AppError, unavailable } from '../errors.js';
import { VERSION } from '../version.js';

/**
 * Turns a driver error that means "the database cannot serve now" into an `unavailable` error
 * (HTTP 503: retry, never an allow); anything else (a constraint, a bug) is left as it is.
 */
export function asStorageFailure(e: unknown): unknown {
  if (e instanceof AppError) return e;
  const err = e as { code?: unknown; message?: unknown };
  const code = typeof err?.code === 'string' ? err.code : '';
  const message = typeof err?.message === 'string' ? err.message : '';
  const unreachable =
    // PostgreSQL: connection exceptions (08…); admin shutdown, crash, cannot connect now, idle
    // session timeout (57P0…); the server out of disk, memory or connections (53100, 53200,
    // 53300) or failing to do I/O (58000, 58030); a database that does not exist (3D000), refuses
    // new connections (55000 "is not currently accepting connections") or refuses our login
    // (28…); a standby after a failover (25006, read-only transaction). None of them is the
    // request's fault or an answer: retry (the driver's error is kept as the cause, for the log).
    // Not a configured limit one query exceeds (53400) or a missing file (58P01): those repeat.
    // Node: sockets that refuse, reset or time out.
    /^(08|28)/.test(code) ||
    ['53100', '53200', '53300', '58000', '58030'].includes(code) ||
    /^57P0[1-5]$/.test(code) ||
    code === '3D000' ||
    code === '25006' ||
    (code === '55000' && /not currently accepting connections/i.test(message)) ||
    ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH'].includes(code) ||
    /Connection terminated|timeout exceeded when trying to connect|Connection ended unexpectedly|Query read timeout|Client has encountered a connection error/i.test(
      message,
    ) ||
    // SQLite: the file is locked past the busy timeout, or cannot be read or written.
    /^SQLITE_(BUSY|LOCKED|IOERR|CANTOPEN|FULL|READONLY)/.test(code);
  return unreachable ? unavailable('storage is unavailable; try again', e) : e;
}

/** Runs `fn`, reporting an unreachable database as `unavailable`. */
export async function storageCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw asStorageFailure(e);
  }
}

/**
 * A schema migration that failed, named by version and title (its transaction rolled back, so
 * the schema is as the migration before it left it); the driver's error is kept as the cause.
 */
export function migrationFailed(m: { version: number; name: string }, e: unknown): Error {
  const why = e instanceof Error ? e.message : String(e);
  return new Error(`schema migration ${m.version} ("${m.name}") failed and was rolled back: ${why}`, {
    cause: e,
  });
}

/**
 * Why this build must not use a database: the migrations applied to it that this build does not
 * know (a newer Arbiter has upgraded it), named with this build's version and newest migration;
 * undefined when it knows every one. An upgrade goes one way: an older engine would misread what a
 * newer one writes, or leave empty a column the newer one relies on (docs/decisions.md).
 */
export function unknownMigrations(
  applied: readonly { version: number | string; name: string }[],
  known: readonly { version: number }[],
): string | undefined {
  const ours = new Set(known.map((m) => m.version));
  const unknown = applied.filter((m) => !ours.has(Number(m.version)));
  if (unknown.length === 0) return undefined;
  const named = unknown.map((m) => `${m.version} ("${m.name}")`).join(', ');
  return newerSchema(`schema migration${unknown.length > 1 ? 's' : ''} ${named}`, known);
}

/**
 * Why a command that must not upgrade the schema (the CLI: every serving engine of the older
 * build would then refuse) cannot use this database: it holds some but not all of this build's
 * migrations, named by the newest applied and this build's; undefined when it holds every one, or
 * none (a fresh store, which the command may create).
 */
function olderSchema(
  applied: readonly { version: number | string }[],
  known: readonly { version: number }[],
): string | undefined {
  const done = new Set(applied.map((m) => Number(m.version)));
  if (done.size === 0 || known.every((m) => done.has(m.version))) return undefined;
  return (
    `the database has schema version ${Math.max(...done)}, older than this build's ` +
    `(Arbiter ${VERSION}, schema version ${newestVersion(known)}): upgrade the servers first ` +
    '(`arbiter serve` migrates it), then run this command (README "Upgrading")'
  );
}

/** The meta row in which every migrating start records the newest schema version it knows. */
export const SCHEMA_VERSION = 'schema_version';

/**
 * Why this build must not append: the schema version recorded in meta (read in the statement
 * that reads or locks the chain head, so a newer Arbiter's migration that committed while the
 * append waited for the head is seen) is newer than this build's. A missing row (a store no
 * migrating start of this build or a later one has opened yet) is no objection; an unreadable one
 * is, since only someone else could have written it.
 */
function newerSchemaVersion(
  rows: readonly { key: string; value: string }[],
  known: readonly { version: number }[],
): string | undefined {
  const recorded = rows.find((r) => r.key === SCHEMA_VERSION)?.value;
  if (recorded === undefined) return undefined;
  if (!/^\d{1,9}$/.test(recorded))
    return newerSchema(`an unreadable schema version (meta ${SCHEMA_VERSION})`, known);
  return Number(recorded) > newestVersion(known)
    ? newerSchema(`schema version ${recorded}`, known)
    : undefined;
}

/** Throws `unavailable` (503, never an answer) when the recorded schema is newer than this build's. */
export function refuseNewerSchema(
  rows: readonly { key: string; value: string }[],
  known: readonly { version: number }[],
): void {
  const problem = newerSchemaVersion(rows, known);
  if (problem !== undefined) throw unavailable(problem);
}

/**
 * Why a start must not use the database, checked under its migration locks: a migration or a
 * recorded schema version newer than this build's, or, without `upgrade` (the CLI), a schema
 * older than this build's; undefined when it may go on (and migrate, with `upgrade`).
 */
export function refusedAtStart(
  applied: readonly { version: number | string; name: string }[],
  recorded: readonly { key: string; value: string }[],
  known: readonly { version: number }[],
  upgrade: boolean,
): string | undefined {
  return (
    unknownMigrations(applied, known) ??
    newerSchemaVersion(recorded, known) ??
    (upgrade ? undefined : olderSchema(applied, known))
  );
}

const newest = new WeakMap<object, number>();

/** The newest version of a backend's migration list, worked out once (appends compare with it). */
export function newestVersion(known: readonly { version: number }[]): number {
  let n = newest.get(known);
  if (n === undefined) {
    n = Math.max(...known.map((m) => m.version));
    newest.set(known, n);
  }
  return n;
}

/** The one sentence for a schema newer than this build's, `what` naming what says it is. */
function newerSchema(what: string, known: readonly { version: number }[]): string {
  return (
    `the database has ${what}, which this build ` +
    `(Arbiter ${VERSION}, schema version ${newestVersion(known)}) does not know: a newer Arbiter has upgraded it; ` +
    'run that version or a newer one (README "Upgrading")'
  );
}
