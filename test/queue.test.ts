import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call, HUMAN, REPO, type Response } from './helpers/harness.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** An agent request that needs approval (confidence below approval_below 0.9) for data-bot. */
const dataBotApproval = (n: number) => ({
  agent_id: 'data-bot',
  action: 'query',
  resource: `analytics/report-${n}`,
  confidence: 0.85,
});

/** carol is an editor in acme, bob an editor in globex: deleting a project needs approval. */
const GLOBEX_APPROVAL = { ...HUMAN.approval, tenant_id: 'globex', user_id: 'bob' };

interface AuditRow {
  kind: string;
  trace_id: string;
  request_id: string;
  actor: string;
  outcome: string;
}

/** The audit events of one request, oldest first, as the API shows them. */
async function auditFor(a: Arbiter, requestId: string): Promise<AuditRow[]> {
  return ((await auditEvents(a.platform, { request_id: requestId })) as AuditRow[]).reverse();
}

/** Asks for an agent (or, with `human`, a human) decision that must come back 202, and returns its ids. */
async function requestApproval(
  a: Arbiter,
  body: Record<string, unknown>,
  key?: string,
): Promise<{ id: string; trace_id: string }> {
  const human = 'user_id' in body;
  const r = await call('POST', a.engine + (human ? '/v1/authorize' : '/v1/agent/authorize'), {
    body,
    key,
  });
  expect(r.status, r.text).to.equal(202);
  return { id: r.json.request_id as string, trace_id: r.json.trace_id as string };
}

const ids = (r: Response) => (r.json.items as { id: string }[]).map((i) => i.id);

