import { expect } from 'chai';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { AppError } from '../src/errors.js';
import { statusOfKind } from '../src/http/errors.js';
import { Explainer } from '../src/policy/explain.js';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditCount, call, HUMAN, REPO } from './helpers/harness.js';
import { slowOn } from './helpers/policies.js';

/** A policy that denies every read; its deny rule is on row 3. */
const DENY_READ = 'package authz.agent\n\ndeny contains "reads are switched off" if input.action == "read"\n';

interface Fired {
  policy: string;
  row: number;
  rule: string;
  text: string;
}

// Explanations read recorded decisions and policy history from each backend.
onEveryBackend('GET /api/v1/decisions/{request_id}/explain: OPA explains a recorded decision', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const authorize = async (body: unknown, status: number) => {
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body });
    expect(r.status, r.text).to.equal(status);
    return r.json.request_id as string;
  };
  const explain = (id: string, key?: string) =>
    call('GET', `${a.platform}/api/v1/decisions/${id}/explain`, { key });
  const revision = async () => (await call('GET', `${a.platform}/api/v1/policies`)).json.revision as number;

  it('names the deny rule of the policy that denied, with its row and text', async () => {
    const id = await authorize(AGENT.deny, 403);
    const r = await explain(id);
    expect(r.status, r.text).to.equal(200);
    expect(r.json).to.have.keys('request_id', 'revision', 'recorded', 'replayed', 'fired');
    expect(r.json.request_id).to.equal(id);
    expect(r.json.revision).to.equal(await revision());
    expect(r.json.recorded).to.deep.equal({ status: 'deny' });
    expect(r.json.replayed).to.deep.equal({ status: 'deny' });
    const fired = r.json.fired as Fired[];
    const deny = fired.find((f) => f.policy === 'agent' && f.rule === 'deny');
    expect(deny, JSON.stringify(fired)).to.not.equal(undefined);
    expect(deny!.text).to.match(/^deny contains/);
    expect(deny!.row).to.be.a('number').and.at.least(1);
    for (const f of fired) expect(f).to.have.keys('policy', 'row', 'rule', 'text');
    // Only user policies are named, never the built-in module.
    expect(fired.map((f) => f.policy)).to.not.include('authz');
  });

  it("replays the decision under its own revision's set, not the live one", async () => {
    const allowed = await authorize(AGENT.allow, 200);
    const was = await revision();
    const put = await call('PUT', `${a.platform}/api/v1/policies/deny-read`, { body: { rego: DENY_READ } });
    expect(put.status, put.text).to.equal(201);
    try {
      const old = await explain(allowed);
      expect(old.status, old.text).to.equal(200);
      expect(old.json.revision).to.equal(was);
      expect(old.json.recorded).to.deep.equal({ status: 'allow' });
      expect(old.json.replayed).to.deep.equal({ status: 'allow' });
      const fired = old.json.fired as Fired[];
      expect(fired.some((f) => f.policy === 'agent' && f.rule === 'allow')).to.equal(true);
      expect(fired.some((f) => f.policy === 'deny-read')).to.equal(false);

      const denied = await authorize(AGENT.allow, 403);
      const now = await explain(denied);
      expect(now.status, now.text).to.equal(200);
      expect(now.json.revision).to.equal(was + 1);
      expect(now.json.replayed).to.deep.equal({ status: 'deny' });
      expect(now.json.fired).to.deep.include({
        policy: 'deny-read',
        row: 3,
        rule: 'deny',
        text: 'deny contains "reads are switched off" if input.action == "read"',
      });
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/deny-read`)).status).to.equal(204);
    }
  });

  it('replays a decision whose `limits` are malformed as the fail-closed deny the engine answered', async () => {
    // The rules allow the read, but its limit cannot be charged: the engine denied it, naming it.
    const BAD_LIMIT =
      'package authz.agent\n\nlimits contains {"key": "k", "window": "forever", "max": 1} if input.action == "read"\n';
    const put = await call('PUT', `${a.platform}/api/v1/policies/bad-limit`, { body: { rego: BAD_LIMIT } });
    expect(put.status, put.text).to.equal(201);
    try {
      const denied = await authorize(AGENT.allow, 403);
      const r = await explain(denied);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.recorded).to.deep.equal({ status: 'deny' });
      expect(r.json.replayed).to.deep.equal({ status: 'deny' });
      expect(r.json.fired).to.deep.include({
        policy: 'bad-limit',
        row: 3,
        rule: 'limits',
        text: 'limits contains {"key": "k", "window": "forever", "max": 1} if input.action == "read"',
      });
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/bad-limit`)).status).to.equal(204);
    }
  });

  it('answers 404 for an unknown request id, and changes nothing', async () => {
    const before = await auditCount(a.platform);
    expectError(await explain('0193a0b0-0000-7000-8000-000000000000'), 404, /not found/);
    expectError(await explain('no-such-id'), 404, /not found/);
    expect(await auditCount(a.platform)).to.equal(before);
  });

  it('needs audit:read, and is served by the Platform API only', async () => {
    const id = await authorize(AGENT.deny, 403);
    const reader = a.createKey('explain-policies', ['policies:read']);
    expectError(await explain(id, reader), 403, 'API key lacks scope audit:read');
    const auditor = a.createKey('explain-auditor', ['audit:read']);
    expect((await explain(id, auditor)).status).to.equal(200);
    expectError(await call('GET', `${a.engine}/api/v1/decisions/${id}/explain`), 404);
  });

  it("shows a tenant-bound key only its tenant's decisions", async () => {
    const r = await call('POST', `${a.engine}/v1/authorize`, { body: HUMAN.allow });
    expect(r.status, r.text).to.equal(200);
    const id = r.json.request_id as string;
    const acme = a.createKey('explain-acme', ['audit:read'], { tenant: 'acme' });
    const other = a.createKey('explain-other', ['audit:read'], { tenant: 'globex' });
    const ok = await explain(id, acme);
    expect(ok.status, ok.text).to.equal(200);
    expect(ok.json.replayed).to.deep.equal({ status: 'allow' });
    expectError(await explain(id, other), 404, `decision ${id} not found`);
  });

  it('runs at most two explanations at once per process (429 beyond, with Retry-After)', async () => {
    const id = await authorize(AGENT.deny, 403);
    const answers = await Promise.all(Array.from({ length: 6 }, () => explain(id)));
    const statuses = answers.map((r) => r.status);
    // Each explanation runs opa for tens of milliseconds: six sent at once cannot all get a slot.
    expect(statuses.filter((s) => s === 200).length, statuses.join()).to.be.within(2, 5);
    for (const r of answers.filter((x) => x.status !== 200)) {
      expectError(r, 429, 'too many explanations are running; try again shortly');
      expect(r.headers.get('retry-after')).to.equal('1');
    }
    expect(statuses.every((s) => s === 200 || s === 429)).to.equal(true);
  });

  /** Asserts that an answer names none of the explainer's internals (SPEC §3). */
  const expectNoInternals = (text: string) => {
    for (const leak of ['/tmp', 'opa eval', '-d ', 'arbiter-explain', '.rego']) {
      expect(text, text).to.not.include(leak);
    }
  };

  it('refuses an explanation that needs more than its memory bound (409), naming no internals', async () => {
    // 200² iterations: evaluated in a few ms, but OPA's trace of them outgrows its memory bound
    // (1 GiB of address space) within a second, about six times over (it reached 1.7 GB without).
    const items = Array.from({ length: 200 }, (_, i) => i);
    const data = await call('PUT', `${a.platform}/api/v1/data/slow`, { body: { items } });
    expect(data.status, data.text).to.equal(201);
    const put = await call('PUT', `${a.platform}/api/v1/policies/explain-slow`, {
      body: { rego: slowOn('explain/slow') },
    });
    expect(put.status, put.text).to.equal(201);
    try {
      const slow = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.allow, resource: 'explain/slow' },
      });
      expect(slow.status, slow.text).to.be.oneOf([200, 202, 403]);
      const before = await auditCount(a.platform);
      const r = await explain(slow.json.request_id as string);
      expectError(r, 409, 'the explanation needed more than 1024 MiB of memory');
      expectNoInternals(r.text);
      expect(r.headers.get('retry-after')).to.equal(null);
      expect(await auditCount(a.platform)).to.equal(before);

      // The service is healthy, and an ordinary decision is explained as before.
      expect((await call('GET', `${a.engine}/healthz`, { key: null })).status).to.equal(200);
      const id = await authorize(AGENT.deny, 403);
      const ok = await explain(id);
      expect(ok.status, ok.text).to.equal(200);
      expect(ok.json.replayed).to.deep.equal({ status: 'deny' });
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/explain-slow`)).status).to.equal(204);
      expect((await call('DELETE', `${a.platform}/api/v1/data/slow`)).status).to.equal(204);
    }
  });

  it("passes on OPA's diagnostic about the policy set (409), by policy and row, never by file", async () => {
    // A second value for thresholds["delete"] (agent.rego has one) on one resource: a conflict
    // that compiles, and that OPA reports only when it evaluates such a request.
    const rego =
      'package authz.agent\n\nthresholds["delete"] := {"deny_below": 0.1, "approval_below": 0.2} if input.resource == "explain/conflict"\n';
    const put = await call('PUT', `${a.platform}/api/v1/policies/explain-conflict`, { body: { rego } });
    expect(put.status, put.text).to.equal(201);
    try {
      const d = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.deny, resource: 'explain/conflict' },
      });
      expect(d.status, d.text).to.be.oneOf([403, 500, 503]);
      const r = await explain(d.json.request_id as string);
      const message = expectError(r, 409, /^the OPA explanation failed: .*eval_conflict_error: /);
      expect(message).to.include('policy explain-conflict:3');
      expect(message).to.include('policy agent:');
      expectNoInternals(r.text);
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/explain-conflict`)).status).to.equal(204);
    }
  });

  // Last: it removes the live revision from history.
  it('answers 409 when the decision was made under a revision history does not hold', async () => {
    const id = await authorize(AGENT.approval, 202);
    const r = await revision();
    await a.alter('DELETE FROM revisions WHERE revision = $1', [r]);
    expectError(
      await explain(id),
      409,
      `decision ${id} was made under revision ${r}, which policy history does not hold: it cannot be replayed`,
    );
  });
});

