import { expect } from 'chai';
import pg from 'pg';
import { clientConfig } from '../src/storage/postgres/pool.js';
import { createServer, Socket, type Server } from 'node:net';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call, type Response } from './helpers/harness.js';
import { onPostgresOnly } from './helpers/backends.js';
import { createTestDatabase, queryDatabase, type TestDatabase } from './helpers/postgres.js';
import { sleep } from './helpers/process.js';

/**
 * SPEC §10 over HTTP: several `arbiter serve` processes on one PostgreSQL database are one
 * deployment. Each promise is driven through two real processes; the outage goes through a TCP
 * proxy of the test's own, cut and restored while the service runs.
 */

/** A TCP proxy to the local PostgreSQL that the test can cut (every connection) and restore. */
class CuttableProxy {
  private readonly sockets = new Set<Socket>();
  private cut = false;
  private server: Server | undefined;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {}

  async start(): Promise<void> {
    this.server = createServer((client) => {
      if (this.cut) return client.destroy();
      const upstream = new Socket();
      upstream.connect(this.target.port, this.target.host);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on('error', () => undefined);
        s.on('close', () => this.sockets.delete(s));
      }
      client.pipe(upstream).pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
  }

  /** Drops every connection and refuses new ones: the database is unreachable. */
  cutAll(): void {
    this.cut = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.cut = false;
  }

  async close(): Promise<void> {
    this.cutAll();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }
}

const authorize = (a: Arbiter, body: object = AGENT.allow, headers: Record<string, string> = {}) =>
  call('POST', `${a.engine}/v1/agent/authorize`, { body, headers });

const revisionOf = async (a: Arbiter) =>
  (await call('GET', `${a.engine}/healthz`, { key: null })).json.revision as number;

/** Polls `probe` until it is true, for at most `ms`; returns how long it took. */
async function within(ms: number, probe: () => Promise<boolean>): Promise<number> {
  const started = Date.now();
  while (Date.now() - started < ms) {
    if (await probe()) return Date.now() - started;
    await sleep(25);
  }
  throw new Error(`not within ${ms} ms`);
}

const FREEZE =
  'package authz.agent\n\ndeny contains "frozen by the cluster test" if input.action == "read"\n';

// Processes of their own on a database of their own: registered on the PostgreSQL run.
onPostgresOnly('several engines on one database (SPEC §10)', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let a: Arbiter;
  let b: Arbiter;

  before(async () => {
    db = await createTestDatabase();
    // Both start at once against the empty database: one migrates and seeds, both serve.
    [a, b] = await Promise.all([
      Arbiter.start({ ARBITER_DATABASE_URL: db.url }),
      Arbiter.start({ ARBITER_DATABASE_URL: db.url }),
    ]);
  });
  after(async () => {
    await Promise.all([a?.close(), b?.close()]);
    await db?.drop();
  });

  it('start together on an empty database: migrated and seeded once, one signing key, one revision', async () => {
    expect(await revisionOf(a)).to.equal(await revisionOf(b));
    const seeds = await auditEvents(a.platform, { kind: 'policy.seed' });
    expect(seeds).to.have.length(1);
    const [ja, jb] = await Promise.all([
      call('GET', `${a.engine}/.well-known/jwks.json`, { key: null }),
      call('GET', `${b.engine}/.well-known/jwks.json`, { key: null }),
    ]);
    expect(ja.json).to.deep.equal(jb.json);
    expect(ja.json.keys).to.have.length(1);
  });

  it('makes a policy change answered by one process live on the other within 1 s', async () => {
    expect((await authorize(b)).status).to.equal(200);
    const put = await call('PUT', `${a.platform}/api/v1/policies/cluster-freeze`, {
      raw: FREEZE,
      headers: { 'content-type': 'text/plain' },
    });
    expect(put.status, put.text).to.equal(201);
    const took = await within(1_000, async () => (await authorize(b)).status === 403);
    expect(took).to.be.lessThan(1_000);
    expect(await revisionOf(b)).to.equal(put.json.revision);
    const del = await call('DELETE', `${b.platform}/api/v1/policies/cluster-freeze`);
    expect(del.status).to.equal(204);
    await within(1_000, async () => (await authorize(a)).status === 200);
  });

  it('makes a data change answered by one process live on the other within 1 s', async () => {
    const blocked = await call('GET', `${a.platform}/api/v1/data/blocked_resources`);
    expect(blocked.status, blocked.text).to.equal(200);
    expect((await authorize(b)).status).to.equal(200);
    // AGENT.allow reads repo/arbiter: blocking it is a data change only.
    const put = await call('PUT', `${a.platform}/api/v1/data/blocked_resources`, {
      body: [...(blocked.json.value as string[]), 'repo/arbiter'],
    });
    expect(put.status, put.text).to.equal(200);
    await within(1_000, async () => (await authorize(b)).status === 403);
    expect(await revisionOf(b)).to.equal(put.json.revision);
    const back = await call('PUT', `${b.platform}/api/v1/data/blocked_resources`, {
      body: blocked.json.value,
    });
    expect(back.status, back.text).to.equal(200);
    await within(1_000, async () => (await authorize(a)).status === 200);
  });

  it('compiles a policy change once, in the process that makes it; the other loads the stored set', async () => {
    const compiles = async (x: Arbiter) => {
      const m = await call('GET', `${x.engine}/metrics`);
      return Number(/^arbiter_policy_compiles_total\{result="success"\} (\d+)$/m.exec(m.text)?.[1] ?? 0);
    };
    const [beforeA, beforeB] = [await compiles(a), await compiles(b)];
    const put = await call('PUT', `${a.platform}/api/v1/policies/cluster-compile-once`, {
      raw: FREEZE,
      headers: { 'content-type': 'text/plain' },
    });
    expect(put.status, put.text).to.equal(201);
    await within(1_000, async () => (await revisionOf(b)) === put.json.revision);
    expect((await authorize(b)).status).to.equal(403);
    expect(await compiles(a)).to.equal(beforeA + 1);
    expect(await compiles(b)).to.equal(beforeB);
    const del = await call('DELETE', `${a.platform}/api/v1/policies/cluster-compile-once`);
    expect(del.status).to.equal(204);
    await within(1_000, async () => (await authorize(b)).status === 200);
  });

  it('lets exactly one of many concurrent approvals across the two processes win', async () => {
    const q = await authorize(a, AGENT.approval);
    expect(q.status).to.equal(202);
    const reviewer = a.createKey(`reviewer-${Date.now()}`, ['queue:read', 'queue:review']);
    const results = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        call(
          'POST',
          `${(i % 2 ? a : b).engine}/v1/queue/${q.json.request_id}/${i % 3 ? 'approve' : 'deny'}`,
          {
            key: reviewer,
            body: { note: `reviewer ${i}` },
          },
        ),
      ),
    );
    const statuses = results.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).to.have.length(1);
    expect(statuses.filter((s) => s === 409)).to.have.length(15);
    const transitions = (await auditEvents(b.platform, { request_id: q.json.request_id })).filter((e) =>
      ['queue.approve', 'queue.deny'].includes(e.kind),
    );
    expect(transitions).to.have.length(1);
  });

  it('wakes a long-poll on one process within 1 s of the decision made on the other', async () => {
    const q = await authorize(a, AGENT.approval);
    const reviewer = b.createKey(`waker-${Date.now()}`, ['queue:review']);
    const started = Date.now();
    const waiting = call('GET', `${a.engine}/v1/queue/${q.json.request_id}?wait=20`);
    await sleep(300);
    const decidedAt = Date.now();
    const approve = await call('POST', `${b.engine}/v1/queue/${q.json.request_id}/approve`, {
      key: reviewer,
    });
    expect(approve.status).to.equal(200);
    const r: Response = await waiting;
    const returnedAt = Date.now();
    expect(r.json.status).to.equal('approved');
    expect(returnedAt - decidedAt, 'long-poll returned late').to.be.lessThan(1_000);
    expect(returnedAt - started).to.be.lessThan(5_000);
  });

  it('makes a token revoked on one process inactive on the other at once', async () => {
    const d = await authorize(a);
    const mint = await call('POST', `${a.engine}/v1/tokens/mint`, {
      body: { request_id: d.json.request_id },
    });
    expect(mint.status, mint.text).to.equal(201);
    const introspect = (x: Arbiter) =>
      call('POST', `${x.engine}/v1/tokens/introspect`, { body: { token: mint.json.token } });
    expect((await introspect(b)).json.active).to.equal(true);
    expect((await call('DELETE', `${b.engine}/v1/tokens/${mint.json.token_id}`)).status).to.equal(200);
    expect((await introspect(a)).json.active).to.equal(false);
  });

  it('refuses a key revoked through one process (or the CLI) everywhere within 1 s', async () => {
    const name = `short-lived-${Date.now()}`;
    const key = a.createKey(name, ['authorize']);
    for (const x of [a, b])
      expect(
        (await call('POST', `${x.engine}/v1/agent/authorize`, { key, body: AGENT.allow })).status,
      ).to.equal(200);
    const cli = b.cli(['keys', 'revoke', name]);
    expect(cli.code, cli.stderr).to.equal(0);
    for (const x of [a, b]) {
      await within(
        1_000,
        async () =>
          (await call('POST', `${x.engine}/v1/agent/authorize`, { key, body: AGENT.allow })).status === 401,
      );
    }
  });

  it('replays an Idempotency-Key retried against the other process', async () => {
    const headers = { 'idempotency-key': `retry-${Date.now()}` };
    const first = await authorize(a, AGENT.approval, headers);
    const retry = await authorize(b, AGENT.approval, headers);
    expect(retry.status).to.equal(first.status);
    expect(retry.json.request_id).to.equal(first.json.request_id);
    expect(retry.headers.get('idempotent-replayed')).to.equal('true');
    const other = await authorize(b, { ...AGENT.approval, resource: 'prod/other' }, headers);
    expectError(other, 422);
  });

  it('pages a list with a cursor handed out by the other process (one sealing key for both)', async () => {
    for (let i = 0; i < 3; i++) await authorize(a, AGENT.allow);
    const list = (x: Arbiter, cursor?: string) =>
      call('GET', `${x.platform}/api/v1/audit?kind=decision&limit=2${cursor ? `&cursor=${cursor}` : ''}`);
    const first = await list(a);
    const cursor = first.json.next_cursor as string;
    expect(cursor).to.be.a('string');
    const onA = await list(a, cursor);
    const onB = await list(b, cursor);
    expect(onB.status, onB.text).to.equal(200);
    expect(onB.json.events.map((e: { id: string }) => e.id)).to.deep.equal(
      onA.json.events.map((e: { id: string }) => e.id),
    );
  });

  it('keeps one verified chain after concurrent load on both processes, and verify on either covers it all', async () => {
    const answers = await Promise.all(
      Array.from({ length: 120 }, (_, i) =>
        authorize(i % 2 ? a : b, [AGENT.allow, AGENT.deny, AGENT.approval][i % 3]),
      ),
    );
    expect(answers.every((r) => [200, 202, 403].includes(r.status))).to.equal(true);
    const [va, vb] = await Promise.all([
      call('GET', `${a.platform}/api/v1/audit/verify`),
      call('GET', `${b.platform}/api/v1/audit/verify`),
    ]);
    expect(va.json.ok, va.text).to.equal(true);
    expect(vb.json).to.deep.equal(va.json);
    // The CLI honours the same URL (ARBITER_DATABASE_URL) and walks the same chain.
    const cli = b.cli(['audit', 'verify']);
    expect(cli.code, cli.stderr).to.equal(0);
    expect(JSON.parse(cli.stdout)).to.include({ ok: true });
    expect(JSON.parse(cli.stdout).checked).to.be.at.least(va.json.checked);
    const decisions = new Set(
      (await auditEvents(a.platform, { kind: 'decision' })).map((e) => e.request_id as string),
    );
    for (const r of answers) expect(decisions.has(r.json.request_id)).to.equal(true);
  });

  it('holds every engine up for only a few seconds when one stops mid-transaction holding the chain head (paused, cut off)', async () => {
    // A session with an engine's own settings that takes the chain head, as every write does
    // first, and then goes quiet, as a paused VM or a network cut leaves it.
    const stuck = new pg.Client(clientConfig(db.url));
    stuck.on('error', () => undefined);
    await stuck.connect();
    await stuck.query('BEGIN');
    await stuck.query(
      "SELECT key, value FROM meta WHERE key IN ('audit_head', 'audit_count') ORDER BY key FOR UPDATE",
    );
    const started = Date.now();
    const r = await authorize(a);
    const waited = Date.now() - started;
    expect(r.status, r.text).to.equal(200);
    // PostgreSQL ends the quiet session (idle_in_transaction_session_timeout, 3 s) and the
    // decision goes on; it used to wait 15 s, every engine with it.
    expect(waited).to.be.lessThan(10_000);
    let ended = false;
    try {
      await stuck.query('SELECT 1');
    } catch {
      ended = true;
    }
    expect(ended, 'the quiet session was ended').to.equal(true);
    await stuck.end().catch(() => undefined);
  });

  it('loses no acknowledged decision when one process is killed with SIGKILL; the other keeps serving', async () => {
    const acknowledged: string[] = [];
    let stop = false;
    const load = (async () => {
      while (!stop) {
        const batch = await Promise.allSettled(Array.from({ length: 8 }, () => authorize(a)));
        for (const r of batch)
          if (r.status === 'fulfilled' && r.value.status === 200) acknowledged.push(r.value.json.request_id);
      }
    })();
    await sleep(600);
    await a.kill();
    stop = true;
    await load;
    expect(acknowledged.length).to.be.greaterThan(0);
    expect((await authorize(b)).status).to.equal(200);
    const recorded = new Set(
      (await auditEvents(b.platform, { kind: 'decision' })).map((e) => e.request_id as string),
    );
    for (const id of acknowledged) expect(recorded.has(id), `acknowledged ${id} was lost`).to.equal(true);
    expect((await call('GET', `${b.platform}/api/v1/audit/verify`)).json.ok).to.equal(true);
    await a.restart();
    expect(await revisionOf(a)).to.equal(await revisionOf(b));
  });
});

