/**
 * The one error type services throw. It carries a *kind*, never an HTTP status: the HTTP layer
 * maps kinds to statuses and headers in one table (src/http/errors.ts), so services know nothing
 * of the transport (the CLI maps the same kinds to exit codes). Anything else that escapes is an
 * internal error answered with a generic message.
 */
export type ErrorKind =
  | 'invalid' // the request is malformed or breaks a rule about its content
  | 'unauthenticated' // no credential, or one we do not accept
  | 'forbidden' // the credential may not do this
  | 'not_found'
  | 'method_not_allowed'
  | 'conflict' // the target's current state does not allow it (already decided, exists, …)
  | 'precondition' // a condition the caller set (If-Match) does not hold
  | 'too_large'
  | 'unsupported_media'
  | 'unprocessable' // well-formed, but contradicts an earlier request (Idempotency-Key reuse)
  | 'busy' // a bounded resource is full; retry shortly
  | 'unavailable' // storage or the policy set cannot serve now; never an allow
  | 'internal';

export class AppError extends Error {
  constructor(
    readonly kind: ErrorKind,
    message: string,
    /** What caused it, for the log only: the answer carries `message` alone. */
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'AppError';
  }
}

export const invalid = (message: string) => new AppError('invalid', message);
export const notFound = (message: string) => new AppError('not_found', message);
export const conflict = (message: string) => new AppError('conflict', message);
export const unauthenticated = (message: string) => new AppError('unauthenticated', message);
export const forbidden = (message: string) => new AppError('forbidden', message);
export const precondition = (message: string) => new AppError('precondition', message);
export const unprocessable = (message: string) => new AppError('unprocessable', message);
export const busy = (message: string) => new AppError('busy', message);
export const tooLarge = (message: string) => new AppError('too_large', message);
export const unavailable = (message: string, cause?: unknown) =>
  new AppError('unavailable', message, cause === undefined ? undefined : { cause });
export const internal = (message: string) => new AppError('internal', message);

/** Whether `e` is an AppError of `kind`. */
export const isKind = (e: unknown, kind: ErrorKind): e is AppError =>
  e instanceof AppError && e.kind === kind;
