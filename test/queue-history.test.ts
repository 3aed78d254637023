import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, call, HUMAN, type Response } from './helpers/harness.js';
import { QUEUE_EXAMINE } from '../src/queue/service.js';
import { decidedQuerySql, pendingQuerySql } from '../src/storage/queue-query.js';
import { seedAt, seedId, seedItems } from './helpers/queue-seed.js';
import { scansOf, type PlanNode } from './helpers/pg-plan.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** An agent request that needs approval (confidence below approval_below 0.9) for data-bot. */
const dataBot = (n: number) => ({
  agent_id: 'data-bot',
  action: 'query',
  resource: `analytics/report-${n}`,
  confidence: 0.85,
});

/** bob is an editor in globex: deleting a project needs approval there too. */
const GLOBEX_APPROVAL = { ...HUMAN.approval, tenant_id: 'globex', user_id: 'bob' };

async function queued(a: Arbiter, body: Record<string, unknown>, key?: string): Promise<string> {
  const human = 'user_id' in body;
  const r = await call('POST', a.engine + (human ? '/v1/authorize' : '/v1/agent/authorize'), { body, key });
  expect(r.status, r.text).to.equal(202);
  return r.json.request_id as string;
}

const ids = (r: Response) => (r.json.items as { id: string }[]).map((i) => i.id);