onPostgresOnly('database unreachable (SPEC §10)', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let proxy: CuttableProxy;
  let a: Arbiter;
  let direct: Arbiter;

  before(async () => {
    db = await createTestDatabase();
    direct = await Arbiter.start({ ARBITER_DATABASE_URL: db.url });
    proxy = new CuttableProxy({ host: '127.0.0.1', port: Number(new URL(db.url).port || 5432) });
    await proxy.start();
    const viaProxy = new URL(db.url);
    viaProxy.port = String(proxy.port);
    a = await Arbiter.start({ ARBITER_DATABASE_URL: viaProxy.toString() });
  });
  after(async () => {
    await a?.close();
    await direct?.close();
    await proxy?.close();
    await db?.drop();
  });

  it('answers decisions 503 (never allow) and /healthz 503 while the database is cut, and recovers without a restart', async () => {
    expect((await authorize(a)).status).to.equal(200);
    proxy.cutAll();
    const during: Response[] = [];
    for (let i = 0; i < 6; i++) during.push(await authorize(a));
    for (const r of during) {
      expect(r.status, r.text).to.equal(503);
      expect(Object.keys(r.json)).to.deep.equal(['error']);
    }
    const health = await call('GET', `${a.engine}/healthz`, { key: null });
    expect(health.status).to.equal(503);
    expect(health.json.status).to.equal('unavailable');
    const verify = await call('GET', `${a.platform}/api/v1/audit/verify`);
    expect(verify.status).to.equal(503);
    // The metrics still answer (the gauges read from the database are NaN, which prom-client
    // writes "Nan" and Prometheus reads in any case), and count the 503s:
    // an outage must not blank the scrape an operator alerts on (an operations probe, 2026-11-29).
    const scrape = await call('GET', `${a.platform}/metrics`);
    expect(scrape.status, scrape.text).to.equal(200);
    expect(scrape.text).to.match(/^arbiter_queue_pending nan$/im);
    expect(scrape.text).to.match(
      /arbiter_http_requests_total\{api="engine",route="\/v1\/agent\/authorize",method="POST",status="503"\} [1-9]/,
    );

    proxy.restore();
    await within(
      15_000,
      async () => (await call('GET', `${a.engine}/healthz`, { key: null })).status === 200,
    );
    await within(15_000, async () => (await authorize(a)).status === 200);
    // Changes another process made go on arriving after the outage (feed or periodic check).
    const put = await call('PUT', `${direct.platform}/api/v1/policies/after-outage`, {
      raw: FREEZE,
      headers: { 'content-type': 'text/plain' },
    });
    expect(put.status, put.text).to.equal(201);
    await within(1_500, async () => (await authorize(a)).status === 403);
    expect((await call('GET', `${a.platform}/api/v1/audit/verify`)).json.ok).to.equal(true);
  });

  it('answers 503, not 500, while the database refuses new connections (ALLOW_CONNECTIONS false), to stored keys too; recovers by itself', async () => {
    const name = new URL(db.url).pathname.slice(1);
    const agentKey = direct.createKey('refused-reader', ['authorize'], { agent: AGENT.allow.agent_id });
    const reviewer = direct.createKey('refused-reviewer', ['queue:review']);
    // The database refuses connections to itself: the statements go through the maintenance one.
    const maintenance = new URL(db.url);
    maintenance.pathname = '/postgres';
    const asAgent = () =>
      call('POST', `${direct.engine}/v1/agent/authorize`, { body: AGENT.allow, key: agentKey });
    const pending = await authorize(direct, AGENT.approval);
    expect(pending.status, pending.text).to.equal(202);
    const answer = (await asAgent()).status;
    expect(answer).to.be.oneOf([200, 403]);
    await queryDatabase(maintenance.toString(), `ALTER DATABASE "${name}" WITH ALLOW_CONNECTIONS false`);
    try {
      await queryDatabase(
        maintenance.toString(),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'arbiter'",
        [name],
      );
      // A stored key is looked up first (its failure was a 500), then the decision is recorded.
      const refused = [
        await asAgent(),
        await authorize(direct),
        await call('POST', `${direct.engine}/v1/queue/${pending.json.request_id as string}/approve`, {
          body: {},
          key: reviewer,
        }),
        await call('GET', `${direct.engine}/healthz`, { key: null }),
      ];
      for (const r of refused) {
        expect(r.status, r.text).to.equal(503);
        expect(Object.keys(r.json)).to.include('error');
        // The answer names no internals; the log says what the database said.
        expect(r.text).not.to.match(/accepting connections/);
      }
      expect(direct.logs.join('\n')).to.match(
        /storage is unavailable; try again: .*not currently accepting connections/,
      );
    } finally {
      await queryDatabase(maintenance.toString(), `ALTER DATABASE "${name}" WITH ALLOW_CONNECTIONS true`);
    }
    await within(
      15_000,
      async () => (await call('GET', `${direct.engine}/healthz`, { key: null })).status === 200,
    );
    await within(15_000, async () => (await asAgent()).status === answer);
  });

  it('survives its connections being terminated mid-query (a restart or failover), answering 503 or the right answer', async () => {
    const name = new URL(db.url).pathname.slice(1);
    // The live policy's answer (the test before this one froze the set): that, or 503.
    const answer = (await authorize(direct)).status;
    expect(answer).to.be.oneOf([200, 403]);
    for (let round = 0; round < 3; round++) {
      // Decisions in flight on checked-out connections while the server ends every one of them.
      const inFlight = Array.from({ length: 16 }, () => authorize(direct));
      await sleep(5);
      await queryDatabase(
        db.url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'arbiter'",
        [name],
      );
      for (const r of await Promise.all(inFlight)) {
        expect([answer, 503], r.text).to.include(r.status);
        if (r.status === 503) expect(Object.keys(r.json)).to.deep.equal(['error']);
      }
    }
    // Still the same process, and it recovers by itself.
    await within(
      15_000,
      async () => (await call('GET', `${direct.engine}/healthz`, { key: null })).status === 200,
    );
    await within(15_000, async () => (await authorize(direct)).status === answer);
    expect((await call('GET', `${direct.platform}/api/v1/audit/verify`)).json.ok).to.equal(true);
  });
});

