import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call, HUMAN } from './helpers/harness.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A request for `agent` that the example policies send to review (deploy to prod). */
const approval = (n: number, agent = 'deploy-bot') => ({
  ...AGENT.approval,
  agent_id: agent,
  resource: `prod/api-${n}`,
});

const FULL = /^review queue full for this API key: it has reached its cap of (\d+) pending approvals/;

/** Pending items stored for the key named `name` (its id is its name's row). */
async function pendingOf(a: Arbiter, keyName: string): Promise<number> {
  const [k] = await a.stored<{ id: string }>('SELECT id FROM api_keys WHERE name = $1', [keyName]);
  return a.count('queue_items', "requested_by = $1 AND status = 'pending'", [k!.id]);
}

// The cap is counted in the decision's transaction (ADR 0013), on each backend's own SQL: every backend.
onEveryBackend('pending approvals capped per API key (ARBITER_QUEUE_MAX_PENDING_PER_KEY)', function () {
  this.timeout(120_000);

  describe('a cap of 3', () => {
    let a: Arbiter;
    let agentKey: string;
    let otherKey: string;
    let reviewer: string;
    before(async () => {
      a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '3' });
      agentKey = a.createKey('flooder', ['authorize']);
      otherKey = a.createKey('neighbour', ['authorize']);
      reviewer = a.createKey('reviewer', ['queue:read', 'queue:review']);
    });
    after(async () => {
      await a.close();
    });

    const ask = (body: Record<string, unknown>, key: string, headers: Record<string, string> = {}) =>
      call('POST', `${a.engine}${'user_id' in body ? '/v1/authorize' : '/v1/agent/authorize'}`, {
        body,
        key,
        headers,
      });

    it('queues three, then denies the fourth with a message naming the cap, and stores no item for it', async () => {
      for (let i = 0; i < 3; i++) expect((await ask(approval(i), agentKey)).status).to.equal(202);
      const r = await ask(approval(3), agentKey);
      expect(r.status, r.text).to.equal(403);
      expect(r.json.status).to.equal('deny');
      expect(r.json.message).to.match(FULL);
      expect(r.json.message).to.include('ARBITER_QUEUE_MAX_PENDING_PER_KEY');
      expect(String(r.json.message).match(FULL)![1]).to.equal('3');
      const id = r.json.request_id as string;
      expect(await a.count('queue_items', 'id = $1', [id])).to.equal(0);
      expect((await call('GET', `${a.engine}/v1/queue/${id}`, { key: reviewer })).status).to.equal(404);
      expect(await pendingOf(a, 'flooder')).to.equal(3);
      // The audit trail records the deny, with its reason, and the request as asked.
      const [event] = (await auditEvents(a.platform, { request_id: id })) as {
        kind: string;
        outcome: string;
        details: { reasons: string[]; resource?: unknown };
      }[];
      expect(event).to.include({ kind: 'decision', outcome: 'deny' });
      expect(event!.details.reasons).to.deep.equal(['pending_approvals_exhausted']);
      // The deny is recorded, so the decision can be read and is never exchangeable.
      const mint = await call('POST', `${a.engine}/v1/tokens/mint`, {
        body: { request_id: id },
        key: agentKey,
      });
      expect(mint.status, mint.text).to.equal(403);
    });

    it("counts the key's human requests too, and answers its allows and denies as before", async () => {
      const human = await ask(HUMAN.approval, agentKey);
      expect(human.status, human.text).to.equal(403);
      expect(human.json.message).to.match(FULL);
      expect((await ask(AGENT.allow, agentKey)).status).to.equal(200);
      const deny = await ask(AGENT.deny, agentKey);
      expect(deny.status).to.equal(403);
      expect(deny.json.message).not.to.match(FULL);
    });

    it('holds each key to its own cap: another key still queues', async () => {
      const r = await ask(approval(10), otherKey);
      expect(r.status, r.text).to.equal(202);
    });

    it('queues again once a reviewer decides one of the pending items', async () => {
      const [k] = await a.stored<{ id: string }>("SELECT id FROM api_keys WHERE name = 'flooder'");
      const [item] = await a.stored<{ id: string }>(
        "SELECT id FROM queue_items WHERE requested_by = $1 AND status = 'pending' ORDER BY created_at LIMIT 1",
        [k!.id],
      );
      const approved = await call('POST', `${a.engine}/v1/queue/${item!.id}/approve`, {
        body: {},
        key: reviewer,
      });
      expect(approved.status, approved.text).to.equal(200);
      expect((await ask(approval(20), agentKey)).status).to.equal(202);
      expect((await ask(approval(21), agentKey)).status).to.equal(403);
      expect(await pendingOf(a, 'flooder')).to.equal(3);
    });

    it('replays a capped request retried with its Idempotency-Key as the deny, even once there is room', async () => {
      const headers = { 'idempotency-key': 'capped-retry-1' };
      const first = await ask(approval(30), agentKey, headers);
      expect(first.status).to.equal(403);
      const [k] = await a.stored<{ id: string }>("SELECT id FROM api_keys WHERE name = 'flooder'");
      const [item] = await a.stored<{ id: string }>(
        "SELECT id FROM queue_items WHERE requested_by = $1 AND status = 'pending' LIMIT 1",
        [k!.id],
      );
      const denied = await call('POST', `${a.engine}/v1/queue/${item!.id}/deny`, {
        body: { note: 'making room' },
        key: reviewer,
      });
      expect(denied.status, denied.text).to.equal(200);
      const retry = await ask(approval(30), agentKey, headers);
      expect(retry.status).to.equal(403);
      expect(retry.json.request_id).to.equal(first.json.request_id);
      expect(retry.json.message).to.equal(first.json.message);
      expect(await pendingOf(a, 'flooder')).to.equal(2);
    });

    it('counts each capped answer in arbiter_queue_capped_total by kind, never a replay', async () => {
      const m = await call('GET', `${a.platform}/metrics`);
      expect(m.status).to.equal(200);
      // This block's capped answers: three agent requests (the fourth, after a review, the first
      // of the retried pair) and one human request; the retry replayed and is not counted again.
      expect(m.text).to.match(/^arbiter_queue_capped_total\{kind="agent"\} 3$/m);
      expect(m.text).to.match(/^arbiter_queue_capped_total\{kind="human"\} 1$/m);
    });
  });

  it('answers concurrent retries of one request at the cap with one decision, as a place comes free', async () => {
    const a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '2' });
    const b = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '2' }, a.dataDir);
    try {
      const key = a.createKey('retrier', ['authorize']);
      const reviewer = a.createKey('retry-reviewer', ['queue:read', 'queue:review']);
      const ask = (x: Arbiter, n: number, idem?: string) =>
        call('POST', `${x.engine}/v1/agent/authorize`, {
          body: approval(n),
          key,
          headers: idem ? { 'idempotency-key': idem } : {},
        });
      const first = await ask(a, 1);
      expect(first.status).to.equal(202);
      expect((await ask(a, 2)).status).to.equal(202);
      for (const round of [1, 2, 3]) {
        // Twelve tries of one request on two processes, while a reviewer frees a place.
        const [answers] = await Promise.all([
          Promise.all(
            Array.from({ length: 12 }, (_, i) => ask(i % 2 ? b : a, 100 + round, `retry-${round}`)),
          ),
          round === 2
            ? call('POST', `${a.engine}/v1/queue/${first.json.request_id as string}/deny`, {
                body: {},
                key: reviewer,
              })
            : Promise.resolve(undefined),
        ]);
        const ids = new Set(answers.map((r) => r.json.request_id as string));
        const statuses = new Set(answers.map((r) => r.status));
        expect(ids.size, `round ${round}: ${[...ids].join(', ')}`).to.equal(1);
        expect(statuses.size, `round ${round}: ${[...statuses].join(', ')}`).to.equal(1);
        expect([...statuses][0]).to.be.oneOf([202, 403]);
        // Exactly one decision recorded for the request, whichever answer it is.
        expect(await a.count('decisions', 'request_id = $1', [[...ids][0]])).to.equal(1);
        expect(
          await a.count('audit_events', "kind = 'decision' AND request_id = $1", [[...ids][0]]),
        ).to.equal(1);
      }
      expect(await pendingOf(a, 'retrier')).to.be.at.most(2);
    } finally {
      await b.close();
      await a.close();
    }
  });

  it('allows exactly the cap of many concurrent requests, from one process and from two on one database', async () => {
    const a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '5' });
    const engines = [a];
    try {
      const key = a.createKey('burst', ['authorize']);
      const answers = await Promise.all(
        Array.from({ length: 24 }, (_, i) =>
          call('POST', `${a.engine}/v1/agent/authorize`, { body: approval(i), key }),
        ),
      );
      const statuses = answers.map((r) => r.status);
      expect(statuses.filter((s) => s === 202)).to.have.length(5);
      expect(statuses.filter((s) => s === 403)).to.have.length(19);
      expect(await pendingOf(a, 'burst')).to.equal(5);

      // Two processes on one PostgreSQL database (on SQLite, two on one file) share the count.
      const b = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '5' }, a.dataDir);
      engines.push(b);
      const key2 = a.createKey('burst-two', ['authorize']);
      const both = await Promise.all(
        Array.from({ length: 24 }, (_, i) =>
          call('POST', `${(i % 2 === 0 ? a : b).engine}/v1/agent/authorize`, {
            body: approval(i),
            key: key2,
          }),
        ),
      );
      expect(both.filter((r) => r.status === 202)).to.have.length(5);
      expect(both.filter((r) => r.status === 403)).to.have.length(19);
      expect(await pendingOf(a, 'burst-two')).to.equal(5);
    } finally {
      for (const e of engines.reverse()) await e.close();
    }
  });

  it('says no more than it knows when the key has more pending than a lowered cap', async () => {
    // The upgrade case: a key flooded the queue under no cap (or a higher one), then the cap came.
    const a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0' });
    const engines = [a];
    try {
      const key = a.createKey('flooded', ['authorize']);
      for (let i = 0; i < 5; i++) {
        const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: approval(i), key });
        expect(r.status, r.text).to.equal(202);
      }
      const b = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '2' }, a.dataDir);
      engines.push(b);
      const headers = { 'idempotency-key': 'lowered-cap-1' };
      const r = await call('POST', `${b.engine}/v1/agent/authorize`, { body: approval(9), key, headers });
      expect(r.status, r.text).to.equal(403);
      // It has 5 pending: the count stops at the cap, so the message must not say "it has 2".
      expect(r.json.message).not.to.match(/it has 2 pending/);
      expect(String(r.json.message).match(FULL)?.[1]).to.equal('2');
      // Asking again under the same key replays this deny: the message says so.
      expect(r.json.message).to.match(/same Idempotency-Key replays this deny/);
    } finally {
      for (const e of engines.reverse()) await e.close();
    }
  });

  it('stops counting an item once it expires, whether or not the sweeper has run', async () => {
    const a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '2', ARBITER_QUEUE_TTL_SECONDS: '1' });
    try {
      const key = a.createKey('expiring', ['authorize']);
      const ask = (n: number) => call('POST', `${a.engine}/v1/agent/authorize`, { body: approval(n), key });
      expect((await ask(1)).status).to.equal(202);
      expect((await ask(2)).status).to.equal(202);
      expect((await ask(3)).status).to.equal(403);
      await sleep(1_500);
      const again = await ask(4);
      expect(again.status, again.text).to.equal(202);
    } finally {
      await a.close();
    }
  });

  it('with 0, caps nothing', async () => {
    const a = await Arbiter.start({ ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0' });
    try {
      const key = a.createKey('uncapped', ['authorize']);
      for (let i = 0; i < 12; i++) {
        const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: approval(i), key });
        expect(r.status, r.text).to.equal(202);
      }
      expect(await pendingOf(a, 'uncapped')).to.equal(12);
    } finally {
      await a.close();
    }
  });
});
