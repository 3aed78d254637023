import { isIPv6 } from 'node:net';
import type { Context, Middleware, Next } from 'koa';
import { AppError, forbidden, invalid, isKind, notFound } from '../errors.js';
import { readBodyText, parseJson } from './body.js';
import { HttpError, toHttpError } from './errors.js';
import {
  findUnstorable,
  inexactNumberIn,
  inexactNumberMessage,
  isNumericMemberOf,
  isStorableString,
  rangeErrorAt,
  MAY_HOLD_UNSTORABLE,
} from '../common/validation.js';
import { newId, newSpanId, newTraceId } from '../ids.js';
import { hasScope, type KeyService } from '../keys/service.js';
import { checkUnbound } from '../keys/binding.js';
import type { Logger } from '../observability/logger.js';
import type { Metrics } from '../observability/metrics.js';
import type { Api, RouteDef, State } from './context.js';

/**
 * W3C Trace Context §3.2: lowercase hex only (uppercase is invalid, not to be folded), version ff
 * and an all-zero trace-id or parent-id are invalid too.
 */
const TRACEPARENT = /^(?!ff)[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;

/**
 * The caller's X-Request-ID that is echoed: 1 to 255 printable ASCII characters, spaces allowed
 * inside (AuthZEN: "an arbitrary string"; `req 42 from pep` is one). Anything else (longer, other
 * characters) is not echoed: the answer carries Arbiter's own id.
 */
export const CALLER_REQUEST_ID = /^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/;

/** A request's ids as its log lines carry them: Arbiter's, the caller's where echoed, the trace's. */
function logIds(ctx: { state: State }) {
  const { requestId, callerRequestId, traceId } = ctx.state;
  return { requestId, ...(callerRequestId === undefined ? {} : { callerRequestId }), traceId };
}

/** For routes that echo it: the caller's X-Request-ID, set before anything can refuse the request. */
export const echoRequestId: Middleware<State> = (ctx, next) => {
  const id = ctx.get('x-request-id');
  if (CALLER_REQUEST_ID.test(id)) {
    ctx.set('X-Request-Id', id);
    // Logged beside Arbiter's own id, so the PEP's id finds the request in the logs.
    ctx.state.callerRequestId = id;
  }
  return next();
};

/**
 * Request id, trace id (from a valid W3C traceparent; an invalid one is ignored and a new trace
 * id made), and the response headers.
 */
export const requestContext: Middleware<State> = async (ctx, next) => {
  ctx.state.started = process.hrtime.bigint();
  ctx.state.requestId = newId();
  ctx.state.traceId = TRACEPARENT.exec(ctx.get('traceparent').trim())?.[1] ?? newTraceId();
  ctx.set('X-Request-Id', ctx.state.requestId);
  ctx.set('traceparent', `00-${ctx.state.traceId}-${newSpanId()}-01`);
  setBaseHeaders(ctx);
  await next();
};

/**
 * The headers every answer carries unless its route says otherwise. Answers carry tokens,
 * decisions and audit data: never stored by a cache on the way (RFC 6749 §5.1 asks it of token
 * responses), never sniffed as anything but their type. A route whose answer may be cached (the
 * JWKS, the console's assets) says so itself.
 */
function setBaseHeaders(ctx: Context): void {
  ctx.set('Cache-Control', 'no-store');
  ctx.set('X-Content-Type-Options', 'nosniff');
}

/** The response headers an error answer keeps from before the error: the request's ids. */
const KEPT_ON_ERROR = ['x-request-id', 'traceparent'];

/**
 * Clears what the handler set for the answer it did not give (an ETag, a Location, a public
 * Cache-Control): the error answer has the request's ids and the headers every answer has.
 */
function resetHeaders(ctx: Context): void {
  for (const name of Object.keys(ctx.response.headers)) {
    if (!KEPT_ON_ERROR.includes(name.toLowerCase())) ctx.remove(name);
  }
  setBaseHeaders(ctx);
}

/**
 * Counts and times every request under its route template (bounded labels), and logs one line
 * per request at info level: method, route, status, latency, request and trace ids, the key's
 * name and the client's address (never headers or bodies: no keys, no tokens). The metric's
 * method is one of `methods` (those the routes use) or "other": Node parses some 34 methods,
 * and each would otherwise add series any client could create.
 */
export function metricsMiddleware(
  api: Api,
  metrics: Metrics,
  log: Logger,
  methods: ReadonlySet<string>,
): Middleware<State> {
  return async (ctx, next) => {
    try {
      await next();
    } finally {
      const seconds = Number(process.hrtime.bigint() - ctx.state.started) / 1e9;
      const route = ctx.state.route?.template ?? 'unmatched';
      if (log.isLevelEnabled('info')) {
        log.info(
          {
            api,
            method: ctx.method,
            route,
            status: ctx.status,
            ms: Math.round(seconds * 1e6) / 1e3,
            ...logIds(ctx),
            keyName: ctx.state.principal?.name,
            // Where it came from (the connection's peer: a proxy in front, if there is one).
            remoteAddress: ctx.req.socket.remoteAddress,
          },
          'request',
        );
      }
      const method = methods.has(ctx.method) ? ctx.method : 'other';
      const labels = { api, route, method, status: String(ctx.status) };
      metrics.httpRequests.inc(labels);
      metrics.httpDuration.observe(labels, seconds);
    }
  };
}

/** How many header lines named `name` (lower case) the request has. */
export function headerLines(ctx: Context, name: string): number {
  const raw = ctx.req.rawHeaders;
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const h = raw[i] as string;
    // The length first: most names differ in it, and then no lower-cased copy is made.
    if (h.length === name.length && h.toLowerCase() === name) n++;
  }
  return n;
}

