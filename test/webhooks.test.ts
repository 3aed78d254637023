import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call } from './helpers/harness.js';
import { sleep } from './helpers/process.js';
import pg from 'pg';
import { CLAIM_SQL_POSTGRES } from '../src/storage/postgres/webhooks.js';
import { CLAIM_EARLIEST_SQLITE } from '../src/storage/sqlite/webhooks.js';
import { scansOf, type PlanNode } from './helpers/pg-plan.js';

interface Received {
  headers: IncomingMessage['headers'];
  body: string;
  at: number;
}

/** A local webhook receiver the test steers: answer ok, fail N times, hang, or refuse. */
class Receiver {
  readonly got: Received[] = [];
  /** Fail this many attempts of deliveries whose body contains the key (e.g. a request id). */
  readonly failing = new Map<string, number>();
  hang = false;
  private server: Server | undefined;
  private readonly hanging = new Set<ServerResponse>();
  port = 0;

  async start(port = 0): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        if (this.hang) {
          this.hanging.add(res);
          return;
        }
        this.got.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), at: Date.now() });
        const body = Buffer.concat(chunks).toString('utf8');
        for (const [key, n] of this.failing) {
          if (n > 0 && body.includes(key)) {
            this.failing.set(key, n - 1);
            res.writeHead(500).end('try later');
            return;
          }
        }
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(port, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** Requests held without an answer while `hang` is set. */
  get held(): number {
    return this.hanging.size;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/hook`;
  }

  /** Messages received so far of one type, parsed. */
  messages(type?: string): { id: string; type: string; time: string; data: Record<string, unknown> }[] {
    return this.got
      .map(
        (r) =>
          JSON.parse(r.body) as { id: string; type: string; time: string; data: Record<string, unknown> },
      )
      .filter((m) => type === undefined || m.type === type);
  }

  async waitFor(pred: () => boolean, ms = 10_000): Promise<void> {
    const until = Date.now() + ms;
    while (!pred()) {
      if (Date.now() > until)
        throw new Error(`receiver did not get it within ${ms} ms: ${this.got.length} received`);
      await sleep(50);
    }
  }

  async stop(): Promise<void> {
    for (const r of this.hanging) r.destroy();
    this.hanging.clear();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }
}

type SlackBody = {
  text: string;
  blocks: {
    type: string;
    text?: { type: string; text: string; verbatim?: boolean };
    elements?: { url: string }[];
  }[];
};

/** arbiter_webhook_deliveries_total of one result, from a /metrics answer (0 before the first). */
const deliveryCount = (metrics: { text: string }, result: string): number =>
  Number(
    new RegExp(`arbiter_webhook_deliveries_total\\{result="${result}"\\} (\\d+)`).exec(metrics.text)?.[1] ??
      0,
  );

const putHook = (a: Arbiter, name: string, body: unknown, key?: string) =>
  call('PUT', `${a.platform}/api/v1/webhooks/${name}`, { body, ...(key ? { key } : {}) });

// The outbox is written by each backend's transactions: every backend.
onEveryBackend('webhooks (SPEC §12)', function () {
  this.timeout(90_000);
  let a: Arbiter;
  let rx: Receiver;
  before(async () => {
    rx = new Receiver();
    await rx.start();
    a = await Arbiter.start({
      ARBITER_WEBHOOK_RETRY_SECONDS: '1',
      ARBITER_PUBLIC_URL: 'https://arbiter.example.com',
    });
  });
  after(async () => {
    await a.close();
    await rx.stop();
  });

  describe('configuration', () => {
    it('creates a webhook with a generated whsec_ secret shown once, and never shows it again', async () => {
      const r = await putHook(a, 'ops', { url: rx.url, events: ['policy.changed'] });
      expect(r.status, r.text).to.equal(201);
      expect(r.json).to.include({ name: 'ops', url: rx.url, format: 'json' });
      expect(r.json.secret).to.match(/^whsec_[A-Za-z0-9+/]{43}=$/);
      const got = await call('GET', `${a.platform}/api/v1/webhooks/ops`);
      expect(got.status).to.equal(200);
      expect(got.json).to.not.have.property('secret');
      const again = await putHook(a, 'ops', { url: rx.url, events: ['policy.changed', 'queue.expired'] });
      expect(again.status).to.equal(200);
      expect(again.json).to.not.have.property('secret');
      const list = await call('GET', `${a.platform}/api/v1/webhooks`);
      expect(list.json.webhooks.map((w: { name: string }) => w.name)).to.include('ops');
      const [ev] = await auditEvents(a.platform, { kind: 'webhook.put' });
      expect(JSON.stringify(ev)).to.not.include(r.json.secret.slice(6));
      expect((await call('DELETE', `${a.platform}/api/v1/webhooks/ops`)).status).to.equal(204);
      expectError(await call('GET', `${a.platform}/api/v1/webhooks/ops`), 404);
      expectError(await call('DELETE', `${a.platform}/api/v1/webhooks/ops`), 404);
      const deletes = await auditEvents(a.platform, { kind: 'webhook.delete' });
      expect(deletes.filter((e) => e.resource === 'ops')).to.have.length(1);
    });

    it('pages the webhook list by name with limit and next_cursor, as every list, and refuses bad paging', async () => {
      const names = ['paged-1', 'paged-a', 'paged_b'];
      for (const name of names) {
        expect((await putHook(a, name, { url: rx.url, events: ['queue.expired'] })).status).to.equal(201);
      }
      try {
        const whole = await call('GET', `${a.platform}/api/v1/webhooks`);
        expect(whole.status, whole.text).to.equal(200);
        expect(whole.json).to.have.keys('webhooks', 'next_cursor');
        expect(whole.json.next_cursor).to.equal(null);
        const all = whole.json.webhooks.map((w: { name: string }) => w.name) as string[];
        expect(all).to.include.members(names);
        const seen: string[] = [];
        let cursor: string | null = null;
        do {
          const r = await call(
            'GET',
            `${a.platform}/api/v1/webhooks?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`,
          );
          expect(r.status, r.text).to.equal(200);
          expect(r.json.webhooks.length).to.be.within(1, 2);
          seen.push(...r.json.webhooks.map((w: { name: string }) => w.name));
          cursor = r.json.next_cursor as string | null;
        } while (cursor !== null);
        expect(seen).to.deep.equal(all);
        // By name in code-unit order: '-' and digits before '_' and letters.
        expect(seen.filter((n) => names.includes(n))).to.deep.equal(['paged-1', 'paged-a', 'paged_b']);
        expectError(await call('GET', `${a.platform}/api/v1/webhooks?limit=0`), 400, /limit/);
        expectError(await call('GET', `${a.platform}/api/v1/webhooks?cursor=nope`), 400, /cursor/);
        const policyCursor = (await call('GET', `${a.platform}/api/v1/policies?limit=1`)).json.next_cursor;
        expectError(
          await call('GET', `${a.platform}/api/v1/webhooks?cursor=${policyCursor as string}`),
          400,
          /cursor/,
        );
        expectError(await call('GET', `${a.platform}/api/v1/webhooks?sort=name`), 400, /sort/);
      } finally {
        for (const name of names) await call('DELETE', `${a.platform}/api/v1/webhooks/${name}`);
      }
    });

    const bad: [string, unknown, RegExp][] = [
      ['a URL that is not http(s)', { url: 'ftp://x/y', events: ['queue.pending'] }, /url/],
      ['a URL that is not a URL', { url: 'not a url', events: ['queue.pending'] }, /url/],
      ['an unknown event', { url: 'http://x/', events: ['queue.exploded'] }, /events\.0/],
      ['no events', { url: 'http://x/', events: [] }, /events/],
      ['a repeated event', { url: 'http://x/', events: ['queue.pending', 'queue.pending'] }, /events/],
      ['an unknown format', { url: 'http://x/', events: ['queue.pending'], format: 'xml' }, /format/],
      [
        'a secret without whsec_',
        { url: 'http://x/', events: ['queue.pending'], secret: 'hunter2' },
        /secret/,
      ],
      // Node decodes these leniently; Python's base64 and the Standard Webhooks libraries refuse them.
      ...(
        [
          ['of 33 base64 characters (not a multiple of 4)', `whsec_${'A'.repeat(33)}`],
          ['of 43 base64 characters without its padding', `whsec_${'A'.repeat(43)}`],
          ['with padding that does not fit its length', `whsec_${'A'.repeat(42)}=`],
          ['with too much padding', `whsec_${'A'.repeat(43)}==`],
          ['with padding in the middle', `whsec_${'A'.repeat(20)}=${'A'.repeat(23)}`],
          ['with unused bits set in its last character', `whsec_${'A'.repeat(42)}B=`],
          ['of 20 bytes (fewer than 24)', `whsec_${Buffer.alloc(20, 1).toString('base64')}`],
          ['in base64url', `whsec_${'-_'.repeat(22)}`],
        ] as const
      ).map(([what, secret]): [string, unknown, RegExp] => [
        `a secret ${what}`,
        { url: 'http://x/', events: ['queue.pending'], secret },
        /^secret /,
      ]),
      ['an unknown field', { url: 'http://x/', events: ['queue.pending'], retries: 3 }, /retries/],
      ['a missing url', { events: ['queue.pending'] }, /url/],
      [
        'a URL with credentials (no delivery could carry them)',
        { url: 'http://user:secretpw@x/h', events: ['queue.pending'] },
        /url must not contain credentials/,
      ],
      [
        'a URL within 2048 characters as sent but not as stored (é is stored as %C3%A9)',
        { url: `http://127.0.0.1/ok?${'é'.repeat(1000)}`, events: ['queue.pending'] },
        /^url must be at most 2048 characters once normalised \(6020: /,
      ],
    ];
    for (const [what, body, field] of bad) {
      it(`refuses ${what} with 400 naming it, and stores nothing`, async () => {
        expectError(await putHook(a, 'bad-hook', body), 400, field);
        expectError(await call('GET', `${a.platform}/api/v1/webhooks/bad-hook`), 404);
      });
    }

    it('accepts a secret in canonical base64 of 24 bytes or more', async () => {
      for (const bytes of [24, 32, 64, 25, 26]) {
        const secret = `whsec_${Buffer.alloc(bytes, bytes).toString('base64')}`;
        const r = await putHook(a, `given-${bytes}`, { url: rx.url, events: ['queue.expired'], secret });
        expect(r.status, `${secret}: ${r.text}`).to.equal(201);
        expect(r.json).to.not.have.property('secret');
        expect((await call('DELETE', `${a.platform}/api/v1/webhooks/given-${bytes}`)).status).to.equal(204);
      }
    });

    it('never shows the password of a URL stored before credentials were refused, nor in a delivery error', async () => {
      expect((await putHook(a, 'legacy', { url: rx.url, events: ['queue.pending'] })).status).to.equal(201);
      // As an earlier version could store it: straight into the database.
      const withPassword = rx.url.replace('http://', 'http://ops:hunter22@');
      await a.alter('UPDATE webhooks SET url = $1 WHERE name = $2', [withPassword, 'legacy']);
      const got = await call('GET', `${a.platform}/api/v1/webhooks/legacy`);
      expect(got.status, got.text).to.equal(200);
      expect(got.json.url).to.equal(rx.url.replace('http://', 'http://ops:***@'));
      const list = await call('GET', `${a.platform}/api/v1/webhooks`);
      expect(list.text).to.not.include('hunter22');
      // fetch refuses such a URL, naming it: the recorded error does not carry the password.
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(q.status).to.equal(202);
      let deliveries = '';
      for (let i = 0; i < 100 && !deliveries.includes('credentials'); i++) {
        await sleep(100);
        deliveries = (await call('GET', `${a.platform}/api/v1/webhooks/legacy/deliveries`)).text;
      }
      expect(deliveries).to.include('credentials');
      expect(deliveries).to.not.include('hunter22');
      expect((await call('DELETE', `${a.platform}/api/v1/webhooks/legacy`)).status).to.equal(204);
    });

    // A Slack incoming-webhook URL is a bearer credential, and audit:read is less than admin.
    it('records a webhook URL in the audit trail as its origin and SHA-256 only, never its path or query', async () => {
      const auditor = a.createKey('hook-auditor', ['audit:read']);
      const slack = 'https://hooks.slack.com/services/T0000/B0000/XXXXSECRETXXXX';
      const withToken = `${rx.url}/T0000?token=abc123tokenvalue`;
      const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
      const created = await putHook(a, 'slack1', { url: slack, events: ['queue.pending'], format: 'slack' });
      expect(created.status, created.text).to.equal(201);
      const same = await putHook(a, 'slack2', { url: slack, events: ['queue.pending'], format: 'slack' });
      expect(same.status, same.text).to.equal(201);
      const replaced = await putHook(a, 'slack1', { url: withToken, events: ['queue.denied'] });
      expect(replaced.status, replaced.text).to.equal(200);
      // The admin who set it still reads it whole.
      expect((await call('GET', `${a.platform}/api/v1/webhooks/slack1`)).json.url).to.equal(withToken);
      for (const name of ['slack1', 'slack2']) {
        expect((await call('DELETE', `${a.platform}/api/v1/webhooks/${name}`)).status).to.equal(204);
      }

      // Every page of the audit trail, as the audit:read key reads it.
      let text = '';
      let cursor: string | null = null;
      do {
        const page: Awaited<ReturnType<typeof call>> = await call(
          'GET',
          `${a.platform}/api/v1/audit?limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
          { key: auditor },
        );
        expect(page.status, page.text).to.equal(200);
        text += page.text;
        cursor = page.json.next_cursor;
      } while (cursor !== null);
      expect(text).to.include('webhook.put').and.include('webhook.delete');
      for (const secret of [
        'XXXXSECRETXXXX',
        '/services/T0000',
        'abc123tokenvalue',
        'token=',
        '/hook/T0000',
      ]) {
        expect(text, secret).to.not.include(secret);
      }

      const puts = (await auditEvents(a.platform, { kind: 'webhook.put' })).filter((e) =>
        ['slack1', 'slack2'].includes(e.resource),
      );
      expect(puts.map((e) => [e.resource, e.details.url_origin, e.details.url_sha256])).to.deep.equal([
        ['slack1', `http://127.0.0.1:${rx.port}`, sha256(withToken)],
        ['slack2', 'https://hooks.slack.com', sha256(slack)],
        ['slack1', 'https://hooks.slack.com', sha256(slack)],
      ]);
      for (const e of puts) expect(e.details).to.not.have.property('url');
    });

    it('refuses a bad name (400), needs admin (403), and 404s the deliveries of an unknown webhook', async () => {
      expectError(await putHook(a, 'Bad_Name', { url: rx.url, events: ['queue.pending'] }), 400, /name/);
      const writer = a.createKey('policy-writer', ['policies:write', 'policies:read']);
      expectError(await putHook(a, 'nope', { url: rx.url, events: ['queue.pending'] }, writer), 403, /admin/);
      expectError(await call('GET', `${a.platform}/api/v1/webhooks/nope/deliveries`), 404);
    });
  });

  describe('delivery', () => {
    let secret: string;
    before(async () => {
      const r = await putHook(a, 'reviewers', {
        url: rx.url,
        events: ['queue.pending', 'queue.approved', 'queue.denied', 'policy.changed'],
      });
      expect(r.status, r.text).to.equal(201);
      secret = r.json.secret as string;
    });

    it('delivers to a webhook named like an Object member (constructor), and to the others meanwhile', async () => {
      const r = await putHook(a, 'constructor', { url: rx.url, events: ['queue.pending'] });
      expect(r.status, r.text).to.equal(201);
      try {
        const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
        expect(q.status).to.equal(202);
        // Two messages for the item: one to `reviewers`, one to `constructor`.
        await rx.waitFor(
          () => rx.messages('queue.pending').filter((m) => m.data.id === q.json.request_id).length === 2,
        );
        const d = await call('GET', `${a.platform}/api/v1/webhooks/constructor/deliveries`);
        expect(d.status, d.text).to.equal(200);
        expect(d.json.deliveries.map((x: { status: string }) => x.status)).to.deep.equal(['delivered']);
      } finally {
        expect((await call('DELETE', `${a.platform}/api/v1/webhooks/constructor`)).status).to.equal(204);
      }
    });

    it('POSTs a queue.pending message signed per Standard Webhooks, verified by its reference library', async () => {
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(q.status).to.equal(202);
      await rx.waitFor(() => rx.messages('queue.pending').some((m) => m.data.id === q.json.request_id));
      const raw = rx.got.find((g) => g.body.includes(q.json.request_id as string))!;
      const verified = new Webhook(secret).verify(raw.body, raw.headers as Record<string, string>) as {
        id: string;
        type: string;
        data: Record<string, unknown>;
      };
      expect(verified.id).to.equal(raw.headers['webhook-id']);
      expect(verified.type).to.equal('queue.pending');
      expect(verified.data).to.include({
        id: q.json.request_id,
        agent_id: 'deploy-bot',
        action: 'deploy',
        resource: 'prod/api',
        expires_at: q.json.expires_at,
        trace_id: q.json.trace_id,
      });
      expect(raw.headers['webhook-signature']).to.match(/^v1,[A-Za-z0-9+/]+=*$/);
      // A wrong secret does not verify.
      expect(() =>
        new Webhook(`whsec_${Buffer.alloc(32, 7).toString('base64')}`).verify(
          raw.body,
          raw.headers as Record<string, string>,
        ),
      ).to.throw();

      const reviewer = a.createKey('hook-reviewer', ['queue:review']);
      await call('POST', `${a.engine}/v1/queue/${q.json.request_id}/approve`, {
        key: reviewer,
        body: { note: 'CHG-9' },
      });
      await rx.waitFor(() => rx.messages('queue.approved').some((m) => m.data.id === q.json.request_id));
      const approved = rx.messages('queue.approved').find((m) => m.data.id === q.json.request_id)!;
      expect(approved.data).to.include({ status: 'approved', decided_by: 'hook-reviewer', note: 'CHG-9' });
    });

    it('POSTs queue.denied with who denied it and the note, signed like every message', async () => {
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.approval, resource: 'prod/web' },
      });
      expect(q.status).to.equal(202);
      const reviewer = a.createKey('hook-denier', ['queue:review']);
      const deny = await call('POST', `${a.engine}/v1/queue/${q.json.request_id}/deny`, {
        key: reviewer,
        body: { note: 'not in a freeze window' },
      });
      expect(deny.status, deny.text).to.equal(200);
      await rx.waitFor(() => rx.messages('queue.denied').some((m) => m.data.id === q.json.request_id));
      const raw = rx.got.find(
        (g) => g.body.includes('"queue.denied"') && g.body.includes(q.json.request_id),
      )!;
      const verified = new Webhook(secret).verify(raw.body, raw.headers as Record<string, string>) as {
        type: string;
        data: Record<string, unknown>;
      };
      expect(verified).to.have.keys('id', 'type', 'time', 'data');
      expect(verified.type).to.equal('queue.denied');
      expect(verified.data).to.include({
        id: q.json.request_id,
        status: 'denied',
        decided_by: 'hook-denier',
        note: 'not in a freeze window',
        agent_id: 'deploy-bot',
        action: 'deploy',
        resource: 'prod/web',
      });
    });

    it('announces policy changes as policy.changed with the new revision', async () => {
      const put = await call('PUT', `${a.platform}/api/v1/policies/hook-probe`, {
        raw: 'package authz.agent\n\ndeny contains "never" if false\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(put.status).to.equal(201);
      await rx.waitFor(() =>
        rx.messages('policy.changed').some((m) => m.data.revision === put.json.revision),
      );
      const m = rx.messages('policy.changed').find((x) => x.data.revision === put.json.revision)!;
      expect(m.data).to.include({ change: 'policy.put', name: 'hook-probe', actor: 'admin' });
      await call('DELETE', `${a.platform}/api/v1/policies/hook-probe`);
    });

    it('retries with backoff after failures and records each attempt in the deliveries list', async () => {
      // Keyed by the trace id, known before the request: the first two attempts fail.
      const trace = '0af7651916cd43dd8448eb211c80319c';
      rx.failing.set(trace, 2);
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: AGENT.approval,
        headers: { traceparent: `00-${trace}-b7ad6b7169203331-01` },
      });
      await rx.waitFor(
        () => rx.messages('queue.pending').filter((m) => m.data.id === q.json.request_id).length >= 3,
        20_000,
      );
      const attempts = rx.got.filter((g) => g.body.includes(q.json.request_id as string));
      expect(attempts).to.have.length(3);
      // One message: the same webhook-id on every attempt; a later attempt waited longer.
      expect(new Set(attempts.map((x) => x.headers['webhook-id'])).size).to.equal(1);
      expect(attempts[2]!.at - attempts[1]!.at).to.be.greaterThan(attempts[1]!.at - attempts[0]!.at - 250);
      const list = await call('GET', `${a.platform}/api/v1/webhooks/reviewers/deliveries?limit=50`);
      expect(list.status).to.equal(200);
      const d = list.json.deliveries.find((x: { id: string }) => x.id === attempts[0]!.headers['webhook-id']);
      expect(d).to.include({ status: 'delivered', attempts: 3, last_status: 204, type: 'queue.pending' });
      const metrics = await call('GET', `${a.engine}/metrics`);
      expect(metrics.text).to.match(/arbiter_webhook_deliveries_total\{result="retry"\} [1-9]/);
      expect(metrics.text).to.match(/arbiter_webhook_deliveries_total\{result="delivered"\} [1-9]/);
    });

    it('pages the deliveries list and refuses bad paging parameters', async () => {
      const first = await call('GET', `${a.platform}/api/v1/webhooks/reviewers/deliveries?limit=1`);
      expect(first.json.deliveries).to.have.length(1);
      expect(first.json.next_cursor).to.be.a('string');
      const second = await call(
        'GET',
        `${a.platform}/api/v1/webhooks/reviewers/deliveries?limit=1&cursor=${first.json.next_cursor}`,
      );
      expect(second.json.deliveries[0].id < first.json.deliveries[0].id).to.equal(true);
      expectError(
        await call('GET', `${a.platform}/api/v1/webhooks/reviewers/deliveries?limit=0`),
        400,
        /limit/,
      );
      expectError(
        await call('GET', `${a.platform}/api/v1/webhooks/reviewers/deliveries?when=now`),
        400,
        /when/,
      );
    });

    it('does not slow decisions while the receiver hangs', async () => {
      rx.hang = true;
      try {
        for (let i = 0; i < 8; i++)
          await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
        await sleep(300);
        const times: number[] = [];
        for (let i = 0; i < 40; i++) {
          const t = Date.now();
          const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
          times.push(Date.now() - t);
          expect(r.status).to.equal(200);
        }
        times.sort((x, y) => x - y);
        // Deliveries wait up to 10 s on the hanging receiver; decisions must not wait with them.
        expect(times[times.length - 1], `slowest decision ${times[times.length - 1]} ms`).to.be.lessThan(
          2_000,
        );
      } finally {
        rx.hang = false;
      }
    });
  });

  it('sends queue.expired with no decider and no note when an item expires, as {id, type, time, data}', async () => {
    const rx2 = new Receiver();
    await rx2.start();
    const b = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1', ARBITER_QUEUE_TTL_SECONDS: '1' });
    try {
      const hook = await putHook(b, 'outcomes', { url: rx2.url, events: ['queue.expired'] });
      expect(hook.status, hook.text).to.equal(201);
      const expiring = await call('POST', `${b.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(expiring.status, expiring.text).to.equal(202);
      // Left to expire (1 s): the sweeper records it and notifies.
      await rx2.waitFor(() => rx2.messages('queue.expired').length === 1);
      const [raw] = rx2.got;
      const verified = new Webhook(hook.json.secret as string).verify(
        raw!.body,
        raw!.headers as Record<string, string>,
      );
      expect(verified).to.have.keys('id', 'type', 'time', 'data');
      const [x] = rx2.messages('queue.expired');
      expect(x!.data).to.include({
        id: expiring.json.request_id,
        status: 'expired',
        decided_by: null,
        note: null,
        agent_id: 'deploy-bot',
        resource: 'prod/api',
        decided_at: expiring.json.expires_at,
      });
      expect(rx2.got).to.have.length(1);
    } finally {
      await b.close();
      await rx2.stop();
    }
  });

  it('formats Slack messages with a link to the console item (ARBITER_PUBLIC_URL)', async () => {
    const slack = new Receiver();
    await slack.start();
    try {
      const r = await putHook(a, 'slack', { url: slack.url, events: ['queue.pending'], format: 'slack' });
      expect(r.status).to.equal(201);
      // An agent's resource with Slack formatting, a URL and a backtick in it.
      const resource = 'prod/*urgent*_x_`www.evil.example/approve';
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.approval, resource },
      });
      expect(q.status, q.text).to.equal(202);
      const link = `https://arbiter.example.com/console/#/item/${q.json.request_id}`;
      await slack.waitFor(() => slack.got.some((g) => g.body.includes(link)));
      const msg = JSON.parse(slack.got.find((g) => g.body.includes(link))!.body) as {
        text: string;
        blocks: { type: string; text?: { text: string; verbatim?: boolean }; elements?: { url: string }[] }[];
      };
      // Agent-chosen strings are inline code (no formatting inside), the backtick shown as U+02CB.
      expect(msg.text).to.include(
        'Approval needed: `deploy-bot` wants to `deploy` on `prod/*urgent*_x_\u02cbwww.evil.example/approve`',
      );
      expect(msg.text).to.include(`<${link}|Open in Arbiter>`);
      const section = msg.blocks.find((b) => b.type === 'section');
      expect(section?.text?.verbatim, 'no URL in the text is made a link').to.equal(true);
      expect(msg.blocks.find((b) => b.type === 'actions')?.elements?.[0]?.url).to.equal(link);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/slack`);
      await slack.stop();
    }
  });

  it('signs every attempt from a secret rotation on with the new secret, retries of earlier deliveries included; a PUT without one keeps it', async () => {
    const rx3 = new Receiver();
    await rx3.start();
    const secretOf = (fill: number) => `whsec_${Buffer.alloc(32, fill).toString('base64')}`;
    const [oldSecret, newSecret] = [secretOf(1), secretOf(2)];
    const verifies = (secret: string, r: Received) => {
      try {
        new Webhook(secret).verify(r.body, r.headers as Record<string, string>);
        return true;
      } catch {
        return false;
      }
    };
    const events = ['queue.pending'];
    try {
      expect((await putHook(a, 'rotating', { url: rx3.url, events, secret: oldSecret })).status).to.equal(
        201,
      );
      // The receiver refuses this item's message until told otherwise: it stays due for retries.
      const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
      rx3.failing.set(trace, 1_000);
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.approval, resource: 'prod/rotation' },
        headers: { traceparent: `00-${trace}-00f067aa0ba902b7-01` },
      });
      expect(q.status, q.text).to.equal(202);
      await rx3.waitFor(() => rx3.got.length >= 1);
      expect(verifies(oldSecret, rx3.got[0]!)).to.equal(true);

      const rotated = await putHook(a, 'rotating', { url: rx3.url, events, secret: newSecret });
      expect(rotated.status, rotated.text).to.equal(200);
      expect(rotated.json).to.not.have.property('secret');
      rx3.failing.set(trace, 0);
      const delivered = async () =>
        (
          (await call('GET', `${a.platform}/api/v1/webhooks/rotating/deliveries`)).json.deliveries as {
            status: string;
          }[]
        )[0]?.status === 'delivered';
      const until = Date.now() + 20_000;
      while (!(await delivered())) {
        if (Date.now() > until) throw new Error('the delivery was not retried to success within 20 s');
        await sleep(100);
      }
      // The attempt that succeeded was made after the rotation: signed with the new secret only.
      const last = rx3.got.at(-1)!;
      expect(JSON.parse(last.body).data.id).to.equal(q.json.request_id);
      expect(verifies(newSecret, last)).to.equal(true);
      expect(verifies(oldSecret, last)).to.equal(false);

      // A PUT without "secret" keeps the current one.
      const kept = await putHook(a, 'rotating', { url: rx3.url, events });
      expect(kept.status, kept.text).to.equal(200);
      expect(kept.json).to.not.have.property('secret');
      const next = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.approval, resource: 'prod/rotation-2' },
      });
      await rx3.waitFor(() => rx3.got.some((g) => g.body.includes(next.json.request_id as string)));
      const msg = rx3.got.find((g) => g.body.includes(next.json.request_id as string))!;
      expect(verifies(newSecret, msg)).to.equal(true);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/rotating`);
      await rx3.stop();
    }
  });

  it("links a Slack message to the Engine API's own address when ARBITER_PUBLIC_URL is unset", async () => {
    const slack = new Receiver();
    await slack.start();
    const b = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1' });
    try {
      const hook = await putHook(b, 'slack', { url: slack.url, events: ['queue.pending'], format: 'slack' });
      expect(hook.status, hook.text).to.equal(201);
      const q = await call('POST', `${b.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(q.status, q.text).to.equal(202);
      await slack.waitFor(() => slack.got.length === 1);
      const msg = JSON.parse(slack.got[0]!.body) as SlackBody;
      const link = `${b.engine}/console/#/item/${q.json.request_id}`;
      expect(msg.text).to.include(`<${link}|Open in Arbiter>`);
      expect(msg.blocks.find((x) => x.type === 'actions')?.elements?.[0]?.url).to.equal(link);
    } finally {
      await b.close();
      await slack.stop();
    }
  });

  it('sends a Slack message for policy.changed: the revision, who changed it, and what', async () => {
    const slack = new Receiver();
    await slack.start();
    try {
      const r = await putHook(a, 'slack-policy', {
        url: slack.url,
        events: ['policy.changed'],
        format: 'slack',
      });
      expect(r.status, r.text).to.equal(201);
      const put = await call('PUT', `${a.platform}/api/v1/data/hooks/slack-probe`, { body: { on: true } });
      expect(put.status, put.text).to.equal(201);
      const expected = `:scroll: Policy set changed to revision ${put.json.revision} by \`admin\` (data.put \`hooks/slack-probe\`)`;
      await slack.waitFor(() => slack.got.some((g) => g.body.includes(expected)));
      const msg = JSON.parse(slack.got.find((g) => g.body.includes(expected))!.body) as SlackBody;
      expect(msg.text).to.equal(expected);
      expect(msg.blocks).to.deep.equal([
        { type: 'section', text: { type: 'mrkdwn', text: expected, verbatim: true } },
      ]);
      const list = await call('GET', `${a.platform}/api/v1/webhooks/slack-policy/deliveries`);
      expect(list.json.deliveries[0]).to.include({
        type: 'policy.changed',
        status: 'delivered',
        attempts: 1,
      });
      await call('DELETE', `${a.platform}/api/v1/data/hooks/slack-probe`);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/slack-policy`);
      await slack.stop();
    }
  });

  it('keeps a Slack section within 3000 characters, escapes counted, for the longest resource and note', async () => {
    const slack = new Receiver();
    await slack.start();
    try {
      const r = await putHook(a, 'slack-long', {
        url: slack.url,
        events: ['queue.pending', 'queue.denied'],
        format: 'slack',
      });
      expect(r.status, r.text).to.equal(201);
      // 1024 characters, the most a resource may have; each & or < takes 5 or 4 once escaped.
      const resource = `prod/${'&<'.repeat(509)}x`;
      expect(resource).to.have.length(1024);
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, {
        body: { ...AGENT.approval, resource },
      });
      expect(q.status, q.text).to.equal(202);
      const reviewer = a.createKey('slack-long-reviewer', ['queue:review']);
      const note = '<'.repeat(2000);
      const denied = await call('POST', `${a.engine}/v1/queue/${q.json.request_id}/deny`, {
        key: reviewer,
        body: { note },
      });
      expect(denied.status, denied.text).to.equal(200);
      const id = q.json.request_id as string;
      await slack.waitFor(() => slack.got.filter((g) => g.body.includes(id)).length >= 2);
      const msgs = slack.got.filter((g) => g.body.includes(id)).map((g) => JSON.parse(g.body) as SlackBody);
      for (const msg of msgs) {
        const section = msg.blocks.find((b) => b.type === 'section')!.text!.text;
        expect(section.length, section).to.be.at.most(3000);
        // No escape cut in half: every & left starts a whole one.
        expect(section).to.not.match(/&(?!amp;|lt;|gt;)/);
        expect(section).to.include(`\`prod/${'&amp;&lt;'.repeat(20)}`);
        expect(section).to.include('…`');
        expect(msg.text.length).to.be.at.most(3000 + 200);
        expect(msg.text.startsWith(section)).to.equal(true);
      }
      const deny = msgs.find((m) => m.text.includes(':no_entry: Denied'))!;
      expect(deny.text).to.include(`(\`${'&lt;'.repeat(200)}`);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/slack-long`);
      await slack.stop();
    }
  });

  it('settles a delivery whose message cannot be rendered as a failed attempt: recorded, retried, given up', async () => {
    const slack = new Receiver();
    await slack.start();
    try {
      expect(
        (await putHook(a, 'slack-broken', { url: slack.url, events: ['queue.expired'], format: 'slack' }))
          .status,
      ).to.equal(201);
      const failedBefore = deliveryCount(await call('GET', `${a.engine}/metrics`), 'failed');
      // Stored messages this version cannot read (a damaged row, say): one still within its 24 h,
      // one past them.
      const now = new Date().toISOString();
      const old = new Date(Date.now() - 25 * 3600 * 1000).toISOString();
      for (const [id, at] of [
        ['dlv-unrenderable-new', now],
        ['dlv-unrenderable-old', old],
      ] as const) {
        await a.alter(
          `INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
           VALUES ($1, 'slack-broken', 'queue.expired', '{"id":', 'pending', 0, $2, $3)`,
          [id, at, at],
        );
      }
      type Row = { id: string; status: string; attempts: number; last_error: string | null };
      const listed = async () =>
        (await call('GET', `${a.platform}/api/v1/webhooks/slack-broken/deliveries`)).json.deliveries as Row[];
      for (let i = 0; ; i++) {
        const rows = await listed();
        const fresh = rows.find((d) => d.id === 'dlv-unrenderable-new');
        const gone = rows.find((d) => d.id === 'dlv-unrenderable-old');
        if (fresh && fresh.attempts >= 2 && gone?.status === 'failed') break;
        if (i > 100) throw new Error(`not settled: ${JSON.stringify(rows)}`);
        await sleep(100);
      }
      const rows = await listed();
      expect(rows.find((d) => d.id === 'dlv-unrenderable-old')).to.include({ status: 'failed', attempts: 1 });
      const fresh = rows.find((d) => d.id === 'dlv-unrenderable-new')!;
      expect(fresh.status).to.equal('pending');
      for (const d of rows) expect(d.last_error).to.match(/^the message could not be prepared: .*JSON/);
      expect(slack.got).to.have.length(0);
      expect(deliveryCount(await call('GET', `${a.engine}/metrics`), 'failed')).to.equal(failedBefore + 1);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/slack-broken`);
      await slack.stop();
    }
  });

  it('records why a connection failed (ECONNREFUSED), not only "fetch failed"', async () => {
    const closed = new Receiver();
    await closed.start();
    const url = closed.url;
    await closed.stop();
    try {
      expect((await putHook(a, 'refused', { url, events: ['queue.pending'] })).status).to.equal(201);
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(q.status).to.equal(202);
      let d: { attempts: number; last_error: string | null } | undefined;
      for (let i = 0; i < 100 && !d?.attempts; i++) {
        await sleep(100);
        d = (await call('GET', `${a.platform}/api/v1/webhooks/refused/deliveries`)).json.deliveries[0];
      }
      expect(d?.last_error).to.match(/^fetch failed: connect ECONNREFUSED 127\.0\.0\.1:\d+$/);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/webhooks/refused`);
    }
  });
});

// Claiming and leasing differ per backend: every backend.
onEveryBackend('webhook deliveries: a receiver that never answers holds back no other', function () {
  this.timeout(90_000);

  /** A receiver that never answers, a healthy one and an instance retrying every second, all stopped after `run`. */
  const withReceivers = async (run: (a: Arbiter, stuck: Receiver, healthy: Receiver) => Promise<void>) => {
    const stuck = new Receiver();
    stuck.hang = true;
    const healthy = new Receiver();
    await stuck.start();
    await healthy.start();
    const a = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1' });
    try {
      await run(a, stuck, healthy);
    } finally {
      await stuck.stop(); // its held attempts fail at once: the instance need not wait them out
      await a.close();
      await healthy.stop();
    }
  };

  /** Twelve items queued 100 ms apart, each announced as queue.pending: when each was made, by id. */
  const queueTwelve = async (a: Arbiter): Promise<Map<string, number>> => {
    const created = new Map<string, number>();
    for (let i = 0; i < 12; i++) {
      const q = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
      expect(q.status).to.equal(202);
      created.set(q.json.request_id as string, Date.now());
      await sleep(100);
    }
    return created;
  };

  /** Each notice within 5 s of its item, well inside the 10 s the stuck receivers' attempts wait. */
  const expectPrompt = async (healthy: Receiver, created: Map<string, number>) => {
    await healthy.waitFor(() => healthy.messages('queue.pending').length >= created.size, 5_000);
    for (const r of healthy.got) {
      const id = (JSON.parse(r.body) as { data: { id: string } }).data.id;
      expect(r.at - created.get(id)!, `notice of ${id}`).to.be.lessThan(5_000);
    }
  };

  it("delivers to a healthy receiver promptly while another's attempts time out, and retries those", () =>
    withReceivers(async (a, stuck, healthy) => {
      for (const [name, rx] of [
        ['stuck', stuck],
        ['healthy', healthy],
      ] as const) {
        expect((await putHook(a, name, { url: rx.url, events: ['queue.pending'] })).status).to.equal(201);
      }
      // More than one webhook's share in flight (8): some of stuck's wait for room, and retries.
      await expectPrompt(healthy, await queueTwelve(a));
      // The stuck receiver holds no more than its share.
      expect(stuck.held).to.be.within(1, 8);
      // Its attempts time out, are recorded, and its deliveries are tried again.
      await stuck.waitFor(() => stuck.held > 8, 20_000).catch(() => undefined);
      expect(stuck.held, 'attempts the stuck receiver got').to.be.greaterThan(8);
      const list = await call('GET', `${a.platform}/api/v1/webhooks/stuck/deliveries?limit=50`);
      expect(list.status).to.equal(200);
      const timedOut = list.json.deliveries.filter(
        (d: { status: string; attempts: number; last_error: string | null }) =>
          d.status === 'pending' && d.attempts >= 1 && /no answer within 10 s/.test(d.last_error ?? ''),
      );
      expect(timedOut.length, list.text).to.be.greaterThan(0);
    }));

  it('delivers to a healthy receiver promptly while stuck receivers hold the whole process allowance', () =>
    // Nine webhooks that never answer may hold 9 × 8 = 72 attempts, more than the process's 64:
    // a webhook with nothing in flight still gets one, so the healthy one is not held back.
    withReceivers(async (a, stuck, healthy) => {
      for (let i = 1; i <= 9; i++) {
        const put = await putHook(a, `stuck-${i}`, { url: `${stuck.url}/${i}`, events: ['queue.pending'] });
        expect(put.status).to.equal(201);
      }
      expect((await putHook(a, 'healthy', { url: healthy.url, events: ['queue.pending'] })).status).to.equal(
        201,
      );
      const created = await queueTwelve(a);
      // The process's whole allowance is held by receivers that do not answer.
      await stuck.waitFor(() => stuck.held >= 64, 5_000);
      await expectPrompt(healthy, created);
    }));

  it("claims from a stuck receiver's large backlog reading only its share, not every due delivery", () =>
    // A receiver that hangs drains 8 deliveries per 10 s; while agents keep asking for approval its
    // due backlog grows. Each claim used to rank every due delivery (the stuck webhook's ones
    // included) while holding SQLite's write lock: with 100 000 due, decisions of every tenant
    // waited 150 ms at the median, ~1 s at p97.5 (soak probe). A claim now reads each webhook's
    // earliest due ones from an index, up to its share.
    withReceivers(async (a, stuck, healthy) => {
      for (const [name, rx] of [
        ['stuck', stuck],
        ['healthy', healthy],
      ] as const) {
        expect((await putHook(a, name, { url: rx.url, events: ['queue.pending'] })).status).to.equal(201);
      }
      // The backlog an outage of the stuck receiver left: 3000 due deliveries.
      const due = new Date(Date.now() - 60_000).toISOString();
      const payload = JSON.stringify({ id: 'backlog', type: 'queue.pending', time: due, data: {} });
      await a.alter(
        `WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
         INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
         SELECT 'dlv-backlog-' || i, 'stuck', 'queue.pending', $1, 'pending', 0, $2, $3 FROM n`,
        [payload, due, new Date().toISOString()],
      );
      // The healthy receiver's notices still go out at once; decisions are answered meanwhile.
      await expectPrompt(healthy, await queueTwelve(a));
      expect(stuck.held).to.be.within(1, 8);
      expect(
        await a.count('webhook_deliveries', "webhook = 'stuck' AND status = 'pending'"),
      ).to.be.greaterThan(2900);

      // What a claim reads with that backlog due: each webhook's share, not the 3000.
      const now = new Date().toISOString();
      if (a.databaseUrl) {
        const c = new pg.Client({ connectionString: a.databaseUrl });
        await c.connect();
        try {
          await c.query('BEGIN');
          await c.query('ANALYZE webhook_deliveries');
          const [plan] = (
            await c.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
              `EXPLAIN (ANALYZE, FORMAT JSON) ${CLAIM_SQL_POSTGRES}`,
              [now, now, 64, 8, '{}'],
            )
          ).rows[0]!['QUERY PLAN'];
          const read = scansOf(plan.Plan, 'webhook_deliveries');
          expect(read.length, JSON.stringify(plan)).to.be.greaterThan(0);
          for (const n of read) {
            const rows =
              (n['Actual Rows'] ?? 0) * (n['Actual Loops'] ?? 1) + (n['Rows Removed by Filter'] ?? 0);
            expect(rows, `${n['Node Type']} read ${rows} rows: ${JSON.stringify(plan)}`).to.be.at.most(64);
          }
        } finally {
          await c.query('ROLLBACK');
          await c.end();
        }
      } else {
        const plan = (
          await a.stored<{ detail: string }>(`EXPLAIN QUERY PLAN ${CLAIM_EARLIEST_SQLITE}`, ['stuck', now, 8])
        )
          .map((r) => r.detail)
          .join('; ');
        expect(plan).to.match(
          /USING (COVERING )?INDEX webhook_deliveries_claim \(webhook=\? AND next_attempt_at<\?\)/,
        );
        expect(plan).not.to.match(/TEMP B-TREE/);
      }
    }));
});

// The send's outcome is recorded after the listeners closed: every backend.
onEveryBackend('webhook sends at shutdown', function () {
  this.timeout(90_000);

  /** Whether a new connection to `url`'s port is refused now (true) or accepted (false). */
  const refused = (url: string) =>
    new Promise<boolean>((resolve, reject) => {
      const { hostname, port } = new URL(url);
      const s = connect({ host: hostname, port: Number(port) }, () => {
        s.destroy();
        resolve(false);
      });
      // A connection the kernel took into the backlog just before the listener closed is reset,
      // not refused: not yet "refused", so the caller probes again.
      s.on('error', (err: NodeJS.ErrnoException) =>
        err.code === 'ECONNREFUSED'
          ? resolve(true)
          : err.code === 'ECONNRESET'
            ? resolve(false)
            : reject(err),
      );
    });

  it('stops accepting at once on SIGTERM while a delivery is in flight, and records it before exiting', async () => {
    const rx = new Receiver();
    rx.hang = true;
    await rx.start();
    const a = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1' });
    try {
      expect((await putHook(a, 'slow', { url: rx.url, events: ['queue.pending'] })).status).to.equal(201);
      expect(
        (await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval })).status,
      ).to.equal(202);
      await rx.waitFor(() => rx.held === 1);
      const engine = a.engine;
      expect(await refused(engine)).to.equal(false);
      let exited = false;
      const signalled = Date.now();
      const stopped = a.stop().then((code) => {
        exited = true;
        return code;
      });
      while (!(await refused(engine))) {
        if (Date.now() - signalled > 3_000) throw new Error('still accepting connections 3 s after SIGTERM');
        await sleep(50);
      }
      // Within about a second, while the send it waits for (up to 10 s) is still in flight.
      expect(Date.now() - signalled).to.be.lessThan(1_000);
      expect(exited, 'exited before its delivery attempt ended').to.equal(false);
      await sleep(500);
      expect(exited).to.equal(false);
      // The receiver goes away: the attempt fails, is recorded (storage still open), and it exits.
      await rx.stop();
      expect(await stopped).to.equal(0);
      const [d] = await a.stored<{ status: string; attempts: number; last_error: string | null }>(
        'SELECT status, attempts, last_error FROM webhook_deliveries',
      );
      expect(d).to.include({ status: 'pending', attempts: 1 });
      expect(d!.last_error).to.be.a('string');
    } finally {
      await rx.stop();
      await a.close();
    }
  });
});

// Each backend stores the settled delivery (and migrates old rows) itself: every backend.
onEveryBackend('webhook deliveries: a settled one has no next attempt', function () {
  this.timeout(90_000);

  it('shows and stores next_attempt_at null once delivered or given up, also for rows settled before', async () => {
    const rx = new Receiver();
    await rx.start();
    const a = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1' });
    type Row = { id: string; status: string; attempts: number; next_attempt_at: string | null };
    const listed = async () =>
      (await call('GET', `${a.platform}/api/v1/webhooks/settled/deliveries`)).json.deliveries as Row[];
    const stored = async (id: string) =>
      (await a.stored<Row>('SELECT * FROM webhook_deliveries WHERE id = $1', [id]))[0]!;
    const until = async (pred: () => Promise<boolean>) => {
      for (let i = 0; !(await pred()); i++) {
        if (i > 200) throw new Error(`not settled: ${JSON.stringify(await listed())}`);
        await sleep(100);
      }
    };
    try {
      expect((await putHook(a, 'settled', { url: rx.url, events: ['queue.pending'] })).status).to.equal(201);
      await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
      await until(async () => (await listed()).some((d) => d.status === 'delivered'));
      const delivered = (await listed()).find((d) => d.status === 'delivered')!;
      expect(delivered).to.include({ attempts: 1, next_attempt_at: null });
      expect((await stored(delivered.id)).next_attempt_at).to.equal(null);

      // A delivery past its 24 h whose next attempt fails is given up: no next attempt either.
      rx.failing.set('give-up-probe', 100);
      const old = new Date(Date.now() - 25 * 3600 * 1000).toISOString();
      await a.alter(
        `INSERT INTO webhook_deliveries (id, webhook, type, payload, status, attempts, next_attempt_at, created_at)
         VALUES ($1, 'settled', 'queue.pending', $2, 'pending', 0, $3, $4)`,
        [
          'dlv-give-up-probe',
          JSON.stringify({
            id: 'dlv-give-up-probe',
            type: 'queue.pending',
            time: old,
            data: { note: 'give-up-probe' },
          }),
          old,
          old,
        ],
      );
      await until(async () => (await listed()).some((d) => d.status === 'failed'));
      expect((await listed()).find((d) => d.id === 'dlv-give-up-probe')).to.include({
        status: 'failed',
        attempts: 1,
        next_attempt_at: null,
      });
      expect((await stored('dlv-give-up-probe')).next_attempt_at).to.equal(null);

      // Rows settled by an earlier version kept their last lease time: the migration clears it.
      await a.stop();
      const future = new Date(Date.now() + 3600_000).toISOString();
      await a.alter("UPDATE webhook_deliveries SET next_attempt_at = $1 WHERE status <> 'pending'", [future]);
      await a.alter('DELETE FROM schema_migrations WHERE version = $1', [a.databaseUrl ? 8 : 15]);
      await a.restart();
      const after = await listed();
      expect(after.map((d) => [d.status, d.next_attempt_at])).to.have.deep.members([
        ['delivered', null],
        ['failed', null],
      ]);
    } finally {
      await a.close();
      await rx.stop();
    }
  });
});

onEveryBackend('webhook deliveries survive a crash (transactional outbox)', function () {
  this.timeout(90_000);

  it('loses no delivery when the process is killed with SIGKILL while they are pending', async () => {
    const rx = new Receiver();
    await rx.start();
    const port = rx.port;
    await rx.stop(); // the receiver is down: every delivery fails and stays pending
    const a = await Arbiter.start({ ARBITER_WEBHOOK_RETRY_SECONDS: '1' });
    try {
      const r = await putHook(a, 'durable', {
        url: `http://127.0.0.1:${port}/hook`,
        events: ['queue.pending'],
      });
      expect(r.status).to.equal(201);
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        ids.push(
          (await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval })).json
            .request_id as string,
        );
      }
      await sleep(1_500);
      const pending = await call('GET', `${a.platform}/api/v1/webhooks/durable/deliveries`);
      expect(pending.json.deliveries).to.have.length(5);
      for (const d of pending.json.deliveries) expect(d.status).to.equal('pending');
      expect(pending.json.deliveries.some((d: { attempts: number }) => d.attempts >= 1)).to.equal(true);
      await a.kill();

      await rx.start(port);
      await a.restart();
      await rx.waitFor(() => new Set(rx.messages('queue.pending').map((m) => m.data.id)).size === 5, 30_000);
      expect([...new Set(rx.messages('queue.pending').map((m) => m.data.id))].sort()).to.deep.equal(
        [...ids].sort(),
      );
      // Each settles once its receiver answered.
      const settled = async () =>
        (await call('GET', `${a.platform}/api/v1/webhooks/durable/deliveries`)).json.deliveries.every(
          (d: { status: string }) => d.status === 'delivered',
        ) as boolean;
      const until = Date.now() + 10_000;
      while (!(await settled())) {
        if (Date.now() > until) throw new Error('deliveries were received but not recorded as delivered');
        await sleep(100);
      }
    } finally {
      await a.close();
      await rx.stop();
    }
  });
});
