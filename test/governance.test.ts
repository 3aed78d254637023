import { expect } from 'chai';
import { decodeJwt } from 'jose';
import { spawnSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onEveryBackend, onPostgresOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { Arbiter, auditCount, auditEvents, call, REPO, type Response } from './helpers/harness.js';
import { createTestDatabase, type TestDatabase } from './helpers/postgres.js';
import { sleep } from './helpers/process.js';

/**
 * SPEC §13 over HTTP: on_behalf_of (the stricter of the agent's and the user's outcome), budgets
 * (consumed with the decision, exact under concurrency, across processes on PostgreSQL), budgets
 * consumed on approval, GET /api/v1/limits, and request_digest on every record of a call.
 *
 * The policies are the test's own (a policy directory written here), so that each outcome is
 * chosen by the request: `context.agent` picks the agent side, the user id the user side, and
 * `context.limits` is the set of limits the agent policy declares.
 */
const AGENT_REGO = `package authz.agent

allow if input.action != "nothing"

deny contains "agent rule denies" if input.context.agent == "deny"

require_approval contains "agent rule needs approval" if input.context.agent == "approve"

limits contains l if some l in input.context.limits
`;

const HUMAN_REGO = `package authz.human

allow if input.user_id != "nobody"

deny contains "user rule denies" if input.user_id == "u-deny"

require_approval contains "user rule needs approval" if input.user_id == "u-approve"
`;

function policyDir(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-governance-'));
  writeFileSync(path.join(dir, 'agent.rego'), AGENT_REGO);
  writeFileSync(path.join(dir, 'human.rego'), HUMAN_REGO);
  return dir;
}

/** The README's recipe: base64url(SHA-256(canonical JSON text)). */
const digestOf = (canonical: string) => createHash('sha256').update(canonical, 'utf8').digest('base64url');

interface Limit {
  key: string;
  window?: unknown;
  max?: unknown;
  cost?: unknown;
}

const spend = (action: string, limits: Limit[], context: Record<string, unknown> = {}) => ({
  agent_id: 'gov-bot',
  action,
  resource: 'doc/1',
  confidence: 0.95,
  context: { ...context, limits },
});

/** Statuses of many answers, counted. */
function tally(rs: Response[]): Record<number, number> {
  const out: Record<number, number> = {};
  for (const r of rs) out[r.status] = (out[r.status] ?? 0) + 1;
  return out;
}

/**
 * Every answer is the decision recorded for it: the audit event of its request_id has the
 * answered outcome (and exactly one decision event exists per request).
 */
async function expectAnswersRecorded(platform: string, action: string, rs: Response[]): Promise<void> {
  const events = await auditEvents(platform, { kind: 'decision', action });
  expect(events).to.have.length(rs.length);
  const byId = new Map(events.map((e) => [e.request_id as string, e]));
  for (const r of rs) {
    const e = byId.get(r.json.request_id as string);
    expect(e, `event of ${r.json.request_id}`).to.not.equal(undefined);
    expect(e.outcome).to.equal(r.json.status);
    if (r.json.status === 'deny') expect(e.message).to.equal(r.json.message);
  }
}

onEveryBackend('agent governance (SPEC §13)', function () {
  this.timeout(120_000);
  let a: Arbiter;
  let dir: string;
  let agentKey: string;
  const authorize = (body: unknown, key = agentKey) =>
    call('POST', `${a.engine}/v1/agent/authorize`, { body, key });
  const limitsOf = async (key: string) => {
    const r = await call('GET', `${a.platform}/api/v1/limits?key=${encodeURIComponent(key)}`);
    expect(r.status, r.text).to.equal(200);
    return r.json.limits as { key: string; window: string; used: number; max: number; remaining: number }[];
  };
  /** What may not change after a refused request: decisions, queue items, audit events, counters. */
  const snapshot = async () => ({
    decisions: await a.count('decisions'),
    queue: await a.count('queue_items'),
    counters: await a.stored('SELECT key, window_start, used FROM limit_counters ORDER BY key, window_start'),
    audit: await auditCount(a.platform),
  });

  before(async () => {
    dir = policyDir();
    a = await Arbiter.start({ ARBITER_POLICY_DIR: dir });
    agentKey = a.createKey('gov-agent', ['authorize', 'tokens:mint', 'queue:read']);
  });
  after(async () => {
    await a?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  describe('on_behalf_of', () => {
    const cases = [
      ['allow', 'u-allow', 'allow'],
      ['allow', 'u-approve', 'requires_approval'],
      ['allow', 'u-deny', 'deny'],
      ['approve', 'u-allow', 'requires_approval'],
      ['approve', 'u-approve', 'requires_approval'],
      ['approve', 'u-deny', 'deny'],
      ['deny', 'u-allow', 'deny'],
      ['deny', 'u-approve', 'deny'],
      ['deny', 'u-deny', 'deny'],
    ] as const;
    const STATUS = { allow: 200, requires_approval: 202, deny: 403 } as const;
    const AGENT_REASON = { allow: null, approve: 'agent rule needs approval', deny: 'agent rule denies' };
    const USER_REASON: Record<string, string | null> = {
      'u-allow': null,
      'u-approve': 'on behalf of u-approve: user rule needs approval',
      'u-deny': 'on behalf of u-deny: user rule denies',
    };

    for (const [agentSide, user, expected] of cases) {
      it(`answers ${expected} for agent ${agentSide} on behalf of ${user}, keeping both reasons`, async () => {
        const r = await authorize({
          agent_id: 'gov-bot',
          action: 'write',
          resource: 'doc/obo',
          confidence: 0.95,
          context: { agent: agentSide },
          on_behalf_of: { tenant_id: 'acme', user_id: user },
        });
        expect(r.status, r.text).to.equal(STATUS[expected]);
        expect(r.json.status).to.equal(expected);
        const [event] = await auditEvents(a.platform, { kind: 'decision', request_id: r.json.request_id });
        const reasons = [AGENT_REASON[agentSide], USER_REASON[user]].filter((x) => x !== null);
        expect(event.details.reasons).to.deep.equal(reasons);
        for (const reason of reasons) expect(r.json.message).to.include(reason);
        expect(event.details.on_behalf_of).to.deep.equal({ tenant_id: 'acme', user_id: user });
        expect(event.tenant_id).to.equal('acme');
        // Found among what was done as the user, and as the agent.
        expect(event.user_id).to.equal(user);
        expect(event.agent_id).to.equal('gov-bot');
        const asUser = await auditEvents(a.platform, { kind: 'decision', user_id: user });
        expect(asUser.map((e) => e.request_id)).to.include(r.json.request_id);
        if (expected === 'requires_approval') {
          // The admin key approves (the agent's own key may not): the approval is done as the user too.
          const approved = await call('POST', `${a.engine}/v1/queue/${r.json.request_id}/approve`, {});
          expect(approved.status, approved.text).to.equal(200);
          const [approval] = await auditEvents(a.platform, {
            kind: 'queue.approve',
            request_id: r.json.request_id,
          });
          expect(approval.user_id).to.equal(user);
          expect(approval.agent_id).to.equal('gov-bot');
        }
      });
    }

    it('decides the user with the resource split at its first "/" (no "/": type "")', async () => {
      const put = await call('PUT', `${a.platform}/api/v1/policies/obo-split`, {
        raw:
          'package authz.human\n\ndeny contains concat("|", ["split", input.resource.type, input.resource.id]) ' +
          'if input.user_id == "u-split"\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(put.status, put.text).to.equal(201);
      try {
        const obo = { tenant_id: 'acme', user_id: 'u-split' };
        const base = { agent_id: 'gov-bot', action: 'read', confidence: 0.95, on_behalf_of: obo };
        const nested = await authorize({ ...base, resource: 'project/p1/files' });
        expect(nested.status).to.equal(403);
        expect(nested.json.message).to.include('split|project|p1/files');
        const flat = await authorize({ ...base, resource: 'standalone' });
        expect(flat.json.message).to.include('split||standalone');
      } finally {
        expect((await call('DELETE', `${a.platform}/api/v1/policies/obo-split`)).status).to.equal(204);
      }
    });

    it('refuses a malformed on_behalf_of with 400 and records nothing', async () => {
      const before = await snapshot();
      const base = { agent_id: 'gov-bot', action: 'read', resource: 'doc/1', confidence: 0.95 };
      for (const obo of [
        {},
        { tenant_id: 'acme' },
        { user_id: 'u-allow' },
        { tenant_id: 7, user_id: 'u-allow' },
        { tenant_id: 'acme', user_id: ['u-allow'] },
        { tenant_id: '', user_id: 'u-allow' },
        { tenant_id: 'acme', user_id: 'u-allow', role: 'admin' },
        'acme/u-allow',
        null,
      ]) {
        expectError(await authorize({ ...base, on_behalf_of: obo }), 400);
      }
      expectError(
        await call('POST', `${a.engine}/v1/agent/authorize`, {
          raw: '{"agent_id": "gov-bot", "on_behalf_of": {',
          headers: { 'content-type': 'application/json' },
          key: agentKey,
        }),
        400,
      );
      expect(await snapshot()).to.deep.equal(before);
    });

    it('answers 403 to a tenant-bound key acting for another tenant, recording nothing', async () => {
      const acmeKey = a.createKey('gov-acme', ['authorize'], { tenant: 'acme' });
      const body = (tenant: string) => ({
        agent_id: 'gov-bot',
        action: 'read',
        resource: 'doc/1',
        confidence: 0.95,
        on_behalf_of: { tenant_id: tenant, user_id: 'u-allow' },
      });
      const before = await snapshot();
      expectError(await authorize(body('globex'), acmeKey), 403, /bound to tenant acme/);
      expect(await snapshot()).to.deep.equal(before);
      expect((await authorize(body('acme'), acmeKey)).status).to.equal(200);
    });
  });

  describe('limits and budgets', () => {
    it('consumes on allow and denies over budget naming key, window and max', async () => {
      const key = `k-${randomUUID()}`;
      const limits = [{ key, window: '1h', max: 2 }];
      expect((await authorize(spend('spend', limits))).status).to.equal(200);
      expect((await authorize(spend('spend', limits))).status).to.equal(200);
      const over = await authorize(spend('spend', limits));
      expect(over.status).to.equal(403);
      expect(over.json.status).to.equal('deny');
      expect(over.json.message).to.include(`"${key}"`).and.include('1h').and.include('allows 2');
      const [event] = await auditEvents(a.platform, { request_id: over.json.request_id });
      expect(event.outcome).to.equal('deny');
      expect(event.details.reasons).to.deep.equal(['limit_exhausted']);
      const [usage] = await limitsOf(key);
      expect(usage).to.include({ key, window: '1h', used: 2, max: 2, remaining: 0 });
    });

    it('consumes nothing for a deny or a requires_approval', async () => {
      const key = `k-${randomUUID()}`;
      const limits = [{ key, window: '1h', max: 1 }];
      expect((await authorize(spend('spend', limits, { agent: 'deny' }))).status).to.equal(403);
      expect((await authorize(spend('spend', limits, { agent: 'approve' }))).status).to.equal(202);
      expect(await limitsOf(key)).to.deep.equal([]);
      expect((await authorize(spend('spend', limits))).status).to.equal(200);
      expect((await limitsOf(key))[0]).to.include({ used: 1 });
    });

    it('charges cost in exact decimal units, and each limit of a decision all or nothing', async () => {
      const key = `k-${randomUUID()}`;
      const other = `k-${randomUUID()}`;
      const dimes = [{ key, window: '1h', max: 0.3, cost: 0.1 }];
      for (let i = 0; i < 3; i++) expect((await authorize(spend('spend', dimes))).status).to.equal(200);
      expect((await authorize(spend('spend', dimes))).status).to.equal(403);
      expect((await limitsOf(key))[0]).to.include({ used: 0.3, max: 0.3, remaining: 0 });
      // The exhausted limit is named; the other limit of the same decision is not charged.
      const both = [
        { key: other, window: '1h', max: 10, cost: 4 },
        { key, window: '1h', max: 0.3, cost: 0.1 },
      ];
      const r = await authorize(spend('spend', both));
      expect(r.status).to.equal(403);
      expect(r.json.message).to.include(`"${key}"`);
      expect(await limitsOf(other)).to.deep.equal([]);
      const alone = [{ key: other, window: '1h', max: 10, cost: 4 }];
      expect((await authorize(spend('spend', alone))).status).to.equal(200);
      expect((await authorize(spend('spend', alone))).status).to.equal(200);
      expect((await authorize(spend('spend', alone))).status).to.equal(403);
      expect((await limitsOf(other))[0]).to.include({ used: 8, max: 10, remaining: 2 });
    });

    it('rounds costs up and maxima down to 6 decimals, never in the caller’s favour', async () => {
      const allowed = async (limits: Limit[], n: number) => {
        const rs: number[] = [];
        for (let i = 0; i < n; i++) rs.push((await authorize(spend('spend', limits))).status);
        return rs.filter((s) => s === 200).length;
      };
      // A cost below half a micro-unit is one micro-unit, not free.
      const crumbs = `k-${randomUUID()}`;
      expect(await allowed([{ key: crumbs, window: '1h', max: 0, cost: 4e-7 }], 3)).to.equal(0);
      expect(await limitsOf(crumbs)).to.deep.equal([]);
      // 1.4e-6 costs 2e-6: pieces pay at least what they spend.
      const pieces = `k-${randomUUID()}`;
      expect(await allowed([{ key: pieces, window: '1h', max: 0.000004, cost: 1.4e-6 }], 4)).to.equal(2);
      expect((await limitsOf(pieces))[0]).to.include({ used: 0.000004, max: 0.000004, remaining: 0 });
      // A maximum of 2.9e-6 allows 2e-6.
      const cap = `k-${randomUUID()}`;
      expect(await allowed([{ key: cap, window: '1h', max: 0.0000029, cost: 0.000001 }], 4)).to.equal(2);
      expect((await limitsOf(cap))[0]).to.include({ used: 0.000002, max: 0.000002, remaining: 0 });
      // Amounts written with 6 decimals or fewer are taken as written.
      const exact = `k-${randomUUID()}`;
      expect(await allowed([{ key: exact, window: '1h', max: 0.7, cost: 0.1 }], 8)).to.equal(7);
      expect((await limitsOf(exact))[0]).to.include({ used: 0.7, max: 0.7, remaining: 0 });
    });

    it('charges a counter declared twice the sum of its costs, within every maximum declared for it', async () => {
      // One counter (key and window length) with two maxima: the decision's total must fit both.
      const key = `k-${randomUUID()}`;
      const twice = [
        { key, window: '1h', max: 1, cost: 1 },
        { key, window: '1h', max: 100, cost: 1 },
      ];
      const r = await authorize(spend('spend', twice));
      expect(r.status).to.equal(403);
      expect(r.json.message).to.include(`"${key}"`).and.include('allows 1 per 1h');
      expect(await limitsOf(key)).to.deep.equal([]);
      // Within both: charged the sum; the counter keeps the smallest maximum, whatever the order
      // and however its window is written.
      const both = `k-${randomUUID()}`;
      const declared = [
        { key: both, window: '60m', max: 10, cost: 2 },
        { key: both, window: '1h', max: 4, cost: 1 },
      ];
      expect((await authorize(spend('spend', declared))).status).to.equal(200);
      const usage = await limitsOf(both);
      expect(usage).to.have.length(1);
      expect(usage[0]).to.include({ window: '1h', used: 3, max: 4, remaining: 1 });
      const over = await authorize(spend('spend', [...declared].reverse()));
      expect(over.status).to.equal(403);
      expect(over.json.message).to.include('allows 4 per 1h');
      expect((await limitsOf(both))[0]).to.include({ used: 3, max: 4 });
      // An approval charges by the same rule: refused, the item stays pending.
      const queued = `k-${randomUUID()}`;
      const item = await authorize(
        spend(
          'spend',
          twice.map((l) => ({ ...l, key: queued })),
          { agent: 'approve' },
        ),
      );
      expect(item.status).to.equal(202);
      expectError(
        await call('POST', `${a.engine}/v1/queue/${item.json.request_id}/approve`, { body: {} }),
        409,
        /budget exhausted.*allows 1 per 1h.*stays pending/,
      );
      expect(await limitsOf(queued)).to.deep.equal([]);
    });

    it('keeps one counter per window length of a key, and starts again when a window rolls over', async () => {
      const key = `k-${randomUUID()}`;
      const limits = [{ key, window: '5s', max: 1 }];
      // Start just after a 5 s boundary, so both requests below fall in one window (5 s, so that
      // a loaded CI machine fits two decisions in it).
      await sleep(5_000 - (Date.now() % 5_000) + 50);
      expect((await authorize(spend('spend', limits))).status).to.equal(200);
      const over = await authorize(spend('spend', limits));
      expect(over.status).to.equal(403);
      expect(over.json.message).to.include('5s');
      await sleep(5_000 - (Date.now() % 5_000) + 50);
      const [stale] = await limitsOf(key);
      expect(stale).to.include({ window: '5s', used: 0, max: 1, remaining: 1 });
      expect((await authorize(spend('spend', limits))).status).to.equal(200);
      expect((await limitsOf(key))[0]).to.include({ used: 1, remaining: 0 });
      // Another window length of the same key is another counter.
      expect((await authorize(spend('spend', [{ key, window: '1h', max: 5 }]))).status).to.equal(200);
      const usage = await limitsOf(key);
      expect(usage.map((u) => [u.window, u.used])).to.deep.equal([
        ['5s', 1],
        ['1h', 1],
      ]);
    });

    it('deletes the counters of superseded windows (at start, then every 10 minutes), never the newest', async () => {
      // More keys than one sweep batch (500): 33 decisions of 16 limits each, in each of two
      // windows of 2 s; and one hourly counter.
      const prefix = `sweep-${randomUUID()}-`;
      const keys = Array.from({ length: 33 * 16 }, (_, i) => `${prefix}${String(i).padStart(3, '0')}`);
      const burst = async () => {
        const rs = await Promise.all(
          Array.from({ length: 33 }, (_, d) =>
            authorize(
              spend(
                'spend',
                keys.slice(d * 16, d * 16 + 16).map((key) => ({ key, window: '2s', max: 5 })),
              ),
            ),
          ),
        );
        expect(rs.map((r) => r.status)).to.deep.equal(rs.map(() => 200));
      };
      await sleep(2_000 - (Date.now() % 2_000) + 20);
      await burst();
      await sleep(2_000 - (Date.now() % 2_000) + 20);
      await burst();
      const hourly = `${prefix}hourly`;
      expect((await authorize(spend('spend', [{ key: hourly, window: '1h', max: 5 }]))).status).to.equal(200);
      const counters = async () =>
        (
          await a.stored<{ key: string; window_ms: number | string; window_start: string }>(
            'SELECT key, window_ms, window_start FROM limit_counters WHERE key LIKE $1 ORDER BY key, window_ms, window_start',
            [`${prefix}%`],
          )
        ).map((c) => ({ ...c, window_ms: Number(c.window_ms) }));
      const all = await counters();
      // (At least: a burst that straddles a window boundary leaves a third window for some keys.)
      expect(all.length).to.be.at.least(keys.length * 2 + 1);
      const newest = all.filter((c, i) => all[i + 1]?.key !== c.key);
      expect(newest).to.have.length(keys.length + 1);
      // A window superseded one window length ago (2 s here; 5 minutes at most) is never read
      // again: the sweep at start deletes it. The newest of each key and window length stays.
      await sleep(2_100);
      await a.restart();
      let left = await counters();
      for (const deadline = Date.now() + 30_000; left.length > newest.length && Date.now() < deadline;) {
        await sleep(100);
        left = await counters();
      }
      expect(left).to.deep.equal(newest);
      const usage = await limitsOf(hourly);
      expect(usage).to.have.length(1);
      expect(usage[0]).to.include({ window: '1h', used: 1, max: 5, remaining: 4 });
      expect((await limitsOf(keys[0] as string)).map((u) => [u.window, u.max])).to.deep.equal([['2s', 5]]);
    });

    it('denies, fails closed and audits the error for a malformed limit, consuming nothing', async () => {
      const good = `k-${randomUUID()}`;
      const bad: Limit[] = [
        { key: 'bad', window: 'soon', max: 1 },
        { key: 'bad', window: '500ms', max: 1 },
        { key: 'bad', window: 60, max: 1 },
        { key: 'bad', window: '1h', max: -1 },
        { key: 'bad', window: '1h', max: '7' },
        { key: 'bad', window: '1h' },
        { key: 'bad', window: '1h', max: 5, cost: -2 },
        { key: 'bad', window: '1h', max: 5, cost: 'x' },
        { key: '', window: '1h', max: 5 },
        { key: 'bad', window: '1h', max: 5, per: 'user' } as Limit,
      ];
      for (const l of bad) {
        const r = await authorize(spend('spend', [{ key: good, window: '1h', max: 100 }, l]));
        expect(r.status, JSON.stringify(l)).to.equal(403);
        expect(r.json.message).to.match(/^invalid limit: /);
        const [event] = await auditEvents(a.platform, { request_id: r.json.request_id });
        expect(event.outcome).to.equal('deny');
        expect(event.details.reasons).to.deep.equal(['invalid_limit']);
        expect(event.details.error).to.match(/^invalid limit: /);
      }
      expect(await limitsOf(good)).to.deep.equal([]);
    });

    it('takes a max and a cost up to 9007199254.74099 and denies a larger one, naming the ceiling', async () => {
      const key = `k-${randomUUID()}`;
      const top = 9007199254.74099;
      expect((await authorize(spend('spend', [{ key, window: '1h', max: top, cost: top }]))).status).to.equal(
        200,
      );
      expect((await limitsOf(key))[0]).to.include({ used: top, max: top, remaining: 0 });
      for (const l of [
        { key, window: '1h', max: 9007199254.740992, cost: 0 },
        { key, window: '1h', max: 1e12, cost: 0 },
        { key, window: '1h', max: top, cost: 1e10 },
      ]) {
        const r = await authorize(spend('spend', [l]));
        expect(r.status, JSON.stringify(l)).to.equal(403);
        expect(r.json.message).to.match(
          /^invalid limit: .*(max|cost) is too large \(at most 9007199254\.74099\)/,
        );
      }
      expect((await limitsOf(key))[0]).to.include({ used: top });
    });

    it('allows exactly min(N, M) of N concurrent requests against a budget of M', async () => {
      for (const [n, m] of [
        [40, 7],
        [5, 7],
      ] as const) {
        const key = `k-${randomUUID()}`;
        const action = `spend-${randomUUID()}`;
        const rs = await Promise.all(
          Array.from({ length: n }, () => authorize(spend(action, [{ key, window: '1h', max: m }]))),
        );
        expect(tally(rs)).to.deep.equal(n > m ? { 200: m, 403: n - m } : { 200: n });
        expect((await limitsOf(key))[0]).to.include({ used: Math.min(n, m), max: m });
        await expectAnswersRecorded(a.platform, action, rs);
      }
    });

    it('replays the deny actually recorded to concurrent retries of an Idempotency-Key', async () => {
      const key = `k-${randomUUID()}`;
      const action = `spend-${randomUUID()}`;
      const body = spend(action, [{ key, window: '1h', max: 1 }]);
      expect((await authorize(body)).status).to.equal(200);
      const headers = { 'idempotency-key': `retry-${randomUUID()}` };
      const rs = await Promise.all(
        Array.from({ length: 20 }, () =>
          call('POST', `${a.engine}/v1/agent/authorize`, { body, key: agentKey, headers }),
        ),
      );
      expect(tally(rs)).to.deep.equal({ 403: 20 });
      expect(new Set(rs.map((r) => r.json.request_id)).size).to.equal(1);
      expect((await limitsOf(key))[0]).to.include({ used: 1 });
      const events = await auditEvents(a.platform, { kind: 'decision', action });
      expect(events.map((e) => e.outcome).sort()).to.deep.equal(['allow', 'deny']);
    });

    it('charges a retried allow once: the replay consumes nothing', async () => {
      const key = `k-${randomUUID()}`;
      const body = spend('spend', [{ key, window: '1h', max: 5 }]);
      const headers = { 'idempotency-key': `retry-${randomUUID()}` };
      const send = () => call('POST', `${a.engine}/v1/agent/authorize`, { body, key: agentKey, headers });
      const first = await send();
      const again = await send();
      expect([first.status, again.status]).to.deep.equal([200, 200]);
      expect(again.json.request_id).to.equal(first.json.request_id);
      expect((await limitsOf(key))[0]).to.include({ used: 1 });
    });

    it('consumes on approval, and refuses the approval with 409 once the budget is exhausted', async () => {
      const key = `k-${randomUUID()}`;
      const limits = [{ key, window: '1h', max: 1 }];
      const first = await authorize(spend('spend', limits, { agent: 'approve' }));
      const second = await authorize(spend('spend', limits, { agent: 'approve' }));
      expect([first.status, second.status]).to.deep.equal([202, 202]);
      expect(await limitsOf(key)).to.deep.equal([]);
      const approve = (id: string) => call('POST', `${a.engine}/v1/queue/${id}/approve`, { body: {} });
      expect((await approve(first.json.request_id)).status).to.equal(200);
      expect((await limitsOf(key))[0]).to.include({ used: 1 });
      const [approval] = await auditEvents(a.platform, {
        kind: 'queue.approve',
        request_id: first.json.request_id,
      });
      expect(approval.details.limits_consumed).to.deep.equal([{ key, window: '1h', cost: 1 }]);
      const before = await snapshot();
      expectError(await approve(second.json.request_id), 409, /budget exhausted.*stays pending/);
      expect(await snapshot()).to.deep.equal(before);
      const item = await call('GET', `${a.engine}/v1/queue/${second.json.request_id}`);
      expect(item.json.status).to.equal('pending');
      // A denial consumes nothing and is not refused.
      expect((await call('POST', `${a.engine}/v1/queue/${second.json.request_id}/deny`)).status).to.equal(
        200,
      );
    });
  });

  describe('budgets consumed by approvals', () => {
    it('approves exactly M of N pending items approved at once against a budget of M', async () => {
      const key = `k-${randomUUID()}`;
      const limits = [{ key, window: '1h', max: 3 }];
      const asked = await Promise.all(
        Array.from({ length: 8 }, () => authorize(spend('spend', limits, { agent: 'approve' }))),
      );
      expect(tally(asked)).to.deep.equal({ 202: 8 });
      const rs = await Promise.all(
        asked.map((r) => call('POST', `${a.engine}/v1/queue/${r.json.request_id}/approve`)),
      );
      expect(tally(rs)).to.deep.equal({ 200: 3, 409: 5 });
      expect((await limitsOf(key))[0]).to.include({ used: 3, remaining: 0 });
      const approvals = await Promise.all(
        asked.map((r) => auditEvents(a.platform, { kind: 'queue.approve', request_id: r.json.request_id })),
      );
      expect(approvals.flat()).to.have.length(3);
    });
  });

  describe('GET /api/v1/limits', () => {
    it('answers 400 without a key, with an empty or repeated key, or an unknown parameter', async () => {
      for (const q of ['', '?key=', '?key=a&key=b', '?key=a&window=1h', `?key=${'x'.repeat(257)}`]) {
        expectError(await call('GET', `${a.platform}/api/v1/limits${q}`), 400);
      }
    });

    it('answers an unknown key with no limits', async () => {
      const r = await call('GET', `${a.platform}/api/v1/limits?key=never-used`);
      expect(r.status).to.equal(200);
      expect(r.json).to.deep.equal({ key: 'never-used', limits: [] });
    });

    it('needs audit:read, refuses keys bound to a tenant or an agent, and is not on the Engine API', async () => {
      const auditor = a.createKey('gov-auditor', ['audit:read']);
      const bound = a.createKey('gov-bound-auditor', ['audit:read'], { tenant: 'acme' });
      const agentBound = a.createKey('gov-agent-auditor', ['audit:read'], { agent: 'gov-bot' });
      const url = `${a.platform}/api/v1/limits?key=anything`;
      expect((await call('GET', url, { key: auditor })).status).to.equal(200);
      expectError(await call('GET', url, { key: agentKey }), 403);
      expectError(await call('GET', url, { key: bound }), 403);
      expectError(await call('GET', url, { key: agentBound }), 403);
      expectError(await call('GET', url, { key: null }), 401);
      expect((await call('GET', `${a.engine}/api/v1/limits?key=anything`)).status).to.equal(404);
    });
  });

  describe('request_digest and policy_revision', () => {
    const revision = async () =>
      (await call('GET', `${a.engine}/healthz`, { key: null })).json.revision as number;

    it('binds an allow to its digest: answer, audit event, token claim and introspection', async () => {
      const r = await authorize({
        agent_id: 'gov-bot',
        action: 'read',
        resource: 'doc/1',
        confidence: 0.95,
        context: { z: 1, a: 'é', nested: { b: [1, 'two'], a: null } },
      });
      expect(r.status).to.equal(200);
      const digest = digestOf(
        '{"action":"read","agent_id":"gov-bot","context":{"a":"é","nested":{"a":null,"b":[1,"two"]},"z":1},' +
          '"resource":"doc/1","tenant_id":null}',
      );
      expect(r.json.request_digest).to.equal(digest);
      await expectBound(r.json.request_id, digest, await revision());
    });

    it('binds an approval to its digest: queue item, audit events, token claim and introspection', async () => {
      const r = await authorize({
        agent_id: 'gov-bot',
        action: 'deploy',
        resource: 'prod/api',
        confidence: 0.95,
        context: { agent: 'approve', amount: 1.5 },
        on_behalf_of: { tenant_id: 'acme', user_id: 'u-allow' },
      });
      expect(r.status).to.equal(202);
      const digest = digestOf(
        '{"action":"deploy","agent_id":"gov-bot","context":{"agent":"approve","amount":1.5},' +
          '"resource":"prod/api","tenant_id":"acme","user_id":"u-allow"}',
      );
      expect(r.json.request_digest).to.equal(digest);
      const rev = await revision();
      const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
      expect(item.json).to.include({ request_digest: digest, policy_revision: rev });
      const approved = await call('POST', `${a.engine}/v1/queue/${r.json.request_id}/approve`);
      expect(approved.status).to.equal(200);
      const [approval] = await auditEvents(a.platform, {
        kind: 'queue.approve',
        request_id: r.json.request_id,
      });
      // The approval names the call and the revision that decided it, as the README says.
      expect(approval.details).to.include({ request_digest: digest, policy_revision: rev });
      await expectBound(r.json.request_id, digest, rev);
    });

    it('digests a human request from its fields as received', async () => {
      const r = await call('POST', `${a.engine}/v1/authorize`, {
        body: { tenant_id: 'acme', user_id: 'u-allow', action: 'read', resource: { type: 'doc', id: '1' } },
      });
      expect(r.status, r.text).to.equal(200);
      const digest = digestOf(
        '{"action":"read","context":{},"resource":{"id":"1","type":"doc"},"tenant_id":"acme","user_id":"u-allow"}',
      );
      expect(r.json.request_digest).to.equal(digest);
      const [event] = await auditEvents(a.platform, { kind: 'decision', request_id: r.json.request_id });
      expect(event.details.request_digest).to.equal(digest);
    });

    it('gives a different digest to a different call', async () => {
      const body = { agent_id: 'gov-bot', action: 'read', resource: 'doc/1', confidence: 0.95 };
      const one = await authorize(body);
      const other = await authorize({ ...body, resource: 'doc/2' });
      const again = await authorize({ ...body, confidence: 0.99 });
      expect(one.json.request_digest).to.not.equal(other.json.request_digest);
      // Confidence is not part of the call.
      expect(again.json.request_digest).to.equal(one.json.request_digest);
    });

    it('refuses an amount that overflows to Infinity, however written, rather than decide it as null', async () => {
      // 1 followed by 210 zeros, e99, is 1e309: JSON.parse reads Infinity, which JSON writes as
      // null, so the policy, the trail and the digest would all see {"amount": null} while a
      // resource server sees a huge amount under the same request_digest.
      const huge = `1${'0'.repeat(210)}e99`;
      const before = await snapshot();
      const r = await call('POST', `${a.engine}/v1/agent/authorize`, {
        raw: `{"agent_id":"gov-bot","action":"pay","resource":"acct/1","confidence":0.95,"context":{"amount":${huge}}}`,
        key: agentKey,
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400, /^context\.amount holds a number too large to represent$/);
      expect(await snapshot()).to.deep.equal(before);
    });

    describe('the user a token acts for', () => {
      const mint = async (requestId: string) => {
        const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
          body: { request_id: requestId },
          key: agentKey,
        });
        expect(minted.status, minted.text).to.equal(201);
        return minted.json;
      };
      const introspect = async (token: unknown) =>
        (await call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token } })).json;
      /** The kinds of the events the audit trail's user_id filter finds for `user`, oldest first. */
      const kindsFor = async (user: string) =>
        (await auditEvents(a.platform, { user_id: user })).map((e) => e.kind as string).reverse();

      it('names the user an agent acted on behalf of: claim, introspection, mint and revoke events', async () => {
        const user = `u-obo-${randomUUID()}`;
        const r = await authorize({
          agent_id: 'gov-bot',
          action: 'read',
          resource: 'doc/1',
          confidence: 0.95,
          on_behalf_of: { tenant_id: 'acme', user_id: user },
        });
        expect(r.status, r.text).to.equal(200);
        const minted = await mint(r.json.request_id);
        const claims = decodeJwt(minted.token as string);
        // The agent holds the scopes; the user is whose behalf it holds them on.
        expect(claims.sub).to.equal('gov-bot');
        expect(claims.on_behalf_of).to.deep.equal({ tenant_id: 'acme', user_id: user });
        expect(await introspect(minted.token)).to.deep.include({
          active: true,
          sub: 'gov-bot',
          on_behalf_of: { tenant_id: 'acme', user_id: user },
        });
        const revoked = await call('DELETE', `${a.engine}/v1/tokens/${minted.token_id}`);
        expect(revoked.status, revoked.text).to.equal(200);
        expect(await kindsFor(user)).to.deep.equal(['decision', 'token.mint', 'token.revoke']);
      });

      it("names a human decision's user in its mint event, with no on_behalf_of claim", async () => {
        const user = `u-human-${randomUUID()}`;
        const r = await call('POST', `${a.engine}/v1/authorize`, {
          body: { tenant_id: 'acme', user_id: user, action: 'read', resource: { type: 'doc', id: '1' } },
          key: agentKey,
        });
        expect(r.status, r.text).to.equal(200);
        const minted = await mint(r.json.request_id);
        const claims = decodeJwt(minted.token as string);
        expect(claims.sub).to.equal(user);
        expect(claims).to.not.have.property('on_behalf_of');
        expect((await introspect(minted.token)).on_behalf_of).to.equal(null);
        expect(await kindsFor(user)).to.deep.equal(['decision', 'token.mint']);
      });

      it('names no user for an agent acting for itself', async () => {
        const r = await authorize({
          agent_id: 'gov-bot',
          action: 'read',
          resource: 'doc/1',
          confidence: 0.95,
        });
        expect(r.status, r.text).to.equal(200);
        const minted = await mint(r.json.request_id);
        expect(decodeJwt(minted.token as string)).to.not.have.property('on_behalf_of');
        expect((await introspect(minted.token)).on_behalf_of).to.equal(null);
        const [event] = await auditEvents(a.platform, { kind: 'token.mint', request_id: r.json.request_id });
        expect(event.user_id).to.equal(null);
      });
    });

    async function expectBound(requestId: string, digest: string, rev: number): Promise<void> {
      const [event] = await auditEvents(a.platform, { kind: 'decision', request_id: requestId });
      expect(event.details.request_digest).to.equal(digest);
      expect(event.policy_revision).to.equal(rev);
      const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
        body: { request_id: requestId },
        key: agentKey,
      });
      expect(minted.status, minted.text).to.equal(201);
      const claims = decodeJwt(minted.json.token as string);
      expect(claims.request_digest).to.equal(digest);
      expect(claims.policy_revision).to.equal(rev);
      const intro = await call('POST', `${a.engine}/v1/tokens/introspect`, {
        body: { token: minted.json.token },
      });
      expect(intro.json).to.include({ active: true, request_digest: digest, policy_revision: rev });
    }
  });
});

