import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { pino } from 'pino';
import { MAX_PAGE_BYTES } from '../src/common/pagination.js';
import type { RouteDef } from '../src/http/context.js';
import { buildApp, createApiServer } from '../src/http/server.js';
import { KeyService } from '../src/keys/service.js';
import { createMetrics } from '../src/observability/metrics.js';
import { openSqliteStores } from '../src/storage/sqlite/index.js';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditCount, call, HUMAN } from './helpers/harness.js';

/** The context limit these suites run with: small enough that a few requests fill a page. */
const CAP = 300_000;

/** A context whose JSON text is exactly `bytes` bytes long. */
const contextOf = (bytes: number, tag = '') => ({ blob: tag + 'x'.repeat(bytes - 11 - tag.length) });

const agentWith = (context: unknown) => ({ ...AGENT.approval, context });

const evaluation = (context: unknown) => ({
  subject: { type: 'agent', id: 'deploy-bot', properties: { confidence: 0.95 } },
  action: { name: 'deploy' },
  resource: { type: 'prod', id: 'api' },
  context,
});

/** Where `evaluationOf` puts its padding: a member of the 4-tuple, or (resource.blob) beside them. */
type Pad = 'subject' | 'action' | 'resource' | 'context' | 'resource.blob';

/**
 * An AuthZEN evaluation whose input.authzen (subject, action, resource and context, as the policy
 * reads it and the audit event records it) is exactly `bytes` bytes of JSON, padded in `where`.
 */
function evaluationOf(bytes: number, where: Pad): Record<string, Record<string, unknown>> {
  const build = (pad: string) => {
    const ev = evaluation({}) as Record<string, Record<string, unknown>>;
    if (where === 'context') ev.context = { blob: pad };
    else if (where === 'resource.blob') ev.resource = { ...ev.resource, blob: pad };
    else {
      const part = ev[where] ?? {};
      ev[where] = { ...part, properties: { ...(part.properties as object | undefined), blob: pad } };
    }
    return ev;
  };
  return build('x'.repeat(bytes - JSON.stringify(build('')).length));
}

/** Every item of a list, following next_cursor from `url`, with the size of each page. */
async function everyPage(url: string, field: string): Promise<{ items: { id: string }[]; sizes: number[] }> {
  const items: { id: string }[] = [];
  const sizes: number[] = [];
  let cursor: string | null = null;
  do {
    const r = await call('GET', cursor ? `${url}&cursor=${cursor}` : url);
    expect(r.status, r.text.slice(0, 200)).to.equal(200);
    // A page never passes the cap by more than its own framing (it always holds one item).
    expect(Buffer.byteLength(r.text)).to.be.below(MAX_PAGE_BYTES + 10_000);
    items.push(...(r.json[field] as { id: string }[]));
    sizes.push((r.json[field] as unknown[]).length);
    cursor = r.json.next_cursor as string | null;
    expect(sizes.length, 'pages').to.be.below(100);
  } while (cursor !== null);
  return { items, sizes };
}

/** The ids of pending queue items, all pages. */
async function pendingIds(a: Arbiter): Promise<string[]> {
  return (await everyPage(`${a.engine}/v1/queue?status=pending&limit=1000`, 'items')).items.map((i) => i.id);
}