// The queue, long-polls and expiry live in storage: every backend.
onEveryBackend('human-review queue', () => {
  let a: Arbiter;
  let reviewer: string;
  let reviewer2: string;
  let reviewer3: string;
  let reader: string;

  before(async () => {
    a = await Arbiter.start();
    reviewer = a.createKey('alice-reviewer', ['queue:read', 'queue:review']);
    reviewer2 = a.createKey('bob-reviewer', ['queue:read', 'queue:review']);
    reviewer3 = a.createKey('carol-reviewer', ['queue:read', 'queue:review']);
    reader = a.createKey('queue-reader', ['queue:read']);
  });
  after(async () => {
    await a.close();
  });

  describe('GET /v1/queue/pending', () => {
    // Every item this block creates, oldest first; the block approves and denies some at the end.
    const created: { id: string; kind: string }[] = [];

    before(async () => {
      const bodies: [string, Record<string, unknown>][] = [
        ['deploy', AGENT.approval],
        ['human-acme', HUMAN.approval],
        ['data', dataBotApproval(1)],
        ['human-globex', GLOBEX_APPROVAL],
        ['data', dataBotApproval(2)],
        ['deploy', AGENT.approval],
        ['data', dataBotApproval(3)],
        ['human-acme', { ...HUMAN.approval, resource: { type: 'project', id: 'p2' } }],
        ['data', dataBotApproval(4)],
        ['data', dataBotApproval(5)],
      ];
      for (const [kind, body] of bodies) created.push({ id: (await requestApproval(a, body)).id, kind });
    });

    it('lists pending items oldest first', async () => {
      const r = await call('GET', a.engine + '/v1/queue/pending', { key: reader });
      expect(r.status).to.equal(200);
      expect(r.json).to.have.keys('items', 'next_cursor');
      expect(r.json.next_cursor).to.equal(null);
      expect(ids(r)).to.deep.equal(created.map((c) => c.id));
      const times = (r.json.items as { created_at: string }[]).map((i) => Date.parse(i.created_at));
      expect(times).to.deep.equal([...times].sort((x, y) => x - y));
      for (const item of r.json.items) expect(item.status).to.equal('pending');
    });

    it('filters by agent_id', async () => {
      const r = await call('GET', a.engine + '/v1/queue/pending?agent_id=deploy-bot', { key: reader });
      expect(r.status).to.equal(200);
      expect(ids(r)).to.deep.equal(created.filter((c) => c.kind === 'deploy').map((c) => c.id));
      for (const item of r.json.items) expect(item.agent_id).to.equal('deploy-bot');
    });

    it('filters by tenant_id', async () => {
      const acme = await call('GET', a.engine + '/v1/queue/pending?tenant_id=acme', { key: reader });
      expect(acme.status).to.equal(200);
      expect(ids(acme)).to.deep.equal(created.filter((c) => c.kind === 'human-acme').map((c) => c.id));
      for (const item of acme.json.items) {
        expect(item).to.include({ tenant_id: 'acme', kind: 'human', user_id: 'carol' });
      }
      const globex = await call('GET', a.engine + '/v1/queue/pending?tenant_id=globex', { key: reader });
      expect(ids(globex)).to.deep.equal(created.filter((c) => c.kind === 'human-globex').map((c) => c.id));
    });

    it('filters by action', async () => {
      const r = await call('GET', a.engine + '/v1/queue/pending?action=query', { key: reader });
      expect(r.status).to.equal(200);
      expect(ids(r)).to.deep.equal(created.filter((c) => c.kind === 'data').map((c) => c.id));
      const both = await call('GET', a.engine + '/v1/queue/pending?action=delete&tenant_id=globex', {
        key: reader,
      });
      expect(ids(both)).to.deep.equal(created.filter((c) => c.kind === 'human-globex').map((c) => c.id));
      const none = await call('GET', a.engine + '/v1/queue/pending?action=no-such-action', { key: reader });
      expect(none.json).to.deep.equal({ items: [], next_cursor: null });
    });

    it('pages with limit and cursor, each item exactly once, next_cursor null on the last page', async () => {
      const expected = created.filter((c) => c.kind === 'data').map((c) => c.id);
      expect(expected).to.have.length(5);
      const seen: string[] = [];
      const cursors: (string | null)[] = [];
      let url = a.engine + '/v1/queue/pending?agent_id=data-bot&limit=2';
      for (let page = 0; page < 10; page++) {
        const r = await call('GET', url, { key: reader });
        expect(r.status, r.text).to.equal(200);
        expect(r.json.items.length).to.be.at.most(2);
        seen.push(...ids(r));
        cursors.push(r.json.next_cursor);
        if (r.json.next_cursor === null) break;
        expect(r.json.next_cursor).to.be.a('string').and.not.equal('');
        url = `${a.engine}/v1/queue/pending?agent_id=data-bot&limit=2&cursor=${encodeURIComponent(r.json.next_cursor)}`;
      }
      expect(seen).to.deep.equal(expected);
      expect(cursors).to.have.length(3);
      expect(cursors[2]).to.equal(null);
    });

    it('does not skip or repeat earlier items when new ones arrive between pages', async () => {
      const expected = created.filter((c) => c.kind === 'data').map((c) => c.id);
      const first = await call('GET', a.engine + '/v1/queue/pending?agent_id=data-bot&limit=2', {
        key: reader,
      });
      expect(ids(first)).to.deep.equal(expected.slice(0, 2));
      const late = [
        (await requestApproval(a, dataBotApproval(6))).id,
        (await requestApproval(a, dataBotApproval(7))).id,
      ];
      const seen = ids(first);
      let cursor: string | null = first.json.next_cursor;
      for (let page = 0; cursor !== null && page < 10; page++) {
        const r = await call(
          'GET',
          `${a.engine}/v1/queue/pending?agent_id=data-bot&limit=2&cursor=${encodeURIComponent(cursor)}`,
          { key: reader },
        );
        expect(r.status, r.text).to.equal(200);
        seen.push(...ids(r));
        cursor = r.json.next_cursor;
      }
      expect(cursor).to.equal(null);
      // The original five, in order, exactly once each; the late arrivals come after them.
      expect(seen).to.deep.equal([...expected, ...late]);
      for (const id of late) created.push({ id, kind: 'data' });
    });

    it('rejects a bad limit or cursor with a 400 naming the parameter', async () => {
      for (const q of ['limit=0', 'limit=1001', 'limit=abc']) {
        expectError(await call('GET', `${a.engine}/v1/queue/pending?${q}`, { key: reader }), 400, /limit/);
      }
      expectError(
        await call('GET', `${a.engine}/v1/queue/pending?cursor=!!!`, { key: reader }),
        400,
        /cursor/,
      );
    });

    it('does not list approved, denied or expired items', async () => {
      const toApprove = created.find((c) => c.kind === 'deploy')!.id;
      const toDeny = created.find((c) => c.kind === 'human-acme')!.id;
      expect(
        (await call('POST', `${a.engine}/v1/queue/${toApprove}/approve`, { key: reviewer })).status,
      ).to.equal(200);
      expect((await call('POST', `${a.engine}/v1/queue/${toDeny}/deny`, { key: reviewer })).status).to.equal(
        200,
      );
      const r = await call('GET', a.engine + '/v1/queue/pending?limit=1000', { key: reader });
      expect(ids(r)).to.not.include(toApprove);
      expect(ids(r)).to.not.include(toDeny);
      expect(ids(r)).to.deep.equal(
        created.map((c) => c.id).filter((id) => id !== toApprove && id !== toDeny),
      );
    });
  });

  describe('GET /v1/queue/{id}', () => {
    it('returns the item with every SPEC §6 field', async () => {
      const { id, trace_id } = await requestApproval(a, { ...AGENT.approval, context: { ticket: 'CHG-1' } });
      const r = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(r.status).to.equal(200);
      for (const f of [
        'id',
        'status',
        'kind',
        'agent_id',
        'tenant_id',
        'action',
        'resource',
        'confidence',
        'context',
        'message',
        'trace_id',
        'created_at',
        'expires_at',
        'decided_at',
        'decided_by',
        'note',
      ]) {
        expect(r.json, f).to.have.property(f);
      }
      expect(r.json).to.include({
        id,
        status: 'pending',
        kind: 'agent',
        agent_id: 'deploy-bot',
        action: 'deploy',
        resource: 'prod/api',
        confidence: 0.95,
        trace_id,
        decided_at: null,
        decided_by: null,
        note: null,
      });
      expect(r.json.context).to.deep.equal({ ticket: 'CHG-1' });
      expect(r.json.message)
        .to.be.a('string')
        .and.match(/approval/);
      expect(Date.parse(r.json.expires_at)).to.be.greaterThan(Date.parse(r.json.created_at));
    });

    it('expires a pending item ARBITER_QUEUE_TTL_SECONDS after it was made, 3600 s by default', async () => {
      const decided = await requestApproval(a, AGENT.approval);
      const r = await call('GET', `${a.engine}/v1/queue/${decided.id}`, { key: reader });
      expect(Date.parse(r.json.expires_at) - Date.parse(r.json.created_at)).to.equal(3600_000);
    });

    it('returns a human item with user_id, tenant_id and the resource object', async () => {
      const { id } = await requestApproval(a, HUMAN.approval);
      const r = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ id, kind: 'human', user_id: 'carol', tenant_id: 'acme', action: 'delete' });
      expect(r.json.resource).to.deep.equal({ type: 'project', id: 'p1' });
    });

    it('answers 404 with an error payload for an unknown or garbage id', async () => {
      expectError(await call('GET', `${a.engine}/v1/queue/${randomUUID()}`, { key: reader }), 404);
      expectError(await call('GET', `${a.engine}/v1/queue/not-an-id%20at-all`, { key: reader }), 404);
    });
  });

  describe('GET /v1/queue/{id}?wait=N', () => {
    it('returns as soon as another key approves the item', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const started = Date.now();
      const poll = call('GET', `${a.engine}/v1/queue/${id}?wait=30`, { key: reader });
      await sleep(300);
      const approved = await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer });
      expect(approved.status).to.equal(200);
      const r = await poll;
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ id, status: 'approved', decided_by: 'alice-reviewer' });
      expect(Date.now() - started).to.be.below(10_000);
    });

    it('answers 401 to a long-poll whose key was revoked while it waited, showing nothing of the decision', async () => {
      const waiter = a.createKey('revoked-while-waiting', ['queue:read']);
      const { id } = await requestApproval(a, AGENT.approval);
      const poll = call('GET', `${a.engine}/v1/queue/${id}?wait=30`, { key: waiter });
      await sleep(300);
      expect(a.cli(['keys', 'revoke', 'revoked-while-waiting']).code).to.equal(0);
      const approved = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
        key: reviewer,
        body: { note: 'ship it' },
      });
      expect(approved.status).to.equal(200);
      const r = await poll;
      expectError(r, 401, 'invalid or revoked API key: it was revoked while the request waited');
      expect(r.text).to.not.contain('alice-reviewer').and.not.contain('ship it');
    });

    it('returns the item still pending when nobody decides it before the wait runs out', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const started = Date.now();
      const r = await call('GET', `${a.engine}/v1/queue/${id}?wait=1`, { key: reader });
      const took = Date.now() - started;
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ id, status: 'pending' });
      expect(took).to.be.at.least(900);
      expect(took).to.be.below(10_000);
    });

    it('returns a decided item at once, whatever the wait', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: reviewer });
      const started = Date.now();
      const r = await call('GET', `${a.engine}/v1/queue/${id}?wait=30`, { key: reader });
      expect(r.json.status).to.equal('denied');
      expect(Date.now() - started).to.be.below(10_000);
    });

    it('accepts the bounds of wait, 0 and 60 s, and answers at once for an item no longer pending', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const approved = await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer });
      expect(approved.status, approved.text).to.equal(200);
      for (const w of ['0', '60']) {
        const r = await call('GET', `${a.engine}/v1/queue/${id}?wait=${w}`, { key: reader });
        expect(r.status, r.text).to.equal(200);
        expect(r.json).to.include({ id, status: 'approved' });
      }
    });

    it('rejects a bad wait with a 400 naming wait', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      for (const w of ['-1', '61', '1000000', 'abc', '']) {
        const r = await call('GET', `${a.engine}/v1/queue/${id}?wait=${encodeURIComponent(w)}`, {
          key: reader,
        });
        expectError(r, 400, /wait/);
      }
    });
  });

  describe('POST /v1/queue/{id}/approve and /deny', () => {
    it('approves with a note: 200 with the item, decided_by the reviewer key name', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const r = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
        key: reviewer,
        body: { note: 'change ticket CHG-42 checked' },
      });
      expect(r.status).to.equal(200);
      expect(r.json).to.include({
        id,
        status: 'approved',
        decided_by: 'alice-reviewer',
        note: 'change ticket CHG-42 checked',
      });
      expect(Number.isNaN(Date.parse(r.json.decided_at))).to.equal(false);
      const again = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(again.json).to.deep.equal(r.json);
    });

    it('denies with a note: 200 with the item', async () => {
      const { id } = await requestApproval(a, HUMAN.approval);
      const r = await call('POST', `${a.engine}/v1/queue/${id}/deny`, {
        key: reviewer2,
        body: { note: 'no' },
      });
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ id, status: 'denied', decided_by: 'bob-reviewer', note: 'no' });
    });

    it('accepts no body at all and stores a null note', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const r = await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer });
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ status: 'approved', note: null });
    });

    it('answers 409 naming the current status to a second decision', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      expect((await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer })).status).to.equal(
        200,
      );
      expectError(
        await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: reviewer2 }),
        409,
        /already approved/,
      );
      expectError(
        await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer2 }),
        409,
        /already approved/,
      );
      const { id: denied } = await requestApproval(a, AGENT.approval);
      expect((await call('POST', `${a.engine}/v1/queue/${denied}/deny`, { key: reviewer })).status).to.equal(
        200,
      );
      expectError(
        await call('POST', `${a.engine}/v1/queue/${denied}/approve`, { key: reviewer }),
        409,
        /already denied/,
      );
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(item.json).to.include({ status: 'approved', decided_by: 'alice-reviewer' });
    });

    it('answers 403 "API key lacks scope queue:review" to a queue:read key, and leaves the item pending', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      for (const verb of ['approve', 'deny']) {
        expectError(
          await call('POST', `${a.engine}/v1/queue/${id}/${verb}`, { key: reader, body: { note: 'no' } }),
          403,
          'API key lacks scope queue:review',
        );
      }
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(item.json).to.include({ status: 'pending', decided_by: null, note: null });
    });

    it('forbids the key that made the request from deciding it, even with queue:review', async () => {
      const selfish = a.createKey('self-approver', ['authorize', 'queue:read', 'queue:review']);
      const { id } = await requestApproval(a, AGENT.approval, selfish);
      expectError(await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: selfish }), 403);
      expectError(await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: selfish }), 403);
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: selfish });
      expect(item.json.status).to.equal('pending');
    });

    it('rejects a note over 2000 characters and leaves the item pending', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const r = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
        key: reviewer,
        body: { note: 'x'.repeat(2001) },
      });
      expectError(r, 400, /note/);
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(item.json).to.include({ status: 'pending', decided_by: null, note: null });
      const ok = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
        key: reviewer,
        body: { note: 'y'.repeat(2000) },
      });
      expect(ok.status).to.equal(200);
      expect(ok.json.note).to.have.length(2000);
    });

    it('rejects an array body, a non-string note and an unknown field with 400', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      for (const verb of ['approve', 'deny']) {
        const url = `${a.engine}/v1/queue/${id}/${verb}`;
        expectError(await call('POST', url, { key: reviewer, body: [{ note: 'x' }] }), 400);
        expectError(await call('POST', url, { key: reviewer, body: { note: 42 } }), 400, /note/);
        expectError(
          await call('POST', url, { key: reviewer, body: { note: 'x', reason: 'y' } }),
          400,
          /reason/,
        );
      }
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(item.json.status).to.equal('pending');
    });

    it('answers 404 for an unknown id', async () => {
      expectError(await call('POST', `${a.engine}/v1/queue/${randomUUID()}/approve`, { key: reviewer }), 404);
      expectError(await call('POST', `${a.engine}/v1/queue/${randomUUID()}/deny`, { key: reviewer }), 404);
    });

    it('lets exactly one of 20 concurrent deciders win; the others get 409', async () => {
      const { id } = await requestApproval(a, AGENT.approval);
      const keys = [reviewer, reviewer2, reviewer3];
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          call('POST', `${a.engine}/v1/queue/${id}/${i % 2 === 0 ? 'approve' : 'deny'}`, {
            key: keys[i % keys.length],
            body: { note: `decider ${i}` },
          }),
        ),
      );
      const statuses = results.map((r) => r.status);
      expect(
        statuses.filter((s) => s === 200),
        statuses.join(','),
      ).to.have.length(1);
      expect(
        statuses.filter((s) => s === 409),
        statuses.join(','),
      ).to.have.length(19);
      const winner = results.find((r) => r.status === 200)!;
      for (const r of results.filter((x) => x.status === 409)) {
        expectError(r, 409, new RegExp(`already ${winner.json.status}`));
      }
      const decisions = (await auditFor(a, id)).filter(
        (e) => e.kind === 'queue.approve' || e.kind === 'queue.deny',
      );
      expect(decisions).to.have.length(1);
      expect(decisions[0]!.outcome).to.equal(winner.json.status);
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reader });
      expect(item.json).to.include({
        status: winner.json.status,
        decided_by: winner.json.decided_by,
        note: winner.json.note,
      });
    });

    it('audits approve and deny with the decision trace_id', async () => {
      const approved = await requestApproval(a, AGENT.approval);
      const denied = await requestApproval(a, HUMAN.approval);
      await call('POST', `${a.engine}/v1/queue/${approved.id}/approve`, {
        key: reviewer,
        body: { note: 'ok' },
      });
      await call('POST', `${a.engine}/v1/queue/${denied.id}/deny`, { key: reviewer2 });
      const a1 = await auditFor(a, approved.id);
      expect(a1.map((e) => e.kind)).to.deep.equal(['decision', 'queue.approve']);
      for (const e of a1) expect(e.trace_id).to.equal(approved.trace_id);
      expect(a1[1]).to.include({ actor: 'alice-reviewer', outcome: 'approved' });
      const d1 = await auditFor(a, denied.id);
      expect(d1.map((e) => e.kind)).to.deep.equal(['decision', 'queue.deny']);
      for (const e of d1) expect(e.trace_id).to.equal(denied.trace_id);
      expect(d1[1]).to.include({ actor: 'bob-reviewer', outcome: 'denied' });
    });
  });

  describe('a tenant-bound reviewer', () => {
    let acmeReviewer: string;
    let acmeItem: string;
    let globexItem: string;
    let agentItem: string;

    before(async () => {
      acmeReviewer = a.createKey('acme-reviewer', ['queue:read', 'queue:review'], { tenant: 'acme' });
      acmeItem = (await requestApproval(a, HUMAN.approval)).id;
      globexItem = (await requestApproval(a, GLOBEX_APPROVAL)).id;
      agentItem = (await requestApproval(a, AGENT.approval)).id;
    });

    it('sees only its tenant in /pending', async () => {
      const r = await call('GET', a.engine + '/v1/queue/pending?limit=1000', { key: acmeReviewer });
      expect(r.status).to.equal(200);
      expect(r.json.items.length).to.be.greaterThan(0);
      for (const item of r.json.items) expect(item.tenant_id).to.equal('acme');
      expect(ids(r)).to.include(acmeItem);
      expect(ids(r)).to.not.include(globexItem);
      expect(ids(r)).to.not.include(agentItem);
      const all = await call('GET', a.engine + '/v1/queue/pending?limit=1000', { key: reader });
      expect(ids(all)).to.include.members([acmeItem, globexItem, agentItem]);
    });

    it('gets 403 for another tenant’s item and cannot approve or deny it (SPEC §2)', async () => {
      expectError(await call('GET', `${a.engine}/v1/queue/${globexItem}`, { key: acmeReviewer }), 403);
      expectError(await call('GET', `${a.engine}/v1/queue/${globexItem}?wait=1`, { key: acmeReviewer }), 403);
      expectError(
        await call('POST', `${a.engine}/v1/queue/${globexItem}/approve`, { key: acmeReviewer }),
        403,
      );
      expectError(await call('POST', `${a.engine}/v1/queue/${globexItem}/deny`, { key: acmeReviewer }), 403);
      const item = await call('GET', `${a.engine}/v1/queue/${globexItem}`, { key: reader });
      expect(item.json).to.include({ status: 'pending', tenant_id: 'globex' });
    });

    it('can read and approve its own tenant’s item', async () => {
      const got = await call('GET', `${a.engine}/v1/queue/${acmeItem}`, { key: acmeReviewer });
      expect(got.status).to.equal(200);
      const r = await call('POST', `${a.engine}/v1/queue/${acmeItem}/approve`, { key: acmeReviewer });
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ status: 'approved', decided_by: 'acme-reviewer' });
    });
  });
});

