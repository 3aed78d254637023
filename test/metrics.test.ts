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
});
