import { createServer, ServerResponse, type IncomingMessage, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import Router from '@koa/router';
import Koa from 'koa';
import { newId } from '../ids.js';
import type { KeyService } from '../keys/service.js';
import type { Logger } from '../observability/logger.js';
import type { Metrics } from '../observability/metrics.js';
import type { Api, Ctx, RouteDef, State } from './context.js';
import {
  authMiddleware,
  bodyMiddleware,
  preconditionMiddleware,
  echoRequestId,
  errorMiddleware,
  fallthrough,
  metricsMiddleware,
  requestContext,
  requireHost,
} from './middleware.js';
import { queryMiddleware } from './query.js';

export interface AppDeps {
  keys: KeyService;
  log: Logger;
  metrics: Metrics;
  maxBodyBytes: number;
}

/** Builds the Koa app of one API from the shared route table. */
export function buildApp(api: Api, routes: RouteDef[], deps: AppDeps): Koa<State> {
  const app = new Koa<State>();
  app.silent = true;
  app.proxy = false;
  const router = new Router<State>();
  const mine = routes.filter((r) => r.apis.includes(api));
  for (const r of mine) {
    router.register(
      r.path,
      [r.method],
      [
        ...(r.echoRequestId ? [echoRequestId] : []),
        authMiddleware(deps.keys, r),
        queryMiddleware(r),
        preconditionMiddleware(r),
        bodyMiddleware(r, deps.maxBodyBytes),
        (ctx) => r.handler(ctx as Ctx),
      ],
    );
  }
  const allowedFor = (path: string): string[] => {
    const methods = new Set<string>();
    for (const layer of router.match(path, 'GET').path) for (const m of layer.methods) methods.add(m);
    return [...methods];
  };
  app.use(requestContext);
  app.use(metricsMiddleware(api, deps.metrics, deps.log, routeMethods(mine)));
  app.use(errorMiddleware(deps.log, deps.maxBodyBytes));
  app.use(requireHost);
  app.use(router.routes());
  app.use(fallthrough((path) => allowedFor(path)));
  return app;
}

/** The methods `routes` answer: theirs, and HEAD wherever GET is (the router serves it). */
function routeMethods(routes: RouteDef[]): ReadonlySet<string> {
  const methods = new Set<string>(routes.map((r) => r.method));
  if (methods.has('GET')) methods.add('HEAD');
  return methods;
}

/** A raw HTTP/1.1 answer in the `{"error"}` shape, for what Node answers before Koa runs. */
function rawError(status: number, reason: string, message: string): string {
  const body = JSON.stringify({ error: message });
  return (
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${newId()}\r\nConnection: close\r\n\r\n${body}`
  );
}

/** The connection and time limits of a listener (src/config.ts). */
export interface ServerLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  maxConnections: number;
}

/**
 * How long a connection answered before its request body was read stays open to take (and
 * discard) what the client is still sending, so that the close does not reset the connection
 * before the client has read the answer (RFC 9112 §9.6, "lingering close").
 */
export const LINGER_MS = 1500;

/**
 * Header lines Node keeps of a request; it silently drops the rest, so a request that reaches
 * this many is refused (431) rather than served without, say, its Authorization.
 */
export const MAX_HEADERS_COUNT = 1000;

/**
 * ServerResponse.prototype.writeHead, for an answer given before the request's body was read (401,
 * 413, 415, …): that closes the connection, with a linger, since otherwise Node would read and
 * discard the body, however long, to keep the connection for a next request. One shared function
 * set on each response (no closure per request); `this.req` is the response's request.
 */
const nodeWriteHead = ServerResponse.prototype.writeHead;
function writeHeadClosingUnread(this: ServerResponse, ...args: unknown[]): ServerResponse {
  if (!this.req.complete) {
    this.shouldKeepAlive = false;
    const socket = this.req.socket as Duplex & { destroySoon?: () => void };
    socket.destroySoon = () => lingeringClose(socket);
  }
  return (nodeWriteHead as (...a: unknown[]) => ServerResponse).apply(this, args);
}

/**
 * Closes the write side now and the whole connection once the client has closed its own or after
 * LINGER_MS, discarding whatever else arrives meanwhile. Replaces Node's immediate destroySoon()
 * for a connection whose request body was never read.
 */
function lingeringClose(socket: Duplex): void {
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
  socket.once('end', () => socket.destroy());
  if (socket.writable) socket.end();
}

/**
 * The node:http server of one API. Answers that Node's HTTP layer would otherwise give on its own
 * (a parse error, oversized headers, a timed-out request, an `Expect` it cannot meet) take the
 * same `{"error"}` JSON shape with a request id as every other error. `isClosing` makes every
 * response ask the client to close its connection once shutdown has begun.
 */
export function createApiServer(app: Koa<State>, isClosing: () => boolean, limits: ServerLimits): Server {
  const handle = app.callback();
  const server = createServer(
    {
      // A missing Host is refused by Koa's chain (JSON, with a request id), not by Node's bare 400.
      requireHostHeader: false,
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      // How often Node looks for connections past those timeouts (its default, 30 s, would let a
      // 10 s limit hold a connection for 40 s).
      connectionsCheckingInterval: Math.min(1000, limits.headersTimeoutMs),
    },
    (req, res) => {
      if (isClosing()) res.shouldKeepAlive = false;
      // An answer given before the request's body was read (401, 413, 415, 431, …) closes the
      // connection, with a linger: otherwise Node would read and discard the body, however long,
      // to keep the connection for a next request. Set before anything can answer.
      res.writeHead = writeHeadClosingUnread as typeof res.writeHead;
      if (req.rawHeaders.length >= 2 * MAX_HEADERS_COUNT) {
        res.shouldKeepAlive = false;
        const body = JSON.stringify({ error: `more than ${MAX_HEADERS_COUNT - 1} header lines` });
        res.writeHead(431, {
          'Content-Type': 'application/json; charset=utf-8',
          'Content-Length': Buffer.byteLength(body),
          'X-Request-Id': newId(),
          Connection: 'close',
        });
        res.end(body);
        return;
      }
      void handle(req, res);
    },
  );
  server.maxHeadersCount = MAX_HEADERS_COUNT;
  server.maxConnections = limits.maxConnections;
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable) return socket.destroy();
    // One request, one response: once an answer to the request in progress has begun (a 401 or
    // 413 sent before its body was read), an error in the rest of that body (a bad chunk, a
    // timeout) only closes the connection, as Node's own handler does. (Once that answer is
    // written, the lingering close has ended the socket's writing side: the line above.)
    const http = socket as Duplex & { _httpMessage?: { headersSent?: boolean } | null };
    if (http._httpMessage?.headersSent) return socket.destroy();
    // Closed, not only half-closed, once the answer is written: a client that keeps its end open
    // must not hold the socket (and a graceful shutdown waiting for it) forever.
    const done = () => socket.destroy();
    socket.end(
      err.code === 'HPE_HEADER_OVERFLOW'
        ? rawError(431, 'Request Header Fields Too Large', 'request headers too large')
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? rawError(408, 'Request Timeout', 'request was not received in time')
          : rawError(400, 'Bad Request', 'malformed HTTP request'),
      done,
    );
  });
  // CONNECT (a proxy tunnel) is nothing Arbiter serves: without this listener Node drops the socket.
  server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    socket.on('error', () => undefined);
    // A CONNECT socket is no longer the server's: closeAllConnections() at shutdown cannot reach
    // it, so it is destroyed as soon as the answer is written.
    socket.end(rawError(400, 'Bad Request', 'CONNECT is not supported: Arbiter is not a proxy'), () =>
      socket.destroy(),
    );
  });
  // With a listener, Node hands an unmeetable Expect to us instead of answering a bare 417.
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const body = JSON.stringify({
      error: `Expect: ${String(req.headers.expect)} is not supported (only 100-continue)`,
    });
    res.writeHead(417, {
      'Content-Type': 'application/json; charset=utf-8',
      'Content-Length': Buffer.byteLength(body),
      'X-Request-Id': newId(),
      Connection: 'close',
    });
    res.end(body);
  });
  server.keepAliveTimeout = 65_000;
  return server;
}
