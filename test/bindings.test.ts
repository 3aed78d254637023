import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call, HUMAN } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// These go through storage: every backend.
onEveryBackend('key bindings, token freshness, ingest provenance', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_TOKEN_EXCHANGE_WINDOW_SECONDS: '2' });
  });
  after(async () => {
    await a.close();
  });

  it('refuses human authorization to an agent-bound key', async () => {
    const key = a.createKey('bot-h', ['authorize'], { agent: 'deploy-bot' });
    const r = await call('POST', a.engine + '/v1/authorize', { key, body: HUMAN.allow });
    expectError(r, 403);
    expect(r.json.error).to.match(/bound to agent deploy-bot/);
  });

  it('refuses to exchange a decision granted longer ago than the exchange window', async () => {
    const key = a.createKey('bot-t', ['authorize', 'tokens:mint'], { agent: 'deploy-bot' });
    const d = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
    expect(d.status).to.equal(200);
    await new Promise((r) => setTimeout(r, 2500));
    const r = await call('POST', a.engine + '/v1/tokens/mint', {
      key,
      body: { request_id: d.json.request_id },
    });
    expectError(r, 403);
    expect(r.json.error).to.match(/authorize again/);
    const fresh = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
    const ok = await call('POST', a.engine + '/v1/tokens/mint', {
      key,
      body: { request_id: fresh.json.request_id },
    });
    expect(ok.status).to.equal(201);
  });

  it('shows an agent-bound key only its own agent in the queue, and no key bound to that agent may decide', async () => {
    const asker = a.createKey('bot-q1', ['authorize', 'queue:read'], { agent: 'deploy-bot' });
    const twin = a.createKey('bot-q2', ['queue:read', 'queue:review'], { agent: 'deploy-bot' });
    const other = a.createKey('bot-q3', ['queue:read'], { agent: 'data-bot' });
    const q = await call('POST', a.engine + '/v1/agent/authorize', { key: asker, body: AGENT.approval });
    expect(q.status).to.equal(202);
    expectError(await call('GET', a.engine + `/v1/queue/${q.json.request_id}`, { key: other }), 403);
    const list = await call('GET', a.engine + '/v1/queue/pending', { key: other });
    expect(list.json.items).to.deep.equal([]);
    const r = await call('POST', a.engine + `/v1/queue/${q.json.request_id}/approve`, { key: twin });
    expectError(r, 403);
  });

  it('keeps ingest from forging Arbiter events or another identity', async () => {
    const key = a.createKey('forwarder', ['audit:write'], { agent: 'agent-a' });
    for (const kind of ['decision', 'queue.approve', 'token.mint']) {
      const r = await call('POST', a.platform + '/api/v1/audit/ingest', { key, body: { kind } });
      expectError(r, 400);
      expect(r.json.error).to.include('reserved');
    }
    expectError(
      await call('POST', a.platform + '/api/v1/audit/ingest', {
        key,
        body: { kind: 'x', agent_id: 'deploy-bot' },
      }),
      403,
    );
    const ok = await call('POST', a.platform + '/api/v1/audit/ingest', {
      key,
      body: { kind: 'engine.decision', actor: 'security-lead' },
    });
    expect(ok.status).to.equal(202);
    const ev = (await call('GET', a.platform + `/api/v1/audit?kind=engine.decision`)).json.events[0];
    expect(ev.actor).to.equal('forwarder');
    expect(ev.agent_id).to.equal('agent-a');
    expect(ev.details.source_actor).to.equal('security-lead');
  });
});
