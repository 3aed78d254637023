import { createHash } from 'node:crypto';
import { expect } from 'chai';
import { onceOnly, onEveryBackend, TEST_BACKEND } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditCount, auditEvents, call } from './helpers/harness.js';
import { denyReadsSlowOn, SLOW_ITEMS, SPIN, SPIN_ITEMS } from './helpers/policies.js';

/** A candidate that denies every read (the AGENT.allow example); its deny rule is on row 3. */
const DENY_READ = 'package authz.agent\n\ndeny contains "reads are switched off" if input.action == "read"\n';
/** Compiles, but every read fails at evaluation: `x` gets two values (an eval conflict). */
const CONFLICT =
  'package authz.agent\n\nx = 1 if input.action == "read"\n\nx = 2 if input.confidence > 0.1\n\ndeny contains "conflict" if x == 3\n';

/** Agrees with the live set on every reference request. */
const AGREE = 'package authz.agent\n\ndeny contains "never" if input.action == "never"\n';

// The shadow set is stored and shared by every process: every backend.
onEveryBackend('Shadow mode: candidate modules evaluated beside the live set, never answering', () => {
  let a: Arbiter;
  before(async () => {
    // These tests send thousands of decisions from the admin key, a third of them to review: far
    // past the default cap on one key's pending approvals (ADR 0013), which is not under test here.
    a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0' });
  });
  after(async () => {
    await a.close();
  });

  const putShadow = (
    name: string,
    body: unknown,
    opts: { key?: string; headers?: Record<string, string> } = {},
  ) => call('PUT', `${a.platform}/api/v1/policies/${name}?mode=shadow`, { body, ...opts });
  const dropShadow = (name: string) => call('DELETE', `${a.platform}/api/v1/policies/${name}?mode=shadow`);
  const report = async () => {
    const r = await call('GET', `${a.platform}/api/v1/shadow`);
    expect(r.status, r.text).to.equal(200);
    return r.json;
  };
  const authorize = async (body: unknown, status: number) => {
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body });
    expect(r.status, r.text).to.equal(status);
    return r.json.request_id as string;
  };
  const decisionEvent = async (id: string) => {
    const [e] = await auditEvents(a.platform, { request_id: id, kind: 'decision' });
    return e;
  };
  const live = async () => {
    const r = await call('GET', `${a.platform}/api/v1/policies`);
    return r.json;
  };
  /** The value of an unlabelled metric of the engine. */
  const metric = async (name: string): Promise<number> => {
    const r = await call('GET', `${a.engine}/metrics`);
    const m = new RegExp(`^${name} (\\d+)$`, 'm').exec(r.text);
    expect(m, `${name} is exposed`).to.not.equal(null);
    return Number(m?.[1]);
  };
  const shadowMetric = async (result: string): Promise<number> => {
    const r = await call('GET', `${a.engine}/metrics`);
    const m = new RegExp(`^arbiter_shadow_decisions_total\\{result="${result}"\\} (\\d+)$`, 'm').exec(r.text);
    return m ? Number(m[1]) : 0;
  };

  it('starts with an empty shadow set and no counts', async () => {
    expect(await report()).to.deep.equal({
      policies: [],
      since: null,
      decisions: 0,
      agree: 0,
      disagree: 0,
      errors: 0,
      changes: {},
      samples: [],
    });
  });

  it('stores a shadow module without changing the live set or any answer, and records disagreements', async () => {
    const before = await live();
    const put = await putShadow('deny-read', { rego: DENY_READ });
    expect(put.status, put.text).to.equal(201);
    expect(put.json).to.have.keys('mode', 'name', 'sha256', 'since');
    expect(put.json).to.deep.include({ mode: 'shadow', name: 'deny-read' });
    expect(put.json.sha256).to.match(/^[0-9a-f]{64}$/);
    expect(await live()).to.deep.equal(before);

    const allowed = await authorize(AGENT.allow, 200);
    const approval = await authorize(AGENT.approval, 202);
    const e1 = await decisionEvent(allowed);
    expect(e1.outcome).to.equal('allow');
    expect(e1.details.shadow_result).to.equal('disagree');
    expect(e1.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
    const e2 = await decisionEvent(approval);
    expect(e2.details.shadow_result).to.equal('agree');
    expect(e2.details).to.not.have.property('shadow');

    const r = await report();
    expect(r.policies).to.deep.equal([{ name: 'deny-read', sha256: put.json.sha256, since: put.json.since }]);
    expect(r.since).to.equal(put.json.since);
    expect(r).to.deep.include({
      decisions: 2,
      agree: 1,
      disagree: 1,
      errors: 0,
      changes: { 'allow→deny': 1 },
    });
    expect(r.samples).to.deep.equal([{ request_id: allowed, live: 'allow', shadow: 'deny' }]);
    expect(await shadowMetric('disagree')).to.equal(1);
    expect(await shadowMetric('agree')).to.equal(1);
  });

  it('counts afresh when the shadow set changes, and counts a failing shadow as an error, never answering', async () => {
    const put = await putShadow('deny-read', CONFLICT, { headers: { 'content-type': 'text/plain' } });
    expect(put.status, put.text).to.equal(200);
    expect((await report()).decisions).to.equal(0);
    const id = await authorize(AGENT.allow, 200);
    const e = await decisionEvent(id);
    expect(e.details.shadow_result).to.equal('error');
    expect(e.details.shadow.status).to.equal('deny');
    expect(e.details.shadow.message).to.match(/evaluation failed/);
    expect(await report()).to.deep.include({ decisions: 1, agree: 0, disagree: 0, errors: 1 });
    expect(await shadowMetric('error')).to.equal(1);
    // Back to the candidate of the next tests.
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(200);
  });

  it('counts every decision and keeps the newest 20 disagreements, stored with the decisions (also across a restart)', async () => {
    // A change starts a new tally: the same candidate, put again, counts afresh.
    expect((await putShadow('deny-read', { rego: DENY_READ + '\n# again\n' })).status).to.equal(200);
    expect((await report()).decisions).to.equal(0);
    // Earlier generations' tallies went with the change (the tests before counted some).
    expect(await a.count('shadow_tallies')).to.equal(0);
    expect(await a.count('shadow_samples')).to.equal(0);
    const disagreed: string[] = [];
    for (let i = 0; i < 25; i++) disagreed.push(await authorize(AGENT.allow, 200));
    for (let i = 0; i < 3; i++) await authorize(AGENT.approval, 202);
    const r = await report();
    expect(r).to.deep.include({
      decisions: 28,
      agree: 3,
      disagree: 25,
      errors: 0,
      changes: { 'allow→deny': 25 },
    });
    expect(r.samples.map((x: { request_id: string }) => x.request_id)).to.deep.equal(
      disagreed.slice(-20).reverse(),
    );
    expect(r.samples[0]).to.deep.equal({ request_id: disagreed[24], live: 'allow', shadow: 'deny' });
    // Only the newest 20 are kept.
    expect(await a.count('shadow_samples')).to.equal(20);
    await a.restart();
    expect(await report()).to.deep.equal(r);
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(200);
    expect(await a.count('shadow_tallies')).to.equal(0);
    expect(await a.count('shadow_samples')).to.equal(0);
  });

  it('refuses bad shadow input with the right status and changes nothing', async () => {
    const reader = a.createKey('shadow-reader', ['policies:read']);
    const auditor = a.createKey('shadow-auditor', ['audit:read']);
    const before = { live: await live(), shadow: await report(), audit: await auditCount(a.platform) };
    const broken = await putShadow('broken', {
      rego: 'package authz.agent\n\ndeny contains "x" if no_such_function(input.action)\n',
    });
    expectError(broken, 400, /^policy set does not compile: policy broken:3:\d+: .*no_such_function/);
    expectError(await putShadow('Bad Name', { rego: DENY_READ }), 400, /invalid policy name/);
    expectError(await putShadow('authz', { rego: DENY_READ }), 400, /reserved/);
    expectError(await putShadow('x', { rego: 42 }), 400, /rego/);
    expectError(await putShadow('x', { description: 'no rego' }), 400, /rego/);
    expectError(
      await call('PUT', `${a.platform}/api/v1/policies/x?mode=shadow`, {
        raw: '{"rego": ',
        headers: { 'content-type': 'application/json' },
      }),
      400,
      /malformed JSON/,
    );
    expectError(
      await call('PUT', `${a.platform}/api/v1/policies/x?mode=live`, { body: { rego: DENY_READ } }),
      400,
      /mode/,
    );
    expectError(await putShadow('x', { rego: DENY_READ }, { headers: { 'if-match': '*' } }), 400, /If-Match/);
    expectError(await dropShadow('not-shadowed'), 404, 'policy not-shadowed is not in the shadow set');
    expectError(
      await call('POST', `${a.platform}/api/v1/policies/not-shadowed/promote`),
      404,
      'policy not-shadowed is not in the shadow set',
    );
    expectError(
      await putShadow('x', { rego: DENY_READ }, { key: reader }),
      403,
      'API key lacks scope policies:write',
    );
    expectError(
      await call('GET', `${a.platform}/api/v1/shadow`, { key: auditor }),
      403,
      'API key lacks scope policies:read',
    );
    expect({ live: await live(), shadow: await report(), audit: await auditCount(a.platform) }).to.deep.equal(
      before,
    );
  });

  it('a dry run compiles the shadow candidate and stores nothing', async () => {
    const before = await report();
    const r = await call('PUT', `${a.platform}/api/v1/policies/other?mode=shadow&dry_run=true`, {
      body: { rego: DENY_READ.replace('reads', 'all reads') },
    });
    expect(r.status, r.text).to.equal(200);
    expect(r.json).to.deep.include({ dry_run: true, compiled: true, mode: 'shadow', name: 'other' });
    expect(await report()).to.deep.equal(before);
  });

  it('promotes a shadow module: it goes live as a normal change and leaves the shadow set', async () => {
    const revision = (await live()).revision as number;
    const r = await call('POST', `${a.platform}/api/v1/policies/deny-read/promote`);
    expect(r.status, r.text).to.equal(201);
    expect(r.json).to.deep.include({ name: 'deny-read', revision: revision + 1 });
    expect(r.headers.get('etag')).to.be.a('string');
    const after = await live();
    expect(after.revision).to.equal(revision + 1);
    expect(after.policies.map((p: { name: string }) => p.name)).to.include('deny-read');
    expect((await report()).policies).to.deep.equal([]);
    // The live answer changed; no shadow is evaluated any more.
    const id = await authorize(AGENT.allow, 403);
    expect((await decisionEvent(id)).details).to.not.have.property('shadow_result');
    const events = await auditEvents(a.platform, { kind: 'policy.shadow.promote' });
    expect(events).to.have.length(1);
    expect((await call('DELETE', `${a.platform}/api/v1/policies/deny-read`)).status).to.equal(204);
  });

  it('promotes only if If-Match holds on the live policy, and of concurrent promotions exactly one wins', async () => {
    const denyAll = 'package authz.agent\n\ndeny contains "all switched off" if input.action == "delete"\n';
    expect(
      (await call('PUT', `${a.platform}/api/v1/policies/deny-read`, { body: { rego: denyAll } })).status,
    ).to.equal(201);
    const current = await call('GET', `${a.platform}/api/v1/policies/deny-read`);
    const etag = current.headers.get('etag') as string;
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(201);
    try {
      const before = await live();
      const promotes = (await auditEvents(a.platform, { kind: 'policy.shadow.promote' })).length;
      const promote = (headers: Record<string, string> = {}) =>
        call('POST', `${a.platform}/api/v1/policies/deny-read/promote`, { headers });
      for (const stale of ['"1-0000000000000000"', 'bogus', '"2-' + 'f'.repeat(16) + '"']) {
        expectError(await promote({ 'if-match': stale }), 412, /If-Match/);
      }
      // Nothing changed: the live set, the shadow set, the trail.
      expect(await live()).to.deep.equal(before);
      expect((await report()).policies.map((p: { name: string }) => p.name)).to.deep.equal(['deny-read']);
      expect(await auditEvents(a.platform, { kind: 'policy.shadow.promote' })).to.have.length(promotes);

      const all = await Promise.all([1, 2, 3].map(() => promote({ 'if-match': etag })));
      const statuses = all.map((r) => r.status).sort();
      expect(statuses, all.map((r) => r.text).join('\n')).to.deep.equal([200, 404, 404]);
      for (const r of all.filter((x) => x.status === 404)) expectError(r, 404, /not in the shadow set/);
      const after = await live();
      expect(after.revision).to.equal(before.revision + 1);
      expect((await report()).policies).to.deep.equal([]);
      expect(await auditEvents(a.platform, { kind: 'policy.shadow.promote' })).to.have.length(promotes + 1);
      const promoted = await call('GET', `${a.platform}/api/v1/policies/deny-read`);
      expect(promoted.json.rego).to.equal(DENY_READ);
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/deny-read`)).status).to.equal(204);
      await dropShadow('deny-read');
    }
  });

  it('counts afresh after a live change: the shadow set is the live set with the shadow modules in it', async () => {
    const put = await putShadow('deny-read', { rego: DENY_READ });
    expect(put.status, put.text).to.equal(201);
    try {
      await authorize(AGENT.allow, 200);
      const counted = await report();
      expect(counted).to.deep.include({ decisions: 1, disagree: 1 });
      expect(counted.samples).to.have.length(1);
      const unrelated = 'package authz.agent\n\ndeny contains "never" if input.action == "never-ever"\n';
      expect(
        (await call('PUT', `${a.platform}/api/v1/policies/unrelated`, { body: { rego: unrelated } })).status,
      ).to.equal(201);
      const fresh = await report();
      expect(fresh).to.deep.include({
        decisions: 0,
        agree: 0,
        disagree: 0,
        errors: 0,
        changes: {},
        samples: [],
      });
      expect(Date.parse(fresh.since)).to.be.greaterThan(Date.parse(counted.since));
      // The module's own `since` is when it entered the shadow set.
      expect(fresh.policies).to.deep.equal(counted.policies);
      await authorize(AGENT.allow, 200);
      expect(await report()).to.deep.include({ decisions: 1, disagree: 1 });
      expect((await call('DELETE', `${a.platform}/api/v1/policies/unrelated`)).status).to.equal(204);
      expect((await report()).decisions).to.equal(0);
    } finally {
      await dropShadow('deny-read');
    }
  });

  it('drops a shadow module with DELETE ?mode=shadow', async () => {
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(201);
    const before = await live();
    const r = await dropShadow('deny-read');
    expect(r.status, r.text).to.equal(204);
    expect(await live()).to.deep.equal(before);
    expect((await report()).policies).to.deep.equal([]);
    const id = await authorize(AGENT.allow, 200);
    expect((await decisionEvent(id)).details).to.not.have.property('shadow_result');
    expectError(await dropShadow('deny-read'), 404);
  });

  it('records each shadow change as an audit event before answering: who, which policy, what went in', async () => {
    const count = async (kind: string) => (await auditEvents(a.platform, { kind })).length;
    const [puts, drops] = [await count('policy.shadow.put'), await count('policy.shadow.delete')];
    const writer = a.createKey('shadow-writer', ['policies:write', 'policies:read']);
    const put = await putShadow('audited-shadow', { rego: DENY_READ }, { key: writer });
    expect(put.status, put.text).to.equal(201);
    const [putEvent] = await auditEvents(a.platform, { kind: 'policy.shadow.put' });
    expect(putEvent).to.deep.include({ actor: 'shadow-writer', resource: 'audited-shadow' });
    expect(putEvent.details.sha256).to.equal(put.json.sha256);
    expect(putEvent.details.sha256).to.equal(createHash('sha256').update(DENY_READ).digest('hex'));
    // A dry run and a refused candidate record nothing.
    const dry = await call('PUT', `${a.platform}/api/v1/policies/audited-shadow?mode=shadow&dry_run=true`, {
      body: { rego: DENY_READ },
    });
    expect(dry.status, dry.text).to.equal(200);
    expectError(await putShadow('audited-shadow', { rego: 'package authz.agent\n\ndeny contains' }), 400);
    expect(await count('policy.shadow.put')).to.equal(puts + 1);

    const drop = await call('DELETE', `${a.platform}/api/v1/policies/audited-shadow?mode=shadow`, {
      key: writer,
    });
    expect(drop.status, drop.text).to.equal(204);
    const [dropEvent] = await auditEvents(a.platform, { kind: 'policy.shadow.delete' });
    expect(dropEvent).to.deep.include({ actor: 'shadow-writer', resource: 'audited-shadow' });
    // Dropping what is not shadowed (404) records nothing.
    expectError(await dropShadow('audited-shadow'), 404);
    expect(await count('policy.shadow.delete')).to.equal(drops + 1);
  });

  it("shows a tenant-bound key the counts over every decision but only its own tenant's samples", async () => {
    const denyAll = 'package authz.human\n\ndeny contains "switched off" if true\n';
    expect((await putShadow('deny-human', { rego: denyAll })).status).to.equal(201);
    const human = async (tenant: string, user: string) => {
      const r = await call('POST', `${a.engine}/v1/authorize`, {
        body: { tenant_id: tenant, user_id: user, action: 'read', resource: { type: 'project', id: 'p1' } },
      });
      expect(r.status, r.text).to.equal(200);
      return r.json.request_id as string;
    };
    const acmeId = await human('acme', 'alice');
    const globexId = await human('globex', 'dave');
    const all = await report();
    expect(all.disagree).to.equal(2);
    expect(all.samples.map((x: { request_id: string }) => x.request_id)).to.have.members([acmeId, globexId]);

    const acme = a.createKey('shadow-acme', ['policies:read'], { tenant: 'acme' });
    const bound = await call('GET', `${a.platform}/api/v1/shadow`, { key: acme });
    expect(bound.status, bound.text).to.equal(200);
    expect({ ...bound.json, samples: [] }).to.deep.equal({ ...all, samples: [] });
    expect(bound.json.samples.map((x: { request_id: string }) => x.request_id)).to.deep.equal([acmeId]);
    expect((await dropShadow('deny-human')).status).to.equal(204);
  });

  it("reports a budget's deny as the live policy's allow it replaced: the policies' answers are compared", async () => {
    // A live module giving requests with context.budgeted a budget of one per window (366 days,
    // so that the two requests below do not straddle a window's start): the second is denied by it.
    const LIMIT =
      'package authz.agent\n\nlimits contains {"key": "shadow-test-reads", "window": "8784h", "max": 1} if input.context.budgeted == true\n';
    const put = await call('PUT', `${a.platform}/api/v1/policies/shadow-budget`, { body: { rego: LIMIT } });
    expect(put.status, put.text).to.equal(201);
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(201);
    try {
      const body = { ...AGENT.allow, context: { budgeted: true } };
      const first = await authorize(body, 200);
      const second = await authorize(body, 403);
      const e2 = await decisionEvent(second);
      expect(e2.outcome).to.equal('deny');
      expect(e2.details.reasons).to.deep.equal(['limit_exhausted']);
      expect(e2.details.shadow_result).to.equal('disagree');
      expect(e2.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
      const r = await report();
      expect(r).to.deep.include({ decisions: 2, agree: 0, disagree: 2, errors: 0 });
      // Not "deny→deny": the policies disagreed, and the budget's deny replaced the live allow.
      expect(r.changes).to.deep.equal({ 'allow→deny': 2 });
      expect(r.samples).to.deep.equal([
        { request_id: second, live: 'allow', shadow: 'deny' },
        { request_id: first, live: 'allow', shadow: 'deny' },
      ]);
    } finally {
      expect((await dropShadow('deny-read')).status).to.equal(204);
      expect((await call('DELETE', `${a.platform}/api/v1/policies/shadow-budget`)).status).to.equal(204);
    }
  });

  it('counts a candidate whose `limits` are malformed as the fail-closed deny it would answer live, not as agreeing', async () => {
    // Compiles, and answers allow for reads, but its limit cannot be charged: live, the engine
    // answers that allow with a deny naming the limit. The shadow must report what a promotion does.
    const BAD_LIMIT =
      'package authz.agent\n\nlimits contains {"key": "k", "window": "forever", "max": 1} if input.action == "read"\n';
    expect((await putShadow('bad-limit', { rego: BAD_LIMIT })).status).to.equal(201);
    try {
      const read = await decisionEvent(await authorize(AGENT.allow, 200));
      expect(read.outcome).to.equal('allow');
      expect(read.details.shadow_result).to.equal('error');
      expect(read.details.shadow.status).to.equal('deny');
      expect(read.details.shadow.message).to.match(/^invalid limit: limit "k": window "forever"/);
      // A decision the candidate declares no limit on agrees as before.
      const held = await decisionEvent(await authorize(AGENT.approval, 202));
      expect(held.details.shadow_result).to.equal('agree');
      expect(await report()).to.deep.include({ decisions: 2, agree: 1, disagree: 0, errors: 1, changes: {} });
    } finally {
      expect((await dropShadow('bad-limit')).status).to.equal(204);
    }
  });

  it('answers a decision made right after a shadow change with the new set, also while its thread starts', async () => {
    const shadowOf = async (body: unknown, status: number) =>
      (await decisionEvent(await authorize(body, status))).details.shadow_result as string | undefined;
    for (let i = 0; i < 3; i++) {
      // No shadow set: no thread. This put starts one; its load may still run when the decision
      // arrives there, and the decision waits for it.
      expect((await putShadow('flip', { rego: DENY_READ })).status).to.equal(201);
      expect(await shadowOf(AGENT.allow, 200)).to.equal('disagree');
      // The running thread gets a new set: the next decision is answered by it, never the old one.
      expect((await putShadow('flip', { rego: AGREE })).status).to.equal(200);
      expect(await shadowOf(AGENT.allow, 200)).to.equal('agree');
      expect((await putShadow('flip', { rego: DENY_READ })).status).to.equal(200);
      expect(await shadowOf(AGENT.allow, 200)).to.equal('disagree');
      // A live change rebuilds the shadow set in the thread too.
      const put = await call('PUT', `${a.platform}/api/v1/policies/flip`, { body: { rego: DENY_READ } });
      expect(put.status, put.text).to.equal(201);
      expect(await shadowOf(AGENT.allow, 403)).to.equal('agree');
      expect((await call('DELETE', `${a.platform}/api/v1/policies/flip`)).status).to.equal(204);
      expect(await shadowOf(AGENT.allow, 200)).to.equal('disagree');
      expect((await dropShadow('flip')).status).to.equal(204);
      expect(await shadowOf(AGENT.allow, 200)).to.equal(undefined);
    }
  });

  it('evaluates a set proven on its thread beside the live set, and sends it back when an evaluation is slow', async () => {
    const inlineMetric = () => metric('arbiter_shadow_inline');
    const sentBackMetric = () => metric('arbiter_shadow_sent_back_total');
    // Denies reads at once; takes ~25 ms (700² comparisons, well under the eval budget) on a read
    // of repo/slow, over what the serving thread may spend on a shadow evaluation (5 ms).
    const candidate = denyReadsSlowOn('reads are switched off', 'repo/slow');
    const data = await call('PUT', `${a.platform}/api/v1/data/slow`, { body: { items: SLOW_ITEMS } });
    expect(data.status, data.text).to.equal(201);
    try {
      expect((await putShadow('proving', { rego: candidate })).status).to.equal(201);
      expect(await inlineMetric()).to.equal(0);
      // 1 000 decisions in a row answered quickly by its thread prove it (shadow-runner.ts); a
      // slow answer there (a pause of this machine) starts the count again: send until it moved.
      let sent = 0;
      /** Sends decisions, half reads, until the set moved (never before `min` of them). */
      const untilInline = async (min: number) => {
        const from = sent;
        while (sent - from < 10_000 && (sent - from < min || (await inlineMetric()) === 0)) {
          await Promise.all(
            Array.from({ length: 20 }, (_, i) =>
              (sent + i) % 2 ? authorize(AGENT.allow, 200) : authorize(AGENT.approval, 202),
            ),
          );
          sent += 20;
          if (sent - from < min) expect(await inlineMetric(), `after ${sent}`).to.equal(0);
        }
        expect(await inlineMetric()).to.equal(1);
      };
      await untilInline(1000);
      // Evaluated inline now, and recorded exactly as before.
      const read = await decisionEvent(await authorize(AGENT.allow, 200));
      expect(read.details.shadow_result).to.equal('disagree');
      expect(read.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
      expect((await decisionEvent(await authorize(AGENT.approval, 202))).details.shadow_result).to.equal(
        'agree',
      );
      // One slow evaluation on the serving thread, its answer recorded: its thread evaluates the
      // input again, finds it slow too, and the set goes back there. (Should a pause of this
      // machine have sent it back meanwhile, it proves itself again first.)
      await untilInline(0);
      const sentBackBefore = await sentBackMetric();
      const keptBefore = await metric('arbiter_shadow_slow_kept_total');
      const slow = { ...AGENT.allow, resource: 'repo/slow' };
      const first = await decisionEvent(await authorize(slow, 200));
      expect(first.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
      for (let i = 0; i < 200 && (await inlineMetric()) !== 0; i++)
        await new Promise((r) => setTimeout(r, 25));
      expect(await inlineMetric()).to.equal(0);
      // Exactly one: the only evaluation between the two reads is the slow one, made inline.
      expect(await sentBackMetric()).to.equal(sentBackBefore + 1);
      expect(await metric('arbiter_shadow_slow_kept_total')).to.equal(keptBefore);
      expect((await decisionEvent(await authorize(slow, 200))).details.shadow_result).to.equal('disagree');
      expect(await inlineMetric()).to.equal(0);
      expect(await report()).to.deep.include({
        decisions: sent + 4,
        agree: sent / 2 + 1,
        disagree: sent / 2 + 3,
        errors: 0,
      });
      // Dropping the set: nothing is shadowed, on any thread.
      expect((await dropShadow('proving')).status).to.equal(204);
      expect(await inlineMetric()).to.equal(0);
    } finally {
      await dropShadow('proving');
      expect((await call('DELETE', `${a.platform}/api/v1/data/slow`)).status).to.be.oneOf([200, 204]);
    }
  });

  it('evaluates a proven set in one pass with the live set once paired, recording exactly what the two would, and pairs again after a live change', async () => {
    let sent = 0;
    /** Sends decisions, a third each of allow, approval and deny, until `done` (never before `min`). */
    const until = async (done: () => Promise<boolean>, min = 0) => {
      const from = sent;
      while (sent - from < min || !(await done())) {
        expect(sent - from, 'decisions sent waiting').to.be.below(10_000);
        await Promise.all(
          Array.from({ length: 21 }, (_, i) =>
            [
              () => authorize(AGENT.allow, 200),
              () => authorize(AGENT.approval, 202),
              () => authorize(AGENT.deny, 403),
            ][i % 3]!(),
          ),
        );
        sent += 21;
      }
    };
    const paired = async () => (await metric('arbiter_shadow_paired')) === 1;
    const differedBefore = await metric('arbiter_shadow_pair_differed_total');
    try {
      expect((await putShadow('paired', { rego: DENY_READ })).status).to.equal(201);
      expect(await metric('arbiter_shadow_paired')).to.equal(0);
      // Proven on its thread (1 000 decisions), then paired once its paired module is built; the
      // first 1 000 paired answers are also checked against the two sets evaluated apart.
      await until(paired, 1000);
      await until(async () => true, 1100);
      // (Should a pause of this machine have sent it back to its thread meanwhile, it proves
      // itself again and is paired again; a paired answer that differed drops the pair for good.)
      await until(paired);
      expect(await metric('arbiter_shadow_pair_differed_total')).to.equal(differedBefore);
      // Recorded as the two sets on their own record it.
      const read = await decisionEvent(await authorize(AGENT.allow, 200));
      expect(read.details.shadow_result).to.equal('disagree');
      expect(read.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
      const held = await decisionEvent(await authorize(AGENT.approval, 202));
      expect(held.details.shadow_result).to.equal('agree');
      expect(held.details).to.not.have.property('shadow');
      expect(held.outcome).to.equal('requires_approval');
      expect(await report()).to.deep.include({
        decisions: sent + 2,
        agree: (2 * sent) / 3 + 1,
        disagree: sent / 3 + 1,
        errors: 0,
        changes: { 'allow→deny': sent / 3 + 1 },
      });
      expect(await metric('arbiter_shadow_pair_differed_total')).to.equal(differedBefore);
      // A live change rebuilds the shadow set: on its thread again, then paired with the new live set.
      const put = await call('PUT', `${a.platform}/api/v1/policies/paired-live`, {
        body: { rego: 'package authz.agent\n\ndeny contains "no exports" if input.action == "export"\n' },
      });
      expect(put.status, put.text).to.equal(201);
      expect(await metric('arbiter_shadow_paired')).to.equal(0);
      await until(paired, 1000);
      const again = await decisionEvent(await authorize(AGENT.allow, 200));
      expect(again.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
    } finally {
      await dropShadow('paired');
      await call('DELETE', `${a.platform}/api/v1/policies/paired-live`);
    }
    expect(await metric('arbiter_shadow_paired')).to.equal(0);
  });

  it('evaluates a proven set it cannot pair (`with` on data in a new rule) on its own, recorded the same', async () => {
    // `with` on data in a rule the copy would hold: the copy cannot replace what the live rules read.
    const WITH_DATA =
      'package authz.agent\n\ndeny contains "reads are switched off" if {\n\tinput.action == "read"\n' +
      '\tnot data.authz.agent.allow with data.agents as {}\n}\n';
    try {
      expect((await putShadow('with-data', { rego: WITH_DATA })).status).to.equal(201);
      let sent = 0;
      while (sent < 1000 || (await metric('arbiter_shadow_inline')) === 0) {
        expect(sent).to.be.below(10_000);
        await Promise.all(Array.from({ length: 20 }, () => authorize(AGENT.approval, 202)));
        sent += 20;
      }
      const read = await decisionEvent(await authorize(AGENT.allow, 200));
      expect(read.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
      // Beside the live set, but never paired: not even once a paired module would long be built.
      await new Promise((r) => setTimeout(r, 2000));
      await Promise.all(Array.from({ length: 20 }, () => authorize(AGENT.approval, 202)));
      expect(await metric('arbiter_shadow_paired')).to.equal(0);
      expect((await report()).errors).to.equal(0);
    } finally {
      await dropShadow('with-data');
    }
  });

  it('counts a shadow evaluation that never finishes as a timeout error, answers live, skips the set for a second, and restarts its thread', async () => {
    const data = await call('PUT', `${a.platform}/api/v1/data/spin`, { body: { items: SPIN_ITEMS } });
    expect(data.status, data.text).to.equal(201);
    try {
      expect((await putShadow('spin', { rego: SPIN })).status).to.equal(201);
      const errors = await shadowMetric('error');
      // The live answer is the live set's, recorded and answered after the shadow timed out.
      const stuck = await authorize(AGENT.allow, 200);
      const e = await decisionEvent(stuck);
      expect(e.outcome).to.equal('allow');
      expect(e.details.shadow_result).to.equal('error');
      expect(e.details.shadow.status).to.equal('deny');
      expect(e.details.shadow.message).to.match(/^the shadow set did not answer within \d+ ms$/);
      expect(await shadowMetric('error')).to.equal(errors + 1);
      expect(await report()).to.deep.include({ decisions: 1, errors: 1 });
      // For a second the set is not evaluated at all: the next decisions wait for nothing and
      // count an error (a slow or stuck candidate would otherwise cost every decision the wait).
      const skippedAt = Date.now();
      const skipped = await decisionEvent(await authorize(AGENT.approval, 202));
      expect(skipped.details.shadow_result).to.equal('error');
      expect(skipped.details.shadow.message).to.equal(
        'not evaluated: the shadow set timed out and is skipped for 1 s',
      );
      expect(await shadowMetric('error')).to.equal(errors + 2);
      // Then the stuck thread has been terminated, and the next decision starts a new one with the
      // same set, which answers that request in time.
      await new Promise((r) => setTimeout(r, Math.max(0, 1_100 - (Date.now() - skippedAt))));
      expect((await decisionEvent(await authorize(AGENT.approval, 202))).details.shadow_result).to.equal(
        'agree',
      );
      expect(await shadowMetric('error')).to.equal(errors + 2);
      expect(await report()).to.deep.include({ decisions: 3, errors: 2 });
    } finally {
      expect((await dropShadow('spin')).status).to.equal(204);
      expect((await call('DELETE', `${a.platform}/api/v1/data/spin`)).status).to.be.oneOf([200, 204]);
    }
  });

  it('follows the live set: rebuilt on every live change, an error while the two do not compile together', async () => {
    expect((await putShadow('deny-read', { rego: DENY_READ })).status).to.equal(201);
    const denyDeploy = 'package authz.agent\n\ndeny contains "deploys are off" if input.action == "deploy"\n';
    expect(
      (await call('PUT', `${a.platform}/api/v1/policies/deny-deploy`, { body: { rego: denyDeploy } })).status,
    ).to.equal(201);
    try {
      // Live and shadow both hold deny-deploy now: they agree on the deploy.
      const id = await authorize(AGENT.approval, 403);
      expect((await decisionEvent(id)).details.shadow_result).to.equal('agree');

      // A live policy that clashes with the shadow module: the live change goes through, the
      // shadow set cannot be built, and every decision counts a shadow error.
      expect(
        (await putShadow('deny-read', { rego: 'package authz.agent\n\nflag(x) := x\n' })).status,
      ).to.equal(200);
      const clash = await call('PUT', `${a.platform}/api/v1/policies/clash`, {
        body: { rego: 'package authz.agent\n\nflag := 2\n' },
      });
      expect(clash.status, clash.text).to.equal(201);
      const broken = await authorize(AGENT.allow, 200);
      const e = await decisionEvent(broken);
      expect(e.details.shadow_result).to.equal('error');
      expect(e.details.shadow.message).to.match(/^the shadow set cannot be evaluated: /);
      expect((await call('DELETE', `${a.platform}/api/v1/policies/clash`)).status).to.equal(204);
      const fixed = await authorize(AGENT.allow, 200);
      expect((await decisionEvent(fixed)).details.shadow_result).to.equal('agree');
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/policies/deny-deploy`)).status).to.equal(204);
      expect((await dropShadow('deny-read')).status).to.equal(204);
    }
  });

  it('is shared by every serving process', async () => {
    // Several workers on one SQLite file relay changes; on PostgreSQL a second instance shares the database too.
    const b = await Arbiter.start({ ARBITER_WORKERS: '2' });
    const c = TEST_BACKEND === 'postgres' ? await Arbiter.start({}, b.dataDir) : undefined;
    /** Waits (≤ 5 s) until `x` answers with the shadow result `want`. */
    const settle = async (x: Arbiter, want: string | undefined) => {
      const deadline = Date.now() + 5000;
      for (;;) {
        const r = await call('POST', `${x.engine}/v1/agent/authorize`, { body: AGENT.allow });
        const [e] = await auditEvents(b.platform, {
          request_id: r.json.request_id as string,
          kind: 'decision',
        });
        if (e.details.shadow_result === want) return;
        expect(Date.now(), 'the other instance never loaded the change').to.be.below(deadline);
        await new Promise((done) => setTimeout(done, 100));
      }
    };
    try {
      const put = await call('PUT', `${b.platform}/api/v1/policies/deny-read?mode=shadow`, {
        body: { rego: DENY_READ },
      });
      expect(put.status, put.text).to.equal(201);
      // Another instance learns of a change by notification (or its once-a-second re-read).
      if (c) await settle(c, 'disagree');
      const ids: string[] = [];
      for (const engine of [b.engine, ...(c ? [c.engine] : [])]) {
        for (let i = 0; i < 8; i++) {
          const r = await call('POST', `${engine}/v1/agent/authorize`, { body: AGENT.allow });
          expect(r.status, r.text).to.equal(200);
          ids.push(r.json.request_id as string);
        }
      }
      const events = await auditEvents(b.platform, { kind: 'decision' });
      const byId = new Map(events.map((e) => [e.request_id as string, e]));
      for (const id of ids) expect(byId.get(id)?.details.shadow_result, id).to.equal('disagree');
      expect((await call('DELETE', `${b.platform}/api/v1/policies/deny-read?mode=shadow`)).status).to.equal(
        204,
      );
      if (c) await settle(c, undefined);
      for (const engine of [b.engine, ...(c ? [c.engine] : [])]) {
        for (let i = 0; i < 4; i++) {
          const r = await call('POST', `${engine}/v1/agent/authorize`, { body: AGENT.allow });
          const [e] = await auditEvents(b.platform, {
            request_id: r.json.request_id as string,
            kind: 'decision',
          });
          expect(e.details, engine).to.not.have.property('shadow_result');
        }
      }
    } finally {
      await c?.close();
      await b.close();
    }
  });
});