// Both limits are about what is stored and listed: every backend.
onEveryBackend('context size limit (ARBITER_MAX_CONTEXT_BYTES)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: String(CAP) });
  });
  after(async () => {
    await a.close();
  });

  /** Asserts that `send` is refused with 413 naming the limit, and stores no event and no item. */
  async function refusedUnrecorded(send: () => ReturnType<typeof call>, names = 'context'): Promise<void> {
    const events = await auditCount(a.platform);
    const pending = (await pendingIds(a)).length;
    const r = await send();
    expectError(r, 413);
    expect(r.json.error).to.include(names).and.to.include(String(CAP));
    expect(await auditCount(a.platform)).to.equal(events);
    expect(await pendingIds(a)).to.have.length(pending);
  }

  it('refuses an agent context one byte over the limit with 413, and records nothing', async () => {
    await refusedUnrecorded(() =>
      call('POST', a.engine + '/v1/agent/authorize', { body: agentWith(contextOf(CAP + 1)) }),
    );
    await refusedUnrecorded(() =>
      call('POST', a.platform + '/api/v1/authorize', { body: agentWith(contextOf(CAP + 1)) }),
    );
  });

  it('accepts an agent context of exactly the limit, and records it', async () => {
    const events = await auditCount(a.platform);
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: agentWith(contextOf(CAP)) });
    expect(r.status, r.text).to.equal(202);
    expect(await auditCount(a.platform)).to.equal(events + 1);
    const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
    expect(JSON.stringify(item.json.context)).to.have.length(CAP);
  });

  it('holds human and AuthZEN contexts to the same limit', async () => {
    await refusedUnrecorded(() =>
      call('POST', a.engine + '/v1/authorize', { body: { ...HUMAN.approval, context: contextOf(CAP + 1) } }),
    );
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.approval, context: contextOf(CAP) },
    });
    expect(human.status, human.text).to.equal(202);
    await refusedUnrecorded(
      () => call('POST', a.engine + '/access/v1/evaluation', { body: evaluation(contextOf(CAP + 1)) }),
      'evaluation',
    );
  });

  it('holds a whole AuthZEN evaluation to the limit: subject, action and resource as well as its context', async () => {
    // Properties and other members of each reach the policy and the audit event (input.authzen).
    for (const where of ['subject', 'action', 'resource', 'context', 'resource.blob'] as const) {
      await refusedUnrecorded(
        () => call('POST', a.engine + '/access/v1/evaluation', { body: evaluationOf(CAP + 1, where) }),
        'evaluation (subject, action, resource and context together)',
      );
    }
    // Each part under the limit, together over it.
    const halves = evaluationOf(CAP / 2, 'resource');
    halves.context = contextOf(CAP / 2 + 3); // {} gives way to it: CAP + 1 bytes in all
    await refusedUnrecorded(
      () => call('POST', a.engine + '/access/v1/evaluation', { body: halves }),
      'evaluation',
    );
    const events = await auditCount(a.platform);
    const single = await call('POST', a.engine + '/access/v1/evaluation', {
      body: evaluationOf(CAP, 'resource'),
    });
    expect(single.status, single.text).to.equal(200);
    expect(await auditCount(a.platform)).to.equal(events + 1);
    const event = await call('GET', `${a.platform}/api/v1/audit?kind=decision&limit=1`);
    const input = event.json.events[0].details.input as { authzen: unknown };
    expect(JSON.stringify(input.authzen)).to.have.length(CAP);
  });

  it('holds each evaluation of a batch, defaults applied, to the limit whole, and refuses the batch', async () => {
    // The second evaluation takes the default resource, whose properties bring it over the limit.
    const big = evaluationOf(CAP + 1, 'resource');
    await refusedUnrecorded(
      () =>
        call('POST', a.engine + '/access/v1/evaluations', {
          body: {
            subject: big.subject,
            action: big.action,
            resource: big.resource,
            context: big.context,
            evaluations: [{ resource: { type: 'prod', id: 'api' } }, {}],
          },
        }),
      'evaluations[1] (subject, action, resource and context together, defaults applied)',
    );
    const events = await auditCount(a.platform);
    const fits = evaluationOf(CAP, 'resource');
    const r = await call('POST', a.engine + '/access/v1/evaluations', {
      body: { ...fits, evaluations: [{ resource: { type: 'prod', id: 'api' } }, {}] },
    });
    expect(r.status, r.text).to.equal(200);
    expect(r.json.evaluations).to.have.length(2);
    expect(await auditCount(a.platform)).to.equal(events + 2);
  });

  it('refuses a whole AuthZEN batch when one evaluation has a context over the limit', async () => {
    // The first evaluation alone would be decided and recorded; the batch is refused before it is.
    await refusedUnrecorded(() =>
      call('POST', a.engine + '/access/v1/evaluations', {
        body: { evaluations: [evaluation({ small: true }), evaluation(contextOf(CAP + 1))] },
      }),
    );
  });

  it('measures the context as it is stored: numbers that grow when rewritten count at their stored size', async () => {
    // 15 000 × `1e20` is about 75 kB as sent and 330 kB as stored (`100000000000000000000`).
    const raw = `{"agent_id":"deploy-bot","action":"deploy","resource":"prod/api","confidence":0.95,"context":{"n":[${Array(15_000).fill('1e20').join(',')}]}}`;
    expect(raw.length).to.be.below(CAP);
    await refusedUnrecorded(() =>
      call('POST', a.engine + '/v1/agent/authorize', {
        raw,
        headers: { 'content-type': 'application/json' },
      }),
    );
  });

  it('holds an ingested event’s details (with its unknown fields) to the same limit, all or nothing', async () => {
    await refusedUnrecorded(
      () =>
        call('POST', a.platform + '/api/v1/audit/ingest', {
          body: { kind: 'engine.step', details: contextOf(CAP + 1) },
        }),
      'details',
    );
    // Unknown fields are kept under details, so they count too; one such event stops the batch.
    await refusedUnrecorded(
      () =>
        call('POST', a.platform + '/api/v1/audit/ingest', {
          body: { events: [{ kind: 'engine.step' }, { kind: 'engine.step', extra: 'x'.repeat(CAP) }] },
        }),
      'events.1',
    );
    const events = await auditCount(a.platform);
    const r = await call('POST', a.platform + '/api/v1/audit/ingest', {
      body: { kind: 'engine.step', details: contextOf(CAP) },
    });
    expect(r.status, r.text).to.equal(202);
    expect(await auditCount(a.platform)).to.equal(events + 1);
  });

  it('holds an ingested event’s resource to the same limit, together with its details', async () => {
    // A resource may be any JSON, and is stored, listed and hashed like the details.
    await refusedUnrecorded(
      () =>
        call('POST', a.platform + '/api/v1/audit/ingest', {
          body: { kind: 'app.event', resource: contextOf(CAP + 1) },
        }),
      'event has',
    );
    // Each under the limit, together over it: 150 001 bytes of details, 150 000 of resource.
    await refusedUnrecorded(
      () =>
        call('POST', a.platform + '/api/v1/audit/ingest', {
          body: {
            events: [{ kind: 'app.event', details: contextOf(CAP / 2 + 1), resource: contextOf(CAP / 2) }],
          },
        }),
      'events.0 has 300001 bytes of details (with its unknown fields) and resource',
    );
    const events = await auditCount(a.platform);
    const r = await call('POST', a.platform + '/api/v1/audit/ingest', {
      body: { kind: 'app.event', details: contextOf(CAP / 2), resource: contextOf(CAP / 2) },
    });
    expect(r.status, r.text).to.equal(202);
    expect(await auditCount(a.platform)).to.equal(events + 1);
  });
});