// Queue items, their history and audit trail are stored: every backend.
onEveryBackend('GET /v1/queue (items in any state)', () => {
  let a: Arbiter;
  let reviewer: string;
  let reviewer2: string;
  let reader: string;
  let acme: string;
  let dataBotKey: string;
  // Created oldest first.
  const all: { id: string; kind: 'deploy' | 'data' | 'acme' | 'globex' }[] = [];
  // Decided newest first, as the decided lists show them.
  const decided: { id: string; status: 'approved' | 'denied'; by: string; note: string | null }[] = [];

  before(async () => {
    a = await Arbiter.start();
    reviewer = a.createKey('alice-reviewer', ['queue:read', 'queue:review']);
    reviewer2 = a.createKey('bob-reviewer', ['queue:read', 'queue:review']);
    reader = a.createKey('queue-reader', ['queue:read']);
    acme = a.createKey('acme-reviewer', ['queue:read', 'queue:review'], { tenant: 'acme' });
    dataBotKey = a.createKey('data-bot-key', ['authorize', 'queue:read'], { agent: 'data-bot' });
    const bodies: [(typeof all)[number]['kind'], Record<string, unknown>][] = [
      ['deploy', AGENT.approval],
      ['data', dataBot(1)],
      ['acme', HUMAN.approval],
      ['globex', GLOBEX_APPROVAL],
      ['data', dataBot(2)],
      ['deploy', AGENT.approval],
      ['acme', { ...HUMAN.approval, resource: { type: 'project', id: 'p2' } }],
      ['data', dataBot(3)],
    ];
    for (const [kind, body] of bodies) all.push({ id: await queued(a, body), kind });
    // Decide five of them, in an order unlike their creation order.
    const plan: [number, 'approve' | 'deny', string, string | null][] = [
      [4, 'approve', reviewer, 'report is aggregate only'],
      [0, 'deny', reviewer2, 'no deploys on Friday'],
      [2, 'approve', reviewer, null],
      [3, 'deny', reviewer, 'globex asked us not to'],
      [1, 'approve', reviewer2, 'ok'],
    ];
    for (const [i, verb, key, note] of plan) {
      const id = all[i]!.id;
      const r = await call('POST', `${a.engine}/v1/queue/${id}/${verb}`, {
        key,
        body: note === null ? undefined : { note },
      });
      expect(r.status, r.text).to.equal(200);
      decided.unshift({
        id,
        status: verb === 'approve' ? 'approved' : 'denied',
        by: r.json.decided_by as string,
        note,
      });
      await sleep(5); // distinct decided_at for a readable order
    }
  });
  after(async () => {
    await a.close();
  });

  const pendingIds = () => all.filter((x) => !decided.some((d) => d.id === x.id)).map((x) => x.id);

  it('lists pending items oldest first when no status is given, as /v1/queue/pending does', async () => {
    const r = await call('GET', `${a.engine}/v1/queue`, { key: reader });
    expect(r.status, r.text).to.equal(200);
    expect(r.json).to.have.keys('items', 'next_cursor');
    expect(ids(r)).to.deep.equal(pendingIds());
    const explicit = await call('GET', `${a.engine}/v1/queue?status=pending`, { key: reader });
    expect(explicit.json).to.deep.equal(r.json);
    const old = await call('GET', `${a.engine}/v1/queue/pending`, { key: reader });
    expect(old.json).to.deep.equal(r.json);
  });

  it('lists approved items newest decision first, with decided_by and note', async () => {
    const r = await call('GET', `${a.engine}/v1/queue?status=approved`, { key: reader });
    expect(r.status, r.text).to.equal(200);
    const want = decided.filter((d) => d.status === 'approved');
    expect(ids(r)).to.deep.equal(want.map((d) => d.id));
    for (const [i, item] of (r.json.items as Record<string, unknown>[]).entries()) {
      expect(item).to.include({ status: 'approved', decided_by: want[i]!.by, note: want[i]!.note });
      expect(item).to.not.have.property('requested_by');
    }
    const times = (r.json.items as { decided_at: string }[]).map((i) => i.decided_at);
    expect(times).to.deep.equal([...times].sort().reverse());
  });

  it('lists denied items with their notes', async () => {
    const r = await call('GET', `${a.engine}/v1/queue?status=denied`, { key: reader });
    expect(r.status).to.equal(200);
    const want = decided.filter((d) => d.status === 'denied');
    expect(ids(r)).to.deep.equal(want.map((d) => d.id));
    expect(r.json.items.map((i: { note: string }) => i.note)).to.deep.equal(want.map((d) => d.note));
  });

  it('lists several decided states at once, newest decision first, in any order of naming', async () => {
    for (const status of ['approved,denied,expired', 'expired,denied,approved', 'denied,approved']) {
      const r = await call('GET', `${a.engine}/v1/queue?status=${status}`, { key: reader });
      expect(r.status, r.text).to.equal(200);
      expect(ids(r)).to.deep.equal(decided.map((d) => d.id));
    }
    const none = await call('GET', `${a.engine}/v1/queue?status=expired`, { key: reader });
    expect(none.json).to.deep.equal({ items: [], next_cursor: null });
  });

  it('filters by agent_id, tenant_id and action in every state', async () => {
    const data = await call('GET', `${a.engine}/v1/queue?status=approved&agent_id=data-bot`, { key: reader });
    expect(ids(data)).to.deep.equal(
      decided
        .filter((d) => d.status === 'approved' && all.find((x) => x.id === d.id)!.kind === 'data')
        .map((d) => d.id),
    );
    const globex = await call('GET', `${a.engine}/v1/queue?status=approved,denied&tenant_id=globex`, {
      key: reader,
    });
    expect(ids(globex)).to.deep.equal([all[3]!.id]);
    const query = await call('GET', `${a.engine}/v1/queue?status=pending&action=query`, { key: reader });
    expect(ids(query)).to.deep.equal([all[7]!.id]);
    const both = await call('GET', `${a.engine}/v1/queue?status=denied&action=delete&tenant_id=acme`, {
      key: reader,
    });
    expect(both.json.items).to.deep.equal([]);
  });

  it('selects by created_at with since (inclusive) and until (exclusive)', async () => {
    const items = (await call('GET', `${a.engine}/v1/queue?status=approved,denied`, { key: reader })).json
      .items as { id: string; created_at: string }[];
    const byCreation = [...items].sort((x, y) => x.created_at.localeCompare(y.created_at));
    const pivot = byCreation[2]!;
    const since = await call(
      'GET',
      `${a.engine}/v1/queue?status=approved,denied&since=${encodeURIComponent(pivot.created_at)}`,
      { key: reader },
    );
    expect(ids(since).sort()).to.deep.equal(
      byCreation
        .filter((i) => i.created_at >= pivot.created_at)
        .map((i) => i.id)
        .sort(),
    );
    const until = await call(
      'GET',
      `${a.engine}/v1/queue?status=approved,denied&until=${encodeURIComponent(pivot.created_at)}`,
      { key: reader },
    );
    expect(ids(until).sort()).to.deep.equal(
      byCreation
        .filter((i) => i.created_at < pivot.created_at)
        .map((i) => i.id)
        .sort(),
    );
    // Another time zone names the same instant.
    const t = new Date(Date.parse(pivot.created_at) + 2 * 3600_000).toISOString().replace('Z', '+02:00');
    const offset = await call(
      'GET',
      `${a.engine}/v1/queue?status=approved,denied&since=${encodeURIComponent(t)}`,
      {
        key: reader,
      },
    );
    expect(ids(offset)).to.deep.equal(ids(since));
    const future = await call('GET', `${a.engine}/v1/queue?since=2999-01-01T00:00:00Z`, { key: reader });
    expect(future.json).to.deep.equal({ items: [], next_cursor: null });
  });

  it('pages decided items with limit and cursor, each once, next_cursor null on the last page', async () => {
    const seen: string[] = [];
    let url = `${a.engine}/v1/queue?status=approved,denied&limit=2`;
    for (let page = 0; page < 10; page++) {
      const r = await call('GET', url, { key: reader });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.items.length).to.be.at.most(2);
      seen.push(...ids(r));
      if (r.json.next_cursor === null) break;
      url = `${a.engine}/v1/queue?status=approved,denied&limit=2&cursor=${encodeURIComponent(r.json.next_cursor)}`;
    }
    expect(seen).to.deep.equal(decided.map((d) => d.id));
  });

  it('refuses a cursor made for another state or list', async () => {
    const first = await call('GET', `${a.engine}/v1/queue?status=approved&limit=1`, { key: reader });
    const cursor = encodeURIComponent(first.json.next_cursor);
    expectError(
      await call('GET', `${a.engine}/v1/queue?status=denied&cursor=${cursor}`, { key: reader }),
      400,
      /cursor/,
    );
    expectError(await call('GET', `${a.engine}/v1/queue?cursor=${cursor}`, { key: reader }), 400, /cursor/);
    // Pending cursors are those of /v1/queue/pending.
    const pending = await call('GET', `${a.engine}/v1/queue/pending?limit=1`, { key: reader });
    const next = await call(
      'GET',
      `${a.engine}/v1/queue?limit=1&cursor=${encodeURIComponent(pending.json.next_cursor)}`,
      {
        key: reader,
      },
    );
    expect(next.status).to.equal(200);
    expect(ids(next)).to.deep.equal([pendingIds()[1]]);
  });

  it('answers 400 naming the parameter for a bad status, time, limit, cursor, filter or unknown parameter', async () => {
    const cases: [string, RegExp][] = [
      ['status=done', /status/],
      ['status=pending,approved', /status/],
      ['status=approved,approved', /status/],
      ['status=', /status/],
      ['since=yesterday', /since/],
      ['until=2026-02-30T00:00:00Z', /until/],
      ['since=2026-01-01', /since/],
      ['limit=0', /limit/],
      ['limit=1001', /limit/],
      ['cursor=!!!', /cursor/],
      ['agent_id=', /agent_id/],
      [`action=${'x'.repeat(257)}`, /action/],
      ['status=approved&status=denied', /status/],
      ['colour=red', /unknown query parameter colour/],
    ];
    for (const [q, message] of cases) {
      expectError(await call('GET', `${a.engine}/v1/queue?${q}`, { key: reader }), 400, message);
    }
  });

  it('shows a tenant-bound key only its tenant, and answers 403 when it asks for another', async () => {
    for (const status of ['pending', 'approved,denied,expired']) {
      const r = await call('GET', `${a.engine}/v1/queue?status=${status}`, { key: acme });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.items.length).to.be.greaterThan(0);
      for (const item of r.json.items) expect(item.tenant_id).to.equal('acme');
    }
    const own = await call('GET', `${a.engine}/v1/queue?status=approved&tenant_id=acme`, { key: acme });
    expect(ids(own)).to.deep.equal([all[2]!.id]);
    expectError(
      await call('GET', `${a.engine}/v1/queue?status=denied&tenant_id=globex`, { key: acme }),
      403,
      'API key is bound to tenant acme',
    );
  });

  it('shows an agent-bound key only its agent, and answers 403 when it asks for another', async () => {
    const r = await call('GET', `${a.engine}/v1/queue?status=approved,denied`, { key: dataBotKey });
    expect(r.status).to.equal(200);
    expect(r.json.items.length).to.equal(2);
    for (const item of r.json.items) expect(item.agent_id).to.equal('data-bot');
    expectError(
      await call('GET', `${a.engine}/v1/queue?agent_id=deploy-bot`, { key: dataBotKey }),
      403,
      'API key is bound to agent data-bot',
    );
  });

  it('needs queue:read', async () => {
    const authorizer = a.createKey('only-authorize', ['authorize']);
    expectError(
      await call('GET', `${a.engine}/v1/queue`, { key: authorizer }),
      403,
      'API key lacks scope queue:read',
    );
    const r = await call('GET', `${a.engine}/v1/queue`, { key: null });
    expectError(r, 401);
    expect(r.headers.get('www-authenticate')).to.match(/^Bearer/);
    // The Engine API serves it; the Platform API does not.
    expectError(await call('GET', `${a.platform}/v1/queue`, { key: reader }), 404);
  });
});

