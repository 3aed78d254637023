/* eslint-disable @typescript-eslint/no-explicit-any -- the document is read as plain JSON */
import { Validator } from '@seriousme/openapi-schema-validator';
import { expect } from 'chai';
import { agentRequestSchema, humanRequestSchema } from '../src/decisions/schemas.js';
import type { RouteDeps } from '../src/http/routes/index.js';
import { routeTable } from '../src/http/routes/index.js';
import { loadConfig } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { Arbiter, call } from './helpers/harness.js';
import { checkAnswer } from './helpers/openapi-check.js';

/** Every value of every `pattern` keyword in a JSON document, with where it sits. */
function patternsOf(node: unknown, at = '#', out: { at: string; pattern: string }[] = []) {
  if (Array.isArray(node)) node.forEach((v, i) => patternsOf(v, `${at}/${i}`, out));
  else if (node !== null && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === 'pattern' && typeof v === 'string') out.push({ at, pattern: v });
      else patternsOf(v, `${at}/${k}`, out);
    }
  }
  return out;
}

/**
 * What RE2 (Go's regexp, hence kin-openapi and most gateways) does not take: lookahead and
 * lookbehind, backreferences (numbered and named), \u escapes (RE2 writes \x{…}) and repetition
 * counts over 1000.
 */
function re2Problem(pattern: string): string | undefined {
  // Walk the pattern so that an escaped backslash or parenthesis is not mistaken for syntax.
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '\\') {
      const n = pattern[i + 1] ?? '';
      if (/[1-9]/.test(n)) return 'a backreference';
      if (n === 'k') return 'a named backreference';
      if (n === 'u') return 'a \\u escape (RE2 needs \\x{…})';
      i++;
    } else if (c === '{') {
      const counts = /^\{(\d+)(?:,(\d*))?\}/.exec(pattern.slice(i));
      if (counts && counts.slice(1).some((n) => n !== undefined && n !== '' && Number(n) > 1000)) {
        return 'a repetition count over 1000';
      }
    } else if (c === '(' && pattern[i + 1] === '?') {
      const rest = pattern.slice(i + 2, i + 4);
      if (/^[=!]/.test(rest) || /^<[=!]/.test(rest)) return 'a lookaround';
    }
  }
  return undefined;
}

