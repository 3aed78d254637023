import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';
import { SPIN_ITEMS, SPIN_THRESHOLDS } from './helpers/policies.js';

const rego = (body: string) => `package authz.agent\n\n${body}\n`;

// Decisions are recorded: every backend.
/** A mistyped stricter gate must never become a looser one: malformed thresholds fail closed. */
onEveryBackend('confidence thresholds are checked, never silently replaced', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const revision = async () =>
    (await call('GET', `${a.engine}/healthz`, { key: null })).json.revision as number;
  const put = (name: string, text: string) =>
    call('PUT', `${a.platform}/api/v1/policies/${name}`, {
      raw: text,
      headers: { 'content-type': 'text/plain' },
    });

  const refused: [string, string, RegExp][] = [
    [
      'a string where a number belongs',
      'thresholds["read"] := {"deny_below": "0.99"}',
      /policy strict:3: thresholds\["read"\]\.deny_below must be a number between 0 and 1, got "0\.99"/,
    ],
    [
      'a number above 1',
      'thresholds["read"] := {"deny_below": 0.5, "approval_below": 1.5}',
      /policy strict:3: thresholds\["read"\]\.approval_below must be a number between 0 and 1, got 1\.5/,
    ],
    ['a negative number', 'thresholds["read"] := {"deny_below": -0.1}', /deny_below must be a number/],
    [
      'deny_below above approval_below',
      'thresholds["read"] := {"deny_below": 0.95, "approval_below": 0.6}',
      /policy strict:3: thresholds\["read"\]: deny_below 0\.95 exceeds approval_below 0\.6/,
    ],
    ['a misspelt key', 'thresholds["read"] := {"deny_bellow": 0.9}', /unknown key "deny_bellow"/],
    ['an entry that is not an object', 'thresholds["read"] := 0.9', /must be an object/],
  ];
  for (const [what, rule, message] of refused) {
    it(`refuses a policy whose threshold has ${what} (400 naming policy and row; nothing changes)`, async () => {
      const before = await revision();
      const r = await put('strict', rego(rule));
      expectError(r, 400, message);
      expect(await revision()).to.equal(before);
      expect((await call('GET', `${a.platform}/api/v1/policies/strict`)).status).to.equal(404);
      const d = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
      expect(d.json.status).to.equal('allow');
    });
  }

  it('refuses a policy whose thresholds never finish evaluating, checked off the serving thread (live and shadow)', async () => {
    const data = await call('PUT', `${a.platform}/api/v1/data/spin`, { body: { items: SPIN_ITEMS } });
    expect(data.status, data.text).to.equal(201);
    try {
      const before = await revision();
      const refused =
        /^invalid confidence thresholds: (policy [\w.-]+:\d+, )*policy spin:3: thresholds could not be checked: evaluation timed out: no answer within \d+ ms$/;
      const live = put('spin', SPIN_THRESHOLDS);
      // Decisions go on meanwhile: on the serving thread the check never ended.
      const during = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
      expect(during.json.status).to.equal('allow');
      expectError(await live, 400, refused);
      expect(await revision()).to.equal(before);
      expect((await call('GET', `${a.platform}/api/v1/policies/spin`)).status).to.equal(404);
      const shadow = await call('PUT', `${a.platform}/api/v1/policies/spin?mode=shadow`, {
        raw: SPIN_THRESHOLDS,
        headers: { 'content-type': 'text/plain' },
      });
      expectError(shadow, 400, refused);
      expect((await call('GET', `${a.platform}/api/v1/shadow`)).json.policies).to.deep.equal([]);
      // The check thread was stopped and starts again for the next change.
      const next = await put('strict', rego('thresholds["read"] := {"deny_below": "0.99"}'));
      expectError(next, 400, /deny_below must be a number/);
    } finally {
      expect((await call('DELETE', `${a.platform}/api/v1/data/spin`)).status).to.be.oneOf([200, 204]);
    }
  });

  it('refuses a dry run with a bad threshold the same way', async () => {
    const r = await call('PUT', `${a.platform}/api/v1/policies/strict?dry_run=true`, {
      raw: rego('thresholds["read"] := {"deny_below": "0.99"}'),
      headers: { 'content-type': 'text/plain' },
    });
    expectError(r, 400, /deny_below must be a number/);
  });

  it('refuses a data change that makes data-driven thresholds malformed', async () => {
    const ok = await call('PUT', `${a.platform}/api/v1/data/gates`, { body: { deny_below: 0.2 } });
    expect(ok.status, ok.text).to.equal(201);
    const p = await put('gates', rego('thresholds["gated"] := data.gates'));
    expect(p.status, p.text).to.equal(201);
    const before = await revision();
    const bad = await call('PUT', `${a.platform}/api/v1/data/gates`, { body: { deny_below: '0.99' } });
    expectError(bad, 400, /policy gates:3: thresholds\["gated"\]\.deny_below must be a number/);
    expect(await revision()).to.equal(before);
    expect((await call('DELETE', `${a.platform}/api/v1/policies/gates`)).status).to.equal(204);
  });

  it('denies a decision whose threshold is malformed at evaluation time, and audits why', async () => {
    // Thresholds computed from the input cannot be checked at PUT time: the decision fails closed.
    const p = await put(
      'from-input',
      rego(
        'thresholds[input.action] := {"deny_below": input.context.gate} if input.action == "read"\n\nallow if input.action == "read"',
      ),
    );
    expect(p.status, p.text).to.equal(201);
    const good = await call('POST', `${a.engine}/v1/agent/authorize`, {
      body: { ...AGENT.allow, action: 'read', context: { gate: 0.1 } },
    });
    expect(good.json.status, good.text).to.equal('allow');
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, {
      body: { ...AGENT.allow, action: 'read', context: { gate: '0.99' } },
    });
    expect(r.status).to.equal(403);
    expect(r.json.status).to.equal('deny');
    expect(r.json.message).to.match(/invalid confidence thresholds: thresholds\["read"\]\.deny_below/);
    const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
    expect(ev.details.reasons).to.deep.equal(['invalid_threshold']);
    expect((await call('DELETE', `${a.platform}/api/v1/policies/from-input`)).status).to.equal(204);
  });
});