// The record of the first answer is what a retry reads: every backend.
onEveryBackend('context size limit and Idempotency-Key retries', () => {
  it('answers a retry of a request recorded under a higher limit from its record, not with 413', async () => {
    const first = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: String(CAP) });
    let later: Arbiter | undefined;
    try {
      const big = contextOf(100_000);
      // Each way of asking, with a context (or an evaluation) under the first limit and over the next.
      const requests: [string, string, unknown][] = [
        ['agent', '/v1/agent/authorize', agentWith(big)],
        ['human', '/v1/authorize', { ...HUMAN.approval, context: big }],
        ['authzen', '/access/v1/evaluation', evaluationOf(100_000, 'resource')],
        [
          'batch',
          '/access/v1/evaluations',
          { evaluations: [evaluation({ small: true }), evaluationOf(100_000, 'subject')] },
        ],
      ];
      const send = (base: string, path: string, body: unknown, idem: string) =>
        call('POST', base + path, { body, headers: { 'idempotency-key': idem } });
      const answers: { status: number; text: string }[] = [];
      for (const [name, path, body] of requests) {
        const r = await send(first.engine, path, body, `retry-${name}`);
        expect(r.status, r.text).to.be.oneOf([200, 202]);
        expect(r.headers.get('idempotent-replayed')).to.equal(null);
        answers.push({ status: r.status, text: r.text });
      }
      await first.stop();
      // The operator lowers the limit; the same data directory (and database).
      later = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: '50000' }, first.dataDir);
      const events = await auditCount(later.platform);
      for (const [i, [name, path, body]] of requests.entries()) {
        const r = await send(later.engine, path, body, `retry-${name}`);
        expect(r.status, `${name}: ${r.text}`).to.equal(answers[i]?.status);
        // The same answer, but for the address of this instance (AuthZEN's status_endpoint).
        expect(r.text.replaceAll(later.engine, first.engine), name).to.equal(answers[i]?.text);
        expect(r.headers.get('idempotent-replayed'), name).to.equal('true');
      }
      expect(await auditCount(later.platform)).to.equal(events);
      // The lower limit holds for anything not recorded: a new key, or none.
      for (const [name, path, body] of requests) {
        const fresh = await send(later.engine, path, body, `fresh-${name}`);
        expectError(fresh, 413);
        expect(fresh.json.error, name).to.include('50000');
      }
      expect(await auditCount(later.platform)).to.equal(events);
    } finally {
      await later?.close();
      await first.close();
    }
  });
});