onEveryBackend('GET /v1/queue with expired items', () => {
  let a: Arbiter;
  let reader: string;
  before(async () => {
    a = await Arbiter.start({ ARBITER_QUEUE_TTL_SECONDS: '1' });
    reader = a.createKey('reader', ['queue:read']);
  });
  after(async () => {
    await a.close();
  });

  it('lists an item past its expiry as expired (decided_at = expires_at), never as pending', async () => {
    const id = await queued(a, AGENT.approval);
    expect(ids(await call('GET', `${a.engine}/v1/queue`, { key: reader }))).to.deep.equal([id]);
    await sleep(1200);
    // Before any sweep or read of the item itself.
    expect(ids(await call('GET', `${a.engine}/v1/queue`, { key: reader }))).to.deep.equal([]);
    const r = await call('GET', `${a.engine}/v1/queue?status=expired`, { key: reader });
    expect(r.status).to.equal(200);
    expect(ids(r)).to.deep.equal([id]);
    expect(r.json.items[0]).to.include({ status: 'expired', decided_by: null, note: null });
    expect(r.json.items[0].decided_at).to.equal(r.json.items[0].expires_at);
  });
});

onEveryBackend('GET /v1/queue/{id}/events (an item’s audit trail)', () => {
  let a: Arbiter;
  let reviewer: string;
  let reader: string;
  let acme: string;

  before(async () => {
    a = await Arbiter.start();
    reviewer = a.createKey('alice-reviewer', ['queue:read', 'queue:review']);
    reader = a.createKey('queue-reader', ['queue:read']);
    acme = a.createKey('acme-reviewer', ['queue:read', 'queue:review'], { tenant: 'acme' });
  });
  after(async () => {
    await a.close();
  });

  it('returns the decision with its policy reasons, the approval and the token mint, oldest first', async () => {
    const r0 = await call('POST', `${a.engine}/v1/agent/authorize`, {
      body: { ...AGENT.approval, context: { ticket: 'CHG-7' } },
    });
    const id = r0.json.request_id as string;
    await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
      key: reviewer,
      body: { note: 'checked CHG-7' },
    });
    const mint = await call('POST', `${a.engine}/v1/tokens/mint`, { body: { request_id: id } });
    expect(mint.status, mint.text).to.equal(201);

    const r = await call('GET', `${a.engine}/v1/queue/${id}/events`, { key: reader });
    expect(r.status, r.text).to.equal(200);
    expect(r.json).to.have.keys('id', 'trace_id', 'events', 'next_cursor');
    expect(r.json).to.include({ id, trace_id: r0.json.trace_id, next_cursor: null });
    const events = r.json.events as Record<string, unknown>[];
    expect(events.map((e) => e.kind)).to.deep.equal(['decision', 'queue.approve', 'token.mint']);
    for (const e of events) expect(e.request_id).to.equal(id);
    expect(events[0]).to.include({ outcome: 'requires_approval', actor: 'admin' });
    expect((events[0]!.details as { reasons: string[] }).reasons).to.deep.equal([
      'deploy to production requires approval',
    ]);
    expect(events[1]).to.include({ outcome: 'approved', actor: 'alice-reviewer', message: 'checked CHG-7' });
    expect(events[2]).to.include({ outcome: 'minted' });
    // The same events as the Platform API's audit query shows, in the same order.
    const audit = await call('GET', `${a.platform}/api/v1/audit?request_id=${id}`);
    expect(events).to.deep.equal([...audit.json.events].reverse());
  });

  it('pages with limit and cursor', async () => {
    const id = await queued(a, HUMAN.approval);
    await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: reviewer });
    const first = await call('GET', `${a.engine}/v1/queue/${id}/events?limit=1`, { key: reader });
    expect(first.json.events.map((e: { kind: string }) => e.kind)).to.deep.equal(['decision']);
    expect(first.json.next_cursor).to.be.a('string');
    const second = await call(
      'GET',
      `${a.engine}/v1/queue/${id}/events?limit=1&cursor=${encodeURIComponent(first.json.next_cursor)}`,
      { key: reader },
    );
    expect(second.json.events.map((e: { kind: string }) => e.kind)).to.deep.equal(['queue.deny']);
    expect(second.json.next_cursor).to.equal(null);
    // A cursor of one item's trail is no cursor for another's.
    const other = await queued(a, AGENT.approval);
    expectError(
      await call(
        'GET',
        `${a.engine}/v1/queue/${other}/events?cursor=${encodeURIComponent(first.json.next_cursor)}`,
        {
          key: reader,
        },
      ),
      400,
      /cursor/,
    );
    expectError(
      await call('GET', `${a.engine}/v1/queue/${id}/events?kind=decision`, { key: reader }),
      400,
      /kind/,
    );
  });

  it('follows the item’s binding rule: 404 unknown, 403 for another tenant, queue:read needed', async () => {
    expectError(await call('GET', `${a.engine}/v1/queue/${randomUUID()}/events`, { key: reader }), 404);
    const globex = await queued(a, GLOBEX_APPROVAL);
    expectError(
      await call('GET', `${a.engine}/v1/queue/${globex}/events`, { key: acme }),
      403,
      'API key is bound to tenant acme',
    );
    const own = await queued(a, HUMAN.approval);
    expect((await call('GET', `${a.engine}/v1/queue/${own}/events`, { key: acme })).status).to.equal(200);
    const authorizer = a.createKey('only-authorize', ['authorize']);
    expectError(
      await call('GET', `${a.engine}/v1/queue/${own}/events`, { key: authorizer }),
      403,
      /queue:read/,
    );
  });
});