// The explainer's own process handling, not storage: once.
onceOnly('explain: an OPA that exits before reading its input', () => {
  let a: Arbiter;
  let dir: string;
  before(async () => {
    // Compiles with the real OPA, but `opa eval` exits at once without reading stdin, as an OPA
    // that cannot start (or a bound that ends it early) does.
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-opa-noeval-'));
    const opa = path.join(dir, 'opa');
    writeFileSync(
      opa,
      `#!/bin/sh\nif [ "$1" = eval ]; then echo 'failed to start' >&2; exit 3; fi\nexec '${path.join(REPO, '.opa-bin', 'opa')}' "$@"\n`,
    );
    chmodSync(opa, 0o755);
    // The input must be larger than a pipe's buffer, which the default context limit (64 KiB) is not.
    a = await Arbiter.start({ ARBITER_OPA_BIN: opa, ARBITER_MAX_CONTEXT_BYTES: '400000' });
  });
  after(async () => {
    await a.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers 503 and keeps serving when the write of a large input fails (EPIPE), never crashing', async () => {
    // An input larger than a pipe's buffer (64 KiB): the write cannot finish before OPA exits.
    const body = { ...AGENT.allow, context: { note: 'x'.repeat(300_000) } };
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body });
    expect(r.status, r.text).to.equal(200);
    for (let i = 0; i < 5; i++) {
      const e = await call('GET', `${a.platform}/api/v1/decisions/${r.json.request_id}/explain`);
      expectError(e, 503, 'the OPA explanation failed');
    }
    expect((await call('GET', `${a.engine}/healthz`)).status).to.equal(200);
  });
});

