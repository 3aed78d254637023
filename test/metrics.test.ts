import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call, HUMAN } from './helpers/harness.js';

const hasPromtool = spawnSync('promtool', ['--version']).status === 0;

// Gauges and counters read or follow storage (queue, revision, audit appends): every backend.
onEveryBackend('GET /metrics', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
    for (const body of [AGENT.allow, AGENT.approval, AGENT.deny]) {
      await call('POST', a.engine + '/v1/agent/authorize', { body });
    }
    await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
    await call('GET', a.engine + '/v1/queue/01a1fc7d-0f58-7caa-8e16-7f5c84336f4d');
    await call('POST', a.platform + '/api/v1/audit/ingest', { body: { kind: 'engine.custom' } });
  });
  after(async () => {
    await a.close();
  });

  it('passes promtool check metrics', function () {
    if (!hasPromtool) {
      // CI installs Debian's prometheus package (.ci/run); there the check must run.
      if (process.env.CI) throw new Error('promtool is not installed');
      this.skip();
    }
    return call('GET', a.engine + '/metrics').then((r) => {
      expect(r.status).to.equal(200);
      const check = spawnSync('promtool', ['check', 'metrics'], { input: r.text, encoding: 'utf8' });
      expect(check.status, check.stdout + check.stderr).to.equal(0);
      expect((check.stdout + check.stderr).trim()).to.equal('');
    });
  });

  it('labels requests by route template, never by raw path or id', async () => {
    const text = (await call('GET', a.engine + '/metrics')).text;
    expect(text).to.match(
      /arbiter_http_requests_total\{api="engine",route="\/v1\/queue\/\{id\}",method="GET",status="404"\} 1/,
    );
    expect(text).to.not.include('01a1fc7d-0f58');
    expect(text).to.match(/arbiter_decisions_total\{kind="agent",outcome="requires_approval"\} 1/);
    expect(text).to.match(/arbiter_decisions_total\{kind="human",outcome="allow"\} 1/);
    expect(text).to.match(/arbiter_policy_revision 1/);
    expect(text).to.match(/arbiter_queue_pending 1/);
    expect(text).to.match(/arbiter_policy_compiles_total\{result="success"\} \d+/);
    expect(text).to.match(/arbiter_audit_events_total\{kind="decision"\} 4/);
    expect(text).to.match(/arbiter_audit_events_total\{kind="ingested"\} 1/);
    expect(text).to.match(/arbiter_policy_evaluation_duration_seconds_count 4/);
    expect(text).to.match(/process_resident_memory_bytes/);
  });

  it('labels a method no route uses "other", so no client can add series by inventing methods', async () => {
    const odd = ['PROPFIND', 'MKCALENDAR', 'M-SEARCH', 'PURGE', 'PATCH'];
    // Sent without a key, as anyone could: refused (404/405), and counted.
    for (const method of odd) {
      const r = await fetch(a.engine + '/v1/agent/authorize', { method });
      expect(r.status, method).to.be.oneOf([404, 405]);
      await r.body?.cancel();
    }
    const head = await fetch(a.engine + '/healthz', { method: 'HEAD' });
    expect(head.status).to.equal(200);
    const text = (await call('GET', a.engine + '/metrics')).text;
    const methods = new Set(
      [...text.matchAll(/arbiter_http_requests_total\{[^}]*method="([^"]*)"/g)].map((m) => m[1]),
    );
    for (const method of odd) expect(methods, method).to.not.include(method);
    expect(text).to.match(
      /arbiter_http_requests_total\{api="engine",route="unmatched",method="other",status="40[45]"\} 5/,
    );
    // The methods the routes use keep their own label (HEAD is served wherever GET is).
    expect([...methods].sort()).to.deep.equal(['GET', 'HEAD', 'POST', 'other']);
  });

  it('counts compiles and compile failures with their latency, tokens minted and revoked, and request latency per route and status', async () => {
    const value = (text: string, series: string): number => {
      const line = text.split('\n').find((l) => l.startsWith(series + ' '));
      return line === undefined ? 0 : Number(line.slice(series.length + 1));
    };
    const SERIES = [
      'arbiter_policy_compiles_total{result="success"}',
      'arbiter_policy_compiles_total{result="failure"}',
      'arbiter_policy_compile_duration_seconds_count',
      'arbiter_tokens_minted_total',
      'arbiter_tokens_revoked_total',
      'arbiter_http_request_duration_seconds_count{api="platform",route="/api/v1/policies/{name}",method="PUT",status="400"}',
      'arbiter_http_request_duration_seconds_count{api="engine",route="/v1/tokens/{tokenID}",method="DELETE",status="200"}',
    ];
    const read = async () => {
      const text = (await call('GET', a.engine + '/metrics')).text;
      return SERIES.map((s) => value(text, s));
    };
    const before = await read();
    const put = (rego: string) =>
      call('PUT', a.platform + '/api/v1/policies/metrics-probe', {
        body: rego,
        headers: { 'content-type': 'text/plain' },
      });
    expect((await put('package authz.agent\n\nallow if input.agent_id == "metrics"\n')).status).to.equal(201);
    expect((await put('package authz.agent\n\nallow if {\n')).status).to.equal(400);
    const minted = await call('POST', a.engine + '/v1/tokens/mint', {
      body: { subject: 'metrics-probe', scopes: ['read:x'] },
    });
    expect(minted.status, minted.text).to.equal(201);
    const revoked = await call('DELETE', `${a.engine}/v1/tokens/${minted.json.token_id as string}`);
    expect(revoked.status, revoked.text).to.equal(200);
    const after = await read();
    expect(after.map((v, i) => v - (before[i] as number))).to.deep.equal([1, 1, 2, 1, 1, 1, 1]);
  });

  // Found by an operations probe (2026-11-29): with PostgreSQL unreachable, the gauges read from
  // storage failed the whole scrape (503), so every counter went dark during the outage, the
  // 503s it caused included. Here their reads fail because the tables they count are gone.
  it('still answers when a gauge read from storage fails: that gauge is NaN, every other metric is served', async () => {
    await a.alter('ALTER TABLE queue_items RENAME TO queue_items_gone');
    await a.alter('ALTER TABLE webhook_deliveries RENAME TO webhook_deliveries_gone');
    let during: Awaited<ReturnType<typeof call>>;
    try {
      during = await call('GET', a.platform + '/metrics');
    } finally {
      await a.alter('ALTER TABLE queue_items_gone RENAME TO queue_items');
      await a.alter('ALTER TABLE webhook_deliveries_gone RENAME TO webhook_deliveries');
    }
    expect(during.status, during.text).to.equal(200);
    expect(during.text).to.match(/^arbiter_queue_pending nan$/im);
    expect(during.text).to.match(/^arbiter_webhook_deliveries_pending nan$/im);
    expect(during.text).to.match(/arbiter_decisions_total\{kind="agent",outcome="requires_approval"\} 1/);
    expect(during.text).to.match(/arbiter_http_requests_total\{api="engine",/);
    if (hasPromtool) {
      const check = spawnSync('promtool', ['check', 'metrics'], { input: during.text, encoding: 'utf8' });
      expect(check.status, check.stdout + check.stderr).to.equal(0);
    }
    const after = (await call('GET', a.platform + '/metrics')).text;
    expect(after).to.match(/^arbiter_queue_pending 1$/m);
    expect(after).to.match(/^arbiter_webhook_deliveries_pending 0$/m);
  });
});