onEveryBackend('GET /v1/whoami', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('describes the calling key: name, scopes, tenant and agent, never the key itself', async () => {
    const key = a.createKey('acme-reviewer', ['queue:review', 'queue:read'], { tenant: 'acme' });
    const r = await call('GET', `${a.engine}/v1/whoami`, { key });
    expect(r.status).to.equal(200);
    expect(r.json).to.deep.equal({
      name: 'acme-reviewer',
      scopes: ['queue:read', 'queue:review'],
      tenant: 'acme',
      agent: null,
    });
    expect(r.text).to.not.include(key);
    const agent = a.createKey('bot', ['authorize'], { agent: 'deploy-bot' });
    expect((await call('GET', `${a.engine}/v1/whoami`, { key: agent })).json).to.deep.equal({
      name: 'bot',
      scopes: ['authorize'],
      tenant: null,
      agent: 'deploy-bot',
    });
    expect((await call('GET', `${a.engine}/v1/whoami`)).json).to.deep.equal({
      name: 'admin',
      scopes: ['admin'],
      tenant: null,
      agent: null,
    });
  });

  it('answers 401 without a valid key', async () => {
    expectError(await call('GET', `${a.engine}/v1/whoami`, { key: null }), 401);
    expectError(await call('GET', `${a.engine}/v1/whoami`, { key: 'arb_not-a-key' }), 401);
  });
});

