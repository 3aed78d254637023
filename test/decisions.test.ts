import { expect } from 'chai';
import { AGENT, Arbiter, call, HUMAN, readDb } from './helpers/harness.js';

describe('decisions over HTTP (real compiler, real SQLite)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const countRows = (table: string) =>
    readDb(a.dataDir, (db) => db.prepare(`SELECT count(*) n FROM ${table}`).get()) as { n: number };

  for (const path of ['/v1/agent/authorize', '/api/v1/authorize']) {
    describe(`POST ${path}`, () => {
      it('answers 200 allow with request_id and trace_id', async () => {
        const r = await call('POST', a.engine + path, { body: AGENT.allow });
        expect(r.status).to.equal(200);
        expect(r.json).to.have.keys('status', 'request_id', 'trace_id');
        expect(r.json.status).to.equal('allow');
        expect(r.headers.get('x-request-id')).to.equal(r.json.request_id);
      });

      it('answers 202 requires_approval with message and expires_at, and queues the request', async () => {
        const before = countRows('queue_items').n;
        const r = await call('POST', a.engine + path, { body: AGENT.approval });
        expect(r.status).to.equal(202);
        expect(r.json.status).to.equal('requires_approval');
        expect(r.json.message).to.be.a('string').and.not.equal('');
        expect(Date.parse(r.json.expires_at)).to.be.greaterThan(Date.now());
        expect(countRows('queue_items').n).to.equal(before + 1);
        const item = readDb(a.dataDir, (db) =>
          db.prepare('SELECT * FROM queue_items WHERE id = ?').get(r.json.request_id),
        ) as {
          status: string;
          trace_id: string;
        };
        expect(item.status).to.equal('pending');
        expect(item.trace_id).to.equal(r.json.trace_id);
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
    const ev = readDb(a.dataDir, (db) =>
      db.prepare('SELECT trace_id, outcome FROM audit_events WHERE request_id = ?').get(r.json.request_id),
    );
    expect(ev).to.deep.equal({ trace_id: trace, outcome: 'allow' });
  });

  it('ignores a malformed traceparent and makes a new trace id', async () => {
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: AGENT.allow,
      headers: { traceparent: '00-00000000000000000000000000000000-00f067aa0ba902b7-01' },
    });
    expect(r.json.trace_id)
      .to.match(/^[0-9a-f]{32}$/)
      .and.not.match(/^0+$/);
  });

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
    const before = countRows('audit_events').n;
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.deny });
    const ev = readDb(a.dataDir, (db) =>
      db.prepare('SELECT * FROM audit_events WHERE request_id = ?').get(r.json.request_id),
    ) as Record<string, unknown>;
    expect(countRows('audit_events').n).to.equal(before + 1);
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
