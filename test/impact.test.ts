import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { SPIN, SPIN_ITEMS, SPIN_THRESHOLDS } from './helpers/policies.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditCount, call, HUMAN } from './helpers/harness.js';

/** A candidate that denies every read (the AGENT.allow example). */
const DENY_READ = 'package authz.agent\n\ndeny contains "reads are switched off" if input.action == "read"\n';
/** A candidate that does not compile: the error is on row 3. */
const BROKEN = 'package authz.agent\n\ndeny contains "x" if no_such_function(input.action)\n';

// Impact replays decisions recorded in the audit trail of each backend.
onEveryBackend('POST /api/v1/impact: replay recorded decisions against a candidate set', () => {
  let a: Arbiter;
  /** Request ids of the recorded decisions, by the example they came from. */
  const ids: Record<string, string[]> = { allow: [], approval: [], deny: [], low: [], human: [] };

  before(async () => {
    a = await Arbiter.start();
    const record = async (name: string, url: string, body: unknown, status: number) => {
      const r = await call('POST', url, { body });
      expect(r.status, r.text).to.equal(status);
      ids[name]?.push(r.json.request_id as string);
    };
    for (let i = 0; i < 3; i++) await record('allow', `${a.engine}/v1/agent/authorize`, AGENT.allow, 200);
    await record('approval', `${a.engine}/v1/agent/authorize`, AGENT.approval, 202);
    await record('deny', `${a.engine}/v1/agent/authorize`, AGENT.deny, 403);
    await record('low', `${a.engine}/v1/agent/authorize`, AGENT.lowConfidence, 403);
    await record('human', `${a.engine}/v1/authorize`, HUMAN.allow, 200);
  });
  after(async () => {
    await a.close();
  });

  const impact = (body: unknown, key?: string) => call('POST', `${a.platform}/api/v1/impact`, { body, key });

  /** What impact must never move: the revision, the policies, the data, the audit trail. */
  const observable = async () => {
    const policies = await call('GET', `${a.platform}/api/v1/policies`);
    const data = await call('GET', `${a.platform}/api/v1/data`);
    return { policies: policies.json, data: data.json, audit: await auditCount(a.platform) };
  };

  it('counts the recorded decisions a candidate policy changes, with samples, and changes nothing', async () => {
    const before = await observable();
    const r = await impact({ policies: { 'deny-read': DENY_READ } });
    expect(r.status, r.text).to.equal(200);
    expect(r.json).to.have.keys('replayed', 'skipped', 'changed', 'changes', 'errors', 'samples');
    expect(r.json.replayed).to.equal(7);
    expect(r.json.skipped).to.equal(0);
    // The three allowed reads turn to deny; the low-confidence read was a deny already.
    expect(r.json.changed).to.equal(3);
    expect(r.json.changes).to.deep.equal({ 'allow→deny': 3 });
    expect(r.json.samples).to.have.length(3);
    for (const s of r.json.samples) {
      expect(s).to.have.keys('request_id', 'time', 'before', 'after');
      expect(s.before).to.equal('allow');
      expect(s.after).to.equal('deny');
      expect(Number.isNaN(Date.parse(s.time))).to.equal(false);
    }
    expect(r.json.samples.map((s: { request_id: string }) => s.request_id)).to.have.members(ids.allow!);
    expect(await observable()).to.deep.equal(before);
    // The live answer is still allow.
    const live = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
    expect(live.status).to.equal(200);
    ids.allow!.push(live.json.request_id as string);
  });

  it('replays only the most recent `limit` decisions, and only those since `since`', async () => {
    // The newest decision is the allow of the previous test.
    const one = await impact({ policies: { 'deny-read': DENY_READ }, limit: 1 });
    expect(one.status, one.text).to.equal(200);
    expect(one.json.replayed).to.equal(1);
    expect(one.json.changes).to.deep.equal({ 'allow→deny': 1 });
    expect(one.json.samples[0].request_id).to.equal(ids.allow!.at(-1));

    const future = await impact({ policies: { 'deny-read': DENY_READ }, since: '2999-01-01T00:00:00Z' });
    expect(future.status, future.text).to.equal(200);
    expect(future.json).to.deep.equal({
      replayed: 0,
      skipped: 0,
      changed: 0,
      changes: {},
      errors: 0,
      samples: [],
    });

    const past = await impact({ policies: { 'deny-read': DENY_READ }, since: '2000-01-01T00:00:00Z' });
    expect(past.json.replayed).to.equal(8);

    // `since` is the instant it names, whatever RFC 3339 form names it (the trail compares UTC).
    const at = async (since: string) => {
      const r = await impact({ policies: { 'deny-read': DENY_READ }, since });
      expect(r.status, r.text).to.equal(200);
      return r.json.replayed as number;
    };
    const hourAgo = new Date(Date.now() - 3_600_000);
    const day = hourAgo.toISOString().slice(0, 10);
    const inAnHour = new Date(Date.now() + 3_600_000);
    expect(await at(`${day}t00:00:00z`)).to.equal(await at(`${day}T00:00:00Z`));
    // An hour ago, written at +05:00, is before every decision of this run: all of them.
    const plus5 = new Date(hourAgo.getTime() + 5 * 3_600_000).toISOString().slice(0, 19) + '+05:00';
    expect(await at(plus5)).to.equal(8);
    // In an hour, written at -05:00 (its text sorts before now): none.
    const minus5 = new Date(inAnHour.getTime() - 5 * 3_600_000).toISOString().slice(0, 19) + '-05:00';
    expect(await at(minus5)).to.equal(0);
  });

  it('counts the decisions a candidate fails on (evaluation errors), with the error in the samples', async () => {
    // Every read gives `x` two values (a conflict): an error deny; nothing else changes.
    const conflicting =
      'package authz.agent\n\nx := 1 if input.action == "read"\n\nx := 2 if input.confidence > 0.1\n\ndeny contains "never" if x == 3\n';
    const r = await impact({ policies: { conflicting } });
    expect(r.status, r.text).to.equal(200);
    // Every replayed read fails, those the live set allowed (changed) and those it denied (not).
    expect(r.json.changes).to.have.keys('allow→deny');
    expect(r.json.errors).to.be.at.least(r.json.changes['allow→deny']).and.greaterThan(0);
    expect(r.json.samples).to.have.length(r.json.changed);
    for (const s of r.json.samples) expect(s.error).to.match(/conflict/);
    const clean = await impact({ policies: { 'deny-read': DENY_READ } });
    expect(clean.json.errors).to.equal(0);
    for (const s of clean.json.samples) expect(s).to.not.have.property('error');
  });

  it('replays a candidate whose `limits` are malformed as the fail-closed deny the engine would answer', async () => {
    // The candidate's policy answer for reads stays allow, but the engine cannot charge its limit
    // and answers deny: that is what promoting it would change.
    const BAD_LIMIT =
      'package authz.agent\n\nlimits contains {"key": "k", "window": "forever", "max": 1} if input.action == "read"\n';
    const r = await impact({ policies: { 'bad-limit': BAD_LIMIT } });
    expect(r.status, r.text).to.equal(200);
    // The four allowed reads (one from the `limit` test) turn to deny; the low-confidence read was
    // a deny already, but fails too.
    expect(r.json).to.deep.include({ replayed: 8, changed: 4, changes: { 'allow→deny': 4 }, errors: 5 });
    expect(r.json.samples).to.have.length(4);
    for (const s of r.json.samples) {
      expect(s.error).to.match(/^invalid limit: limit "k": window "forever"/);
    }
  });

  it('replays a removed policy (null) and changed data documents', async () => {
    // Without the agent policy nothing allows an agent: every agent allow and approval is denied.
    const removed = await impact({ policies: { agent: null } });
    expect(removed.status, removed.text).to.equal(200);
    expect(removed.json.changes).to.deep.equal({ 'allow→deny': 4, 'requires_approval→deny': 1 });
    expect(removed.json.changed).to.equal(5);

    // With no registered agents, deploy-bot is unknown: its allows and approvals are denied too.
    const data = await impact({ policies: {}, data: { agents: {} } });
    expect(data.status, data.text).to.equal(200);
    expect(data.json.changes).to.deep.equal({ 'allow→deny': 4, 'requires_approval→deny': 1 });

    // An empty candidate is the live set: nothing changes.
    const same = await impact({ policies: {} });
    expect(same.json).to.deep.include({ replayed: 8, changed: 0, changes: {} });
  });

  it('refuses a candidate that does not compile with 400 naming policy, row and column, changing nothing', async () => {
    const before = await observable();
    const r = await impact({ policies: { broken: BROKEN } });
    expectError(r, 400, /^policy set does not compile: policy broken:3:\d+: .*no_such_function/);
    expect(await observable()).to.deep.equal(before);
  });

  it('refuses bad input with 400 and changes nothing', async () => {
    const before = await observable();
    const cases: [unknown, RegExp][] = [
      [{ policies: { x: DENY_READ }, limit: 0 }, /limit/],
      [{ policies: { x: DENY_READ }, limit: 100001 }, /limit/],
      [{ policies: { x: DENY_READ }, limit: 'ten' }, /limit/],
      [{ policies: { x: DENY_READ }, limit: 1.5 }, /limit/],
      [{ policies: { x: DENY_READ }, since: 'yesterday' }, /since/],
      [{ policies: { x: DENY_READ }, since: '2026-11-29T24:00:00Z' }, /since must be an RFC 3339/],
      [{}, /policies/],
      [{ policies: 'package authz.agent' }, /policies/],
      [{ policies: { x: 42 } }, /policies/],
      [{ policies: { x: DENY_READ }, data: [] }, /data/],
      [{ policies: { x: DENY_READ }, extra: true }, /extra/],
      [{ policies: { 'Bad Name': DENY_READ } }, /invalid policy name/],
      [{ policies: { authz: DENY_READ } }, /reserved/],
      [{ policies: { x: '   ' } }, /empty/],
      [{ policies: { 'not-there': null } }, /not-there is not live/],
      [{ policies: {}, data: { 'no/such': null } }, /no\/such does not exist/],
      [{ policies: {}, data: { 'bad path!': 1 } }, /invalid data path/],
      [{ policies: {}, data: { 'agents/x': 1 } }, /overlaps/],
    ];
    for (const [body, message] of cases) {
      expectError(await impact(body), 400, message);
    }
    expectError(
      await call('POST', `${a.platform}/api/v1/impact`, {
        raw: '{"policies": {',
        headers: { 'content-type': 'application/json' },
      }),
      400,
      /malformed JSON/,
    );
    expect(await observable()).to.deep.equal(before);
  });

  it('stops with a 400 naming the decision when a candidate never finishes, and decisions go on meanwhile', async () => {
    // A read-only key must not be able to stall the engine with a candidate: the replay runs on
    // threads of its own, and one that does not answer in time is stopped.
    const reader = a.createKey('impact-spinner', ['policies:read']);
    const before = await observable();
    const replay = impact({ policies: { spin: SPIN }, data: { spin: { items: SPIN_ITEMS } } }, reader);
    const during = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
    expect(during.status, during.text).to.equal(202);
    const r = await replay;
    expectError(r, 400);
    expect(r.json.error).to.match(
      /^impact replay stopped: the candidate set could not evaluate decision [0-9a-f-]{36}: evaluation timed out: no answer within \d+ ms$/,
    );
    // A decision of the chunk the thread held when it was stopped (all of them went unanswered);
    // the one made meanwhile may be among them (the candidate compiles before the replay reads).
    expect([...Object.values(ids).flat(), during.json.request_id]).to.include(
      /decision ([0-9a-f-]{36})/.exec(r.json.error as string)?.[1],
    );
    // Nothing moved but the decision made meanwhile; and the next replay runs normally.
    const after = await observable();
    expect({ ...after, audit: after.audit - 1 }).to.deep.equal(before);
    const next = await impact({ policies: { 'deny-read': DENY_READ } }, reader);
    expect(next.status, next.text).to.equal(200);
    expect(next.json.replayed).to.be.at.least(8);
    expect(next.json.changed).to.be.at.least(3);
  });

  it('refuses a candidate whose thresholds never finish evaluating (400), checked off the serving thread', async () => {
    const reader = a.createKey('impact-threshold-spinner', ['policies:read']);
    const before = await observable();
    const replay = impact(
      { policies: { spin: SPIN_THRESHOLDS }, data: { spin: { items: SPIN_ITEMS } } },
      reader,
    );
    // Decisions go on while the check runs (on the serving thread it never ended).
    const during = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
    expect(during.status, during.text).to.equal(202);
    // A live change meanwhile is checked on another thread: the candidate cannot fail its check.
    const harmless = 'package authz.agent\n\ndeny contains "never" if input.action == "no-such-action"\n';
    const change = await call('PUT', `${a.platform}/api/v1/policies/meanwhile`, { body: { rego: harmless } });
    expect(change.status, change.text).to.equal(201);
    expect((await call('DELETE', `${a.platform}/api/v1/policies/meanwhile`)).status).to.equal(204);
    const r = await replay;
    expectError(
      r,
      400,
      /^invalid confidence thresholds: (policy [\w.-]+:\d+, )*policy spin:3: thresholds could not be checked: evaluation timed out: no answer within \d+ ms$/,
    );
    const after = await observable();
    // The policies and data are as they were (the change meanwhile was made and undone); the
    // trail has the decision and the two changes.
    expect(after.policies.policies).to.deep.equal(before.policies.policies);
    expect(after.data.documents).to.deep.equal(before.data.documents);
    expect(after.audit).to.equal(before.audit + 3);
    expect((await impact({ policies: { 'deny-read': DENY_READ } }, reader)).status).to.equal(200);
  });

  it('needs policies:read, and is served by the Platform API only', async () => {
    const auditor = a.createKey('impact-auditor', ['audit:read']);
    expectError(await impact({ policies: {} }, auditor), 403, 'API key lacks scope policies:read');
    const reader = a.createKey('impact-reader', ['policies:read']);
    expect((await impact({ policies: {} }, reader)).status).to.equal(200);
    const engine = await call('POST', `${a.engine}/api/v1/impact`, { body: { policies: {} } });
    expectError(engine, 404);
  });

  // Last: it records a decision of another tenant, which the counts above do not expect.
  it("replays for a tenant-bound key only its tenant's decisions: another tenant's input cannot be probed", async () => {
    const globex = await call('POST', `${a.engine}/v1/authorize`, {
      body: {
        tenant_id: 'globex',
        user_id: 'dave',
        action: 'read',
        resource: { type: 'project', id: 'p9' },
        context: { ssn: '123-45' },
      },
    });
    expect(globex.status, globex.text).to.equal(200);
    // A candidate that asks about that input: it changes the decision only if the guess is right.
    const probe = {
      policies: {
        probe:
          'package authz.human\n\ndeny contains "probe" if {\n\tinput.tenant_id == "globex"\n\tinput.context.ssn == "123-45"\n}\n',
      },
    };
    const unbound = await impact(probe);
    expect(unbound.status, unbound.text).to.equal(200);
    expect(unbound.json.changed).to.equal(1);
    expect(unbound.json.samples[0].request_id).to.equal(globex.json.request_id);

    const acme = a.createKey('impact-acme', ['policies:read'], { tenant: 'acme' });
    const bound = await impact(probe, acme);
    expect(bound.status, bound.text).to.equal(200);
    expect(bound.json.changed).to.equal(0);
    expect(bound.json.samples).to.deep.equal([]);
    // It replays exactly its tenant's decisions (the human ones here): a candidate denying
    // everything changes those and nothing else.
    const all = await impact(
      { policies: { probe: 'package authz.human\n\ndeny contains "all" if true\n' } },
      acme,
    );
    expect(all.status, all.text).to.equal(200);
    expect(all.json.replayed).to.equal(ids.human!.length);
    expect(all.json.samples.map((x: { request_id: string }) => x.request_id)).to.have.members(ids.human!);
  });
});