onceOnly('explain: an `opa eval` that does not finish in time', () => {
  let dir: string;
  // A duration no other process (nor another test run) sleeps for, to find the one this OPA stand-in starts.
  const SLEEP = `sleep 41.${process.pid}`;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-opa-slow-'));
    writeFileSync(path.join(dir, 'opa'), `#!/bin/sh\nexec ${SLEEP}\n`);
    chmodSync(path.join(dir, 'opa'), 0o755);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  const running = () => {
    try {
      return execFileSync('pgrep', ['-f', SLEEP], { encoding: 'utf8' }).trim();
    } catch {
      return ''; // pgrep exits 1 when nothing matches
    }
  };

  it('is refused as unavailable (503) after the time limit, naming it, and the process is killed', async () => {
    const explainer = new Explainer(path.join(dir, 'opa'), undefined, 1_000);
    const started = Date.now();
    let error: unknown;
    try {
      await explainer.explain([{ name: 'agent', rego: 'package authz.agent\n' }], {}, { action: 'read' });
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(AppError);
    expect(statusOfKind((error as AppError).kind)).to.equal(503);
    expect((error as AppError).message).to.equal('the explanation did not finish within 1 s');
    expect(Date.now() - started).to.be.below(10_000);
    expect(running(), 'the timed-out OPA is still running').to.equal('');
  });
});