onEveryBackend('human-review queue expiry', () => {
  let a: Arbiter;
  let reviewer: string;
  before(async () => {
    a = await Arbiter.start({ ARBITER_QUEUE_TTL_SECONDS: '1' });
    reviewer = a.createKey('reviewer', ['queue:read', 'queue:review']);
  });
  after(async () => {
    await a.close();
  });

  it('expires an undecided item after the TTL: shown expired, 409 on approve, 403 on mint, audited', async () => {
    const { id, trace_id } = await requestApproval(a, AGENT.approval);
    const fresh = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reviewer });
    expect(fresh.json.status).to.equal('pending');
    expect(Date.parse(fresh.json.expires_at) - Date.parse(fresh.json.created_at)).to.equal(1000);
    await sleep(1500);

    const r = await call('GET', `${a.engine}/v1/queue/${id}`, { key: reviewer });
    expect(r.status).to.equal(200);
    expect(r.json).to.include({ id, status: 'expired', decided_by: null });

    const pending = await call('GET', `${a.engine}/v1/queue/pending`, { key: reviewer });
    expect(ids(pending)).to.not.include(id);

    expectError(await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer }), 409, /expired/);
    expectError(await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: reviewer }), 409, /expired/);

    // The admin key made the request, so it may try to exchange it.
    expectError(await call('POST', `${a.engine}/v1/tokens/mint`, { body: { request_id: id } }), 403);

    const events = await auditFor(a, id);
    const expired = events.filter((e) => e.kind === 'queue.expire');
    expect(expired).to.have.length(1);
    expect(expired[0]).to.include({ trace_id, outcome: 'expired' });
    expect(events.filter((e) => e.kind === 'queue.approve' || e.kind === 'queue.deny')).to.have.length(0);
  });

  it('shows a waiting long-poll the item as expired once the TTL passes', async () => {
    const { id } = await requestApproval(a, AGENT.approval);
    const started = Date.now();
    const r = await call('GET', `${a.engine}/v1/queue/${id}?wait=30`, { key: reviewer });
    expect(r.status).to.equal(200);
    expect(r.json.status).to.equal('expired');
    expect(Date.now() - started).to.be.below(10_000);
  });
});