onEveryBackend('pages capped in bytes', () => {
  /** 16 items of ~290 kB: about 4.6 MB, more than one page holds. */
  const COUNT = 16;
  const trace = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';
  let a: Arbiter;
  let ids: string[];
  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: String(CAP) });
    ids = [];
    for (let i = 0; i < COUNT; i++) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: agentWith(contextOf(290_000, `item${i}:`)),
        headers: { traceparent: `00-${trace}-00f067aa0ba902b7-01` },
      });
      expect(r.status, r.text).to.equal(202);
      ids.push(r.json.request_id as string);
    }
  });
  after(async () => {
    await a.close();
  });

  /** The page sizes must show a short page; the items, each id once, in list order. */
  function expectShortPagesCoveringAll(got: { items: { id: string }[]; sizes: number[] }, want: string[]) {
    expect(got.sizes.length, `pages ${got.sizes.join(',')}`).to.be.greaterThan(1);
    expect(got.sizes[0]).to.be.below(COUNT);
    expect(got.items.map((i) => i.id)).to.deep.equal(want);
  }

  it('ends a queue page before 4 MiB, with a next_cursor that continues exactly where it stopped', async () => {
    // The console's own poll: pending, up to 200.
    const got = await everyPage(`${a.engine}/v1/queue?status=pending&limit=200`, 'items');
    expectShortPagesCoveringAll(got, ids);
  });

  it('ends an audit page before 4 MiB, and its cursors return every event once', async () => {
    const got = await everyPage(`${a.platform}/api/v1/audit?kind=decision&limit=1000`, 'events');
    // Newest first; each event names its decision.
    const requests = got.items.map((e) => (e as unknown as { request_id: string }).request_id);
    expect(got.sizes[0]).to.be.below(COUNT);
    expect(requests).to.deep.equal([...ids].reverse());
  });

  it('ends a trace page before 4 MiB, and its cursors return every event once', async () => {
    const got = await everyPage(`${a.platform}/api/v1/audit/trace/${trace}?limit=1000`, 'events');
    const requests = got.items.map((e) => (e as unknown as { request_id: string }).request_id);
    expect(got.sizes[0]).to.be.below(COUNT);
    expect(requests).to.deep.equal(ids);
  });

  it('ends a queue item’s events page before 4 MiB, and its cursors return every event once', async () => {
    const item = ids[0] as string;
    const ingested: string[] = [];
    for (let i = 0; i < 15; i++) {
      const r = await call('POST', a.platform + '/api/v1/audit/ingest', {
        body: { kind: 'engine.step', request_id: item, details: contextOf(290_000) },
      });
      expect(r.status, r.text).to.equal(202);
      ingested.push(r.json.ids[0] as string);
    }
    const got = await everyPage(`${a.engine}/v1/queue/${item}/events?limit=1000`, 'events');
    expect(got.sizes[0]).to.be.below(16);
    const events = got.items as unknown as { id: string; kind: string }[];
    expect(events[0]?.kind).to.equal('decision');
    expect(events.slice(1).map((e) => e.id)).to.deep.equal(ingested);
  });

  it('still answers a page of one item larger than the cap on its own', async () => {
    const got = await everyPage(`${a.engine}/v1/queue?status=pending&limit=1`, 'items');
    expect(got.sizes).to.deep.equal(Array(COUNT).fill(1));
    expect(got.items.map((i) => i.id)).to.deep.equal(ids);
  });
});

