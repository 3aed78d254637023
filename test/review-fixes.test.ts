import { expect } from 'chai';
import { AGENT, Arbiter, call, HUMAN } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

/** Findings of the security review, each pinned. */
describe('security review fixes', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('refuses whitespace in action, resource and ids, so no token scope can smuggle in another', async () => {
    const cases = [
      { ...AGENT.allow, resource: 'repo/x deploy:prod/api' },
      { ...AGENT.allow, action: 'read deploy' },
      { ...AGENT.allow, agent_id: 'deploy-bot\n' },
      { ...AGENT.allow, resource: 'repo/x\u0000' },
    ];
    for (const body of cases) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body });
      expectError(r, 400);
      expect(r.json.error).to.match(/whitespace or control characters/);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, resource: { type: 'project', id: 'p1 admin:all' } },
    });
    expectError(human, 400);
    expect(human.json.error).to.match(/^resource\.id must not contain whitespace/);
  });

  it('refuses data path segments that reach Object.prototype, and keeps serving', async () => {
    for (const seg of ['__proto__', 'constructor', 'prototype']) {
      const r = await call('PUT', a.platform + `/api/v1/data/x/${seg}/polluted`, {
        raw: '"yes"',
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400);
      expect(r.json.error).to.include(seg);
    }
    expect((await call('GET', a.engine + '/healthz', { key: null })).status).to.equal(200);
    expect((await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    expect(({} as Record<string, unknown>).polluted).to.equal(undefined);
  });
});