// A wall clock stepped back (NTP) while a long-poll waits (test/fixtures/skew-clock.mjs steps it
// on SIGUSR2). Found by a race probe (2026-11-29): the wait's deadline was on the wall clock, so
// a step back of an hour held a `?wait=2` request, and its key's place among the long-polls, for
// an hour and 2 s.
onEveryBackend('long-polls and a wall clock stepped back', function () {
  this.timeout(120_000);
  let a: Arbiter;
  let reviewer: string;
  before(async () => {
    a = await Arbiter.start({
      NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'skew-clock.mjs')}`,
      TEST_CLOCK_JUMP_MS: String(-3600_000),
      ARBITER_MAX_LONG_POLLS_PER_KEY: '1',
    });
    reviewer = a.createKey('reviewer', ['queue:read']);
  });
  after(async () => {
    await a.close();
  });

  it('ends a ?wait=2 when its time has run out, however far the wall clock went back meanwhile', async () => {
    const { id } = await requestApproval(a, AGENT.approval);
    const startPoll = () => call('GET', `${a.engine}/v1/queue/${id}?wait=2`, { key: reviewer });
    let poll = startPoll();
    // The key's one place is taken once the poll is held: a second wait is refused (429). The
    // probe waits 0 s, so it holds the place only for an instant; should the poll have come in
    // during that instant (429 itself), it is sent again.
    let held = false;
    for (let i = 0; i < 100 && !held; i++) {
      const second = await call('GET', `${a.engine}/v1/queue/${id}?wait=0`, { key: reviewer });
      held = second.status === 429;
      if (held) break;
      const early = await Promise.race([poll, sleep(0).then(() => undefined)]);
      if (early?.status === 429) poll = startPoll();
      await sleep(20);
    }
    expect(held, 'the first poll is held').to.equal(true);
    process.kill(a.pid!, 'SIGUSR2');
    for (let i = 0; i < 100 && !a.logs.some((l) => /wall clock stepped/.test(l)); i++) await sleep(50);
    expect(a.logs.some((l) => /wall clock stepped/.test(l))).to.equal(true);

    // Not a timing check: 60 s is the longest wait the API takes; an hour is what it held before.
    const outcome = await Promise.race([poll, sleep(60_000).then(() => 'still held after 60 s')]);
    expect(outcome).to.not.be.a('string');
    const r = outcome as Response;
    expect(r.status).to.equal(200);
    expect(r.json).to.include({ id, status: 'pending' });
    // Its place is free again.
    const again = await call('GET', `${a.engine}/v1/queue/${id}?wait=1`, { key: reviewer });
    expect(again.status).to.equal(200);
  });
});