// Two processes of their own on one database: registered on the PostgreSQL run.
onPostgresOnly('budgets across two engine processes (SPEC §13)', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let dir: string;
  let a: Arbiter;
  let b: Arbiter;

  before(async () => {
    db = await createTestDatabase();
    dir = policyDir();
    const env = { ARBITER_DATABASE_URL: db.url, ARBITER_POLICY_DIR: dir };
    [a, b] = await Promise.all([Arbiter.start(env), Arbiter.start(env)]);
  });
  after(async () => {
    await Promise.all([a?.close(), b?.close()]);
    await db?.drop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('allows exactly M of N concurrent requests split over both processes', async () => {
    const key = `k-${randomUUID()}`;
    const action = `spend-${randomUUID()}`;
    const body = spend(action, [{ key, window: '1h', max: 7 }]);
    const rs = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        call('POST', `${(i % 2 === 0 ? a : b).engine}/v1/agent/authorize`, { body }),
      ),
    );
    expect(tally(rs)).to.deep.equal({ 200: 7, 403: 33 });
    await expectAnswersRecorded(a.platform, action, rs);
    const usage = await call('GET', `${b.platform}/api/v1/limits?key=${key}`);
    expect(usage.json.limits[0]).to.include({ used: 7, max: 7, remaining: 0 });
  });
});