// The OpenAPI document is built from the route table, whatever the storage: once (on the SQLite run).
onceOnly('GET /openapi.json', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('needs a valid key (any scope), as every route but /healthz and the JWKS', async () => {
    const r = await call('GET', a.engine + '/openapi.json', { key: null });
    expect(r.status).to.equal(401);
    const key = a.createKey('reader', ['authorize']);
    expect((await call('GET', a.engine + '/openapi.json', { key })).status).to.equal(200);
  });

  it('is a valid OpenAPI 3.1 document (third-party validator), served on both listeners', async () => {
    for (const base of [a.engine, a.platform]) {
      const r = await call('GET', base + '/openapi.json');
      expect(r.status).to.equal(200);
      expect(r.json.openapi).to.equal('3.1.0');
      const result = await new Validator().validate(r.json);
      expect(result.errors ?? [], JSON.stringify(result.errors)).to.deep.equal([]);
      expect(result.valid).to.equal(true);
    }
  });

  it('describes every route of the route table, with its scope and listeners', async () => {
    const doc = (await call('GET', a.platform + '/openapi.json')).json;
    // The handlers are never called here: only the table's shape is compared.
    const routes = routeTable({ config: loadConfig({}), version: '0' } as unknown as RouteDeps);
    expect(routes.length).to.be.greaterThan(20);
    for (const r of routes) {
      const op = doc.paths[r.template]?.[r.method.toLowerCase()];
      expect(op, `${r.method} ${r.template}`).to.be.an('object');
      expect(op['x-arbiter-scope']).to.equal(r.scope);
      expect(op['x-arbiter-apis']).to.deep.equal([...r.apis]);
      expect(op['x-arbiter-unbound-keys-only'], `${r.method} ${r.template}`).to.equal(
        r.global === undefined ? undefined : true,
      );
    }
    // What spans every tenant refuses bound keys: every admin route, the chain, the budget counters,
    // the metrics.
    expect(
      routes
        .filter((r) => r.global !== undefined)
        .map((r) => `${r.method} ${r.template}`)
        .sort(),
    ).to.deep.equal([
      'DELETE /api/v1/webhooks/{name}',
      'GET /api/v1/audit/verify',
      'GET /api/v1/limits',
      'GET /api/v1/signing-keys',
      'GET /api/v1/webhooks',
      'GET /api/v1/webhooks/{name}',
      'GET /api/v1/webhooks/{name}/deliveries',
      'GET /metrics',
      'POST /api/v1/signing-keys/rotate',
      'PUT /api/v1/webhooks/{name}',
    ]);
    for (const r of routes) if (r.scope === 'admin') expect(r.global, r.template).to.be.a('string');
    const described = Object.entries(doc.paths).flatMap(([p, ops]) =>
      Object.keys(ops as object).map((m) => `${m.toUpperCase()} ${p}`),
    );
    expect(described.sort()).to.deep.equal(routes.map((r) => `${r.method} ${r.template}`).sort());
  });

  it('gives every JSON answer of every operation a schema, and every route its success schema', async () => {
    const doc = (await call('GET', a.engine + '/openapi.json')).json;
    const missing: string[] = [];
    for (const [p, ops] of Object.entries(doc.paths as Record<string, Record<string, any>>)) {
      for (const [m, op] of Object.entries(ops)) {
        for (const [status, answer] of Object.entries(op.responses as Record<string, any>)) {
          const json = answer.content?.['application/json'];
          if (json && !json.schema) missing.push(`${m.toUpperCase()} ${p} ${status}`);
        }
        const success = Object.keys(op.responses).filter((st) => /^[23]/.test(st));
        expect(success.length, `${m} ${p}`).to.be.greaterThan(0);
      }
    }
    expect(missing).to.deep.equal([]);
    // The statuses beyond the derived ones that routes answer with are documented.
    const statuses = (p: string, m: string) => Object.keys(doc.paths[p][m].responses);
    expect(statuses('/v1/tokens/mint', 'post')).to.include.members(['201', '404', '409']);
    expect(statuses('/v1/queue/{id}', 'get')).to.include('429');
    expect(statuses('/v1/queue/{id}/approve', 'post')).to.include('409');
    expect(statuses('/api/v1/policies/{name}', 'put')).to.include.members(['200', '201', '412']);
    expect(statuses('/api/v1/data/{path}', 'put')).to.include.members(['200', '201', '409']);
    expect(statuses('/v1/agent/authorize', 'post')).to.include.members(['200', '202', '403', '422', '503']);
    expect(statuses('/healthz', 'get')).to.include.members(['200', '503']);
  });

  it('holds its regex patterns to what RE2-based tools compile', async () => {
    const doc = (await call('GET', a.engine + '/openapi.json')).json;
    const patterns = patternsOf(doc);
    expect(patterns.length).to.be.greaterThan(3);
    for (const { at, pattern } of patterns) {
      expect(re2Problem(pattern), `${at}: ${pattern}`).to.equal(undefined);
      expect(() => new RegExp(pattern, 'u'), `${at}: ${pattern}`).to.not.throw();
    }
    // The check itself refuses what RE2 refuses.
    for (const bad of [
      '^(?=a)b$',
      '^(?!a)b$',
      '(?<=a)b',
      '(?<!a)b',
      '(a)\\1',
      '(?<n>a)\\k<n>',
      '^\\u00e9$',
      '^a{2000}$',
    ]) {
      expect(re2Problem(bad), bad).to.be.a('string');
    }
    for (const good of ['^[^\\s\\x00-\\x1f\\x7f]+$', '^\\S+$', '\\(?=', '(?:a)', '(?P<n>a)', '^a{1,1000}$']) {
      expect(re2Problem(good), good).to.equal(undefined);
    }
  });

  it('holds answers to it: an undocumented status or a body off its schema fails the call', async () => {
    const url = a.engine + '/v1/whoami';
    const whoami = { name: 'admin', scopes: ['admin'], tenant: null, agent: null };
    const json = 'application/json; charset=utf-8';
    await checkAnswer('GET', url, 200, json, JSON.stringify(whoami), whoami);
    const fails = async (status: number, body: unknown, message: RegExp, u = url, method = 'GET') => {
      let error: Error | undefined;
      try {
        await checkAnswer(method, u, status, json, JSON.stringify(body), body);
      } catch (e) {
        error = e as Error;
      }
      expect(error?.message, `${method} ${u} ${status}`).to.match(message);
    };
    await fails(418, { error: 'x' }, /status 418 is not documented for GET \/v1\/whoami/);
    await fails(200, { ...whoami, extra: 1 }, /does not match the OpenAPI document/);
    await fails(200, { ...whoami, tenant: 7 }, /does not match/);
    await fails(401, { error: 'x', detail: 'y' }, /does not match/);
    await fails(201, { items: [] }, /no operation POST/, a.engine + '/v1/queue/pending', 'POST');
    await fails(200, { items: [] }, /no operation GET/, a.engine + '/v1/no-such-route');
    // The same answers through call(): a real 404 on no route is an {"error"} the document allows.
    expect((await call('GET', a.engine + '/v1/no-such-route')).status).to.equal(404);
  });

  it('uses the very schemas that validate requests', async () => {
    const doc = (await call('GET', a.engine + '/openapi.json')).json;
    const body = (p: string) => doc.paths[p].post.requestBody.content['application/json'].schema;
    expect(body('/v1/agent/authorize')).to.deep.equal(agentRequestSchema);
    expect(body('/api/v1/authorize')).to.deep.equal(agentRequestSchema);
    expect(body('/v1/authorize')).to.deep.equal(humanRequestSchema);
  });
});