// A process of its own on a database of its own: registered on the PostgreSQL run.
onPostgresOnly('ARBITER_DATABASE_URL (postgresql://) and ARBITER_DATABASE_POOL (SPEC §10)', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let a: Arbiter;

  before(async () => {
    db = await createTestDatabase();
    const url = db.url.replace(/^postgres:\/\//, 'postgresql://');
    expect(url.startsWith('postgresql://')).to.equal(true);
    a = await Arbiter.start({ ARBITER_DATABASE_URL: url, ARBITER_DATABASE_POOL: '2' });
  });
  after(async () => {
    await a?.close();
    await db?.drop();
  });

  it('serves on PostgreSQL named by a postgresql:// URL, never opening more connections than the pool holds', async () => {
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        i % 2 ? authorize(a) : call('GET', `${a.platform}/api/v1/audit?kind=decision&limit=50`),
      ),
    );
    expect(answers.map((r) => r.status)).to.deep.equal(Array<number>(40).fill(200));
    // The decisions are in this database: the URL named it.
    const stored = await queryDatabase<{ n: number }>(
      db.url,
      "SELECT count(*)::int AS n FROM audit_events WHERE kind = 'decision'",
    );
    expect(stored[0]!.n).to.equal(20);
    // The pool (2) and the one LISTEN connection; idle pool connections stay open 30 s, so a pool
    // that had grown past its size under the load above would still show here.
    const sessions = await queryDatabase<{ n: number }>(
      db.url,
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = 'arbiter'",
      [db.name],
    );
    expect(sessions[0]!.n).to.be.at.most(3);
  });
});

