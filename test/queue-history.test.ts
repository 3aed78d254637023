import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, call, HUMAN, type Response } from './helpers/harness.js';

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