// The example policies in policies/ (budgets.rego, delegation.rego), live in the real service.
onEveryBackend('the example governance policies (policies/)', function () {
  this.timeout(120_000);
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => a?.close());

  const authorize = (body: unknown) => call('POST', `${a.engine}/v1/agent/authorize`, { body });

  it('charges finance-bot’s daily invoice spend and denies a payment over it', async () => {
    const pay = (amount: unknown) =>
      authorize({
        agent_id: 'finance-bot',
        action: 'invoices.pay',
        resource: 'invoices/i-1',
        confidence: 0.95,
        context: { amount },
      });
    expect((await pay(15_000)).status).to.equal(200);
    const over = await pay(6_000);
    expect(over.status).to.equal(403);
    expect(over.json.message).to.include('"agent:finance-bot:invoices.usd"').and.include('allows 20000');
    const unpriced = await pay('6000');
    expect(unpriced.status).to.equal(403);
    expect(unpriced.json.message).to.equal('invoices.pay requires a positive numeric context.amount');
    const usage = await call('GET', `${a.platform}/api/v1/limits?key=agent:finance-bot:invoices.usd`);
    expect(usage.json.limits[0]).to.include({ window: '24h', used: 15_000, max: 20_000, remaining: 5_000 });
    const count = await call('GET', `${a.platform}/api/v1/limits?key=agent:finance-bot:invoices.pay`);
    expect(count.json.limits[0]).to.include({ used: 1, max: 50 });
  });

  it('keeps each tenant’s finance-bot to its own budget (found by a tenancy probe)', async () => {
    // The counters were keyed by agent id alone: acme spending 20000 left globex's finance-bot
    // nothing, and globex's refusal named acme's counter.
    const acme = a.createKey('acme-finance', ['authorize'], { tenant: 'acme' });
    const globex = a.createKey('globex-finance', ['authorize'], { tenant: 'globex' });
    const pay = (key: string, amount: number) =>
      call('POST', `${a.engine}/v1/agent/authorize`, {
        key,
        body: {
          agent_id: 'finance-bot',
          action: 'invoices.pay',
          resource: 'invoices/t-1',
          confidence: 0.95,
          context: { amount },
        },
      });
    expect((await pay(acme, 20_000)).status).to.equal(200);
    const acmeOver = await pay(acme, 1);
    expect(acmeOver.status).to.equal(403);
    expect(acmeOver.json.message).to.include(JSON.stringify('agent:["acme","finance-bot"]:invoices.usd'));
    expect((await pay(globex, 10)).status).to.equal(200);
    const usage = (tenant: string) =>
      call(
        'GET',
        `${a.platform}/api/v1/limits?key=${encodeURIComponent(`agent:${JSON.stringify([tenant, 'finance-bot'])}:invoices.usd`)}`,
      );
    expect((await usage('acme')).json.limits[0]).to.include({ used: 20_000, remaining: 0 });
    expect((await usage('globex')).json.limits[0]).to.include({ used: 10, remaining: 19_990 });
  });

  it('answers the request_digest that the README recipe computes', async () => {
    const readme = readFileSync(path.join(REPO, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('## Governance: on behalf of'));
    const open = section.indexOf("```sh\nnode -e '") + '```sh\n'.length;
    const script = section.slice(open, section.indexOf('```\n', open));
    const r = spawnSync('bash', ['-c', script], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status, r.stderr).to.equal(0);
    const [canonical, digest] = r.stdout.trim().split('\n');
    const answer = await authorize({
      agent_id: 'deploy-bot',
      action: 'read',
      resource: 'repo/arbiter',
      confidence: 0.95,
    });
    expect(answer.json.request_digest).to.equal(digest).and.equal(digestOf(canonical!));
    // The README shows the output it promises.
    expect(script).to.include(`# ${canonical}`).and.include(`# ${digest}`);
  });

  it('decides deploy-bot on behalf of acme users by their roles, and never delegates delete', async () => {
    const obo = (user: string, action: string, resource: string) =>
      authorize({
        agent_id: 'deploy-bot',
        action,
        resource,
        confidence: 0.99,
        on_behalf_of: { tenant_id: 'acme', user_id: user },
      });
    expect((await obo('alice', 'read', 'repo/arbiter')).status).to.equal(200);
    const bob = await obo('bob', 'deploy', 'prod/api');
    expect(bob.status).to.equal(403);
    // The user's deny won, so it is named first (before the agent's "requires approval").
    expect(bob.json.message).to.match(
      /^on behalf of bob: no policy allows deploy on this resource; deploy to production requires approval$/,
    );
    const del = await obo('alice', 'delete', 'repo/old');
    expect(del.status).to.equal(403);
    expect(del.json.message).to.include('agent deploy-bot may not delete on behalf of a user');
    const usage = await call(
      'GET',
      `${a.platform}/api/v1/limits?key=${encodeURIComponent('delegated:["acme","alice"]')}`,
    );
    expect(usage.json.limits[0]).to.include({ window: '1h', used: 1, max: 1000 });
  });

  it('denies, never leaves unmetered, a payment or a delegated call whose budget data is missing', async () => {
    const document = async (name: string) =>
      (await call('GET', `${a.platform}/api/v1/data/${name}`)).json.value as Record<string, unknown>;
    const put = async (name: string, value: unknown) =>
      expect((await call('PUT', `${a.platform}/api/v1/data/${name}`, { body: value })).status).to.be.oneOf([
        200, 201,
      ]);
    const budgets = await document('budgets');
    const delegation = await document('delegation');
    try {
      // A renamed key (a typo in a data change) drops the value the limit's max reads.
      const { invoice_spend_per_day: spendPerDay, ...rest } = budgets;
      await put('budgets', { ...rest, invoice_spend_usd_per_day: spendPerDay });
      const pay = await authorize({
        agent_id: 'finance-bot',
        action: 'invoices.pay',
        resource: 'invoices/i-2',
        confidence: 0.95,
        context: { amount: 15_000_000 },
      });
      expect(pay.status, pay.text).to.equal(403);
      expect(pay.json.message).to.include('data.budgets.invoice_spend_per_day must be a number');
      const { calls_per_user_per_hour: _perHour, ...withoutRate } = delegation;
      await put('delegation', withoutRate);
      const obo = await authorize({
        agent_id: 'deploy-bot',
        action: 'read',
        resource: 'repo/arbiter',
        confidence: 0.99,
        on_behalf_of: { tenant_id: 'acme', user_id: 'carol' },
      });
      expect(obo.status, obo.text).to.equal(403);
      expect(obo.json.message).to.include('data.delegation.calls_per_user_per_hour must be a number');
      expect(
        (
          await call(
            'GET',
            `${a.platform}/api/v1/limits?key=${encodeURIComponent('delegated:["acme","carol"]')}`,
          )
        ).json.limits,
      ).to.deep.equal([]);
    } finally {
      await put('budgets', budgets);
      await put('delegation', delegation);
    }
  });
});