// A database of its own, created with another collation: registered on the PostgreSQL run.
onPostgresOnly('lists paged by name on a database that sorts names its own way (ICU en-US)', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let a: Arbiter;

  before(async () => {
    db = await createTestDatabase({ icuLocale: 'en-US' });
    // The collation puts `_` and `-` before digits; UTF-16 code units put digits first.
    const [sorted] = await queryDatabase<{ names: string[] }>(
      db.url,
      "SELECT array_agg(x ORDER BY x) AS names FROM (VALUES ('a1'), ('a_b'), ('a-b')) v(x)",
    );
    expect(sorted!.names).to.deep.equal(['a_b', 'a-b', 'a1']);
    a = await Arbiter.start({ ARBITER_DATABASE_URL: db.url });
  });
  after(async () => {
    await a?.close();
    await db?.drop();
  });

  /** Every name of a list, one page (limit=1) at a time, following next_cursor. */
  const pagedNames = async (path: string, items: string, key: string): Promise<string[]> => {
    const names: string[] = [];
    let cursor: string | null = null;
    do {
      const r: Response = await call(
        'GET',
        `${a.platform}${path}?limit=1${cursor === null ? '' : `&cursor=${cursor}`}`,
      );
      expect(r.status, r.text).to.equal(200);
      names.push(...(r.json[items] as Record<string, string>[]).map((x) => x[key]!));
      cursor = r.json.next_cursor as string | null;
    } while (cursor !== null && names.length < 100);
    return names;
  };
  const codeUnitOrder = (names: string[]) => [...names].sort((x, y) => Number(x > y) - Number(x < y));

  it('pages policies, data documents and webhooks each once, in code-unit order', async () => {
    const rego = 'package authz.agent\n\ndeny contains "never" if false\n';
    for (const name of ['a1', 'a_b', 'a-b']) {
      const put = await call('PUT', `${a.platform}/api/v1/policies/p${name}`, { body: { rego } });
      expect(put.status, put.text).to.equal(201);
      const data = await call('PUT', `${a.platform}/api/v1/data/d${name}`, { body: 1 });
      expect(data.status, data.text).to.equal(201);
      const hook = await call('PUT', `${a.platform}/api/v1/webhooks/w${name}`, {
        body: { url: 'http://127.0.0.1:9/hook', events: ['policy.changed'] },
      });
      expect(hook.status, hook.text).to.equal(201);
    }
    const lists: [string, string, string][] = [
      ['/api/v1/policies', 'policies', 'name'],
      ['/api/v1/data', 'documents', 'path'],
      ['/api/v1/webhooks', 'webhooks', 'name'],
    ];
    for (const [path, items, key] of lists) {
      const whole = await call('GET', `${a.platform}${path}`);
      const all = (whole.json[items] as Record<string, string>[]).map((x) => x[key]!);
      const paged = await pagedNames(path, items, key);
      expect(paged, path).to.deep.equal(codeUnitOrder(all));
      expect(all, path).to.deep.equal(codeUnitOrder(all));
    }
  });
});
