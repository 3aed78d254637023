import { expect } from 'chai';
import { expectError } from './helpers/expect-error.js';
import { onEveryBackend } from './helpers/backends.js';
import path from 'node:path';
import { ADMIN_KEY, AGENT, Arbiter, auditCount, auditEvents, call, HUMAN, REPO } from './helpers/harness.js';

// Idempotency records are stored (and must survive a restart): run on every backend.
onEveryBackend('Idempotency-Key on authorize', () => {
  let a: Arbiter;
  let agentKey: string;
  before(async () => {
    a = await Arbiter.start();
    agentKey = a.createKey('deploy-bot-key', ['authorize'], { agent: 'deploy-bot' });
  });
  after(async () => {
    await a.close();
  });

  /** What was written: decision events and all events (as the audit API shows them), queue rows. */
  const counts = async () => ({
    decisions: (await auditEvents(a.platform, { kind: 'decision' })).length,
    queue: await a.count('queue_items'),
    audit: await auditCount(a.platform),
  });

  const authorize = (body: unknown, idem: string, key: string = agentKey, path = '/v1/agent/authorize') =>
    call('POST', a.engine + path, { body, key, headers: { 'idempotency-key': idem } });

  it('replays the first response for the same key and body, writing nothing new', async () => {
    const first = await authorize(AGENT.approval, 'deploy-2024-06-01-a');
    expect(first.status).to.equal(202);
    expect(first.headers.get('idempotent-replayed')).to.equal(null);
    const before = await counts();

    for (let i = 0; i < 2; i++) {
      const again = await authorize(AGENT.approval, 'deploy-2024-06-01-a');
      expect(again.status).to.equal(202);
      expect(again.headers.get('idempotent-replayed')).to.equal('true');
      expect(again.json.request_id).to.equal(first.json.request_id);
      expect(again.json.status).to.equal('requires_approval');
      expect(again.json.trace_id).to.equal(first.json.trace_id);
      expect(again.json.expires_at).to.equal(first.json.expires_at);
    }
    expect(await counts()).to.deep.equal(before);
    const item = await call('GET', `${a.engine}/v1/queue/${first.json.request_id}`);
    expect(item.status, item.text).to.equal(200);
    expect(item.json.status).to.equal('pending');
    expect(
      await auditEvents(a.platform, { kind: 'decision', request_id: first.json.request_id }),
      'one decision event',
    ).to.have.length(1);
  });

  it('replays allow and deny decisions with their status codes', async () => {
    const allow = await authorize(AGENT.allow, 'idem-allow');
    const allowAgain = await authorize(AGENT.allow, 'idem-allow');
    expect([allow.status, allowAgain.status]).to.deep.equal([200, 200]);
    expect(allowAgain.json).to.deep.equal(allow.json);
    expect(allowAgain.headers.get('idempotent-replayed')).to.equal('true');

    const deny = await authorize(AGENT.deny, 'idem-deny');
    const denyAgain = await authorize(AGENT.deny, 'idem-deny');
    expect([deny.status, denyAgain.status]).to.deep.equal([403, 403]);
    expect(denyAgain.json).to.deep.equal(deny.json);
    expect(denyAgain.headers.get('idempotent-replayed')).to.equal('true');
  });

  it('replays human decisions too', async () => {
    const first = await authorize(HUMAN.approval, 'idem-human', ADMIN_KEY, '/v1/authorize');
    expect(first.status).to.equal(202);
    const before = await counts();
    const again = await authorize(HUMAN.approval, 'idem-human', ADMIN_KEY, '/v1/authorize');
    expect(again.status).to.equal(202);
    expect(again.json.request_id).to.equal(first.json.request_id);
    expect(again.headers.get('idempotent-replayed')).to.equal('true');
    expect(await counts()).to.deep.equal(before);
  });

  it('answers 422 for the same key with a different body, and writes nothing', async () => {
    const first = await authorize(AGENT.approval, 'idem-conflict');
    expect(first.status).to.equal(202);
    const before = await counts();
    const r = await authorize({ ...AGENT.approval, resource: 'prod/web' }, 'idem-conflict');
    expectError(r, 422);
    expect(r.headers.get('idempotent-replayed')).to.equal(null);
    const r2 = await authorize({ ...AGENT.approval, confidence: 0.96 }, 'idem-conflict');
    expectError(r2, 422);
    expect(await counts()).to.deep.equal(before);
    // The original is still replayable.
    const again = await authorize(AGENT.approval, 'idem-conflict');
    expect(again.json.request_id).to.equal(first.json.request_id);
  });

  it('treats the same Idempotency-Key from a different API key as a new request', async () => {
    const mine = await authorize(AGENT.approval, 'shared-idem-key');
    expect(mine.status).to.equal(202);
    const before = await counts();
    const theirs = await authorize(AGENT.approval, 'shared-idem-key', ADMIN_KEY);
    expect(theirs.status).to.equal(202);
    expect(theirs.headers.get('idempotent-replayed')).to.equal(null);
    expect(theirs.json.request_id).to.not.equal(mine.json.request_id);
    expect((await counts()).decisions).to.equal(before.decisions + 1);
    expect((await counts()).queue).to.equal(before.queue + 1);
    // And a different body from the other key is not a conflict with the first key's body.
    const other = a.createKey('other-caller', ['authorize']);
    const third = await authorize(AGENT.allow, 'shared-idem-key', other);
    expect(third.status).to.equal(200);
    expect(third.headers.get('idempotent-replayed')).to.equal(null);
  });

  it('rejects an Idempotency-Key that is empty, of 256 characters or with a space with 400', async () => {
    const before = await counts();
    // Sent empty, it is a key the client meant to use: refused, not taken for no key.
    expectError(await authorize(AGENT.allow, ''), 400, /Idempotency-Key/i);
    expectError(await authorize(AGENT.allow, 'k'.repeat(256)), 400, /Idempotency-Key/i);
    expectError(await authorize(AGENT.allow, 'has space'), 400, /Idempotency-Key/i);
    expect(await counts()).to.deep.equal(before);
    const max = await authorize(AGENT.allow, 'k'.repeat(255));
    expect(max.status).to.equal(200);
  });

  it('still replays after a restart', async () => {
    const first = await authorize(AGENT.approval, 'idem-restart');
    expect(first.status).to.equal(202);
    await a.restart();
    const before = await counts();
    const again = await authorize(AGENT.approval, 'idem-restart');
    expect(again.status).to.equal(202);
    expect(again.headers.get('idempotent-replayed')).to.equal('true');
    expect(again.json.request_id).to.equal(first.json.request_id);
    expect(await counts()).to.deep.equal(before);
    expectError(await authorize(AGENT.allow, 'idem-restart'), 422);
  });
});