// Recorded inputs as large as a request could once carry (before ARBITER_MAX_CONTEXT_BYTES bounded
// them at 64 KiB; here it is raised to record them). A thread answers a message as one, so the
// last input of a message waits for the others: messages sized by count alone gave 64 such inputs
// one allowance (the eval budget plus 1 s), and the replay stopped with a timeout. 70 decisions:
// the first page holds 64, the next is sized by their length.
onEveryBackend('POST /api/v1/impact: large recorded inputs', () => {
  let a: Arbiter;
  const RECORDED = 70;
  /** ~600 kB of context per decision: two do not fit in one ~1 MiB message. */
  const context = { pad: 'x'.repeat(600_000) };
  /**
   * 0..1699: SLOW's 1700² comparisons take ~0.15 s per read (more on a loaded machine): well within
   * the allowance (1.25 s) one at a time, far beyond it 64 at a time.
   */
  const items = Array.from({ length: 1700 }, (_, i) => i);
  const SLOW = [
    'package authz.agent',
    '',
    'deny contains "never" if {',
    '\tinput.action == "read"',
    '\tsome x in data.slow.items',
    '\tsome y in data.slow.items',
    '\tx > y',
    '\ty > x',
    '}',
    '',
  ].join('\n');

  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: '700000' });
    for (let i = 0; i < RECORDED; i++) {
      const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: { ...AGENT.allow, context } });
      expect(r.status, r.text).to.equal(200);
    }
  });
  after(async () => {
    await a.close();
  });

  it('gives each evaluation its allowance however large the inputs: it replays them all', async () => {
    const r = await call('POST', `${a.platform}/api/v1/impact`, {
      body: { policies: { slow: SLOW }, data: { slow: { items } } },
    });
    expect(r.status, r.text).to.equal(200);
    expect(r.json.replayed).to.equal(RECORDED);
    expect(r.json.skipped).to.equal(0);
    // SLOW denies nothing; a read that took longer than the eval budget is a deny with an error.
    expect(r.json.changed).to.equal(r.json.errors);
  });
});