// Engines whose clocks disagree (test/fixtures/skew-clock.mjs), on one database, one after the
// other: the sweep the test needs is the one at start, and it runs the same on either backend.
onEveryBackend('budgets across engines with skewed clocks (SPEC §13)', function () {
  this.timeout(120_000);
  const HOUR_MS = 3600_000;
  let dir: string;
  const started: Arbiter[] = [];

  before(() => {
    dir = policyDir();
  });
  after(async () => {
    // The first instance owns the data directory and the database: closed last.
    for (const x of started.reverse()) await x.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** An engine whose clock is `offsetMs` ahead of this machine's, over `dataDir` if given. */
  const engine = async (offsetMs: number, dataDir?: string) => {
    const env = {
      ARBITER_POLICY_DIR: dir,
      NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'skew-clock.mjs')}`,
      TEST_CLOCK_OFFSET_MS: String(offsetMs),
    };
    const x = await Arbiter.start(env, dataDir);
    started.push(x);
    return x;
  };

  it('keeps a superseded window for an engine 10 minutes behind: a 1h budget of 3 allows 3', async () => {
    // `ahead` is 6 minutes into an hour, `behind` 10 minutes behind it, in the hour before.
    const boundary = Math.ceil(Date.now() / HOUR_MS) * HOUR_MS;
    const aheadBy = boundary + 6 * 60_000 - Date.now();
    const key = `skew-${randomUUID()}`;
    const charge = (x: Arbiter, limits: Limit[]) =>
      call('POST', `${x.engine}/v1/agent/authorize`, { body: spend('spend', limits) });
    const hourly = [{ key, window: '1h', max: 3 }];

    const behind = await engine(aheadBy - 10 * 60_000);
    const first = await Promise.all([1, 2, 3, 4].map(() => charge(behind, hourly)));
    expect(tally(first)).to.deep.equal({ 200: 3, 403: 1 });
    await behind.stop();

    // The engine ahead starts the next hour's counter, and one in 1 s windows that its next
    // start's sweep must delete (so the test knows that sweep has run).
    const ahead = await engine(aheadBy, behind.dataDir);
    expect((await charge(ahead, hourly)).status).to.equal(200);
    const canary = `${key}~canary`;
    expect((await charge(ahead, [{ key: canary, window: '1s', max: 1 }])).status).to.equal(200);
    await sleep(1_100);
    expect((await charge(ahead, [{ key: canary, window: '1s', max: 1 }])).status).to.equal(200);
    await sleep(1_100);
    const counters = (k: string) =>
      ahead.stored<{ window_start: string; used: number | string }>(
        'SELECT window_start, used FROM limit_counters WHERE key = $1 ORDER BY window_start',
        [k],
      );
    await ahead.restart();
    for (const deadline = Date.now() + 30_000; (await counters(canary)).length > 1 && Date.now() < deadline;)
      await sleep(100);
    expect(await counters(canary)).to.have.length(1);
    await sleep(500);
    // The previous hour's counter is kept: its successor began 6 minutes ago, less than a window.
    expect((await counters(key)).map((c) => Number(c.used))).to.deep.equal([3_000_000, 1_000_000]);
    await ahead.stop();

    // So the engine behind, still in that hour by its clock, finds it exhausted.
    const again = await engine(aheadBy - 10 * 60_000, behind.dataDir);
    const second = await Promise.all([1, 2, 3].map(() => charge(again, hourly)));
    expect(tally(second)).to.deep.equal({ 403: 3 });
  });
});
