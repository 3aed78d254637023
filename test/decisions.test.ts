import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditCount, auditEvents, call, HUMAN } from './helpers/harness.js';

// Every decision is stored (decision, queue item, audit event): run on every backend.
onEveryBackend('decisions over HTTP (real compiler, real storage)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  for (const path of ['/v1/agent/authorize', '/api/v1/authorize']) {
    describe(`POST ${path}`, () => {
      it('answers 200 allow with request_id and trace_id', async () => {
        const r = await call('POST', a.engine + path, { body: AGENT.allow });
        expect(r.status).to.equal(200);
        // SPEC §13: every decision carries the digest of the call it decided.
        expect(r.json).to.have.keys('status', 'request_id', 'trace_id', 'request_digest');
        expect(r.json.request_digest).to.match(/^[A-Za-z0-9_-]{43}$/);
        expect(r.json.status).to.equal('allow');
        expect(r.headers.get('x-request-id')).to.equal(r.json.request_id);
      });

      it('answers 202 requires_approval with message and expires_at, and queues the request', async () => {
        const before = await a.count('queue_items');
        const r = await call('POST', a.engine + path, { body: AGENT.approval });
        expect(r.status).to.equal(202);
        expect(r.json.status).to.equal('requires_approval');
        expect(r.json.message).to.be.a('string').and.not.equal('');
        expect(Date.parse(r.json.expires_at)).to.be.greaterThan(Date.now());
        expect(await a.count('queue_items')).to.equal(before + 1);
        const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
        expect(item.status, item.text).to.equal(200);
        expect(item.json).to.include({ id: r.json.request_id, status: 'pending', trace_id: r.json.trace_id });
      });

      it('answers 403 deny with the decision payload, not an error payload', async () => {
        const r = await call('POST', a.engine + path, { body: AGENT.deny });
        expect(r.status).to.equal(403);
        expect(r.json.status).to.equal('deny');
        expect(r.json.message).to.match(/destructive/);
        expect(r.json).to.not.have.property('error');
      });
    });
  }

  it("decides the seed's agent request as written, context with reason and user_id, and passes the context on", async () => {
    const body = {
      agent_id: 'deploy-bot',
      action: 'deploy',
      resource: 'prod/api',
      confidence: 0.95,
      context: { reason: 'release 1.4 hotfix', user_id: 'alice' },
    };
    const r = await call('POST', a.engine + '/api/v1/authorize', { body });
    expect(r.status, r.text).to.equal(202);
    expect(r.json).to.include({ status: 'requires_approval' });
    expect(r.json.message).to.be.a('string').and.not.equal('');
    const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
    expect(item.json.context).to.deep.equal(body.context);
  });

  it('serves /api/v1/authorize on the platform listener too', async () => {
    const r = await call('POST', a.platform + '/api/v1/authorize', { body: AGENT.allow });
    expect(r.status).to.equal(200);
  });

  it('denies below the deny threshold and by default when no policy allows', async () => {
    const low = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.lowConfidence });
    expect(low.status).to.equal(403);
    expect(low.json.message).to.match(/below the deny threshold/);
    const unknown = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.unknownAgent });
    expect(unknown.status).to.equal(403);
    expect(unknown.json.message).to.match(/no policy allows/);
  });

  it('denies, in the example policy, a resource with an empty segment that hid a blocked one', async () => {
    // Each was an allow: a resource server that collapses slashes acts on a blocked resource.
    for (const resource of ['repo//legacy-billing', 'repo/legacy-billing/', 'prod//secrets/x', 'repo//x']) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body: { ...AGENT.allow, resource } });
      expect(r.status, r.text).to.equal(403);
      expect(r.json.message).to.equal(`resource ${resource} has an empty path segment`);
    }
  });

  it('applies per-action thresholds from the policy', async () => {
    // payments.transfer has deny_below 0.7 in policies/agent.rego; the default is 0.5.
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: { agent_id: 'deploy-bot', action: 'deploy', resource: 'staging/api', confidence: 0.55 },
    });
    expect(r.status).to.equal(403);
    expect(r.json.message).to.match(/deny threshold 0\.6/);
  });

  it('takes the trace id from a W3C traceparent header', async () => {
    const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: AGENT.allow,
      headers: { traceparent: `00-${trace}-00f067aa0ba902b7-01` },
    });
    expect(r.json.trace_id).to.equal(trace);
    const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
    expect({ trace_id: ev.trace_id, outcome: ev.outcome }).to.deep.equal({
      trace_id: trace,
      outcome: 'allow',
    });
  });

  // W3C Trace Context §3.2: uppercase hex, version ff and an all-zero trace-id or parent-id are
  // all invalid; an invalid header is ignored and a new trace id made.
  for (const [what, traceparent] of [
    ['an all-zero trace-id', '00-00000000000000000000000000000000-00f067aa0ba902b7-01'],
    ['an all-zero parent-id', '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01'],
    ['uppercase hex', '00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01'],
    ['uppercase hex in the parent-id only', '00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01'],
    ['version ff', 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'],
  ]) {
    it(`ignores a traceparent with ${what} and makes a new trace id`, async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: AGENT.allow,
        headers: { traceparent: traceparent as string },
      });
      expect(r.status).to.equal(200);
      expect(r.json.trace_id)
        .to.match(/^[0-9a-f]{32}$/)
        .and.not.match(/^0+$/)
        .and.not.equal('4bf92f3577b34da6a3ce929d0e0e4736');
      const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
      expect(ev.trace_id).to.equal(r.json.trace_id);
    });
  }

  describe('POST /v1/authorize (humans)', () => {
    it('answers 200, 202 and 403 as the RBAC policy says', async () => {
      const ok = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
      expect(ok.status).to.equal(200);
      expect(ok.json.status).to.equal('allow');
      const approval = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.approval });
      expect(approval.status).to.equal(202);
      expect(approval.json.status).to.equal('requires_approval');
      const deny = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.deny });
      expect(deny.status).to.equal(403);
      expect(deny.json.status).to.equal('deny');
    });
  });

  it('records every decision in the audit trail before answering', async () => {
    const before = await auditCount(a.platform);
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.deny });
    const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
    expect(await auditCount(a.platform)).to.equal(before + 1);
    expect(ev).to.include({
      kind: 'decision',
      outcome: 'deny',
      agent_id: 'deploy-bot',
      action: 'delete',
      actor: 'admin',
    });
    expect(ev.policy_revision).to.be.a('number');
    expect(ev.latency_us).to.be.a('number');
    expect(ev.hash).to.match(/^[0-9a-f]{64}$/);
  });
});
