import { Ajv, type ValidateFunction } from 'ajv';
import { isRfc3339 } from '../../src/common/validation.js';

/**
 * Live validation of answers against the OpenAPI document: every answer `call()` gets from an
 * Arbiter instance is checked against the document that instance serves (fetched once per
 * listener), for the route template, method and status of the request. An undocumented status,
 * a JSON answer where the document has no schema, or a body that does not match fails the test
 * that made the call.
 */

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the document is read as plain JSON
type Doc = any;

interface Checker {
  doc: Doc;
  ajv: Ajv;
  templates: { template: string; exact: RegExp; strict: RegExp; greedy: RegExp; params: number }[];
  compiled: Map<string, ValidateFunction>;
}

const DOC_ID = 'urn:arbiter:openapi';
/** Listener origins of the Arbiter instances the tests started: which API, and the admin key. */
const origins = new Map<string, { api: 'engine' | 'platform'; key: string; owner: object }>();
const checkers = new Map<string, Promise<Checker>>();

/**
 * Registers a listener (e.g. http://127.0.0.1:PORT) whose answers are to be validated, and
 * fetches its document now, while it surely serves (a test may stop it before its first check).
 */
export async function watchOrigin(
  url: string,
  api: 'engine' | 'platform',
  adminKey: string,
  owner: object,
): Promise<void> {
  const origin = new URL(url).origin;
  origins.set(origin, { api, key: adminKey, owner });
  const loading = load(origin, adminKey);
  checkers.set(origin, loading);
  // A failure is reported by the first check of an answer of this listener.
  await loading.catch(() => undefined);
}

/**
 * Forgets a listener when its instance stops: the port is free again, and another process (one
 * serving a different API, say) may be given it; its answers must not be held to this document.
 * Only `owner`'s registration is forgotten: the port may already serve another instance.
 */
export function unwatchOrigin(url: string, owner: object): void {
  if (!url) return;
  const origin = new URL(url).origin;
  if (origins.get(origin)?.owner !== owner) return;
  origins.delete(origin);
  checkers.delete(origin);
}

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

function templateRegex(template: string, greedyLast: boolean, trailingSlash: boolean): RegExp {
  const parts = template.split(/(\{\w+\})/);
  const lastParam = parts
    .map((p, i) => (/^\{\w+\}$/.test(p) ? i : -1))
    .filter((i) => i >= 0)
    .pop();
  const src = parts
    .map((p, i) => (/^\{\w+\}$/.test(p) ? (greedyLast && i === lastParam ? '.+' : '[^/]+') : escapeRe(p)))
    .join('');
  // The router matches paths case-insensitively, and with or without a trailing slash.
  return new RegExp(`^${src}${trailingSlash ? '/?' : ''}$`, 'i');
}

