import type { ParameterizedContext } from 'koa';
import type { Principal, Scope } from '../keys/types.js';
import type { JsonSchema } from '../common/validation.js';
import type { QueryParam } from './query.js';

export type Api = 'engine' | 'platform';

/** How a route takes its body. */
export type BodyKind =
  | 'none' // no body, or `{}`; any other body is refused (400, or 415 for another type)
  | 'object' // required JSON object
  | 'optional-object' // JSON object, or no body at all
  | 'json' // any JSON value
  | 'policy'; // JSON object, or text/plain Rego

/** A request header a route reads, as the OpenAPI document describes it. */
export interface HeaderParam {
  name: string;
  description: string;
  schema: JsonSchema;
}

/** One documented answer of a route. */
export interface Answer {
  status: number;
  description: string;
  schema?: JsonSchema | null;
}

export interface RouteDef {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** Koa path, e.g. /api/v1/policies/:name */
  path: string;
  /** OpenAPI-style template, used as the metrics label and in docs: /api/v1/policies/{name} */
  template: string;
  apis: readonly Api[];
  /** The scope the route needs; 'authenticated' = any valid key; null = public. */
  scope: Scope | 'authenticated' | null;
  /**
   * Set when the route's effect or answer spans every tenant and agent (webhooks, signing keys,
   * the audit chain, budget counters): a key bound to a tenant or an agent is refused with 403
   * whatever its scopes (src/keys/binding.ts `checkUnbound`), and this says what it cannot do.
   */
  global?: string;
  body: BodyKind;
  summary: string;
  /**
   * Status and meaning of the successful answer, with the JSON Schema of its body (absent only for
   * answers without a JSON body: 204, redirects, `produces`).
   */
  ok: { status: number; description: string; schema?: JsonSchema };
  /**
   * The other answers this route gives beyond the ones derived from its definition (auth, bad
   * input, unknown id, body limits): each status with its meaning, and the schema of its body
   * (absent: the `{"error"}` body; `null`: no body at all).
   */
  also?: readonly Answer[];
  /** Media types of a successful answer other than JSON (the OpenAPI document names them). */
  produces?: string[];
  /** The JSON Schema the body is validated with (the same object the service uses). */
  requestSchema?: JsonSchema;
  /** The query parameters it takes (any other is a 400), each with its schema and parser. */
  query?: readonly QueryParam[];
  /**
   * The console's page and files only: any query string is ignored, as a web server does (a shared
   * link's `?utm_source=`, an asset's `?v=`). Every API route refuses what it does not take.
   */
  ignoresQuery?: true;
  /** Request headers with a meaning for this route (documented; the handler reads them). */
  headers?: readonly HeaderParam[];
  /**
   * Echo the caller's X-Request-ID (1 to 255 printable ASCII characters, spaces inside) in place of ours on every
   * answer of this route, errors included (the AuthZEN HTTPS binding's MUST).
   */
  echoRequestId?: boolean;
  handler: (ctx: Ctx) => Promise<void> | void;
}

declare module 'koa' {
  interface Request {
    /** The parsed body, set by the body middleware for routes that take one (src/http/body.ts). */
    body?: unknown;
  }
}

export interface State {
  requestId: string;
  traceId: string;
  /** The caller's own X-Request-ID, where a route echoes it (AuthZEN) instead of requestId. */
  callerRequestId?: string;
  principal?: Principal;
  route?: RouteDef;
  /** The query parameters, parsed by the route's definitions (src/http/query.ts). */
  query?: Record<string, unknown>;
  /** The UTF-8 size of the request body as read (after Content-Encoding), for routes that take one. */
  receivedBytes?: number;
  started: bigint;
}

export type Ctx = ParameterizedContext<State> & { params: Record<string, string | string[] | undefined> };

/** The authenticated principal; routes with a scope always have one. */
export function principalOf(ctx: Ctx): Principal {
  const p = ctx.state.principal;
  if (!p) throw new Error('route reached without authentication');
  return p;
}

export function actorOf(ctx: Ctx): string {
  return ctx.state.principal?.name ?? 'anonymous';
}