// SPEC §5: an Idempotency-Key is honoured within 24 h. The service's wall clock is stepped
// forward (test/fixtures/skew-clock.mjs, on SIGUSR2) instead of waiting a day. Records are stored:
// every backend.
onEveryBackend('Idempotency-Key after 24 h', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({
      NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'skew-clock.mjs')}`,
      TEST_CLOCK_JUMP_MS: String(12 * 3600_000),
    });
  });
  after(async () => {
    await a.close();
  });

  /** Steps the service's wall clock 12 h forward and waits until it says so. */
  const stepForward = async (times: number) => {
    process.kill(a.pid!, 'SIGUSR2');
    for (let i = 0; i < 200; i++) {
      if (a.logs.filter((l) => /wall clock stepped/.test(l)).length >= times) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('the wall clock was not stepped');
  };

  const authorize = (body: unknown) =>
    call('POST', a.engine + '/v1/agent/authorize', { body, headers: { 'idempotency-key': 'daily-1' } });

  it('replays within 24 h, and decides afresh once the first answer is more than 24 h old', async () => {
    const first = await authorize(AGENT.allow);
    expect(first.status).to.equal(200);
    await stepForward(1);
    const within = await authorize(AGENT.allow);
    expect(within.json.request_id, '12 h later').to.equal(first.json.request_id);
    expect(within.headers.get('idempotent-replayed')).to.equal('true');
    expectError(await authorize(AGENT.deny), 422);
    await stepForward(2);
    const after = await authorize(AGENT.allow);
    expect(after.status).to.equal(200);
    expect(after.json.request_id, '24 h later').to.not.equal(first.json.request_id);
    expect(after.headers.get('idempotent-replayed')).to.equal(null);
    expect(await auditEvents(a.platform, { request_id: after.json.request_id })).to.have.length(1);
  });
});
