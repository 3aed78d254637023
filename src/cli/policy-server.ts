import { maskPassword, maskPasswordsIn } from '../common/urls.js';
import { checkDataPath, POLICY_NAME } from '../policy/documents.js';
import { CliUsageError, HttpRefused, Refused } from './policy-errors.js';

/** Where the CLI finds the Platform API, and with which key. */
export interface ServerOptions {
  url: string | undefined;
  key: string | undefined;
}

/** Pages of one list the CLI reads at most: 1000 of 1000 items, far beyond any real set. */
const MAX_PAGES = 1000;
const PAGE_SIZE = 1000;

/** How long one request may take, answer included. */
const REQUEST_TIMEOUT_MS = 120_000;

/** Certificate errors that mean the server's certificate chain is not one Node trusts. */
const UNTRUSTED = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_GET_ISSUER_CERT',
]);

/**
 * Transport errors that mean the request never reached the server (no connection was made, or
 * TLS refused it before anything was sent): every untrusted-certificate code among them.
 */
const NOT_SENT = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
  ...UNTRUSTED,
  'CERT_HAS_EXPIRED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'ERR_SSL_WRONG_VERSION_NUMBER',
]);

/** What to do about a TLS error, after its code (an internal CA is the usual cause). */
function tlsHint(code: string | undefined): string {
  if (code === undefined) return '';
  if (UNTRUSTED.has(code)) {
    return (
      " (the server's TLS certificate is not signed by a CA Node trusts: set NODE_EXTRA_CA_CERTS " +
      "to the PEM file of your CA; don't turn verification off, the key is sent to this server)"
    );
  }
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID')
    return " (the server's TLS certificate is for another host name)";
  if (code === 'CERT_HAS_EXPIRED') return " (the server's TLS certificate has expired)";
  if (code === 'ERR_SSL_WRONG_VERSION_NUMBER')
    return ' (the server does not speak TLS there: is it http://?)';
  return '';
}

/** A password-shaped part of a URL anywhere in a text (`//user:secret@`), masked. */

export const errorOf = (json: Record<string, unknown>) =>
  typeof json.error === 'string' ? json.error : json.error === undefined ? '' : JSON.stringify(json.error);

/** An answer no Arbiter gives (another service on the port, a proxy's page): exit 2. */
export const notArbiter = (what: string, why: string) =>
  new CliUsageError(`${what}: ${why}: the answer is not Arbiter's (is --url the Platform API?)`);

