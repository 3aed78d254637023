import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';
import { AUDIT_EXAMINE } from '../src/audit/service.js';

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

// What one audit page reads is bounded on every backend (each store builds its own statements).
onEveryBackend(
  'GET /api/v1/audit: a page that combines conditions examines a bounded number of events',
  function () {
    this.timeout(120_000);
    let a: Arbiter;
    const total = AUDIT_EXAMINE + 500;
    // One event with action "rare", the oldest, then `total - 1` others of the same agent.
    const base = Date.parse('2026-01-01T00:00:00.000Z');
    before(async () => {
      a = await Arbiter.start();
      const events = Array.from({ length: total }, (_, i) => ({
        kind: 'edge.probe',
        agent_id: 'busy-bot',
        action: i === 0 ? 'rare' : 'op',
        time: new Date(base + i * 1000).toISOString(),
      }));
      for (let i = 0; i < events.length; i += 1000) {
        const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
          body: { events: events.slice(i, i + 1000) },
        });
        expect(r.status, r.text).to.equal(202);
      }
    });
    after(async () => {
      await a.close();
    });

    /** Every page of a query, following next_cursor to the end. */
    const pages = async (query: string): Promise<{ ids: string[]; sizes: number[] }> => {
      const ids: string[] = [];
      const sizes: number[] = [];
      let cursor: string | null = null;
      do {
        const r = await call(
          'GET',
          `${a.platform}/api/v1/audit?${query}${cursor ? `&cursor=${cursor}` : ''}`,
        );
        expect(r.status, r.text).to.equal(200);
        ids.push(...(r.json.events as { id: string }[]).map((e) => e.id));
        sizes.push(r.json.events.length);
        cursor = r.json.next_cursor;
        expect(sizes.length, 'pages').to.be.at.most(10);
      } while (cursor);
      return { ids, sizes };
    };

    // Two filters that together match nothing used to read every event of the first (O(trail) per
    // request, on SQLite on the thread that serves decisions: found by a soak probe).
    it('answers an empty page with a cursor after examining its share, and ends after the last event', async () => {
      const first = await call('GET', `${a.platform}/api/v1/audit?agent_id=busy-bot&kind=nothing&limit=1000`);
      expect(first.status, first.text).to.equal(200);
      expect(first.json.events).to.deep.equal([]);
      expect(first.json.next_cursor, 'a page that stopped early continues').to.be.a('string');
      expect((await pages('agent_id=busy-bot&kind=nothing&limit=1000')).sizes).to.deep.equal([0, 0]);
    });

    it('still finds every match by following next_cursor, in seq order and in a time window', async () => {
      const rare = await pages('agent_id=busy-bot&action=rare&limit=10');
      expect(rare.ids).to.have.length(1);
      expect(rare.sizes).to.deep.equal([0, 1]);
      const since = new Date(base - 1000).toISOString();
      const windowed = await pages(`since=${since}&agent_id=busy-bot&action=rare&limit=10`);
      expect(windowed.ids).to.deep.equal(rare.ids);
      expect(windowed.sizes).to.deep.equal([0, 1]);
      // Every event once, across the pages the bound cut.
      for (const q of [
        'agent_id=busy-bot&kind=edge.probe&limit=1000',
        `since=${since}&kind=edge.probe&limit=1000`,
      ]) {
        const all = await pages(q);
        expect(all.ids, q).to.have.length(total);
        expect(new Set(all.ids).size, q).to.equal(total);
      }
    });

    it("answers a tenant-bound key's pages exactly: how many other tenants' events lie between is not its to learn", async () => {
      // Two events of another tenant, older than all of busy-bot's (the first pages of a window).
      const old = (s: number) => new Date(base - s * 1000).toISOString();
      const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
        body: {
          events: [
            { kind: 'edge.probe', tenant_id: 'small-co', agent_id: 'x', time: old(20) },
            {
              kind: 'edge.probe',
              tenant_id: 'small-co',
              agent_id: 'x',
              time: old(10),
              request_id: 'req-rare-1',
            },
          ],
        },
      });
      expect(r.status, r.text).to.equal(202);
      const reader = a.createKey('small-co-reader', ['audit:read'], { tenant: 'small-co' });
      for (const q of [
        `since=${old(30)}&kind=edge.probe&limit=10`,
        'kind=edge.probe&limit=10',
        `since=${old(30)}&until=${old(5)}&limit=10`,
      ]) {
        const page = await call('GET', `${a.platform}/api/v1/audit?${q}`, { key: reader });
        expect(page.status, page.text).to.equal(200);
        expect(
          page.json.events.map((e: { time: string }) => e.time),
          q,
        ).to.deep.equal([old(10), old(20)]);
        expect(page.json.next_cursor, q).to.equal(null);
      }
      // A request's events in a window: found in one page through request_id, not a page per
      // 2 000 events of the window.
      const one = await call(
        'GET',
        `${a.platform}/api/v1/audit?since=${old(30)}&request_id=req-rare-1&limit=10`,
      );
      expect(one.json.events.map((e: { request_id: string }) => e.request_id)).to.deep.equal(['req-rare-1']);
      expect(one.json.next_cursor).to.equal(null);
    });

    it('reads one filter alone, or a window alone, to the end of each page as before', async () => {
      const r = await call('GET', `${a.platform}/api/v1/audit?agent_id=busy-bot&limit=1000`);
      expect(r.json.events).to.have.length(1000);
      const all = await pages('agent_id=busy-bot&limit=1000');
      expect(all.sizes).to.deep.equal([1000, 1000, total - 2000]);
    });
  },
);
