import { Validator } from '@seriousme/openapi-schema-validator';
import { expect } from 'chai';
import { agentRequestSchema, humanRequestSchema } from '../src/decisions/schemas.js';
import type { RouteDeps } from '../src/http/routes/index.js';
import { routeTable } from '../src/http/routes/index.js';
import { loadConfig } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { Arbiter, call } from './helpers/harness.js';

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
    }
    const described = Object.entries(doc.paths).flatMap(([p, ops]) =>
      Object.keys(ops as object).map((m) => `${m.toUpperCase()} ${p}`),
    );
    expect(described.sort()).to.deep.equal(routes.map((r) => `${r.method} ${r.template}`).sort());
  });

  it('uses the very schemas that validate requests', async () => {
    const doc = (await call('GET', a.engine + '/openapi.json')).json;
    const body = (p: string) => doc.paths[p].post.requestBody.content['application/json'].schema;
    expect(body('/v1/agent/authorize')).to.deep.equal(agentRequestSchema);
    expect(body('/api/v1/authorize')).to.deep.equal(agentRequestSchema);
    expect(body('/v1/authorize')).to.deep.equal(humanRequestSchema);
  });
});