async function load(origin: string, key: string): Promise<Checker> {
  const res = await fetch(`${origin}/openapi.json`, { headers: { authorization: `Bearer ${key}` } });
  if (res.status !== 200) {
    throw new Error(`live OpenAPI validation: GET ${origin}/openapi.json answered ${res.status}`);
  }
  const doc = (await res.json()) as Doc;
  const ajv = new Ajv({ strict: false, allErrors: true, allowUnionTypes: true });
  ajv.addFormat('date-time', { type: 'string', validate: isRfc3339 });
  ajv.addSchema({ ...doc, $id: DOC_ID });
  const templates = Object.keys(doc.paths as object).map((template) => ({
    template,
    exact: templateRegex(template, false, false),
    strict: templateRegex(template, false, true),
    greedy: templateRegex(template, true, true),
    params: (template.match(/\{/g) ?? []).length,
  }));
  return { doc, ajv, templates, compiled: new Map() };
}

const pointer = (...segs: string[]) =>
  segs.map((s) => '/' + encodeURIComponent(s.replace(/~/g, '~0').replace(/\//g, '~1'))).join('');

/**
 * The template a path is served by on this listener: a literal match over a parameter, a segment
 * over a wildcard; only operations this listener serves (x-arbiter-apis) count.
 */
function templateOf(c: Checker, path: string, method: string, api: string): string | undefined {
  for (const kind of ['exact', 'strict', 'greedy'] as const) {
    const hits = c.templates
      .filter((t) => t[kind].test(path))
      .filter((t) =>
        Object.values(c.doc.paths[t.template] as Record<string, Doc>).some((op) =>
          (op['x-arbiter-apis'] as string[]).includes(api),
        ),
      )
      .sort((a, b) => a.params - b.params);
    const withMethod = hits.find((t) =>
      (c.doc.paths[t.template][method]?.['x-arbiter-apis'] as string[] | undefined)?.includes(api),
    );
    if (withMethod) return withMethod.template;
    if (hits[0]) return hits[0].template;
  }
  return undefined;
}

/**
 * Checks one answer; throws an Error naming the request, the status and what does not match.
 * `json` is the parsed body (undefined when the body is empty or not JSON). `rawTarget`: the
 * request-target was sent as written in `url` (not normalized as fetch normalizes it).
 */
export async function checkAnswer(
  method: string,
  url: string,
  status: number,
  contentType: string | null,
  text: string,
  json: unknown,
  rawTarget = false,
): Promise<void> {
  const u = new URL(url);
  const listener = origins.get(u.origin);
  if (listener === undefined) return;
  const c = await checkers.get(u.origin)!;
  const path = rawTarget ? url.slice(u.origin.length).replace(/[?#].*$/s, '') : u.pathname;
  const m = method.toLowerCase() === 'head' ? 'get' : method.toLowerCase();
  const what = `${method} ${path} answered ${status}`;
  const isJson = /^application\/(.+\+)?json\b/.test(contentType ?? '');
  if (isJson && text !== '' && json === undefined) throw new Error(`${what} with malformed JSON: ${text}`);
  const template = templateOf(c, path, m, listener.api);
  const op = template === undefined ? undefined : c.doc.paths[template][m];
  const served = (op?.['x-arbiter-apis'] as string[] | undefined)?.includes(listener.api) === true;
  // The seed: every response body is JSON, except the metrics endpoint's (and what the document
  // declares otherwise for its answer: the console's pages). An empty body (204, 304, a redirect)
  // is no body.
  if (!isJson && text !== '') {
    const essence = (contentType ?? '').split(';')[0]!.trim().toLowerCase();
    const declared = served ? Object.keys(op.responses[String(status)]?.content ?? {}) : [];
    if (!declared.includes(essence)) {
      throw new Error(
        `${what} with a body of type ${essence || '(none)'}, which the OpenAPI document does not declare for it (every other answer is JSON): ${text.slice(0, 200)}`,
      );
    }
  }
  let schemaAt: string;
  if (!served) {
    // No route of this listener: only "no such route" (404), "other method" (405), or a refusal
    // before any route (a malformed request, an unmeetable Expect, …), as {"error"}.
    if (![400, 404, 405, 408, 417, 431].includes(status)) {
      throw new Error(
        `${what}, but the OpenAPI document has no operation ${m.toUpperCase()} for it on the ${listener.api} API`,
      );
    }
    schemaAt = pointer('components', 'schemas', 'Error');
  } else {
    const answer = op.responses[String(status)];
    if (answer === undefined) {
      throw new Error(
        `${what}: status ${status} is not documented for ${m.toUpperCase()} ${template} in the OpenAPI document (documented: ${Object.keys(op.responses).join(', ')}); body: ${text.slice(0, 300)}`,
      );
    }
    if (!isJson || method.toUpperCase() === 'HEAD') return;
    const media = answer.content?.['application/json'];
    if (media === undefined) {
      throw new Error(`${what} with a JSON body, but the document gives ${status} no JSON content`);
    }
    if (media.schema === undefined) {
      throw new Error(`${what}: the document has no schema for this answer (give the route ok.schema)`);
    }
    schemaAt = pointer(
      'paths',
      template!,
      m,
      'responses',
      String(status),
      'content',
      'application/json',
      'schema',
    );
  }
  if (!isJson) return;
  let validate = c.compiled.get(schemaAt);
  if (!validate) {
    validate = c.ajv.compile({ $ref: `${DOC_ID}#${schemaAt}` });
    c.compiled.set(schemaAt, validate);
  }
  if (!validate(json)) {
    throw new Error(
      `${what}, and the body does not match the OpenAPI document (${template ?? 'no route'}): ` +
        `${c.ajv.errorsText(validate.errors, { separator: '; ' })}; body: ${text.slice(0, 500)}`,
    );
  }
}