// A process setting, no storage of its own: once (SQLite run).
onceOnly('ARBITER_SHADOW_INLINE=false: the shadow set stays on its own thread', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_SHADOW_INLINE: 'false', ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0' });
  });
  after(async () => {
    await a.close();
  });

  it('never moves a proven set to the serving thread (twice the decisions that prove one), nor pairs it', async () => {
    const put = await call('PUT', `${a.platform}/api/v1/policies/deny-read?mode=shadow`, {
      body: { rego: DENY_READ },
    });
    expect(put.status, put.text).to.equal(201);
    for (let sent = 0; sent < 2000; sent += 20) {
      await Promise.all(
        Array.from({ length: 20 }, async () => {
          const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
          expect(r.status, r.text).to.equal(200);
        }),
      );
    }
    const r = await call('GET', `${a.platform}/api/v1/shadow`);
    expect(r.json).to.deep.include({ decisions: 2000, disagree: 2000, errors: 0 });
    const metrics = await call('GET', `${a.engine}/metrics`);
    expect(metrics.text).to.match(/^arbiter_shadow_inline 0$/m);
    expect(metrics.text).to.match(/^arbiter_shadow_paired 0$/m);
  });
});

onceOnly('ARBITER_SHADOW_PAIRED=false: a proven shadow set is evaluated beside the live set, apart', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_SHADOW_PAIRED: 'false', ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0' });
  });
  after(async () => {
    await a.close();
  });

  it('moves a proven set to the serving thread but never pairs it with the live set', async () => {
    const gauge = async (name: string) =>
      Number(new RegExp(`^${name} (\\d+)$`, 'm').exec((await call('GET', `${a.engine}/metrics`)).text)?.[1]);
    const put = await call('PUT', `${a.platform}/api/v1/policies/deny-read?mode=shadow`, {
      body: { rego: DENY_READ },
    });
    expect(put.status, put.text).to.equal(201);
    let sent = 0;
    while (sent < 1000 || (await gauge('arbiter_shadow_inline')) === 0) {
      expect(sent).to.be.below(10_000);
      await Promise.all(
        Array.from({ length: 20 }, async () => {
          const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
          expect(r.status, r.text).to.equal(200);
        }),
      );
      sent += 20;
    }
    // Long enough for a paired module to have been built, were it built.
    await new Promise((r) => setTimeout(r, 2000));
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    const [e] = await auditEvents(a.platform, { request_id: r.json.request_id, kind: 'decision' });
    expect(e.details.shadow).to.deep.equal({ status: 'deny', message: 'reads are switched off' });
    expect(await gauge('arbiter_shadow_paired')).to.equal(0);
  });
});