// The default and the sample cap of SPEC §11, over decisions recorded in each backend.
onEveryBackend('POST /api/v1/impact: default limit (10 000) and at most 50 samples', function () {
  this.timeout(300_000);
  let a: Arbiter;
  /** One more than the default limit. */
  const RECORDED = 10_001;

  before(async () => {
    a = await Arbiter.start();
    // 100 evaluations a request (the batch maximum), each an audited decision like any other.
    const item = {
      subject: { type: 'agent', id: 'deploy-bot', properties: { confidence: 0.95 } },
      action: { name: 'read' },
      resource: { type: 'repo', id: 'arbiter' },
    };
    for (let made = 0; made < RECORDED; made += 100) {
      const n = Math.min(100, RECORDED - made);
      const r = await call('POST', `${a.engine}/access/v1/evaluations`, {
        body: { evaluations: Array<typeof item>(n).fill(item) },
      });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.evaluations.every((e: { decision: boolean }) => e.decision)).to.equal(true);
    }
  });
  after(async () => {
    await a.close();
  });

  it('replays the most recent 10 000 decisions when no limit is given, and keeps 50 of the changes as samples', async () => {
    const r = await call('POST', `${a.platform}/api/v1/impact`, {
      body: { policies: { 'deny-read': DENY_READ } },
    });
    expect(r.status, r.text).to.equal(200);
    expect(r.json.replayed).to.equal(10_000);
    expect(r.json.changed).to.equal(10_000);
    expect(r.json.changes).to.deep.equal({ 'allow→deny': 10_000 });
    expect(r.json.samples).to.have.length(50);
    expect(new Set(r.json.samples.map((s: { request_id: string }) => s.request_id)).size).to.equal(50);

    const all = await call('POST', `${a.platform}/api/v1/impact`, {
      body: { policies: { 'deny-read': DENY_READ }, limit: RECORDED },
    });
    expect(all.status, all.text).to.equal(200);
    expect(all.json.replayed).to.equal(RECORDED);
    expect(all.json.samples).to.have.length(50);
  });
});