const ALL_STATES = ['approved', 'denied', 'expired'] as const;

/** One seeded queue item, as the test's model of what the store holds. */
interface Seeded {
  id: string;
  status: 'pending' | 'approved' | 'denied' | 'expired';
  tenant: string;
  agent: string;
  action: string;
  /** created_at, and decided_at of a decided item: second `i` of 2026-01-01 */
  at: string;
}

// What one queue page reads is bounded on every backend (each store runs its own statements).
onEveryBackend(
  'GET /v1/queue: a page whose filters no index serves examines a bounded number of items',
  function () {
    this.timeout(300_000);
    let a: Arbiter;
    let reader: string;
    let small: string;
    let busy: string;
    let busyBot: string;
    let busyBoth: string;
    const RARE = [1, 2300, 4499];
    const SMALL = [10, 1000, 2500, 3500, 6000];
    const PENDING_RARE = 2400;
    const SMALL_PENDING = [5, 1500, 2450];
    /** Every seeded item. */
    const items: Seeded[] = [];

    before(async () => {
      a = await Arbiter.start();
      reader = a.createKey('history-reader', ['queue:read']);
      small = a.createKey('small-co-reviewer', ['queue:read', 'queue:review'], { tenant: 'small-co' });
      busy = a.createKey('busy-co-reviewer', ['queue:read', 'queue:review'], { tenant: 'busy-co' });
      busyBot = a.createKey('busy-bot-reader', ['queue:read'], { agent: 'busy-bot' });
      busyBoth = a.createKey('busy-co-bot-reader', ['queue:read'], { tenant: 'busy-co', agent: 'busy-bot' });
      /** Seeds items in SQL (`s`) and mirrors them in `items`: `indices` are those `s.where` holds. */
      const seed = async (
        s: Parameters<typeof seedItems>[1],
        indices: readonly number[],
        row: (i: number) => Pick<Seeded, 'status' | 'action'>,
      ) => {
        await seedItems(a, s);
        for (const i of indices) {
          items.push({ id: seedId(s.prefix, i), tenant: s.tenant, agent: s.agent, at: seedAt(i), ...row(i) });
        }
      };
      const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, k) => from + k);
      // busy-co: 4 500 decided items of busy-bot, a third each approved, denied, expired; three rare.
      const statusOf = (i: number) => (['approved', 'denied', 'expired'] as const)[i % 3]!;
      await seed(
        {
          prefix: 'qb',
          upTo: 4500,
          where: 'i >= 1',
          status: "CASE i % 3 WHEN 0 THEN 'approved' WHEN 1 THEN 'denied' ELSE 'expired' END",
          tenant: 'busy-co',
          agent: 'busy-bot',
          action: `CASE WHEN i IN (${RARE.join(', ')}) THEN 'rare' ELSE 'op' END`,
        },
        range(1, 4500),
        (i) => ({ status: statusOf(i), action: RARE.includes(i) ? 'rare' : 'op' }),
      );
      // other-co: the 2 000 newest decisions, all approved.
      await seed(
        {
          prefix: 'qo',
          upTo: 6500,
          where: 'i > 4500',
          status: "'approved'",
          tenant: 'other-co',
          agent: 'other-bot',
          action: "'op'",
        },
        range(4501, 6500),
        () => ({ status: 'approved', action: 'op' }),
      );
      // small-co: five denials among the others.
      await seed(
        {
          prefix: 'qs',
          upTo: 6500,
          where: `i IN (${SMALL.join(', ')})`,
          status: "'denied'",
          tenant: 'small-co',
          agent: 'small-bot',
          action: "'op'",
        },
        SMALL,
        () => ({ status: 'denied', action: 'op' }),
      );
      // Pending: 2 500 of busy-co (one rare), then three of small-co.
      await seed(
        {
          prefix: 'qp',
          upTo: 2500,
          where: 'i >= 1',
          status: "'pending'",
          tenant: 'busy-co',
          agent: 'busy-bot',
          action: `CASE WHEN i = ${PENDING_RARE} THEN 'rare' ELSE 'op' END`,
        },
        range(1, 2500),
        (i) => ({ status: 'pending', action: i === PENDING_RARE ? 'rare' : 'op' }),
      );
      await seed(
        {
          prefix: 'qq',
          upTo: 2500,
          where: `i IN (${SMALL_PENDING.join(', ')})`,
          status: "'pending'",
          tenant: 'small-co',
          agent: 'small-bot',
          action: "'op'",
        },
        SMALL_PENDING,
        () => ({ status: 'pending', action: 'op' }),
      );
      expect(await a.count('queue_items')).to.equal(items.length);
    });
    after(async () => {
      await a.close();
    });

    /** Decided items matching `keep`, newest decision first; pending ones oldest first. */
    const decided = (keep: (s: Seeded) => boolean = () => true) =>
      items
        .filter((s) => s.status !== 'pending' && keep(s))
        .sort((x, y) => (x.at === y.at ? (x.id < y.id ? 1 : -1) : x.at < y.at ? 1 : -1))
        .map((s) => s.id);
    const pendingIds = (keep: (s: Seeded) => boolean = () => true) =>
      items
        .filter((s) => s.status === 'pending' && keep(s))
        .map((s) => s.id)
        .sort();

    /** Every page of a list, following next_cursor to the end: the ids and each page's size. */
    const pages = async (
      path: string,
      key: string = reader,
    ): Promise<{ ids: string[]; sizes: number[]; first: Response }> => {
      const found: string[] = [];
      const sizes: number[] = [];
      let first: Response | undefined;
      let cursor: string | null = null;
      do {
        const sep = path.includes('?') ? '&' : '?';
        const r = await call(
          'GET',
          `${a.engine}${path}${cursor ? `${sep}cursor=${encodeURIComponent(cursor)}` : ''}`,
          { key },
        );
        expect(r.status, r.text).to.equal(200);
        first ??= r;
        found.push(...ids(r));
        sizes.push(r.json.items.length);
        cursor = r.json.next_cursor;
        expect(sizes.length, `pages of ${path}`).to.be.at.most(12);
      } while (cursor);
      return { ids: found, sizes, first: first! };
    };
    const ALL = 'status=approved,denied,expired';

    // A filter that matched nothing read every decided item in decided_at order (47 ms over 107 000
    // on SQLite's serving thread, linear in the store: docs/performance.md).
    it('answers a filter that matches nothing with empty pages that continue, and ends after the last item', async () => {
      const first = await call('GET', `${a.engine}/v1/queue?${ALL}&action=nothing&limit=1000`, {
        key: reader,
      });
      expect(first.status, first.text).to.equal(200);
      expect(first.json.items).to.deep.equal([]);
      expect(first.json.next_cursor, 'a page that stopped early continues').to.be.a('string');
      // 6 505 decided items, 2 000 a page.
      expect((await pages(`/v1/queue?${ALL}&action=nothing&limit=1000`)).sizes).to.deep.equal([0, 0, 0, 0]);
      expect((await pages(`/v1/queue?${ALL}&since=2030-01-01T00:00:00Z`)).sizes).to.deep.equal([0, 0, 0, 0]);
      // Through the agent's items only (4 500), and through the states asked for (approved and
      // denied: 5 005; approved: 3 500).
      expect((await pages(`/v1/queue?${ALL}&agent_id=busy-bot&action=nothing`)).sizes).to.deep.equal([
        0, 0, 0,
      ]);
      expect((await pages('/v1/queue?status=approved,denied&action=nothing')).sizes).to.deep.equal([0, 0, 0]);
      expect((await pages('/v1/queue?status=approved&until=2026-01-01T00:00:00Z')).sizes).to.deep.equal([
        0, 0,
      ]);
    });

    it('finds every match exactly once, in list order, across pages the bound cut short', async () => {
      const rare = await pages(`/v1/queue?${ALL}&action=rare&limit=10`);
      expect(rare.ids).to.deep.equal(decided((s) => s.action === 'rare'));
      expect(rare.ids).to.deep.equal(['qb-004499', 'qb-002300', 'qb-000001']);
      expect(rare.sizes).to.deep.equal([0, 1, 1, 1]);
      const oldest = await pages(`/v1/queue?${ALL}&until=${seedAt(5)}`);
      expect(oldest.ids).to.deep.equal(['qb-000004', 'qb-000003', 'qb-000002', 'qb-000001']);
      expect(oldest.sizes).to.deep.equal([0, 0, 0, 4]);
      // Pages that fill up are cut after their last item, as before.
      const op = await pages(`/v1/queue?${ALL}&action=op&limit=1000`);
      expect(op.ids).to.deep.equal(decided((s) => s.action === 'op'));
      expect(op.sizes).to.deep.equal([1000, 1000, 1000, 1000, 1000, 1000, 502]);
      const window = await pages(
        `/v1/queue?status=approved,denied&since=${seedAt(2000)}&until=${seedAt(2100)}&limit=7`,
      );
      expect(window.ids).to.deep.equal(
        decided((s) => s.status !== 'expired' && s.at >= seedAt(2000) && s.at < seedAt(2100)),
      );
      expect(new Set(window.ids).size).to.equal(window.ids.length);
      // Through one tenant's items: the five of small-co in one page.
      const smallCo = await pages(`/v1/queue?${ALL}&tenant_id=small-co&action=op`);
      expect(smallCo.ids).to.deep.equal(decided((s) => s.tenant === 'small-co'));
      expect(smallCo.sizes).to.deep.equal([5]);
    });

    it('answers unfiltered and status-only pages full, as before', async () => {
      const cases: [string, (s: Seeded) => boolean, number[]][] = [
        [ALL, () => true, [1000, 1000, 1000, 1000, 1000, 1000, 505]],
        ['status=approved', (s) => s.status === 'approved', [1000, 1000, 1000, 500]],
        ['status=approved,denied', (s) => s.status !== 'expired', [1000, 1000, 1000, 1000, 1000, 5]],
        ['status=denied,expired', (s) => s.status !== 'approved', [1000, 1000, 1000, 5]],
        ['status=expired', (s) => s.status === 'expired', [1000, 500]],
      ];
      for (const [q, keep, sizes] of cases) {
        const all = await pages(`/v1/queue?${q}&limit=1000`);
        expect(all.ids, q).to.deep.equal(decided(keep));
        expect(all.sizes, q).to.deep.equal(sizes);
      }
      // One agent's or one tenant's every decision, through its own index: exact pages.
      const agent = await pages(`/v1/queue?${ALL}&agent_id=busy-bot&limit=1000`);
      expect(agent.ids).to.deep.equal(decided((s) => s.agent === 'busy-bot'));
      expect(agent.sizes).to.deep.equal([1000, 1000, 1000, 1000, 500]);
      const tenant = await pages(`/v1/queue?${ALL}&tenant_id=other-co&limit=1000`);
      expect(tenant.sizes).to.deep.equal([1000, 1000]);
    });

    it("answers a tenant-bound key's pages from its own tenant's items alone: nothing of other tenants shows", async () => {
      // small-co's five decisions lie among 6 500 of other tenants: its pages are what they would be
      // if it were alone (no empty page with a cursor, which would count the others).
      const own = await pages(`/v1/queue?${ALL}`, small);
      expect(own.ids).to.deep.equal(decided((s) => s.tenant === 'small-co'));
      expect(own.sizes).to.deep.equal([5]);
      for (const q of [
        `${ALL}&action=nothing`,
        'status=approved',
        `${ALL}&agent_id=busy-bot`,
        `${ALL}&until=${seedAt(9)}`,
      ]) {
        const r = await call('GET', `${a.engine}/v1/queue?${q}`, { key: small });
        expect(r.status, r.text).to.equal(200);
        expect(r.json, q).to.deep.equal({ items: [], next_cursor: null });
      }
      expect((await pages(`/v1/queue?${ALL}&action=op&limit=2`, small)).sizes).to.deep.equal([2, 2, 1]);
      // busy-co's own 4 500 are examined 2 000 a page, whatever the 2 000 newer ones of other-co.
      for (const key of [busy, busyBot]) {
        const rare = await pages(`/v1/queue?${ALL}&action=rare&limit=10`, key);
        expect(rare.ids).to.deep.equal(['qb-004499', 'qb-002300', 'qb-000001']);
        expect(rare.sizes).to.deep.equal([1, 1, 1]);
        expect((await pages(`/v1/queue?${ALL}&action=nothing`, key)).sizes).to.deep.equal([0, 0, 0]);
        const approved = await pages('/v1/queue?status=approved&limit=1000', key);
        expect(approved.ids).to.deep.equal(decided((s) => s.status === 'approved' && s.tenant === 'busy-co'));
      }
      // A key bound to a tenant and an agent: its pages are exact (examined through either binding,
      // a bound page would count items of the other).
      const both = await call('GET', `${a.engine}/v1/queue?${ALL}&action=rare&limit=10`, { key: busyBoth });
      expect(ids(both)).to.deep.equal(['qb-004499', 'qb-002300', 'qb-000001']);
      expect(both.json.next_cursor).to.equal(null);
      const none = await call('GET', `${a.engine}/v1/queue?${ALL}&action=nothing`, { key: busyBoth });
      expect(none.json).to.deep.equal({ items: [], next_cursor: null });
      expectError(
        await call('GET', `${a.engine}/v1/queue?${ALL}&tenant_id=busy-co`, { key: small }),
        403,
        'API key is bound to tenant small-co',
      );
    });

    it('bounds filtered pending pages the same way, and answers unfiltered ones full', async () => {
      for (const path of [
        '/v1/queue/pending?action=nothing&limit=1000',
        '/v1/queue?action=nothing&limit=1000',
      ]) {
        const none = await pages(path);
        expect(none.sizes, path).to.deep.equal([0, 0]);
        expect(none.first.json.next_cursor, path).to.be.a('string');
      }
      const rare = await pages('/v1/queue/pending?agent_id=busy-bot&action=rare');
      expect(rare.ids).to.deep.equal([seedId('qp', PENDING_RARE)]);
      expect(rare.sizes).to.deep.equal([0, 1]);
      const smallCo = await pages('/v1/queue?status=pending&tenant_id=small-co&limit=2');
      expect(smallCo.ids).to.deep.equal(pendingIds((s) => s.tenant === 'small-co'));
      expect(smallCo.sizes).to.deep.equal([0, 2, 1]);
      const all = await pages('/v1/queue/pending?limit=1000');
      expect(all.ids).to.deep.equal(pendingIds());
      expect(all.sizes).to.deep.equal([1000, 1000, 503]);
      // A bound key's pending pages are exact: bounded, they would count other tenants' items.
      const own = await call('GET', `${a.engine}/v1/queue/pending?limit=2`, { key: small });
      expect(ids(own)).to.deep.equal(pendingIds((s) => s.tenant === 'small-co').slice(0, 2));
      const nothing = await call('GET', `${a.engine}/v1/queue/pending?action=nothing`, { key: small });
      expect(nothing.json).to.deep.equal({ items: [], next_cursor: null });
    });

    it('refuses a bad cursor, or one of another list, with 400', async () => {
      const empty = await call('GET', `${a.engine}/v1/queue?${ALL}&action=nothing`, { key: reader });
      const resume = encodeURIComponent(empty.json.next_cursor as string);
      // A cursor is a position in its list: another filter of the same states may use it.
      expect(
        (await call('GET', `${a.engine}/v1/queue?${ALL}&action=op&limit=1&cursor=${resume}`, { key: reader }))
          .json.items,
      ).to.have.length(1);
      for (const q of [
        `status=approved&cursor=${resume}`,
        `cursor=${resume}`,
        `${ALL}&action=nothing&cursor=x${resume}`,
        `${ALL}&action=nothing&cursor=!!`,
      ]) {
        expectError(await call('GET', `${a.engine}/v1/queue?${q}`, { key: reader }), 400, /cursor/);
      }
      expectError(
        await call('GET', `${a.engine}/v1/queue/pending?cursor=${resume}`, { key: reader }),
        400,
        /cursor/,
      );
      const pendingResume = (
        await call('GET', `${a.engine}/v1/queue/pending?action=nothing`, { key: reader })
      ).json.next_cursor as string;
      expectError(
        await call('GET', `${a.engine}/v1/queue?${ALL}&cursor=${encodeURIComponent(pendingResume)}`, {
          key: reader,
        }),
        400,
        /cursor/,
      );
    });
  },
);