// Deliveries are stored per backend: every backend.
onEveryBackend('webhook delivery pages', () => {
  it('are cut on what they answer, not on the payloads they do not show', async () => {
    const a = await Arbiter.start({ ARBITER_MAX_CONTEXT_BYTES: String(CAP) });
    try {
      // Nothing listens on port 9: the deliveries stay, retried, with their payloads.
      const hook = await call('PUT', `${a.platform}/api/v1/webhooks/reviewers`, {
        body: { url: 'http://127.0.0.1:9/hook', events: ['queue.pending'] },
      });
      expect(hook.status, hook.text).to.equal(201);
      // A policy that gives the context's note as its approval reason: the payload carries it
      // twice (message and reasons), about 560 kB a delivery, 5 MB for the nine.
      const put = await call('PUT', `${a.platform}/api/v1/policies/echo-note`, {
        raw: 'package authz.agent\n\nrequire_approval contains input.context.note if is_string(input.context.note)\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(put.status, put.text).to.equal(201);
      for (let i = 0; i < 9; i++) {
        const r = await call('POST', a.engine + '/v1/agent/authorize', {
          body: agentWith({ note: `note${i}:` + 'x'.repeat(280_000) }),
        });
        expect(r.status, r.text).to.equal(202);
      }
      const r = await call('GET', `${a.platform}/api/v1/webhooks/reviewers/deliveries?limit=1000`);
      expect(r.status, r.text.slice(0, 200)).to.equal(200);
      expect(r.json.deliveries).to.have.length(9);
      expect(r.json.next_cursor).to.equal(null);
      expect(r.text.length).to.be.below(20_000);
    } finally {
      await a.close();
    }
  });
});

// No storage: the error middleware and Koa's response writing over a real socket.
onceOnly('answers that cannot be serialized', () => {
  it('become a logged JSON 500 with X-Request-Id and none of the handler’s headers, counted and logged as 500', async () => {
    // No route of Arbiter's can still produce an unserializable answer through the API (pages are
    // capped in bytes, contexts in size), so the mechanism is driven through a route of its own, in
    // the real app, middleware chain and HTTP server.
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-serialize-'));
    const stores = openSqliteStores({ dataDir: dir, sync: 'normal' });
    const lines: Record<string, unknown>[] = [];
    const log = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
    const metrics = createMetrics();
    const route: RouteDef = {
      method: 'GET',
      path: '/unserializable',
      template: '/unserializable',
      apis: ['engine'],
      scope: null,
      body: 'none',
      summary: 'a body JSON.stringify throws on',
      ok: { status: 200, description: 'never' },
      handler: (ctx) => {
        // Headers for the answer the handler meant to give, which an error answer must not carry.
        ctx.set('ETag', '"v1"');
        ctx.set('Location', '/somewhere');
        ctx.set('Cache-Control', 'public, max-age=31536000, immutable');
        ctx.body = { n: 1n };
      },
    };
    const app = buildApp('engine', [route], {
      keys: new KeyService(stores.keys, undefined),
      log,
      metrics,
      maxBodyBytes: 1024,
    });
    const server = createApiServer(app, () => false, {
      headersTimeoutMs: 5000,
      requestTimeoutMs: 5000,
      maxConnections: 10,
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      const res = await fetch(`http://127.0.0.1:${port}/unserializable`);
      expect(res.status).to.equal(500);
      expect(res.headers.get('content-type')).to.equal('application/json; charset=utf-8');
      const id = res.headers.get('x-request-id');
      expect(id).to.be.a('string').and.not.equal('');
      expect(res.headers.get('traceparent')).to.match(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
      expect(res.headers.get('etag')).to.equal(null);
      expect(res.headers.get('location')).to.equal(null);
      expect(res.headers.get('cache-control')).to.equal('no-store');
      expect(res.headers.get('x-content-type-options')).to.equal('nosniff');
      expect(await res.json()).to.deep.equal({ error: 'internal error' });
      const failed = lines.find((l) => l.msg === 'request failed');
      expect(failed?.requestId).to.equal(id);
      const request = lines.find((l) => l.msg === 'request');
      expect(request?.status).to.equal(500);
      const counted = (await metrics.httpRequests.get()).values.filter(
        (v) => v.labels.route === '/unserializable',
      );
      expect(counted.map((v) => [v.labels.status, v.value])).to.deep.equal([['500', 1]]);
    } finally {
      await new Promise((resolve) => server.close(resolve));
      await stores.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
