import { expect } from 'chai';
import { checkStoredEvent, GENESIS_HASH, readStoredHead, type ChainHead } from '../../src/audit/chain.js';
import { AuditService } from '../../src/audit/service.js';
import type { AuditStore } from '../../src/audit/store.js';
import type { NewAuditEvent } from '../../src/audit/types.js';
import { BudgetService } from '../../src/decisions/budgets.js';
import type { DecisionRecord } from '../../src/decisions/store.js';
import { newId } from '../../src/ids.js';
import type { ApiKeyRecord } from '../../src/keys/types.js';
import type { PolicyChange } from '../../src/policy/types.js';
import type { LimitUse, QueueItem } from '../../src/queue/types.js';
import type { Stores } from '../../src/storage/stores.js';
import type { SigningKeyRecord, TokenRecord } from '../../src/tokens/types.js';
import type { WebhookRecord } from '../../src/webhooks/types.js';

/**
 * The storage contract, as one suite every backend runs (the pattern of openfga's
 * pkg/storage/test and cerbos's internal.TestSuite): the same test code drives each backend
 * through the Stores interface only. `open` gives a fresh, empty store; `second` another
 * connection (another process, as far as the store can tell) to the same one.
 */
export interface Backend {
  name: string;
  /** A fresh, empty deployment; `second()` opens another handle on the same database. */
  fresh(): Promise<{ stores: Stores; second: () => Promise<Stores>; dispose: () => Promise<void> }>;
}

const iso = (msFromNow = 0) => new Date(Date.now() + msFromNow).toISOString();
const HOUR = 3600_000;

function decision(over: Partial<DecisionRecord> = {}): DecisionRecord {
  const id = newId();
  return {
    request_id: id,
    kind: 'agent',
    status: 'allow',
    key_id: 'key-1',
    tenant_id: null,
    subject: 'bot',
    action: 'read',
    resource: 'repo/x',
    message: null,
    trace_id: 'a'.repeat(32),
    created_at: iso(),
    expires_at: null,
    idem_key: null,
    body_hash: null,
    token_id: null,
    request_digest: null,
    policy_revision: null,
    user_id: null,
    ...over,
  };
}

function item(d: DecisionRecord, over: Partial<QueueItem> = {}): QueueItem {
  return {
    id: d.request_id,
    status: 'pending',
    kind: 'agent',
    agent_id: d.subject,
    user_id: null,
    tenant_id: d.tenant_id,
    action: d.action,
    resource: d.resource,
    confidence: 0.7,
    context: { why: 'test', nested: { n: 1 } },
    message: 'needs a human',
    trace_id: d.trace_id,
    created_at: d.created_at,
    expires_at: iso(HOUR),
    decided_at: null,
    decided_by: null,
    note: null,
    requested_by: d.key_id,
    request_digest: null,
    policy_revision: null,
    on_behalf_of: null,
    limits: null,
    ...over,
  };
}

const event = (d: DecisionRecord): NewAuditEvent => ({
  kind: 'decision',
  request_id: d.request_id,
  trace_id: d.trace_id,
  agent_id: d.subject,
  action: d.action,
  resource: d.resource,
  outcome: d.status,
  details: { reasons: [] },
});

const change = (over: Partial<PolicyChange>): PolicyChange => ({
  expectedRevision: 0,
  putPolicies: [],
  deletePolicies: [],
  putData: [],
  deleteData: [],
  actor: 'tester',
  message: null,
  ...over,
});

const rego = (name: string, body = 'x := 1') => ({
  name,
  rego: `package authz.agent.${name}\n\n${body}\n`,
  description: `policy ${name}`,
  sha256: `${name}-${body}`.padEnd(64, '0').slice(0, 64),
});

/** The recorded head, which must be readable. */
async function headOf(stores: Stores): Promise<ChainHead> {
  const r = readStoredHead(await stores.audit.head());
  if (!r.ok) throw new Error(r.reason);
  return r.head;
}

/** Walks the whole chain through the interface, as AuditService.verify does. */
async function verifyChain(stores: Stores): Promise<{ ok: boolean; checked: number; reason?: string }> {
  const head = await headOf(stores);
  let prev = GENESIS_HASH;
  let after = 0;
  let checked = 0;
  for (;;) {
    const rows = await stores.audit.chunk(after, 500);
    for (const row of rows) {
      const r = checkStoredEvent(row, prev, checked + 1);
      if (!r.ok) return { ok: false, checked, reason: r.reason };
      prev = r.hash;
      checked++;
    }
    if (rows.length < 500) break;
    after = rows[rows.length - 1]!.seq;
  }
  const ok = head.hash === prev && head.count === checked;
  return ok ? { ok, checked } : { ok, checked, reason: 'head does not match the chain' };
}

