import { AppError, unavailable } from '../errors.js';

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
    // PostgreSQL: connection exceptions (08…), admin shutdown / crash / cannot connect now (57P…),
    // and too many connections (53300); node: sockets that refuse, reset or time out.
    /^08/.test(code) ||
    /^57P0[1-4]$/.test(code) ||
    code === '53300' ||
    ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH'].includes(code) ||
    /Connection terminated|timeout exceeded when trying to connect|Connection ended unexpectedly|Query read timeout|Client has encountered a connection error/i.test(
      message,
    ) ||
    // SQLite: the file is locked past the busy timeout, or cannot be read or written.
    /^SQLITE_(BUSY|LOCKED|IOERR|CANTOPEN|FULL|READONLY)/.test(code);
  return unreachable ? unavailable('storage is unavailable; try again') : e;
}

/** Runs `fn`, reporting an unreachable database as `unavailable`. */
export async function storageCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw asStorageFailure(e);
  }
}