/**
 * RFC 3986 host [":" port]: a reg-name (unreserved, pct-encoded, sub-delims), an IPv4 address
 * (a reg-name of digits and dots already), or an IPv6 address in brackets. No userinfo, path,
 * query, quotes or angle brackets: the value becomes the base of published URLs.
 */
const HOST = /^(?:(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*|\[([0-9A-Fa-f:.]+)\])(?::[0-9]*)?$/;

/** The last Host value found valid: nearly every request of a deployment carries the same one. */
let lastValidHost = '';

export function isValidHost(value: string): boolean {
  if (value === lastValidHost) return true;
  const m = HOST.exec(value);
  if (!m) return false;
  if (m[1] !== undefined && !isIPv6(m[1])) return false;
  lastValidHost = value;
  return true;
}

/**
 * HTTP/1.1 requires exactly one Host header with a valid value (RFC 9112 §3.2); Node is told to
 * let us refuse a missing one in JSON. An absolute-form request target (`GET http://host/path`)
 * is accepted as §3.2.2 requires of a server, and its authority replaces Host (the request is then
 * served as its origin form).
 */
export const requireHost: Middleware<State> = async (ctx, next) => {
  const lines = headerLines(ctx, 'host');
  if (lines > 1) throw invalid('send one Host header, not several');
  const target = ctx.req.url ?? '';
  if (!target.startsWith('/') && target !== '*') {
    const m = /^(https?):\/\/([^/?#]*)([^#]*)$/i.exec(target);
    if (!m || !isValidHost(m[2] as string) || m[2] === '') {
      throw invalid('request target must be a path or an absolute http(s) URL with a valid host');
    }
    const rest = m[3] as string;
    ctx.req.headers.host = m[2] as string;
    ctx.url = rest.startsWith('/') ? rest : `/${rest}`;
  } else if (ctx.req.httpVersionMajor === 1 && ctx.req.httpVersionMinor >= 1 && ctx.get('host') === '') {
    throw invalid('missing Host header');
  }
  const host = ctx.get('host');
  if (host !== '' && !isValidHost(host)) {
    throw invalid('invalid Host header: expected host[:port] (a name, an IPv4 address or an [IPv6] address)');
  }
  await next();
};

/**
 * A JSON answer's text, made here rather than by Koa after the middleware chain: there a body too
 * large for one string (V8's limit) or otherwise unserializable would escape the error middleware
 * and become Koa's bare text/plain 500 after the request was logged and counted as a 200.
 * Only plain objects and arrays are JSON here; buffers, strings and streams are sent as they are.
 */
function serializeJsonBody(ctx: Context): void {
  const body: unknown = ctx.body;
  if (typeof body !== 'object' || body === null) return;
  const proto: unknown = Object.getPrototypeOf(body);
  if (!Array.isArray(body) && proto !== Object.prototype && proto !== null) return;
  // Koa set application/json for the object; a string body keeps the Content-Type already set.
  ctx.body = JSON.stringify(body);
}

/**
 * The one error middleware: every error becomes `{"error": "…"}` with the right status, a JSON
 * body that cannot be serialized included (a logged 500).
 */
export function errorMiddleware(log: Logger, maxBodyBytes: number): Middleware<State> {
  const seen = outageSeen();
  const answerError = (ctx: Context, err: unknown) => {
    const { status, message, headers } = toHttpError(err, maxBodyBytes);
    if (status >= 500) {
      const ids = logIds(ctx);
      const outage = isKind(err, 'unavailable') ? outageCause(err) : undefined;
      if (outage !== undefined && seen(outage)) {
        // The same outage again: its request id and cause, without the stack logged already.
        log.error(
          { ...ids, error: err instanceof Error ? err.message : message, cause: outage },
          'request failed',
        );
      } else {
        log.error({ err, ...ids }, 'request failed');
      }
    }
    ctx.status = status;
    for (const [k, v] of Object.entries(headers)) ctx.set(k, v);
    ctx.body = { error: message };
  };
  return async (ctx, next) => {
    try {
      await next();
    } catch (err) {
      // Headers a handler set before it threw stay (the console's 404 keeps its CSP).
      answerError(ctx, err);
      return;
    }
    try {
      serializeJsonBody(ctx);
    } catch (err) {
      // The handler finished its answer, headers and all: none of them belongs to this 500.
      resetHeaders(ctx);
      answerError(ctx, err);
    }
  };
}

/** How long an outage's cause is logged whole once, then by its message alone. */
const OUTAGE_STACK_EVERY_MS = 10_000;

/**
 * Whether this outage cause was logged whole (with its stack) in the last 10 s, noting it if not.
 * While storage is down every request fails with the same cause: each still gets its own line
 * (its request id is how an operator finds why a given call got 503), but the ~2 KB stack only
 * every 10 s, so an outage does not write megabytes a second (found by an operations probe).
 */
function outageSeen(): (cause: string) => boolean {
  const last = new Map<string, number>();
  return (cause) => {
    const now = Date.now();
    const at = last.get(cause);
    if (at !== undefined && now - at < OUTAGE_STACK_EVERY_MS && now >= at) return true;
    if (last.size >= 100) last.clear();
    last.set(cause, now);
    return false;
  };
}

/** An unavailable error's message and its causes' (a few deep), as one line. */
function outageCause(err: AppError): string {
  let line = err.message;
  let cause: unknown = err.cause;
  for (let depth = 0; depth < 4 && cause !== undefined && cause !== null; depth++) {
    line +=
      cause instanceof Error ? `: caused by ${cause.name}: ${cause.message}` : `: caused by ${String(cause)}`;
    cause = cause instanceof Error ? cause.cause : undefined;
  }
  return line;
}

/** Preconditions a client may put on a change (RFC 9110 §13.1). */
const PRECONDITIONS = ['If-Match', 'If-None-Match', 'If-Unmodified-Since'];

/**
 * A change whose route does not honour a precondition header it was sent is refused (400), never
 * made unconditionally: the client meant "only if nothing changed", and a silent success would be
 * the lost update it guards against (RFC 9110 §13.2.1: a server must not ignore it). Routes that
 * honour one declare it in `headers` (a policy PUT, a bundle, a promote); GET and HEAD keep theirs
 * (the console's files answer If-None-Match with 304).
 */
export function preconditionMiddleware(
  route: Pick<RouteDef, 'method' | 'template' | 'headers'>,
): Middleware<State> {
  const honoured = new Set((route.headers ?? []).map((h) => h.name.toLowerCase()));
  const refused = PRECONDITIONS.filter((h) => !honoured.has(h.toLowerCase()));
  if (route.method === 'GET' || refused.length === 0) return (_ctx, next) => next();
  return (ctx, next) => {
    // ctx.get reads a header whatever its case.
    const sent = refused.find((h) => ctx.get(h) !== '');
    if (sent !== undefined) {
      throw invalid(
        `${route.method} ${route.template} does not take ${sent}: it cannot make this change conditional` +
          (route.template.startsWith('/api/v1/data') || route.template.startsWith('/api/v1/policies')
            ? ' (a bundle with If-Match: "rev-N" can)'
            : ''),
      );
    }
    return next();
  };
}

/** A 401 with its Bearer challenge (RFC 6750), naming the error when there is one. */
const unauthenticated = (message: string, error?: string) =>
  new HttpError('unauthenticated', message, {
    'WWW-Authenticate': error ? `Bearer realm="arbiter", error="${error}"` : 'Bearer realm="arbiter"',
  });

/**
 * Bearer-key authentication, the route's scope, and for a global route a key bound to nothing.
 * Public routes (scope null) skip it.
 */
export function authMiddleware(keys: KeyService, route: RouteDef): Middleware<State> {
  const scope = route.scope;
  return async (ctx, next) => {
    ctx.state.route = route;
    if (scope === null) return next();
    // Node keeps the first of several, silently: which key was meant is unknowable.
    if (headerLines(ctx, 'authorization') > 1) {
      throw unauthenticated('send one Authorization header, not several', 'invalid_request');
    }
    const header = ctx.get('authorization');
    if (header === '') throw unauthenticated('missing API key: send Authorization: Bearer <key>');
    const m = /^Bearer +(\S+) *$/i.exec(header);
    if (!m) throw unauthenticated('malformed Authorization header: expected Bearer <key>', 'invalid_request');
    const principal = await keys.authenticate(m[1] as string);
    if (!principal) throw unauthenticated('invalid or revoked API key', 'invalid_token');
    ctx.state.principal = principal;
    if (scope !== 'authenticated' && !hasScope(principal, scope)) {
      throw forbidden(`API key lacks scope ${scope}`);
    }
    if (route.global !== undefined) checkUnbound(principal, route.global);
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

const unsupportedType = (allowed: string[], type: string) =>
  new AppError('unsupported_media', `Content-Type must be ${allowed.join(' or ')}, got ${type || 'none'}`);

const JSON_TYPE = Object.freeze({ type: 'application/json', charset: undefined });

/**
 * The Content-Type's type/subtype in lower case (RFC 9110 §8.3.1: case-insensitive; whitespace
 * allowed before and after `;`), '' when absent or unparsable, and its charset parameter in lower
 * case if it has one.
 */
export function mediaType(header: string): { type: string; charset: string | undefined } {
  // What nearly every client sends, answered without parsing.
  if (header === 'application/json') return JSON_TYPE;
  const [essence = '', ...params] = header.split(';');
  const type = essence.trim().toLowerCase();
  if (!/^[!#$%&'*+\-.^_`|~0-9a-z]+\/[!#$%&'*+\-.^_`|~0-9a-z]+$/.test(type)) {
    return { type: header.trim() === '' ? '' : header.trim().slice(0, 100), charset: undefined };
  }
  let charset: string | undefined;
  for (const p of params) {
    const m = /^\s*charset\s*=\s*(?:"([^"]*)"|([^\s";]*))\s*$/i.exec(p);
    if (m) charset = (m[1] ?? m[2] ?? '').toLowerCase();
  }
  return { type, charset };
}

/** Whether `value` is `{}`: the one body a route that takes none accepts (JSON.parse makes plain objects). */
function isEmptyObject(value: unknown): boolean {
  return (
    typeof value === 'object' && value !== null && !Array.isArray(value) && Object.keys(value).length === 0
  );
}

/**
 * Parses the body the route expects; wrong type 415, too large 413, malformed or wrong shape 400.
 * An empty body is no body however it was framed (Content-Length: 0, or chunked with no data; an
 * empty body that claims a Content-Encoding is not valid in it: 400). A body announced with a
 * length and a type the route does not take is refused unread (415); a chunked one is read first
 * (within the size limit), since only then is it known not to be empty.
 *
 * A route that takes no body (`none`, every method, GET and HEAD included) is served when none is
 * sent, whatever the headers say; a body sent to it is checked as any other (415, 413, 400 for
 * malformed JSON), and is then refused (400) unless it is `{}`, which clients send for "nothing".
 * It is never ignored: a client that sends one means something by it (a filter, a reason, a
 * target) that the route would not do, and must be told before anything changes.
 */
export function bodyMiddleware(
  route: Pick<RouteDef, 'body' | 'template' | 'requestSchema'>,
  maxBodyBytes: number,
): Middleware<State> {
  const kind = route.body;
  const allowed = kind === 'policy' ? ['application/json', 'text/plain'] : ['application/json'];
  return async (ctx, next: Next) => {
    const length = Number(ctx.get('content-length') || '0');
    const framed = length > 0 || ctx.get('transfer-encoding') !== '';
    // No body where none is taken: the path of nearly every GET, with no header parsed.
    if (kind === 'none' && !framed) return next();
    const { type, charset } = mediaType(ctx.get('content-type'));
    // Request bodies are read as UTF-8, the one encoding of JSON (RFC 8259 §8.1): a body that
    // declares another is refused, not misread.
    if (charset !== undefined && charset !== 'utf-8' && allowed.includes(type)) {
      throw new AppError(
        'unsupported_media',
        `Content-Type charset must be utf-8, got ${charset.slice(0, 40)}`,
      );
    }
    if (length > 0 && !allowed.includes(type)) throw unsupportedType(allowed, type);
    const { text, bytes } = framed ? await readBodyText(ctx.req, maxBodyBytes) : { text: '', bytes: 0 };
    ctx.state.receivedBytes = bytes;
    if (text === '') {
      if (kind === 'none') return next();
      if (kind === 'optional-object') {
        ctx.request.body = {};
        return next();
      }
      // An empty Rego text is a policy like any other: the policy rules name what is wrong with it.
      if (kind === 'policy' && type === 'text/plain') {
        ctx.request.body = '';
        return next();
      }
      throw invalid(
        kind === 'json' ? 'request body must be a JSON value' : 'request body must be a JSON object',
      );
    }
    if (!allowed.includes(type)) throw unsupportedType(allowed, type);
    const body = type === 'text/plain' ? text : parseJson(text);
    if (kind === 'none') {
      if (!isEmptyObject(body)) {
        throw invalid(`${ctx.method} ${route.template} takes no request body: send none, or {}`);
      }
      return next();
    }
    ctx.request.body = body;
    if (nestingExceeds(body, MAX_JSON_DEPTH)) {
      throw invalid(`request body nests deeper than ${MAX_JSON_DEPTH} levels`);
    }
    if (typeof body === 'string') {
      if (!isStorableString(body)) throw invalid('request body holds a U+0000 character');
    } else {
      const bad = MAY_HOLD_UNSTORABLE.test(text) ? findUnstorable(body) : undefined;
      if (bad?.what === 'string') {
        throw invalid(
          `${bad.at} holds a lone UTF-16 surrogate or a U+0000 character: strings must be well-formed Unicode without NUL`,
        );
      }
      const outOfRange = (at: string) =>
        route.requestSchema ? rangeErrorAt(text, route.requestSchema, at) : undefined;
      if (bad) throw invalid(outOfRange(bad.at) ?? `${bad.at} holds a number too large to represent`);
      // A number JSON.parse rounded: policies would decide on a value the caller did not send.
      const inexact = inexactNumberIn(text);
      if (inexact) {
        const { at, literal, read } = inexact;
        const range = outOfRange(at);
        if (range) throw invalid(range);
        // A member typed as a number cannot be sent as a string; 15 significant digits always
        // reach the policy as written.
        const numeric = route.requestSchema !== undefined && isNumericMemberOf(route.requestSchema, at);
        const fix = numeric ? 'send it with at most 15 significant digits' : 'send it as a string';
        throw invalid(inexactNumberMessage(`${at} holds`, literal, read, fix));
      }
    }
    if (
      kind !== 'json' &&
      type === 'application/json' &&
      (typeof body !== 'object' || body === null || Array.isArray(body))
    ) {
      throw invalid('request body must be a JSON object');
    }
    return next();
  };
}

/** After the router: a known path with another method is 405 with Allow; anything else 404. */
export function fallthrough(match: (path: string, method: string) => string[]): Middleware<State> {
  return async (ctx) => {
    const allowed = match(ctx.path, ctx.method);
    if (allowed.length > 0) {
      throw new HttpError('method_not_allowed', `method ${ctx.method} not allowed on ${ctx.path}`, {
        Allow: allowed.join(', '),
      });
    }
    throw notFound(`no route for ${ctx.method} ${ctx.path}`);
  };
}