// The plans are those of a store large enough that reading everything would cost more than the
// bound (on a few thousand rows PostgreSQL rightly reads them all, by bitmap): every backend.
onEveryBackend('GET /v1/queue: what a bounded page reads over 60 000 decided items', function () {
  this.timeout(300_000);
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
    await seedItems(a, {
      prefix: 'qd',
      upTo: 60_000,
      where: 'i >= 1',
      status: "CASE i % 3 WHEN 0 THEN 'approved' WHEN 1 THEN 'denied' ELSE 'expired' END",
      tenant: 'busy-co',
      agent: 'busy-bot',
      action: "'op'",
    });
    await seedItems(a, {
      prefix: 'qp',
      upTo: 30_000,
      where: 'i >= 1',
      status: "'pending'",
      tenant: 'busy-co',
      agent: 'busy-bot',
      action: "'op'",
    });
  });
  after(async () => {
    await a.close();
  });

  // What a bounded page reads, as each backend plans it: its index in list order, up to the bound
  // (not every row of the states or of the table, as a filter that matched nothing did).
  it('reads at most its bound through its index, on the plan of each backend', async () => {
    const now = new Date().toISOString();
    const style = a.databaseUrl ? 'postgres' : 'sqlite';
    const statements = [
      { statuses: ALL_STATES, action: 'nothing', limit: 101, examine: QUEUE_EXAMINE },
      { statuses: ['approved', 'denied'] as const, action: 'nothing', limit: 101, examine: QUEUE_EXAMINE },
      { statuses: ['expired'] as const, since: '2030-01-01T00:00:00Z', limit: 101, examine: QUEUE_EXAMINE },
    ].flatMap((f) => {
      const q = decidedQuerySql(f, style);
      return [q.list, q.resume!];
    });
    const pending = pendingQuerySql({ now, action: 'nothing', limit: 101, examine: QUEUE_EXAMINE }, style);
    // And the console's poll, unfiltered (exact): the pending items only, not the decided ones
    // before them in id order.
    const poll = pendingQuerySql({ now, limit: 201 }, style);
    statements.push(pending.list, pending.resume!, poll.list);
    if (a.databaseUrl) {
      await a.alter('ANALYZE queue_items');
      for (const q of statements) {
        const [row] = await a.stored<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
          `EXPLAIN (ANALYZE, FORMAT JSON) ${q.sql}`,
          q.params,
        );
        const plan = row!['QUERY PLAN'][0].Plan;
        const read = scansOf(plan, 'queue_items');
        expect(read.length, JSON.stringify(plan)).to.be.greaterThan(0);
        for (const n of read) {
          const rows =
            (n['Actual Rows'] ?? 0) * (n['Actual Loops'] ?? 1) + (n['Rows Removed by Filter'] ?? 0);
          expect(rows, `${n['Node Type']} read ${rows} rows: ${q.sql}`).to.be.at.most(QUEUE_EXAMINE + 1);
        }
      }
    } else {
      for (const q of statements) {
        const plan = (await a.stored<{ detail: string }>(`EXPLAIN QUERY PLAN ${q.sql}`, q.params)).map(
          (r) => r.detail,
        );
        const reads = plan.filter((d) => /^(SCAN|SEARCH) queue_items/.test(d));
        expect(reads.length, plan.join('; ')).to.be.greaterThan(0);
        for (const d of reads) {
          expect(d, q.sql).to.match(/USING (COVERING )?INDEX queue_(decided|decided_status|pending_id)\b/);
        }
        expect(plan.join('; '), q.sql).not.to.match(/TEMP B-TREE/);
      }
    }
  });
});