/** The Platform API at --url / ARBITER_URL with the key at --key / ARBITER_KEY. */
export class Server {
  readonly base: string;
  /** The URL as printed: never its password. */
  readonly shown: string;
  private readonly key: string;
  constructor(opts: ServerOptions) {
    const url = opts.url ?? process.env.ARBITER_URL;
    const key = opts.key ?? process.env.ARBITER_KEY;
    if (!url) throw new CliUsageError('the server is unknown: pass --url or set ARBITER_URL');
    if (!key) throw new CliUsageError('no API key: pass --key or set ARBITER_KEY');
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      // Not echoed: a URL that does not parse may still hold a password.
      throw new CliUsageError('the server URL (--url or ARBITER_URL) is not a URL');
    }
    this.base = url.replace(/\/+$/, '');
    this.shown = maskPassword(this.base);
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new CliUsageError(`--url ${this.shown} must be http:// or https://`);
    }
    if (parsed.search !== '' || parsed.hash !== '' || url.includes('?') || url.includes('#')) {
      // The API's paths are appended to the URL: after a query or fragment they would be part
      // of it, and every request would go to the base path (a 404 that reads as "not Arbiter").
      throw new CliUsageError(
        // Not echoed: a query may hold a token.
        "the server URL (--url or ARBITER_URL) holds a query or fragment (?, #): give the Platform API's base URL, " +
          'with a path prefix if a proxy serves it under one',
      );
    }
    if (parsed.username !== '' || parsed.password !== '') {
      // fetch refuses such a URL, and the key is the credential the API takes.
      throw new CliUsageError(
        `--url ${this.shown} holds a user name or password, which the CLI cannot send: ` +
          'give the URL without them and the API key with --key or ARBITER_KEY',
      );
    }
    // Whitespace around it is dropped, as fetch drops it from a header value (a key read from a
    // file with its line break). Anything else a header cannot carry is refused here, without the
    // key: fetch's own error quotes the whole header, key and all, into what CI logs keep.
    const sent = key.replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, '');
    if (!/^[\x21-\x7e]+$/.test(sent)) {
      throw new CliUsageError(
        'the API key (--key or ARBITER_KEY) must be printable ASCII without spaces or line breaks; it is not shown',
      );
    }
    this.key = sent;
  }

  /** One request; a transport failure is exit 2, an error answer is returned to the caller. */
  async call(
    method: string,
    p: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<{ status: number; json: Record<string, unknown>; headers: Headers }> {
    let res: Response;
    try {
      res = await fetch(this.base + p, {
        method,
        headers: {
          authorization: `Bearer ${this.key}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          ...headers,
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    } catch (e) {
      const cause = (e as { cause?: { code?: string; message?: string } }).cause;
      const timedOut = (e as Error).name === 'TimeoutError';
      const why = timedOut
        ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`
        : (cause?.code ?? cause?.message ?? (e as Error).message);
      // A connection that broke (or timed out) after a change was sent: the server may have
      // applied it. "cannot reach" would say nothing happened.
      if (method !== 'GET' && (timedOut || !NOT_SENT.has(cause?.code ?? ''))) {
        throw new CliUsageError(
          maskPasswordsIn(
            `${method} ${p}: ${this.shown} did not answer (${why}) after the request was sent: ` +
              'whether it took effect is unknown; diff shows what is live',
          ),
        );
      }
      throw new CliUsageError(maskPasswordsIn(`cannot reach ${this.shown}: ${why}${tlsHint(cause?.code)}`));
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      throw new CliUsageError(
        maskPasswordsIn(`${method} ${p}: the answer broke off: ${(e as Error).message}`),
      );
    }
    let json: unknown;
    try {
      json = text === '' ? {} : JSON.parse(text);
    } catch {
      // Not Arbiter answering (a proxy's error page, another service): a connection problem.
      throw new CliUsageError(`${method} ${p}: answered ${res.status} with a body that is not JSON`);
    }
    if (typeof json !== 'object' || json === null || Array.isArray(json)) {
      throw notArbiter(`${method} ${p}`, `answered ${res.status} with JSON that is not an object`);
    }
    return { status: res.status, json: json as Record<string, unknown>, headers: res.headers };
  }

  /** A 2xx answer's body; a 4xx is a refusal naming the server's error, a 5xx exit 2. */
  async ok(method: string, p: string, body?: unknown, headers?: Record<string, string>) {
    return this.settle(method, p, await this.call(method, p, body, headers));
  }

  /** An answer's body if 2xx; a 4xx is a refusal naming the server's error, a 5xx exit 2. */
  private settle(method: string, p: string, r: { status: number; json: Record<string, unknown> }) {
    if (r.status >= 200 && r.status <= 299) return r.json;
    const what = `${method} ${p}: ${r.status} ${errorOf(r.json)}`.trim();
    if (r.status >= 400 && r.status <= 499) throw new HttpRefused(r.status, what);
    throw new CliUsageError(r.status >= 500 ? `${what} (the server failed; try again)` : what);
  }

  /**
   * Every item of a paginated list, each checked by `item` (undefined: not an item Arbiter lists).
   * Bounded: a repeated cursor, an empty page with a next one, or more than MAX_PAGES pages is
   * not Arbiter answering (exit 2), never an endless loop.
   */
  async all<T>(
    p: string,
    field: string,
    item: (x: unknown) => T | undefined,
  ): Promise<{ items: T[]; revision: number }> {
    const items: T[] = [];
    const seen = new Set<string>();
    let cursor: string | null = null;
    const revisions = new Set<number>();
    for (let pages = 0; ; pages++) {
      if (pages >= MAX_PAGES) throw notArbiter(`GET ${p}`, `more than ${MAX_PAGES} pages`);
      const q = `?limit=${PAGE_SIZE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`;
      // A 404 on a list every Arbiter serves: another service (the Engine API) answers.
      const r = await this.call('GET', p + q);
      if (r.status === 404) throw notArbiter(`GET ${p}`, `answered 404 ${errorOf(r.json)}`.trim());
      const page = this.settle('GET', p + q, r);
      const list = page[field];
      if (!Array.isArray(list)) throw notArbiter(`GET ${p}`, `${field} is not a list`);
      if (list.length > PAGE_SIZE) throw notArbiter(`GET ${p}`, `a page of more than ${PAGE_SIZE} items`);
      for (const x of list) {
        const v = item(x);
        if (v === undefined) throw notArbiter(`GET ${p}`, `${JSON.stringify(x)?.slice(0, 200)} in ${field}`);
        items.push(v);
      }
      revisions.add(revisionOf(page, `GET ${p}`));
      const next = page.next_cursor;
      if (next === null) break;
      if (typeof next !== 'string' || next === '')
        throw notArbiter(`GET ${p}`, 'next_cursor is not a cursor');
      if (list.length === 0) throw notArbiter(`GET ${p}`, 'an empty page with a next page');
      if (seen.has(next)) throw notArbiter(`GET ${p}`, 'next_cursor repeats an earlier one');
      seen.add(next);
      cursor = next;
    }
    // Pages read at different revisions are not one set: -1 makes the caller read again.
    return { items, revision: revisions.size === 1 ? ([...revisions][0] as number) : -1 };
  }
}

/** An answer's `revision`: a non-negative integer, else not Arbiter answering. */
export function revisionOf(json: Record<string, unknown>, what: string): number {
  const r = json.revision;
  if (typeof r !== 'number' || !Number.isSafeInteger(r) || r < 0) throw notArbiter(what, 'no revision');
  return r;
}

export const isObject = (x: unknown): x is Record<string, unknown> =>
  typeof x === 'object' && x !== null && !Array.isArray(x);
const policyItem = (x: unknown) =>
  isObject(x) &&
  typeof x.name === 'string' &&
  POLICY_NAME.test(x.name) &&
  typeof x.sha256 === 'string' &&
  /^[0-9a-f]{64}$/.test(x.sha256)
    ? { name: x.name, sha256: x.sha256 }
    : undefined;
/** A data document's path as listed; one that is not a valid path (`../x`) never reaches pull. */
const documentItem = (x: unknown) => {
  if (!isObject(x) || typeof x.path !== 'string') return undefined;
  try {
    checkDataPath(x.path);
  } catch {
    return undefined;
  }
  return { path: x.path };
};

export interface LiveSet {
  revision: number;
  policies: Map<string, { sha256: string }>;
  data: Map<string, unknown>;
}

/** The live set at one revision (read again if a change landed between the reads). */
export async function readLive(
  server: Server,
  withRego = false,
): Promise<LiveSet & { rego: Map<string, string> }> {
  for (let tries = 0; tries < 5; tries++) {
    const policies = await server.all('/api/v1/policies', 'policies', policyItem);
    const docs = await server.all('/api/v1/data', 'documents', documentItem);
    const byName = new Map(policies.items.map((p) => [p.name, { sha256: p.sha256 }]));
    if (byName.size !== policies.items.length)
      throw notArbiter('GET /api/v1/policies', 'a name listed twice');
    const data = new Map<string, unknown>();
    for (const d of docs.items) {
      if (data.has(d.path)) throw notArbiter('GET /api/v1/data', 'a path listed twice');
      const doc = await server.ok('GET', `/api/v1/data/${d.path}`);
      if (!Object.hasOwn(doc, 'value')) throw notArbiter(`GET /api/v1/data/${d.path}`, 'no value');
      data.set(d.path, doc.value);
    }
    const rego = new Map<string, string>();
    if (withRego) {
      for (const p of policies.items) {
        const one = await server.ok('GET', `/api/v1/policies/${p.name}`);
        if (typeof one.rego !== 'string') throw notArbiter(`GET /api/v1/policies/${p.name}`, 'no rego');
        rego.set(p.name, one.rego);
      }
    }
    const again = revisionOf(await server.ok('GET', '/api/v1/policies?limit=1'), 'GET /api/v1/policies');
    if (policies.revision === docs.revision && docs.revision === again) {
      return { revision: again, policies: byName, data, rego };
    }
  }
  throw new Refused('the live policy set kept changing while it was read; try again');
}
