import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// Audit queries and verification read storage: every backend.
onEveryBackend('GET /api/v1/audit with a time window', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('pages newest first by event time, neither skipping nor repeating while events arrive', async () => {
    const since = new Date(Date.now() - 1000).toISOString();
    for (let i = 0; i < 7; i++) await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    const until = new Date(Date.now() + 1).toISOString();
    const seen: string[] = [];
    const times: string[] = [];
    let cursor: string | null = null;
    do {
      const q: string = `?kind=decision&since=${since}&until=${until}&limit=3${cursor ? `&cursor=${cursor}` : ''}`;
      const r = await call('GET', a.platform + '/api/v1/audit' + q);
      expect(r.status, r.text).to.equal(200);
      for (const e of r.json.events) {
        seen.push(e.id);
        times.push(e.time);
      }
      cursor = r.json.next_cursor;
      // New events arrive between pages; they are newer than `until` and never show up.
      await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    } while (cursor);
    expect(seen).to.have.length(7);
    expect(new Set(seen).size).to.equal(7);
    expect([...times].sort().reverse()).to.deep.equal(times);
  });

  it('refuses a cursor of the other ordering', async () => {
    const plain = await call('GET', a.platform + '/api/v1/audit?limit=1');
    expect(plain.json.next_cursor).to.be.a('string');
    const since = new Date(Date.now() - 60_000).toISOString();
    const r = await call('GET', a.platform + `/api/v1/audit?since=${since}&cursor=${plain.json.next_cursor}`);
    expectError(r, 400);
    expect(r.json.error).to.include('cursor');
  });
});

onEveryBackend('GET /api/v1/audit/verify and tenants', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('answers 403 to a tenant-bound key: the chain spans every tenant', async () => {
    const key = a.createKey('acme-auditor', ['audit:read'], { tenant: 'acme' });
    expectError(await call('GET', a.platform + '/api/v1/audit/verify', { key }), 403);
    const global = a.createKey('auditor', ['audit:read']);
    expect((await call('GET', a.platform + '/api/v1/audit/verify', { key: global })).json.ok).to.equal(true);
  });
});

onEveryBackend('GET /api/v1/audit/verify under traffic', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('verifies the chain as it stood when asked, while events keep arriving', async () => {
    const batch = {
      events: Array.from({ length: 1000 }, (_, i) => ({ kind: 'engine.event', message: `m${i}` })),
    };
    for (let i = 0; i < 5; i++) {
      expect((await call('POST', a.platform + '/api/v1/audit/ingest', { body: batch })).status).to.equal(202);
    }
    const verifying = call('GET', a.platform + '/api/v1/audit/verify');
    const during = await Promise.all([
      call('POST', a.platform + '/api/v1/audit/ingest', { body: batch }),
      call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow }),
      call('GET', a.engine + '/healthz', { key: null }),
    ]);
    expect(during.map((r) => r.status)).to.deep.equal([202, 200, 200]);
    const r = await verifying;
    expect(r.json.ok, JSON.stringify(r.json)).to.equal(true);
    expect(r.json.checked).to.be.at.least(5000);
    const after = (await call('GET', a.platform + '/api/v1/audit/verify')).json;
    expect(after.ok).to.equal(true);
    expect(after.checked).to.be.greaterThan(r.json.checked);
  });
});