export function storageContract(backend: Backend): void {
  describe(`storage contract: ${backend.name}`, function () {
    this.timeout(60_000);
    let stores: Stores;
    let second: () => Promise<Stores>;
    let dispose: () => Promise<void>;
    beforeEach(async () => {
      ({ stores, second, dispose } = await backend.fresh());
    });
    afterEach(async () => {
      await stores.close();
      await dispose();
    });

    describe('shared secrets', () => {
      it('keeps the first value stored under a name, for every connection of the deployment', async () => {
        expect(await stores.sharedSecret('cursor_key', 'first')).to.equal('first');
        expect(await stores.sharedSecret('cursor_key', 'second')).to.equal('first');
        const other = await second();
        try {
          expect(await other.sharedSecret('cursor_key', 'third')).to.equal('first');
        } finally {
          await other.close();
        }
      });
    });

    describe('audit chain', () => {
      it('starts empty at the genesis hash, and is healthy', async () => {
        expect(await headOf(stores)).to.deep.equal({ hash: GENESIS_HASH, count: 0 });
        expect(await stores.audit.extent()).to.deep.equal({
          minSeq: null,
          maxSeq: null,
          head: { audit_head: GENESIS_HASH, audit_count: '0' },
        });
        expect(await stores.health()).to.equal(undefined);
      });

      it('reports the extent of the stored rows with the head recorded with them', async () => {
        const [, last] = await stores.audit.append([{ kind: 'x.one' }, { kind: 'x.two' }]);
        expect(await stores.audit.extent()).to.deep.equal({
          minSeq: 1,
          maxSeq: 2,
          head: { audit_head: last!.hash, audit_count: '2' },
        });
      });

      it('links appended events in order, stores what it hashed, and verifies', async () => {
        const a = await stores.audit.append([
          { kind: 'x.one', message: 'first', details: { n: 1, s: 'ü\u{1F680}' } },
          { kind: 'x.two', resource: { type: 'doc', id: '1' } },
        ]);
        const b = await stores.audit.append([{ kind: 'x.three', confidence: 0.25, latency_us: 12 }]);
        expect(a[0]!.prev_hash).to.equal(GENESIS_HASH);
        expect(a[1]!.prev_hash).to.equal(a[0]!.hash);
        expect(b[0]!.prev_hash).to.equal(a[1]!.hash);
        expect(await headOf(stores)).to.deep.equal({ hash: b[0]!.hash, count: 3 });
        expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 3 });
        const [newest] = await stores.audit.query({ limit: 1 });
        expect(newest!.event).to.deep.equal(b[0]);
        const back = (await stores.audit.query({ limit: 10 })).map((r) => r.event);
        expect(back.reverse()).to.deep.equal([...a, ...b]);
      });

      it('filters and pages newest first without skipping or repeating', async () => {
        for (let i = 0; i < 7; i++) {
          await stores.audit.append([
            { kind: i % 2 ? 'odd' : 'even', agent_id: `a${i % 3}`, tenant_id: 't1', trace_id: 'tr' },
          ]);
        }
        const odd = await stores.audit.query({ kind: 'odd', limit: 10 });
        expect(odd.map((r) => r.event.kind)).to.deep.equal(['odd', 'odd', 'odd']);
        const seen: number[] = [];
        let before: number | undefined;
        for (;;) {
          const page = await stores.audit.query({
            tenant_id: 't1',
            limit: 3,
            ...(before ? { before: { seq: before } } : {}),
          });
          seen.push(...page.map((r) => r.seq));
          if (page.length < 3) break;
          before = page[page.length - 1]!.seq;
        }
        expect(seen).to.deep.equal([7, 6, 5, 4, 3, 2, 1]);
        const trace = await stores.audit.trace('tr', 2, 3);
        expect(trace.map((r) => r.seq)).to.deep.equal([3, 4, 5]);
        // Filtered before the limit: a page holds only the tenant's and agent's events.
        const ofAgent = await stores.audit.trace('tr', 0, 2, { tenant_id: 't1', agent_id: 'a1' });
        expect(ofAgent.map((r) => r.seq)).to.deep.equal([2, 5]);
        expect(await stores.audit.trace('tr', 0, 1, { tenant_id: 't2' })).to.deep.equal([]);
        expect(await stores.audit.trace('tr', 0, 10, { agent_id: 'a9' })).to.deep.equal([]);
        const byTime = await stores.audit.query({ since: '2000-01-01T00:00:00.000Z', limit: 2 });
        expect(byTime.map((r) => r.seq)).to.deep.equal([7, 6]);
      });

      it('walks again for an anchor newer than the walk it joined (taken meanwhile on another handle)', async () => {
        await stores.audit.append([{ kind: 'x.one' }, { kind: 'x.two' }, { kind: 'x.three' }]);
        // This handle's walk reads the head (3 events) and is held there.
        let release!: () => void;
        const gate = new Promise<void>((r) => (release = r));
        let headRead!: () => void;
        const read = new Promise<void>((r) => (headRead = r));
        const gated = {
          head: async () => {
            const h = await stores.audit.head();
            headRead();
            await gate;
            return h;
          },
          chunk: (after: number, limit: number) => stores.audit.chunk(after, limit),
          extent: () => stores.audit.extent(),
        } as unknown as AuditStore;
        const here = new AuditService(gated, (d) => d, 65_536);
        const running = here.verify();
        await read;
        // Meanwhile two more events, and an anchor taken of all five on another handle.
        const other = await second();
        try {
          await other.audit.append([{ kind: 'x.four' }, { kind: 'x.five' }]);
          const anchor = await new AuditService(other.audit, (d) => d, 65_536).verify();
          expect(anchor).to.include({ ok: true, checked: 5 });
          const anchored = here.verify({ head: (anchor as { head: string }).head, count: 5 });
          release();
          expect(await running).to.include({ ok: true, checked: 3 });
          expect(await anchored).to.include({ ok: true, checked: 5 });
        } finally {
          await other.close();
        }
      });

      it('keeps one chain when two handles append concurrently', async () => {
        const other = await second();
        try {
          await Promise.all(
            Array.from({ length: 40 }, (_, i) =>
              (i % 2 ? other : stores).audit.append([
                { kind: 'race', message: String(i) },
                { kind: 'race.b' },
              ]),
            ),
          );
          expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 80 });
          expect((await headOf(other)).count).to.equal(80);
        } finally {
          await other.close();
        }
      });
    });

    describe('decisions and idempotency', () => {
      it('records a decision with its queue item and audit event, atomically', async () => {
        const d = decision({ status: 'requires_approval', expires_at: iso(HOUR) });
        const it = item(d);
        const r = await stores.decisions.record({
          decision: d,
          event: event(d),
          item: it,
          idemSince: iso(-HOUR),
        });
        expect(r).to.have.property('recorded');
        expect(await stores.decisions.get(d.request_id)).to.deep.equal(d);
        expect(await stores.queue.get(d.request_id)).to.deep.equal(it);
        const [ev] = await stores.audit.byRequest(d.request_id, 0, 10);
        expect(ev!.event).to.include({
          kind: 'decision',
          request_id: d.request_id,
          outcome: 'requires_approval',
        });
      });

      it('replays a decision whose idempotency key was used within the window, writing nothing', async () => {
        const first = decision({ idem_key: 'k1', body_hash: 'h' });
        await stores.decisions.record({
          decision: first,
          event: event(first),
          item: undefined,
          idemSince: iso(-HOUR),
        });
        const retry = decision({ idem_key: 'k1', body_hash: 'h' });
        const r = await stores.decisions.record({
          decision: retry,
          event: event(retry),
          item: undefined,
          idemSince: iso(-HOUR),
        });
        expect(r).to.deep.equal({ replay: first });
        expect(await stores.decisions.get(retry.request_id)).to.equal(undefined);
        expect((await headOf(stores)).count).to.equal(1);
        expect(await stores.decisions.findByIdempotencyKey('key-1', 'k1', iso(-HOUR))).to.deep.equal(first);
        // Another API key's identical idempotency key is another request.
        const other = decision({ idem_key: 'k1', key_id: 'key-2' });
        expect(
          await stores.decisions.record({
            decision: other,
            event: event(other),
            item: undefined,
            idemSince: iso(-HOUR),
          }),
        ).to.have.property('recorded');
      });

      it('lets an idempotency key be used again once its window has passed', async () => {
        const old = decision({ idem_key: 'k2', created_at: iso(-3 * HOUR) });
        await stores.decisions.record({
          decision: old,
          event: event(old),
          item: undefined,
          idemSince: iso(-4 * HOUR),
        });
        const fresh = decision({ idem_key: 'k2' });
        expect(
          await stores.decisions.record({
            decision: fresh,
            event: event(fresh),
            item: undefined,
            idemSince: iso(-HOUR),
          }),
        ).to.have.property('recorded');
        expect(await stores.decisions.findByIdempotencyKey('key-1', 'k2', iso(-HOUR))).to.deep.equal(fresh);
        expect((await stores.decisions.get(old.request_id))?.idem_key).to.equal(null);
      });

      it('replays the first of two retries that arrive together, and across handles', async () => {
        const other = await second();
        try {
          const tries = Array.from({ length: 6 }, () => decision({ idem_key: 'k3', body_hash: 'h' }));
          const out = await Promise.all(
            tries.map((d, i) =>
              (i % 2 ? other : stores).decisions.record({
                decision: d,
                event: event(d),
                item: undefined,
                idemSince: iso(-HOUR),
              }),
            ),
          );
          const recorded = out.filter((o) => 'recorded' in o);
          expect(recorded).to.have.length(1);
          const winner = tries[out.findIndex((o) => 'recorded' in o)]!;
          for (const o of out) if ('replay' in o) expect(o.replay.request_id).to.equal(winner.request_id);
          expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 1 });
        } finally {
          await other.close();
        }
      });
    });

    describe('budgets', () => {
      const HOUR_MS = 3600_000;
      const use = (over: Partial<LimitUse> = {}): LimitUse => ({
        key: 'agent:bot:calls',
        window: '1h',
        windowMs: HOUR_MS,
        windowStart: new Date(Math.floor(Date.now() / HOUR_MS) * HOUR_MS).toISOString(),
        max: 5_000_000,
        cost: 1_000_000,
        ...over,
      });
      /** An allow charging `limits`, with the deny that replaces it when one is exhausted. */
      const charged = (limits: LimitUse[]) => {
        const d = decision();
        const denials = limits.map((l) => {
          const denial = { ...d, status: 'deny' as const, message: `limit ${l.key} exhausted` };
          return { decision: denial, event: { ...event(denial), outcome: 'deny' } };
        });
        return { decision: d, event: event(d), idemSince: iso(-HOUR), charge: { limits, denials } };
      };

      it('allows exactly min(N, M) of N concurrent requests against a budget of M, across handles', async () => {
        const other = await second();
        try {
          const out = await Promise.all(
            Array.from({ length: 12 }, (_, i) => (i % 2 ? other : stores).decisions.record(charged([use()]))),
          );
          const statuses = out.map((o) => ('recorded' in o ? o.decision.status : 'replay'));
          expect(statuses.filter((x) => x === 'allow')).to.have.length(5);
          expect(statuses.filter((x) => x === 'deny')).to.have.length(7);
          for (const o of out) {
            if ('recorded' in o && o.decision.status === 'deny')
              expect(o.exhausted?.key).to.equal('agent:bot:calls');
            if ('recorded' in o) expect(o.recorded.outcome).to.equal(o.decision.status);
          }
          const [counter] = await stores.limits.latest('agent:bot:calls');
          expect(counter).to.include({
            key: 'agent:bot:calls',
            window: '1h',
            used: 5_000_000,
            max: 5_000_000,
          });
        } finally {
          await other.close();
        }
      });

      it('replays the deny a budget recorded, not the allow it replaced, to retries of its key', async () => {
        const empty = use({ key: 'agent:bot:none', max: 0 });
        const tries = Array.from({ length: 6 }, () => {
          const c = charged([empty]);
          const keyed = (d: DecisionRecord) => ({ ...d, idem_key: 'k-budget', body_hash: 'h' });
          return {
            ...c,
            decision: keyed(c.decision),
            charge: {
              ...c.charge,
              denials: c.charge.denials.map((x) => ({ ...x, decision: keyed(x.decision) })),
            },
          };
        });
        // Submitted together, so they share one batch (one transaction) on either backend.
        const out = await Promise.all(tries.map((t) => stores.decisions.record(t)));
        const recorded = out.filter((o) => 'recorded' in o);
        expect(recorded).to.have.length(1);
        const first = recorded[0] as { decision: DecisionRecord };
        expect(first.decision.status).to.equal('deny');
        for (const o of out) {
          expect(o, 'a deny is never capped').to.not.have.property('capped');
          const d = 'replay' in o ? o.replay : 'decision' in o ? o.decision : undefined;
          expect(d).to.include({ status: 'deny', request_id: first.decision.request_id });
        }
        expect(await stores.decisions.findByIdempotencyKey('key-1', 'k-budget', iso(-HOUR))).to.include({
          status: 'deny',
        });
      });

      it('consumes every limit of a decision or none, and counts windows separately', async () => {
        const money = use({ key: 'tenant:acme:usd', max: 1_000_000, cost: 600_000 });
        expect(
          ((await stores.decisions.record(charged([use(), money]))) as { decision: DecisionRecord }).decision
            .status,
        ).to.equal('allow');
        const second_ = (await stores.decisions.record(charged([use(), money]))) as {
          decision: DecisionRecord;
          exhausted?: LimitUse;
        };
        expect(second_.decision.status).to.equal('deny');
        expect(second_.exhausted?.key).to.equal('tenant:acme:usd');
        const byKey = new Map((await stores.limits.latest(undefined)).map((c) => [c.key, c]));
        // The calls budget was not charged by the refused decision.
        expect(byKey.get('agent:bot:calls')?.used).to.equal(1_000_000);
        expect(byKey.get('tenant:acme:usd')?.used).to.equal(600_000);
        const nextWindow = new Date(Math.floor(Date.now() / HOUR_MS + 1) * HOUR_MS).toISOString();
        const later = (await stores.decisions.record(
          charged([money].map((m) => ({ ...m, windowStart: nextWindow }))),
        )) as {
          decision: DecisionRecord;
        };
        expect(later.decision.status).to.equal('allow');
        expect((await stores.limits.latest('tenant:acme:usd'))[0]).to.include({
          windowStart: nextWindow,
          used: 600_000,
        });
      });
    });

    describe('budget counter sweep', () => {
      const HOUR_MS = 3600_000;
      const YEAR_MS = 366 * 24 * HOUR_MS;
      const at = (ms: number) => new Date(ms).toISOString();
      /** Window starts are aligned to the epoch: T0 to the hour, Y0 to 366 days. */
      const T0 = Date.UTC(2030, 0, 1);
      const Y0 = Math.floor(T0 / YEAR_MS) * YEAR_MS;
      const charge = async (l: Partial<LimitUse>) => {
        const d = decision();
        const denial = {
          decision: { ...d, status: 'deny' as const },
          event: event({ ...d, status: 'deny' }),
        };
        const limit: LimitUse = {
          key: 'sweep:hourly',
          window: '1h',
          windowMs: HOUR_MS,
          windowStart: at(T0),
          max: 1_000_000,
          cost: 1_000_000,
          ...l,
        };
        const r = await stores.decisions.record({
          decision: d,
          event: event(d),
          idemSince: iso(-HOUR),
          charge: { limits: [limit], denials: [denial] },
        });
        return 'recorded' in r ? r.decision.status : 'replay';
      };

      it('keeps a superseded counter until its successor began one whole window ago', async () => {
        let now = 0;
        const budgets = new BudgetService(stores.limits, () => now);
        for (const n of [0, 1, 2])
          expect(await charge({ windowStart: at(T0 + n * HOUR_MS) })).to.equal('allow');
        const year = { key: 'sweep:yearly', window: '8784h', windowMs: YEAR_MS };
        for (const n of [0, 1])
          expect(await charge({ ...year, windowStart: at(Y0 + n * YEAR_MS) })).to.equal('allow');
        // 6 minutes into hour 2 (and 200 days into year 1): hour 0 goes, hour 1 stays, so an
        // engine whose clock lags by less than an hour still finds it used up.
        now = T0 + 2 * HOUR_MS + 6 * 60_000;
        expect(await budgets.sweep()).to.equal(1);
        expect(await charge({ windowStart: at(T0 + HOUR_MS) })).to.equal('deny');
        // (Hour 0 starts from zero again: a clock two hours behind is beyond what budgets hold.)
        expect(await charge({ windowStart: at(T0) })).to.equal('allow');
        // Up to exactly one window after its successor began, hour 1 stays (hour 0 goes again);
        // then it goes.
        now = T0 + 3 * HOUR_MS;
        expect(await budgets.sweep()).to.equal(1);
        expect(await charge({ windowStart: at(T0 + HOUR_MS) })).to.equal('deny');
        now = T0 + 3 * HOUR_MS + 1;
        expect(await budgets.sweep()).to.equal(1);
        // A 366-day window is kept for 366 days after its successor began.
        now = Y0 + 2 * YEAR_MS;
        expect(await budgets.sweep()).to.equal(0);
        expect(await charge({ ...year, windowStart: at(Y0) })).to.equal('deny');
        now = Y0 + 2 * YEAR_MS + 1;
        expect(await budgets.sweep()).to.equal(1);
        // The newest counter of each stays for ever.
        now = Y0 + 100 * YEAR_MS;
        expect(await budgets.sweep()).to.equal(0);
        expect((await stores.limits.latest(undefined)).map((c) => [c.key, c.windowStart])).to.deep.equal([
          ['sweep:hourly', at(T0 + 2 * HOUR_MS)],
          ['sweep:yearly', at(Y0 + YEAR_MS)],
        ]);
      });

      it('deletes 1 s windows once their successor is 1 s old', async () => {
        let now = 0;
        const budgets = new BudgetService(stores.limits, () => now);
        const second_ = { key: 'sweep:secondly', window: '1s', windowMs: 1_000 };
        for (let n = 0; n < 5; n++)
          expect(await charge({ ...second_, windowStart: at(T0 + n * 1_000) })).to.equal('allow');
        now = T0 + 4_500;
        // Windows 0 to 2 have a successor that began a second or more ago; 3 and 4 stay.
        expect(await budgets.sweep()).to.equal(3);
        expect(await charge({ ...second_, windowStart: at(T0 + 3_000) })).to.equal('deny');
      });
    });

    describe('queue', () => {
      async function queued(over: Partial<QueueItem> = {}, d = decision({ status: 'requires_approval' })) {
        const it = item(d, over);
        await stores.decisions.record({ decision: d, event: event(d), item: it, idemSince: iso(-HOUR) });
        return it;
      }

      it('lists pending items oldest first, filtered and paged, never those past expiry', async () => {
        const a = await queued({ tenant_id: 't1' });
        const b = await queued({ tenant_id: 't2' });
        const c = await queued({ tenant_id: 't1' });
        await queued({ expires_at: iso(-1000) });
        const now = iso();
        expect((await stores.queue.listPending({ now, limit: 10 })).map((i) => i.id)).to.deep.equal([
          a.id,
          b.id,
          c.id,
        ]);
        expect(
          (await stores.queue.listPending({ now, limit: 10, tenant_id: 't1' })).map((i) => i.id),
        ).to.deep.equal([a.id, c.id]);
        expect(
          (await stores.queue.listPending({ now, limit: 1, after: a.id })).map((i) => i.id),
        ).to.deep.equal([b.id]);
        expect(await stores.queue.countPending(now)).to.equal(3);
      });

      it('caps pending items per requesting key: over the cap nothing is written, exactly, across handles and within a batch', async () => {
        const capped = (key: string, over: Partial<QueueItem> = {}) => {
          const d = decision({ status: 'requires_approval', key_id: key });
          return { decision: d, event: event(d), item: item(d, over), idemSince: iso(-HOUR), pendingCap: 3 };
        };
        // An expired item, one of another key and one decided do not count.
        await queued({ expires_at: iso(-1000), requested_by: 'key-cap' });
        await queued({ requested_by: 'key-other' });
        const other = await second();
        const before = (await headOf(stores)).count;
        try {
          // Submitted together: batched on each handle, the handles serialized by the store.
          const out = await Promise.all(
            Array.from({ length: 10 }, (_, i) =>
              (i % 2 ? other : stores).decisions.record(capped('key-cap')),
            ),
          );
          expect(out.filter((o) => 'recorded' in o)).to.have.length(3);
          expect(out.filter((o) => 'capped' in o)).to.have.length(7);
          // Only the three recorded have rows, items and audit events.
          expect((await headOf(stores)).count).to.equal(before + 3);
          const pending = await stores.queue.listPending({ now: iso(), limit: 50 });
          expect(pending.filter((i) => i.requested_by === 'key-cap')).to.have.length(3);
          for (const o of out) {
            if ('capped' in o) continue;
            expect(o).to.have.property('recorded');
          }
          // Another key is not held to this one's count; a decided item frees a place.
          expect(await stores.decisions.record(capped('key-other'))).to.have.property('recorded');
          const first = pending.find((i) => i.requested_by === 'key-cap')!;
          const r = await stores.queue.decide(first.id, 'denied', 'rev', null, iso(), (x) => ({
            kind: 'queue.decide',
            request_id: x.id,
            outcome: x.status,
          }));
          expect(r.won).to.equal(true);
          expect(await stores.decisions.record(capped('key-cap'))).to.have.property('recorded');
          expect(await stores.decisions.record(capped('key-cap'))).to.deep.equal({ capped: true });
          // Without a cap, or for an answer with no item, nothing is counted.
          const { pendingCap: _, ...uncapped } = capped('key-cap');
          expect(await stores.decisions.record(uncapped)).to.have.property('recorded');
        } finally {
          await other.close();
        }
      });

      it('lets exactly one of many concurrent deciders win, across handles, with one audit event', async () => {
        const it = await queued();
        const other = await second();
        try {
          const results = await Promise.all(
            Array.from({ length: 12 }, (_, i) =>
              (i % 2 ? other : stores).queue.decide(
                it.id,
                i % 3 ? 'approved' : 'denied',
                `rev-${i}`,
                `note ${i}`,
                iso(),
                (x) => ({
                  kind: 'queue.decide',
                  request_id: x.id,
                  outcome: x.status,
                }),
              ),
            ),
          );
          const winners = results.filter((r) => r.won);
          expect(winners).to.have.length(1);
          const final = await stores.queue.get(it.id);
          expect(final?.status).to.equal(winners[0]!.item!.status);
          for (const r of results) if (!r.won) expect(r.item?.status).to.equal(final?.status);
          expect((await stores.audit.byRequest(it.id, 0, 10)).map((e) => e.event.kind)).to.deep.equal([
            'decision',
            'queue.decide',
          ]);
        } finally {
          await other.close();
        }
      });

      it('expires due items once, with their audit events, and lists decided ones newest first', async () => {
        const due = await queued({ expires_at: iso(-5) });
        const live = await queued();
        const ev = (x: QueueItem): NewAuditEvent => ({
          kind: 'queue.expire',
          request_id: x.id,
          outcome: 'expired',
        });
        const [first, again] = await Promise.all([
          stores.queue.expireDue(iso(), ev),
          stores.queue.expireDue(iso(), ev),
        ]);
        expect([...first!, ...again!].map((i) => i.id)).to.deep.equal([due.id]);
        expect((await stores.queue.get(due.id))?.status).to.equal('expired');
        await stores.queue.decide(live.id, 'approved', 'alice', 'ok', iso(), (x) => ({
          kind: 'queue.approve',
          request_id: x.id,
        }));
        const decided = await stores.queue.listDecided({ statuses: ['approved', 'expired'], limit: 10 });
        expect(decided.map((i) => i.id)).to.deep.equal([live.id, due.id]);
        expect(decided[0]).to.include({ decided_by: 'alice', note: 'ok' });
        expect(await verifyChain(stores)).to.include({ ok: true });
      });
    });

    describe('tokens and keys', () => {
      const signingKey = (kid: string, created_at = iso()): SigningKeyRecord => ({
        kid,
        private_jwk: `p-${kid}`,
        public_jwk: `q-${kid}`,
        created_at,
        retired_at: null,
        verify_until: null,
      });
      // Every mint names the active signing key that signed it.
      beforeEach(async () => {
        await stores.tokens.ensureSigningKey(async () => signingKey('k1', iso(-HOUR)));
      });
      const token = (over: Partial<TokenRecord> = {}): TokenRecord => ({
        id: newId(),
        request_id: null,
        subject: 'bot',
        scopes: ['read:repo/x'],
        audience: 'arbiter',
        tenant_id: null,
        agent_id: null,
        issued_at: iso(),
        expires_at: iso(HOUR),
        revoked_at: null,
        minted_by: 'admin',
        trace_id: null,
        signing_kid: 'k1',
        ...over,
      });

      it('keeps the first signing key stored, whichever handle asks', async () => {
        const other = await second();
        try {
          const make = (kid: string) => async () => signingKey(kid);
          await Promise.all([
            stores.tokens.ensureSigningKey(make('a')),
            other.tokens.ensureSigningKey(make('b')),
          ]);
          expect((await stores.tokens.signingKeys()).map((k) => k.kid)).to.deep.equal(['k1']);
          expect(await other.tokens.signingKeys()).to.deep.equal(await stores.tokens.signingKeys());
        } finally {
          await other.close();
        }
      });

      it('rotates: the new key signs, the previous verifies until its last live token expires', async () => {
        const later = iso(2 * HOUR);
        // Live tokens of k1 (the latest expiring in two hours), a revoked one expiring even later,
        // and an expired one: only the live, unrevoked ones count.
        await stores.tokens.insert(token(), { kind: 'token.mint' });
        await stores.tokens.insert(token({ expires_at: later }), { kind: 'token.mint' });
        await stores.tokens.insert(token({ expires_at: iso(3 * HOUR), revoked_at: iso(-1000) }), {
          kind: 'token.mint',
        });
        await stores.tokens.insert(token({ issued_at: iso(-2 * HOUR), expires_at: iso(-HOUR) }), {
          kind: 'token.mint',
        });
        const told: (string | null)[] = [];
        const r = await stores.tokens.rotateSigningKey(signingKey('k2'), {
          revokePrevious: false,
          verifyUntil: (latest) => {
            told.push(latest);
            return latest ?? 'now';
          },
          token: () => ({ kind: 'token.revoke' }),
          rotate: (prev, n) => ({ kind: 'signing_key.rotate', details: { prev: prev.kid, n } }),
        });
        expect(told).to.deep.equal([later]);
        expect(r?.tokensRevoked).to.equal(0);
        expect(r?.previous).to.include({ kid: 'k1', verify_until: later });
        expect(r?.previous.retired_at).to.be.a('string');
        const keys = await stores.tokens.signingKeys();
        expect(keys.map((k) => [k.kid, k.retired_at === null])).to.deep.equal([
          ['k2', true],
          ['k1', false],
        ]);
        // A mint signed by k1 that had not seen the rotation is refused and writes nothing.
        const late = token();
        expect(await stores.tokens.insert(late, { kind: 'token.mint' })).to.equal('signing_key_retired');
        expect(await stores.tokens.get(late.id)).to.equal(undefined);
        expect(await stores.tokens.insert(token({ signing_kid: 'k2' }), { kind: 'token.mint' })).to.equal(
          'ok',
        );
        // Four mints, the rotation, the mint under k2.
        expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 6 });
        // A mint that names no signing key is refused as well.
        expect(await stores.tokens.insert(token({ signing_kid: null }), { kind: 'token.mint' })).to.equal(
          'signing_key_retired',
        );
      });

      it('rotates with revoke_previous: every live token of the previous key and of every earlier key still verifying is revoked with its event', async () => {
        const k1 = token();
        await stores.tokens.insert(k1, { kind: 'token.mint' });
        await stores.tokens.rotateSigningKey(signingKey('k2'), {
          revokePrevious: false,
          verifyUntil: () => iso(HOUR),
          token: () => ({ kind: 'token.revoke' }),
          rotate: () => ({ kind: 'signing_key.rotate' }),
        });
        const k2 = token({ signing_kid: 'k2' });
        expect(await stores.tokens.insert(k2, { kind: 'token.mint' })).to.equal('ok');
        const revokedIds: string[] = [];
        const r = await stores.tokens.rotateSigningKey(signingKey('k3'), {
          revokePrevious: true,
          verifyUntil: () => 'unused',
          token: (t, kid) => {
            revokedIds.push(`${t.id}@${kid}`);
            expect(t.revoked_at).to.be.a('string');
            return { kind: 'token.revoke', resource: t.id };
          },
          rotate: (prev, n) => ({ kind: 'signing_key.rotate', details: { prev: prev.kid, n } }),
        });
        expect(r?.tokensRevoked).to.equal(2);
        expect(r?.previous.kid).to.equal('k2');
        expect(r?.previous.verify_until).to.equal(r?.previous.retired_at);
        // k1 (the first key) was still verifying until iso(HOUR): revoked too, with its token.
        expect(r?.alsoRevoked).to.have.length(1);
        expect(revokedIds).to.deep.equal([`${k2.id}@k2`, `${k1.id}@${r?.alsoRevoked[0]}`]);
        expect((await stores.tokens.tokenState(k2.id))?.revoked_at).to.equal(r?.previous.retired_at);
        expect((await stores.tokens.tokenState(k1.id))?.revoked_at).to.equal(r?.previous.retired_at);
        const keys = await stores.tokens.signingKeys();
        const first = keys.find((k) => k.kid === r?.alsoRevoked[0]);
        expect(first?.verify_until).to.equal(r?.previous.retired_at);
        expect(await verifyChain(stores)).to.include({ ok: true });
      });

      it('exchanges a decision for a token once, and revokes idempotently', async () => {
        const d = decision();
        await stores.decisions.record({
          decision: d,
          event: event(d),
          item: undefined,
          idemSince: iso(-HOUR),
        });
        const t = token({ request_id: d.request_id });
        const [x, y] = await Promise.all([
          stores.tokens.exchange(d.request_id, t, { kind: 'token.mint' }),
          stores.tokens.exchange(d.request_id, token({ request_id: d.request_id }), { kind: 'token.mint' }),
        ]);
        expect([x, y].sort()).to.deep.equal(['already', 'ok']);
        expect((await stores.decisions.get(d.request_id))?.token_id).to.be.a('string');
        const minted = (await stores.decisions.get(d.request_id))!.token_id!;
        expect((await stores.tokens.tokenState(minted))?.revoked_at).to.equal(null);
        const at = iso();
        const r1 = await stores.tokens.revoke(minted, at, () => ({ kind: 'token.revoke' }));
        const r2 = await stores.tokens.revoke(minted, iso(5000), () => ({ kind: 'token.revoke' }));
        expect(r1?.revoked_at).to.equal(at);
        expect(r2?.revoked_at).to.equal(at);
        expect((await stores.tokens.tokenState(minted))?.revoked_at).to.equal(at);
        expect((await stores.tokens.tokenState('no-such-token'))?.revoked_at).to.equal(undefined);
        expect(await stores.tokens.revoke('no-such-token', at, () => ({ kind: 'token.revoke' }))).to.equal(
          undefined,
        );
        expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 3 });
      });

      it('finds keys by id and name, refuses a taken name, and revokes', async () => {
        const key = (name: string): ApiKeyRecord => ({
          id: newId().slice(0, 16),
          name,
          hash: 'ab'.repeat(32),
          scopes: ['authorize', 'queue:read'],
          tenant: 'acme',
          agent: null,
          created_at: iso(),
          revoked_at: null,
        });
        const k = key('ci-bot');
        expect(await stores.keys.create(k, { kind: 'key.create' })).to.equal('ok');
        expect(await stores.keys.create(key('ci-bot'), { kind: 'key.create' })).to.equal('exists');
        expect(await stores.keys.findById(k.id)).to.deep.equal(k);
        expect(await stores.keys.findByName('ci-bot')).to.deep.equal(k);
        expect((await stores.keys.list()).map((x) => x.name)).to.deep.equal(['ci-bot']);
        // Tokens the key minted: live, expired, already revoked; and one another key minted.
        const live = token({ minted_by: 'ci-bot' });
        const expired = token({ minted_by: 'ci-bot', issued_at: iso(-2 * HOUR), expires_at: iso(-HOUR) });
        const earlier = iso(-1000);
        const alreadyRevoked = token({ minted_by: 'ci-bot', revoked_at: earlier });
        const others = token({ minted_by: 'other-bot' });
        for (const t of [live, expired, alreadyRevoked, others])
          await stores.tokens.insert(t, { kind: 'token.mint' });
        const told: number[] = [];
        const tokenEvents: string[] = [];
        const revoked = await stores.keys.revoke('ci-bot', iso(), {
          key: (n, rec) => {
            expect(rec.id).to.equal(k.id);
            told.push(n);
            return { kind: 'key.revoke', details: { tokens_revoked: n } };
          },
          token: (t) => {
            tokenEvents.push(t.id);
            return { kind: 'token.revoke', resource: t.id };
          },
        });
        expect(revoked?.key.revoked_at).to.be.a('string');
        expect(revoked?.tokensRevoked).to.equal(1);
        expect(told).to.deep.equal([1]);
        expect(tokenEvents).to.deep.equal([live.id]);
        // A mint by the revoked key is refused in its own transaction, and writes nothing.
        expect(await stores.tokens.insert(token({ minted_by: 'ci-bot' }), { kind: 'token.mint' })).to.equal(
          'key_revoked',
        );
        expect((await stores.tokens.tokenState(live.id))?.revoked_at).to.equal(revoked?.key.revoked_at);
        expect((await stores.tokens.tokenState(expired.id))?.revoked_at).to.equal(null);
        expect((await stores.tokens.tokenState(alreadyRevoked.id))?.revoked_at).to.equal(earlier);
        expect((await stores.tokens.tokenState(others.id))?.revoked_at).to.equal(null);
        expect((await stores.keys.findById(k.id))?.revoked_at).to.equal(revoked?.key.revoked_at);
        // Revoking again writes nothing and revokes nothing.
        const none = { key: () => ({ kind: 'key.revoke' }), token: () => ({ kind: 'token.revoke' }) };
        const again = await stores.keys.revoke('ci-bot', iso(), none);
        expect(again?.tokensRevoked).to.equal(0);
        expect(again?.key.revoked_at).to.equal(revoked?.key.revoked_at);
        expect(await stores.keys.revoke('nobody', iso(), none)).to.equal(undefined);
        // key.create, four token.mint, one token.revoke, key.revoke.
        expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 7 });
      });
    });

    describe('webhooks and their outbox', () => {
      const hook = (name: string, events: WebhookRecord['events']): WebhookRecord => ({
        name,
        url: `http://127.0.0.1:9/${name}`,
        events,
        format: 'json',
        secret: `whsec_${'a'.repeat(43)}=`,
        created_at: iso(),
        updated_at: iso(),
      });

      it('enqueues one delivery per subscribed webhook in the transaction of the change', async () => {
        expect(
          await stores.webhooks.put(hook('pending-only', ['queue.pending']), { kind: 'webhook.put' }),
        ).to.deep.equal({
          created: true,
        });
        await stores.webhooks.put(hook('policy-only', ['policy.changed']), { kind: 'webhook.put' });
        expect(
          (await stores.webhooks.put(hook('policy-only', ['policy.changed']), { kind: 'webhook.put' }))
            .created,
        ).to.equal(false);
        const d = decision({ status: 'requires_approval', expires_at: iso(HOUR) });
        await stores.decisions.record({
          decision: d,
          event: { ...event(d), outcome: 'requires_approval', details: { expires_at: iso(HOUR) } },
          item: item(d),
          idemSince: iso(-HOUR),
        });
        const allowed = decision();
        await stores.decisions.record({
          decision: allowed,
          event: event(allowed),
          item: undefined,
          idemSince: iso(-HOUR),
        });
        const pending = await stores.webhooks.deliveries('pending-only', undefined, 10);
        expect(pending).to.have.length(1);
        expect(pending[0]).to.include({ type: 'queue.pending', status: 'pending', attempts: 0 });
        expect(JSON.parse(pending[0]!.payload).data.id).to.equal(d.request_id);
        expect(await stores.webhooks.deliveries('policy-only', undefined, 10)).to.have.length(0);
        // A change that is refused writes no delivery either.
        await stores.policies.commit(change({ expectedRevision: 5 }), () => [{ kind: 'policy.put' }]);
        expect(await stores.webhooks.deliveries('policy-only', undefined, 10)).to.have.length(0);
        await stores.policies.commit(change({ seed: true }), () => [{ kind: 'policy.seed' }]);
        expect(await stores.webhooks.deliveries('policy-only', undefined, 10)).to.have.length(1);
        expect(await stores.webhooks.countPending()).to.equal(2);
      });

      it('hands each due delivery to one claimer at a time, across handles, and settles it', async () => {
        await stores.webhooks.put(hook('all', ['policy.changed']), { kind: 'webhook.put' });
        let rev = 0;
        for (let i = 0; i < 6; i++) {
          await stores.policies.commit(
            change({ expectedRevision: rev, putPolicies: [rego(`p${i}`)] }),
            () => [{ kind: 'policy.put' }],
          );
          rev++;
        }
        const other = await second();
        try {
          const lease = iso(60_000);
          const [x, y] = await Promise.all([
            stores.webhooks.claimDue(iso(1000), lease, 4),
            other.webhooks.claimDue(iso(1000), lease, 4),
          ]);
          const ids = [...x, ...y].map((d) => d.id);
          expect(new Set(ids).size).to.equal(ids.length);
          expect(ids.length).to.equal(6);
          expect(await stores.webhooks.claimDue(iso(1000), lease, 10)).to.have.length(0);
          expect(x[0]).to.include({ url: 'http://127.0.0.1:9/all', format: 'json' });
          await stores.webhooks.settle(ids[0]!, { delivered: true, at: iso(), status: 204 });
          await stores.webhooks.settle(ids[1]!, {
            delivered: false,
            status: 500,
            error: 'boom',
            retryAt: iso(-1),
          });
          await stores.webhooks.settle(ids[2]!, {
            delivered: false,
            status: null,
            error: 'gone',
            retryAt: null,
          });
          const byId = new Map(
            (await stores.webhooks.deliveries('all', undefined, 10)).map((d) => [d.id, d]),
          );
          expect(byId.get(ids[0]!)).to.include({ status: 'delivered', attempts: 1, last_status: 204 });
          expect(byId.get(ids[1]!)).to.include({ status: 'pending', attempts: 1, last_error: 'boom' });
          expect(byId.get(ids[2]!)).to.include({ status: 'failed', attempts: 1 });
          // Delivered or given up: no next attempt; a retry is due at its retry time.
          expect(byId.get(ids[0]!)!.next_attempt_at).to.equal(null);
          expect(byId.get(ids[2]!)!.next_attempt_at).to.equal(null);
          expect(byId.get(ids[1]!)!.next_attempt_at! <= iso()).to.equal(true);
          expect((await stores.webhooks.claimDue(iso(1000), lease, 10)).map((d) => d.id)).to.deep.equal([
            ids[1],
          ]);
          expect(await stores.webhooks.delete('all', { kind: 'webhook.delete' })).to.equal(true);
          expect(await stores.webhooks.deliveries('all', undefined, 10)).to.have.length(0);
          expect(await stores.webhooks.delete('all', { kind: 'webhook.delete' })).to.equal(false);
        } finally {
          await other.close();
        }
      });

      it("takes no more of one webhook's due deliveries than its share, and the others' first", async () => {
        await stores.webhooks.put(hook('busy', ['policy.changed']), { kind: 'webhook.put' });
        await stores.webhooks.put(hook('idle', ['policy.changed']), { kind: 'webhook.put' });
        let rev = 0;
        for (let i = 0; i < 5; i++) {
          await stores.policies.commit(
            change({ expectedRevision: rev, putPolicies: [rego(`s${i}`)] }),
            () => [{ kind: 'policy.put' }],
          );
          rev++;
        }
        const lease = iso(60_000);
        // A share of 3: busy has 2 in flight, so one more of it; idle three of its five.
        const first = await stores.webhooks.claimDue(iso(1000), lease, 10, {
          perWebhook: 3,
          inFlight: new Map([['busy', 2]]),
        });
        const count = (ds: { webhook: string }[], w: string) => ds.filter((d) => d.webhook === w).length;
        expect([count(first, 'busy'), count(first, 'idle')]).to.deep.equal([1, 3]);
        // Up to the limit, longest due first: busy's second and third (idle's fourth came later).
        const next = await stores.webhooks.claimDue(iso(1000), lease, 2, {
          perWebhook: 3,
          inFlight: new Map(),
        });
        expect(next.map((d) => d.webhook)).to.deep.equal(['busy', 'busy']);
        const rest = await stores.webhooks.claimDue(iso(1000), lease, 10);
        expect([count(rest, 'busy'), count(rest, 'idle')]).to.deep.equal([2, 2]);
        expect(await stores.webhooks.claimDue(iso(1000), lease, 10)).to.have.length(0);
        await stores.webhooks.delete('busy', { kind: 'webhook.delete' });
        await stores.webhooks.delete('idle', { kind: 'webhook.delete' });
      });
    });

    describe('policy revisions and history', () => {
      const events = (kind: string) => (revision: number) => [{ kind, policy_revision: revision }];

      it('commits each change as one revision, refusing stale, conflicting and absent changes', async () => {
        const seed = await stores.policies.commit(
          change({
            seed: true,
            putPolicies: [rego('a'), rego('b')],
            putData: [{ path: 'cfg', value: { on: true }, sha256: 'd1' }],
          }),
          events('policy.seed'),
        );
        expect(seed).to.include({ ok: true, revision: 1 });
        expect(
          await stores.policies.commit(change({ seed: true, expectedRevision: 1 }), events('x')),
        ).to.deep.equal({
          ok: false,
          stale: true,
        });
        expect(await stores.policies.commit(change({ putPolicies: [rego('c')] }), events('x'))).to.deep.equal(
          {
            ok: false,
            stale: true,
          },
        );
        expect(
          await stores.policies.commit(
            change({ expectedRevision: 1, ifVersions: { a: 7 }, putPolicies: [rego('a', 'y := 2')] }),
            events('x'),
          ),
        ).to.deep.equal({ ok: false, conflict: 'a' });
        expect(
          await stores.policies.commit(change({ expectedRevision: 1, deletePolicies: ['zz'] }), events('x')),
        ).to.deep.equal({
          ok: false,
          absent: 'zz',
        });
        const snap = await stores.policies.snapshot();
        expect(snap).to.include({ revision: 1, seeded: true });
        expect(snap.policies.map((p) => [p.name, p.version])).to.deep.equal([
          ['a', 1],
          ['b', 1],
        ]);
        expect(snap.data.map((d) => [d.path, d.value])).to.deep.equal([['cfg', { on: true }]]);
        expect(await stores.policies.revision()).to.equal(1);
        expect((await headOf(stores)).count).to.equal(1);
      });

      it('keeps every revision, content-addressed, and every version of a policy, deletes included', async () => {
        await stores.policies.commit(
          change({ seed: true, putPolicies: [rego('a'), rego('b')] }),
          events('s'),
        );
        await stores.policies.commit(
          change({
            expectedRevision: 1,
            ifVersions: { a: 1 },
            putPolicies: [rego('a', 'y := 2')],
            message: 'tweak a',
          }),
          events('policy.put'),
        );
        await stores.policies.commit(
          change({ expectedRevision: 2, deletePolicies: ['a'] }),
          events('policy.delete'),
        );
        const r4 = await stores.policies.commit(
          change({ expectedRevision: 3, putPolicies: [rego('a')] }),
          events('policy.put'),
        );
        expect(r4).to.include({ ok: true, revision: 4 });
        expect(r4.ok && r4.created).to.deep.equal(['a']);
        expect(r4.ok && r4.policies[0]?.version).to.equal(4);

        const revs = await stores.policies.listRevisions(undefined, 10);
        expect(revs.map((r) => r.revision)).to.deep.equal([4, 3, 2, 1]);
        expect(revs[2]).to.include({ actor: 'tester', message: 'tweak a' });
        expect(revs[2]!.changes).to.deep.equal([{ kind: 'policy', name: 'a', op: 'put' }]);
        expect(revs[1]!.changes).to.deep.equal([{ kind: 'policy', name: 'a', op: 'delete' }]);
        // A list reads summaries only: the manifests of the whole set stay in the database.
        for (const r of revs) expect(r).to.have.all.keys('revision', 'time', 'actor', 'message', 'changes');
        expect((await stores.policies.getRevision(3))!.policies.map((p) => p.name)).to.deep.equal(['b']);
        expect((await stores.policies.listRevisions(3, 1)).map((r) => r.revision)).to.deep.equal([2]);
        expect(await stores.policies.getRevision(99)).to.equal(undefined);
        expect(await stores.policies.firstRevision()).to.equal(1);

        const versions = await stores.policies.policyVersions('a', undefined, 10);
        expect(versions.map((v) => [v.version, v.revision, v.deleted])).to.deep.equal([
          [4, 4, false],
          [3, 3, true],
          [2, 2, false],
          [1, 1, false],
        ]);
        // Revision 1 and 4 hold the same text of a: one blob serves both.
        const one = (await stores.policies.getRevision(1))!.policies.find((p) => p.name === 'a')!;
        const four = (await stores.policies.getRevision(4))!.policies.find((p) => p.name === 'a')!;
        expect(one.sha256).to.equal(four.sha256);
        const blobs = await stores.policies.blobs([one.sha256, rego('a', 'y := 2').sha256, 'missing'], []);
        expect(blobs.rego.get(one.sha256)).to.equal(rego('a').rego);
        expect(blobs.rego.size).to.equal(2);
      });

      it('lets exactly one of two changes compiled against the same revision commit', async () => {
        const other = await second();
        try {
          await stores.policies.commit(change({ seed: true }), events('s'));
          const [x, y] = await Promise.all([
            stores.policies.commit(
              change({ expectedRevision: 1, putPolicies: [rego('p')] }),
              events('policy.put'),
            ),
            other.policies.commit(
              change({ expectedRevision: 1, putPolicies: [rego('q')] }),
              events('policy.put'),
            ),
          ]);
          expect([x.ok, y.ok].sort()).to.deep.equal([false, true]);
          expect(await stores.policies.revision()).to.equal(2);
        } finally {
          await other.close();
        }
      });

      it('keeps compiled sets by hash for any handle to load', async () => {
        const other = await second();
        try {
          await stores.policies.putCompiled('set-1', Buffer.from([0, 97, 115, 109, 1, 2, 3]));
          expect(await other.policies.getCompiled('set-1')).to.deep.equal(
            Buffer.from([0, 97, 115, 109, 1, 2, 3]),
          );
          expect(await other.policies.getCompiled('set-2')).to.equal(undefined);
        } finally {
          await other.close();
        }
      });
    });

    describe('shadow set', () => {
      it('shares shadow modules between handles, bumping the generation on every change, with audit events', async () => {
        const other = await second();
        try {
          expect(await stores.policies.shadow()).to.deep.equal({
            generation: 0,
            changed_at: null,
            policies: [],
          });
          const a = rego('a');
          const put = await stores.policies.putShadow(a, [{ kind: 'policy.shadow.put', resource: 'a' }]);
          expect(put.created).to.equal(true);
          expect(await other.policies.shadowGeneration()).to.equal(1);
          const seen = await other.policies.shadow();
          expect(seen.changed_at).to.equal(put.since);
          expect(seen.policies).to.deep.equal([
            { name: 'a', rego: a.rego, sha256: a.sha256, since: put.since },
          ]);

          const a2 = rego('a', 'x := 2');
          expect((await other.policies.putShadow(a2, [{ kind: 'policy.shadow.put' }])).created).to.equal(
            false,
          );
          expect((await stores.policies.shadow()).policies.map((p) => p.sha256)).to.deep.equal([a2.sha256]);
          expect(await stores.policies.shadowGeneration()).to.equal(2);

          // A drop conditional on an older text changes nothing; an unconditional one drops it.
          expect(
            await stores.policies.dropShadow('a', a.sha256, [{ kind: 'policy.shadow.promote' }]),
          ).to.equal(false);
          expect(
            await stores.policies.dropShadow('missing', undefined, [{ kind: 'policy.shadow.delete' }]),
          ).to.equal(false);
          expect(await stores.policies.shadowGeneration()).to.equal(2);
          expect(
            await other.policies.dropShadow('a', a2.sha256, [{ kind: 'policy.shadow.delete' }]),
          ).to.equal(true);
          const after = await stores.policies.shadow();
          expect(after.generation).to.equal(3);
          expect(after.policies).to.deep.equal([]);
          expect(after.changed_at).to.be.a('string');

          const kinds = (await stores.audit.query({ limit: 10 })).map((e) => e.event.kind);
          expect(kinds).to.deep.equal(['policy.shadow.delete', 'policy.shadow.put', 'policy.shadow.put']);
          expect(await verifyChain(stores)).to.deep.equal({ ok: true, checked: 3 });
        } finally {
          await other.close();
        }
      });
    });
  });
}
