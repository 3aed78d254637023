import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call, HUMAN } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// Bindings, token freshness, ingest and long-polls go through storage: every backend.
/** Findings of the security review, each pinned. */
onEveryBackend('security review fixes', () => {
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
      expect(r.json.error).to.match(/whitespace or control characters|U\+0000/);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, resource: { type: 'project', id: 'p1 admin:all' } },
    });
    expectError(human, 400);
    expect(human.json.error).to.match(/^resource\.id must not contain whitespace/);
  });

  it('reserves the policy name authz, serves both agent paths on both APIs, keeps requested_by internal', async () => {
    const r = await call('PUT', a.platform + '/api/v1/policies/authz', {
      raw: 'package authz.agent\n\nallow if input.action == "x"\n',
      headers: { 'content-type': 'text/plain' },
    });
    expectError(r, 400);
    expect(r.json.error).to.include('reserved');
    expect((await call('POST', a.platform + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const item = await call('GET', a.engine + `/v1/queue/${q.json.request_id}`);
    expect(item.json).to.not.have.property('requested_by');
    const list = await call('GET', a.engine + '/v1/queue/pending');
    expect(list.json.items[0]).to.not.have.property('requested_by');
  });

  it('pages the policy and data lists and names a bad parameter', async () => {
    const first = await call('GET', a.platform + '/api/v1/policies?limit=1');
    expect(first.json.policies).to.have.length(1);
    expect(first.json.next_cursor).to.be.a('string');
    const second = await call(
      'GET',
      a.platform + `/api/v1/policies?limit=1&cursor=${first.json.next_cursor}`,
    );
    expect(second.json.policies[0].name).to.not.equal(first.json.policies[0].name);
    expect((await call('GET', a.platform + '/api/v1/policies')).json.next_cursor).to.equal(null);
    for (const q of ['limit=abc', 'limit=0', 'foo=1', 'cursor=!!']) {
      expectError(await call('GET', a.platform + `/api/v1/policies?${q}`), 400);
      expectError(await call('GET', a.platform + `/api/v1/data?${q}`), 400);
    }
    expect((await call('GET', a.platform + '/api/v1/data?limit=2')).json.documents).to.have.length(2);
  });

  it('answers requests the HTTP parser refuses with a JSON error and an X-Request-Id', async () => {
    const { connect } = await import('node:net');
    const url = new URL(a.engine);
    const raw = await new Promise<string>((resolve) => {
      const s = connect(Number(url.port), url.hostname, () => s.write('GARBAGE\r\n\r\n'));
      let out = '';
      s.on('data', (d) => (out += d.toString()));
      s.on('close', () => resolve(out));
    });
    expect(raw).to.match(/^HTTP\/1\.1 400 /);
    expect(raw).to.match(/X-Request-Id: [0-9a-f-]{36}/);
    expect(raw).to.match(/\{"error":"malformed HTTP request"\}$/);
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

onEveryBackend('security review fixes: bindings, token freshness, ingest provenance', () => {
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

onEveryBackend('bounded long-polls and traces', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_LONG_POLLS: '2' });
  });
  after(async () => {
    await a.close();
  });

  it('answers 429 with Retry-After once the long-poll limit is reached', async () => {
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const url = a.engine + `/v1/queue/${q.json.request_id}?wait=2`;
    const held = [call('GET', url), call('GET', url)];
    await new Promise((r) => setTimeout(r, 300));
    const third = await call('GET', url);
    expectError(third, 429);
    expect(third.headers.get('retry-after')).to.equal('1');
    expect((await Promise.all(held)).map((r) => r.status)).to.deep.equal([200, 200]);
    expect((await call('GET', url)).status).to.equal(200);
  });

  it('pages a trace that grew past the limit, oldest first, without gaps', async () => {
    const trace = 'abcdefabcdefabcdefabcdefabcdef01';
    const events = Array.from({ length: 7 }, (_, i) => ({
      kind: 'engine.step',
      trace_id: trace,
      message: `s${i}`,
    }));
    expect((await call('POST', a.platform + '/api/v1/audit/ingest', { body: { events } })).status).to.equal(
      202,
    );
    const seen: string[] = [];
    let cursor: string | null = null;
    let firstCursor: string | null = null;
    do {
      const r = await call(
        'GET',
        a.platform + `/api/v1/audit/trace/${trace}?limit=3${cursor ? `&cursor=${cursor}` : ''}`,
      );
      expect(r.status, r.text).to.equal(200);
      seen.push(...r.json.events.map((e: { message: string }) => e.message));
      cursor = r.json.next_cursor;
      firstCursor ??= cursor;
    } while (cursor);
    expect(seen).to.deep.equal(['s0', 's1', 's2', 's3', 's4', 's5', 's6']);
    const whole = await call('GET', a.platform + `/api/v1/audit/trace/${trace}`);
    expect(whole.json.events).to.have.length(7);
    expect(whole.json.next_cursor).to.equal(null);
    // A cursor belongs to its trace.
    const other = await call('GET', a.platform + `/api/v1/audit/trace/ffff?cursor=${firstCursor}`);
    expectError(other, 400);
  });
});
