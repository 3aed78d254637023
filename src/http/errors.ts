import { AppError, type ErrorKind } from '../errors.js';

/**
 * The one table that turns error kinds into HTTP: status codes, and the headers a kind implies.
 * Services raise kinds; only this file knows what they look like on the wire.
 */
const STATUS: Record<ErrorKind, number> = {
  invalid: 400,
  unauthenticated: 401,
  forbidden: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  precondition: 412,
  too_large: 413,
  unsupported_media: 415,
  unprocessable: 422,
  busy: 429,
  internal: 500,
  unavailable: 503,
};

const HEADERS: Partial<Record<ErrorKind, Record<string, string>>> = {
  unauthenticated: { 'WWW-Authenticate': 'Bearer realm="arbiter"' },
  busy: { 'Retry-After': '1' },
  unavailable: { 'Retry-After': '1' },
};

/** An error the HTTP layer itself raises with headers of its own (a 401 challenge, a 405 Allow). */
export class HttpError extends AppError {
  constructor(
    kind: ErrorKind,
    message: string,
    readonly headers: Record<string, string>,
  ) {
    super(kind, message);
  }
}

export const statusOfKind = (kind: ErrorKind): number => STATUS[kind];

/** The status, `{"error"}` message and headers for anything a request threw. */
export function toHttpError(
  err: unknown,
  maxBodyBytes: number,
): { status: number; message: string; headers: Record<string, string> } {
  if (err instanceof AppError) {
    return {
      status: STATUS[err.kind],
      message: err.message,
      headers: { ...HEADERS[err.kind], ...(err instanceof HttpError ? err.headers : {}) },
    };
  }
  // Errors of the body reader (raw-body, src/http/body.ts) carry an HTTP status of their own.
  const e = err as { status?: number; expose?: boolean; message?: string };
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500) {
    if (e.status === 413)
      return { status: 413, message: `request body exceeds ${maxBodyBytes} bytes`, headers: {} };
    if (e.status === 415) return { status: 415, message: e.message ?? 'unsupported media type', headers: {} };
    if (e.status === 400)
      return { status: 400, message: `malformed JSON body: ${e.message ?? 'invalid'}`, headers: {} };
    return { status: e.status, message: e.expose && e.message ? e.message : 'bad request', headers: {} };
  }
  return { status: 500, message: 'internal error', headers: {} };
}
