import bodyParser from 'koa-bodyparser';
import type { Middleware, Next } from 'koa';
import { AppError } from '../errors.js';
import { newId, newSpanId, newTraceId } from '../ids.js';
import { hasScope, type KeyService } from '../keys/service.js';
import type { Logger } from '../observability/logger.js';
import type { Metrics } from '../observability/metrics.js';
import type { Api, BodyKind, RouteDef, State } from './context.js';

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** Request id, trace id (from a valid W3C traceparent, else new), and the response headers. */
export const requestContext: Middleware<State> = async (ctx, next) => {
  ctx.state.started = process.hrtime.bigint();
  ctx.state.requestId = newId();
  const tp = TRACEPARENT.exec(ctx.get('traceparent').trim().toLowerCase());
  const incoming = tp && tp[1] !== 'ff' && !/^0+$/.test(tp[2] as string) ? (tp[2] as string) : undefined;
  ctx.state.traceId = incoming ?? newTraceId();
  ctx.set('X-Request-Id', ctx.state.requestId);
  ctx.set('traceparent', `00-${ctx.state.traceId}-${newSpanId()}-01`);
  await next();
};

/**
 * Counts and times every request under its route template (bounded labels), and logs it at
 * debug level with its request and trace ids (never headers or bodies: no keys, no tokens).
 */
export function metricsMiddleware(api: Api, metrics: Metrics, log: Logger): Middleware<State> {
  const logRequests = log.isLevelEnabled('debug');
  return async (ctx, next) => {
    try {
      await next();
    } finally {
      const seconds = Number(process.hrtime.bigint() - ctx.state.started) / 1e9;
      if (logRequests) {
        log.debug(
          {
            api,
            requestId: ctx.state.requestId,
            traceId: ctx.state.traceId,
            method: ctx.method,
            route: ctx.state.route?.template ?? 'unmatched',
            status: ctx.status,
            ms: Math.round(seconds * 1e6) / 1e3,
            principal: ctx.state.principal?.name,
          },
          'request',
        );
      }
      const labels = {
        api,
        route: ctx.state.route?.template ?? 'unmatched',
        method: ctx.method,
        status: String(ctx.status),
      };
      metrics.httpRequests.inc(labels);
      metrics.httpDuration.observe(labels, seconds);
    }
  };
}

/** The one error middleware: every error becomes `{"error": "…"}` with the right status. */
export function errorMiddleware(log: Logger, maxBodyBytes: number): Middleware<State> {
  return async (ctx, next) => {
    try {
      await next();
    } catch (err) {
      const { status, message, headers } = toHttpError(err, maxBodyBytes);
      if (status >= 500) {
        log.error({ err, requestId: ctx.state.requestId, traceId: ctx.state.traceId }, 'request failed');
      }
      ctx.status = status;
      for (const [k, v] of Object.entries(headers)) ctx.set(k, v);
      ctx.body = { error: message };
    }
  };
}

function toHttpError(
  err: unknown,
  maxBodyBytes: number,
): { status: number; message: string; headers: Record<string, string> } {
  if (err instanceof AppError) return { status: err.status, message: err.message, headers: err.headers };
  const e = err as { status?: number; expose?: boolean; message?: string; type?: string };
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

const challenge = (error?: string) => ({
  'WWW-Authenticate': error ? `Bearer realm="arbiter", error="${error}"` : 'Bearer realm="arbiter"',
});

/** Bearer-key authentication and the route's scope. Public routes (scope null) skip it. */
export function authMiddleware(keys: KeyService, route: RouteDef): Middleware<State> {
  const scope = route.scope;
  return async (ctx, next) => {
    ctx.state.route = route;
    if (scope === null) return next();
    const header = ctx.get('authorization');
    if (header === '')
      throw new AppError(401, 'missing API key: send Authorization: Bearer <key>', challenge());
    const m = /^Bearer +(\S+) *$/i.exec(header);
    if (!m)
      throw new AppError(
        401,
        'malformed Authorization header: expected Bearer <key>',
        challenge('invalid_request'),
      );
    const principal = await keys.authenticate(m[1] as string);
    if (!principal) throw new AppError(401, 'invalid or revoked API key', challenge('invalid_token'));
    ctx.state.principal = principal;
    if (scope !== 'authenticated' && !hasScope(principal, scope)) {
      throw new AppError(403, `API key lacks scope ${scope}`);
    }
    return next();
  };
}

/**
 * Deeper JSON than this is refused: nothing legitimate needs it, and recursive consumers (the
 * audit's canonical hashing, wasm's JSON reader) must never meet a body that exhausts a stack.
 */
export const MAX_JSON_DEPTH = 64;

/** Whether `value` nests objects/arrays more than `max` levels deep (iterative: no recursion). */
export function nestingExceeds(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop() as [unknown, number];
    if (typeof v !== 'object' || v === null) continue;
    if (depth > max) return true;
    for (const child of Object.values(v)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1]);
    }
  }
  return false;
}

/** Parses the body the route expects; wrong type 415, too large 413, malformed or wrong shape 400. */
export function bodyMiddleware(kind: BodyKind, maxBodyBytes: number): Middleware<State> {
  if (kind === 'none') return (_ctx, next) => next();
  const limit = `${maxBodyBytes}b`;
  const parser = bodyParser({
    enableTypes: kind === 'policy' ? ['json', 'text'] : ['json'],
    jsonLimit: limit,
    textLimit: limit,
    // Shape is checked below, so that `null` or `"x"` get the same message as an array.
    strict: false,
    onerror: (err) => {
      throw err;
    },
  });
  return async (ctx, next: Next) => {
    const hasBody = Number(ctx.get('content-length') || '0') > 0 || ctx.get('transfer-encoding') !== '';
    if (!hasBody) {
      if (kind === 'optional-object') {
        ctx.request.body = {};
        return next();
      }
      throw new AppError(
        400,
        kind === 'json' ? 'request body must be a JSON value' : 'request body must be a JSON object',
      );
    }
    const type = ctx.request.type;
    const allowed = kind === 'policy' ? ['application/json', 'text/plain'] : ['application/json'];
    if (!allowed.includes(type)) {
      throw new AppError(415, `Content-Type must be ${allowed.join(' or ')}, got ${type || 'none'}`);
    }
    await parser(ctx as unknown as Parameters<typeof parser>[0], async () => undefined);
    const body = ctx.request.body;
    if (nestingExceeds(body, MAX_JSON_DEPTH)) {
      throw new AppError(400, `request body nests deeper than ${MAX_JSON_DEPTH} levels`);
    }
    if (
      kind !== 'json' &&
      type === 'application/json' &&
      (typeof body !== 'object' || body === null || Array.isArray(body))
    ) {
      throw new AppError(400, 'request body must be a JSON object');
    }
    return next();
  };
}

/** After the router: a known path with another method is 405 with Allow; anything else 404. */
export function fallthrough(match: (path: string, method: string) => string[]): Middleware<State> {
  return async (ctx) => {
    const allowed = match(ctx.path, ctx.method);
    if (allowed.length > 0) {
      throw new AppError(405, `method ${ctx.method} not allowed on ${ctx.path}`, {
        Allow: allowed.join(', '),
      });
    }
    throw new AppError(404, `no route for ${ctx.method} ${ctx.path}`);
  };
}
