import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call, HUMAN } from './helpers/harness.js';
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

/** A W3C traceparent naming `trace`, so that a test knows its decision's trace id beforehand. */
const traced = (trace: string) => ({ traceparent: `00-${trace}-00f067aa0ba902b7-01` });

// Tokens, the audit trail and recorded decisions are read from storage: every backend.
onEveryBackend('agent and tenant bindings on tokens, the audit trail and explanations', () => {
  let a: Arbiter;
  let deployAsker: string;
  let financeAsker: string;
  /** Bound to finance-bot, with every scope that reads or revokes tokens and audit data. */
  let financeReader: string;
  let deploy: { request_id: string; trace_id: string; token_id: string; token: string };
  let finance: { request_id: string; trace_id: string; token_id: string; token: string };
  const FINANCE_READ = { agent_id: 'finance-bot', action: 'read', resource: 'ledger/2024', confidence: 0.95 };

  /** An allowed agent decision exchanged for a token by the key that asked. */
  const allowAndMint = async (key: string, body: unknown) => {
    const d = await call('POST', a.engine + '/v1/agent/authorize', { key, body });
    expect(d.status, d.text).to.equal(200);
    const t = await call('POST', a.engine + '/v1/tokens/mint', {
      key,
      body: { request_id: d.json.request_id },
    });
    expect(t.status, t.text).to.equal(201);
    return {
      request_id: d.json.request_id as string,
      trace_id: d.json.trace_id as string,
      token_id: t.json.token_id as string,
      token: t.json.token as string,
    };
  };
  const introspect = (token: string, key?: string) =>
    call('POST', a.engine + '/v1/tokens/introspect', { key, body: { token } });

  before(async () => {
    a = await Arbiter.start();
    deployAsker = a.createKey('deploy-asker', ['authorize', 'tokens:mint'], { agent: 'deploy-bot' });
    financeAsker = a.createKey('finance-asker', ['authorize', 'tokens:mint'], { agent: 'finance-bot' });
    financeReader = a.createKey('finance-reader', ['tokens:read', 'tokens:revoke', 'audit:read'], {
      agent: 'finance-bot',
    });
    deploy = await allowAndMint(deployAsker, AGENT.allow);
    finance = await allowAndMint(financeAsker, FINANCE_READ);
  });
  after(async () => {
    await a.close();
  });

  it("introspects another agent's token as inactive to an agent-bound key, and its own as active", async () => {
    expect((await introspect(deploy.token, financeReader)).json).to.deep.equal({ active: false });
    // The token is live: an unbound key sees it so.
    expect((await introspect(deploy.token)).json).to.include({ active: true, sub: 'deploy-bot' });
    const own = await introspect(finance.token, financeReader);
    expect(own.status, own.text).to.equal(200);
    expect(own.json).to.include({ active: true, sub: 'finance-bot', request_id: finance.request_id });
    // A human decision's token belongs to no agent: not an agent-bound key's either.
    const human = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
    const minted = await call('POST', a.engine + '/v1/tokens/mint', {
      body: { request_id: human.json.request_id },
    });
    expect(minted.status, minted.text).to.equal(201);
    expect((await introspect(minted.json.token as string, financeReader)).json).to.deep.equal({
      active: false,
    });
  });

  it("answers 403 to an agent-bound key revoking another agent's token, and revokes nothing", async () => {
    const victim = await allowAndMint(deployAsker, AGENT.allow);
    const revokes = await a.count('audit_events', "kind = 'token.revoke'");
    const r = await call('DELETE', a.engine + `/v1/tokens/${victim.token_id}`, { key: financeReader });
    expectError(r, 403, /API key is bound to agent finance-bot/);
    expect((await introspect(victim.token)).json.active).to.equal(true);
    expect(await a.count('tokens', 'id = $1 AND revoked_at IS NOT NULL', [victim.token_id])).to.equal(0);
    expect(await a.count('audit_events', "kind = 'token.revoke'")).to.equal(revokes);
    // Its own agent's token it may revoke.
    const mine = await allowAndMint(financeAsker, FINANCE_READ);
    const ok = await call('DELETE', a.engine + `/v1/tokens/${mine.token_id}`, { key: financeReader });
    expect(ok.status, ok.text).to.equal(200);
    expect((await introspect(mine.token)).json).to.deep.equal({ active: false });
    // The revocation is recorded as the agent's, so the agent's reviewers find it.
    const [ev] = await auditEvents(a.platform, { kind: 'token.revoke', agent_id: 'finance-bot' });
    expect(ev).to.include({ resource: mine.token_id, agent_id: 'finance-bot' });
  });

  it("lists only its own agent's audit events to an agent-bound key, and 403 for another agent's", async () => {
    const asked = await call('GET', a.platform + '/api/v1/audit?agent_id=deploy-bot', { key: financeReader });
    expectError(asked, 403, /API key is bound to agent finance-bot/);
    const all = await call('GET', a.platform + '/api/v1/audit?limit=1000', { key: financeReader });
    expect(all.status, all.text).to.equal(200);
    const events = all.json.events as { agent_id: string | null; kind: string; request_id: string | null }[];
    expect(events.length).to.be.greaterThan(0);
    for (const e of events) expect(e.agent_id).to.equal('finance-bot');
    // Its decision and the token minted for it, which now carries the decision's agent.
    const ofFinance = events.filter((e) => e.request_id === finance.request_id).map((e) => e.kind);
    expect(ofFinance).to.include.members(['decision', 'token.mint']);
    const ofDeploy = await call('GET', a.platform + `/api/v1/audit?request_id=${deploy.request_id}`, {
      key: financeReader,
    });
    expect(ofDeploy.json.events).to.deep.equal([]);
  });

  it("answers an agent-bound key's request for another agent's trace or explanation as for an unknown one", async () => {
    const unknownTrace = 'ffffffffffffffffffffffffffffffff';
    for (const limit of [1, 100]) {
      const other = await call('GET', a.platform + `/api/v1/audit/trace/${deploy.trace_id}?limit=${limit}`, {
        key: financeReader,
      });
      const unknown = await call('GET', a.platform + `/api/v1/audit/trace/${unknownTrace}?limit=${limit}`, {
        key: financeReader,
      });
      expectError(unknown, 404);
      expectError(other, 404);
      expect(other.json.error).to.equal(
        (unknown.json.error as string).replace(unknownTrace, deploy.trace_id),
      );
    }
    const own = await call('GET', a.platform + `/api/v1/audit/trace/${finance.trace_id}?limit=1`, {
      key: financeReader,
    });
    expect(own.status, own.text).to.equal(200);
    expect(own.json.events).to.have.length(1);
    expect(own.json.next_cursor).to.be.a('string');

    const explain = (id: string) =>
      call('GET', a.platform + `/api/v1/decisions/${id}/explain`, { key: financeReader });
    expectError(await explain(deploy.request_id), 404, `decision ${deploy.request_id} not found`);
    const unknownId = '0193a0b0-0000-7000-8000-000000000000';
    expectError(await explain(unknownId), 404, `decision ${unknownId} not found`);
    const mine = await explain(finance.request_id);
    expect(mine.status, mine.text).to.equal(200);
    expect(mine.json.replayed).to.deep.equal({ status: 'allow' });
  });

  it("shows an agent-bound key its queue item's events of its own agent, not what another agent's key ingested about it", async () => {
    const asker = a.createKey('item-asker', ['authorize', 'queue:read'], { agent: 'deploy-bot' });
    const otherForwarder = a.createKey('item-forwarder', ['audit:write'], { agent: 'finance-bot' });
    const pending = await call('POST', a.engine + '/v1/agent/authorize', {
      key: asker,
      body: AGENT.approval,
    });
    expect(pending.status, pending.text).to.equal(202);
    const id = pending.json.request_id as string;
    const ingested = await call('POST', a.platform + '/api/v1/audit/ingest', {
      key: otherForwarder,
      body: { kind: 'edge.note', request_id: id, message: 'finance-bot says so' },
    });
    expect(ingested.status, ingested.text).to.equal(202);
    const kinds = async (key?: string) => {
      const r = await call('GET', a.engine + `/v1/queue/${id}/events`, { key });
      expect(r.status, r.text).to.equal(200);
      return (r.json.events as { kind: string }[]).map((e) => e.kind);
    };
    // The unbound admin sees the whole story of the item; the agent's key sees its own agent's part.
    expect(await kinds()).to.deep.equal(['decision', 'edge.note']);
    expect(await kinds(asker)).to.deep.equal(['decision']);
  });

  it("answers a tenant-bound key's request for another tenant's trace as for an unknown one, at any limit", async () => {
    const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
    const unknownTrace = 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee';
    const acmeAsker = a.createKey('acme-asker', ['authorize', 'queue:read'], { tenant: 'acme' });
    const acmeReader = a.createKey('acme-trace-reader', ['audit:read'], { tenant: 'acme' });
    const globexReader = a.createKey('globex-trace-reader', ['audit:read'], { tenant: 'globex' });
    // Two events of acme in one trace: a decision and its queue item's approval.
    const q = await call('POST', a.engine + '/v1/authorize', {
      key: acmeAsker,
      body: HUMAN.approval,
      headers: traced(trace),
    });
    expect(q.status, q.text).to.equal(202);
    expect(q.json.trace_id).to.equal(trace);
    const approved = await call('POST', a.engine + `/v1/queue/${q.json.request_id}/approve`, {});
    expect(approved.status, approved.text).to.equal(200);

    for (const limit of [1, 2, 100]) {
      const other = await call('GET', a.platform + `/api/v1/audit/trace/${trace}?limit=${limit}`, {
        key: globexReader,
      });
      const unknown = await call('GET', a.platform + `/api/v1/audit/trace/${unknownTrace}?limit=${limit}`, {
        key: globexReader,
      });
      expectError(unknown, 404);
      expectError(other, 404);
      expect(other.json.error).to.equal((unknown.json.error as string).replace(unknownTrace, trace));
    }
    // Its own tenant's trace pages as before.
    const first = await call('GET', a.platform + `/api/v1/audit/trace/${trace}?limit=1`, { key: acmeReader });
    expect(first.status, first.text).to.equal(200);
    expect(first.json.events).to.have.length(1);
    const rest = await call(
      'GET',
      a.platform + `/api/v1/audit/trace/${trace}?limit=100&cursor=${first.json.next_cursor as string}`,
      { key: acmeReader },
    );
    expect(rest.status, rest.text).to.equal(200);
    const kinds = [...first.json.events, ...rest.json.events].map((e: { kind: string }) => e.kind);
    expect(kinds).to.deep.equal(['decision', 'queue.approve']);
  });
});

// Keys are stored and webhooks, signing keys and the chain live in storage: every backend.
onEveryBackend('bound keys and the routes that span every tenant', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  /** An `admin` key bound as an earlier version let `arbiter keys create` bind one. */
  const boundAdmin = async (name: string, binding: 'tenant' | 'agent', value: string) => {
    const key = a.createKey(name, ['admin']);
    await a.alter(`UPDATE api_keys SET ${binding} = $1 WHERE name = $2`, [value, name]);
    return key;
  };

  it('refuses to create a key with the admin scope bound to a tenant or an agent', () => {
    for (const [scopes, binding] of [
      ['admin', ['--tenant', 'acme']],
      ['tokens:read,admin', ['--agent', 'deploy-bot']],
      ['admin', ['--tenant', 'acme', '--agent', 'deploy-bot']],
    ] as const) {
      const r = a.cli(['keys', 'create', '--name', 'bound-admin', '--scopes', scopes, ...binding]);
      expect(r.code, r.stderr).to.equal(1);
      expect(r.stderr).to.include('arbiter: the admin scope cannot be bound to a tenant or an agent');
      expect(r.stdout).to.equal('');
    }
    const listed = a.cli(['keys', 'list']);
    expect(listed.code).to.equal(0);
    expect(listed.stdout).to.not.include('bound-admin');
    // Unbound, or bound without admin, is as before.
    expect(a.cli(['keys', 'create', '--name', 'bound-admin', '--scopes', 'admin']).code).to.equal(0);
    const bound = a.cli([
      'keys',
      'create',
      '--name',
      'bound-reader',
      '--scopes',
      'audit:read',
      '--tenant',
      'acme',
    ]);
    expect(bound.code, bound.stderr).to.equal(0);
  });

  it('answers 403 to a bound admin key on every webhook route, and changes nothing', async () => {
    const hook = { url: 'https://hooks.example.com/arbiter', events: ['queue.pending'] };
    const existing = await call('PUT', a.platform + '/api/v1/webhooks/ops', { body: hook });
    expect(existing.status, existing.text).to.equal(201);
    for (const [name, binding, value] of [
      ['tenant-admin', 'tenant', 'acme'],
      ['agent-admin', 'agent', 'deploy-bot'],
    ] as const) {
      const key = await boundAdmin(name, binding, value);
      const refused = new RegExp(`API key is bound to ${binding} ${value} and cannot manage webhooks`);
      expectError(await call('GET', a.platform + '/api/v1/webhooks', { key }), 403, refused);
      expectError(await call('GET', a.platform + '/api/v1/webhooks/ops', { key }), 403, refused);
      expectError(await call('PUT', a.platform + '/api/v1/webhooks/mine', { key, body: hook }), 403, refused);
      expectError(await call('DELETE', a.platform + '/api/v1/webhooks/ops', { key }), 403, refused);
      expectError(await call('GET', a.platform + '/api/v1/webhooks/ops/deliveries', { key }), 403, refused);
    }
    const names = (await call('GET', a.platform + '/api/v1/webhooks')).json.webhooks.map(
      (w: { name: string }) => w.name,
    );
    expect(names).to.deep.equal(['ops']);
    expect(await a.count('audit_events', "kind = 'webhook.put'")).to.equal(1);
    expect(await a.count('audit_events', "kind = 'webhook.delete'")).to.equal(0);
  });

  it('answers 403 to a bound admin key listing or rotating the signing keys, and rotates nothing', async () => {
    // A live token of no tenant and another agent, which revoke_previous would revoke.
    const allowed = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    const minted = await call('POST', a.engine + '/v1/tokens/mint', {
      body: { request_id: allowed.json.request_id },
    });
    expect(minted.status, minted.text).to.equal(201);
    const before = (await call('GET', a.platform + '/api/v1/signing-keys')).json.keys;
    for (const [name, binding, value] of [
      ['tenant-admin-2', 'tenant', 'acme'],
      ['agent-admin-2', 'agent', 'finance-bot'],
    ] as const) {
      const key = await boundAdmin(name, binding, value);
      const refused = new RegExp(
        `API key is bound to ${binding} ${value} and cannot manage the signing keys`,
      );
      expectError(await call('GET', a.platform + '/api/v1/signing-keys', { key }), 403, refused);
      expectError(
        await call('POST', a.platform + '/api/v1/signing-keys/rotate', {
          key,
          body: { revoke_previous: true },
        }),
        403,
        refused,
      );
    }
    expect((await call('GET', a.platform + '/api/v1/signing-keys')).json.keys).to.deep.equal(before);
    const live = await call('POST', a.engine + '/v1/tokens/introspect', {
      body: { token: minted.json.token },
    });
    expect(live.json.active).to.equal(true);
  });

  it('answers 403 to an agent-bound key verifying the audit chain or reading budget counters', async () => {
    const key = a.createKey('agent-auditor', ['audit:read'], { agent: 'deploy-bot' });
    expectError(
      await call('GET', a.platform + '/api/v1/audit/verify', { key }),
      403,
      /API key is bound to agent deploy-bot and cannot verify the audit chain/,
    );
    expectError(
      await call('GET', a.platform + '/api/v1/limits?key=x', { key }),
      403,
      /API key is bound to agent deploy-bot and cannot read budget counters/,
    );
    const unbound = a.createKey('unbound-auditor', ['audit:read']);
    expect((await call('GET', a.platform + '/api/v1/audit/verify', { key: unbound })).json.ok).to.equal(true);
  });

  it("answers 403 to a bound key reading /metrics, which counts every tenant's decisions and events", async () => {
    const tenantKey = a.createKey('tenant-scraper', ['metrics:read'], { tenant: 'acme' });
    const agentKey = a.createKey('agent-scraper', ['metrics:read'], { agent: 'deploy-bot' });
    for (const api of [a.engine, a.platform]) {
      const r = await call('GET', api + '/metrics', { key: tenantKey });
      expectError(r, 403, /API key is bound to tenant acme and cannot read the metrics/);
      expect(r.text).to.not.include('arbiter_decisions_total');
      expectError(
        await call('GET', api + '/metrics', { key: agentKey }),
        403,
        /API key is bound to agent deploy-bot and cannot read the metrics/,
      );
    }
    const unbound = a.createKey('unbound-scraper', ['metrics:read']);
    expect((await call('GET', a.engine + '/metrics', { key: unbound })).status).to.equal(200);
  });
});
