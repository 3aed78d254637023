import Database from 'better-sqlite3';
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import path from 'node:path';
import { onEveryBackend, onPostgresOnly, onSqliteOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import {
  AGENT,
  Arbiter,
  auditCount,
  auditEvents as everyAuditEvent,
  call,
  HUMAN,
  storedText,
  type Response,
} from './helpers/harness.js';
import { sealedCursor } from './helpers/cursors.js';
import { queryDatabase } from './helpers/postgres.js';
import { canonicalJson } from '../src/common/canonical-json.js';
import { encodeCursor } from '../src/common/pagination.js';
import { ASCII_NAME } from '../src/common/validation.js';

/** Every field SPEC §8 gives an audit event. */
const EVENT_FIELDS = [
  'id',
  'time',
  'kind',
  'trace_id',
  'request_id',
  'actor',
  'agent_id',
  'user_id',
  'tenant_id',
  'action',
  'resource',
  'outcome',
  'message',
  'confidence',
  'policy_revision',
  'latency_us',
  'details',
  'hash',
  'prev_hash',
];

const HEX64 = /^[0-9a-f]{64}$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

const b64url = (s: string) => Buffer.from(s, 'utf8').toString('base64url');

interface RawRow {
  seq: number;
  id: string;
  kind: string;
  hash: string;
  prev_hash: string;
  message: string | null;
  details: Record<string, unknown>;
}

/** The stored rows, on either backend: each event's body is the canonical JSON text its hash covers. */
async function auditRows(a: Arbiter): Promise<RawRow[]> {
  const rows = await a.stored<{ seq: number | string; body: string; hash: string }>(
    'SELECT seq, body, hash FROM audit_events ORDER BY seq',
  );
  return rows.map((r) => ({
    ...(JSON.parse(r.body) as Omit<RawRow, 'seq' | 'hash'>),
    seq: Number(r.seq),
    hash: r.hash,
  }));
}

/** The event id inside a stored body, in SQLite's SQL. */
const ID = "json_extract(body, '$.id')";

/**
 * The position of each event id in the chain (1 = the oldest), as the API shows it: the unfiltered
 * list, newest first, in which each event's prev_hash is the hash of the one after it.
 */
async function chainPositions(a: Arbiter, ids: string[]): Promise<number[]> {
  const all = await everyAuditEvent(a.platform);
  for (let i = 0; i + 1 < all.length; i++) {
    expect(all[i].prev_hash, `event ${all[i].id} links to the one listed after it`).to.equal(all[i + 1].hash);
  }
  const position = new Map(all.map((e, i) => [e.id as string, all.length - i]));
  return ids.map((id) => {
    const p = position.get(id);
    expect(p, `${id} in the chain`).to.be.a('number');
    return p as number;
  });
}

/** Opens the instance's SQLite file read-write, behind the (stopped) service's back. */
function writeDb(a: Arbiter, fn: (db: Database.Database) => void): void {
  const db = new Database(path.join(a.dataDir, 'arbiter.db'), { fileMustExist: true });
  try {
    fn(db);
  } finally {
    db.close();
  }
}

async function expectNewestFirst(a: Arbiter, events: { id: string }[]): Promise<void> {
  const seqs = await chainPositions(
    a,
    events.map((e) => e.id),
  );
  for (let i = 1; i < seqs.length; i++) {
    expect(seqs[i], `event ${i} is older than event ${i - 1}`).to.be.lessThan(seqs[i - 1] as number);
  }
}

function expectSpecFields(e: Record<string, unknown>): void {
  expect(e).to.include.all.keys(...EVENT_FIELDS);
  expect(e.id).to.match(UUID);
  expect(Number.isNaN(Date.parse(e.time as string))).to.equal(false);
  expect(e.hash).to.match(HEX64);
  expect(e.prev_hash).to.match(HEX64);
  expect(e.details).to.be.an('object');
}

function decisionPath(body: Record<string, unknown>): string {
  return 'user_id' in body ? '/v1/authorize' : '/v1/agent/authorize';
}

async function decide(
  a: Arbiter,
  body: Record<string, unknown>,
  opts: { key?: string; trace?: string } = {},
) {
  const headers: Record<string, string> = {};
  if (opts.trace) headers.traceparent = `00-${opts.trace}-00f067aa0ba902b7-01`;
  const r = await call('POST', a.engine + decisionPath(body), { body, key: opts.key, headers });
  expect([200, 202, 403], r.text).to.include(r.status);
  expect(r.json.request_id, r.text).to.be.a('string');
  return r;
}

async function audit(a: Arbiter, query: string, key?: string | null): Promise<Response> {
  return call('GET', `${a.platform}/api/v1/audit${query ? '?' + query : ''}`, { key });
}

/** The events matching `query` (a single page of up to 1000), asserting a 200. */
async function auditEvents(a: Arbiter, query: string, key?: string) {
  const r = await audit(a, query ? `${query}&limit=1000` : 'limit=1000', key);
  expect(r.status, r.text).to.equal(200);
  expect(r.json).to.have.keys('events', 'next_cursor');
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- events are arbitrary JSON
  return r.json.events as any[];
}

const ingest = (a: Arbiter, body: unknown, key?: string) =>
  call('POST', `${a.platform}/api/v1/audit/ingest`, { body, key });

/** The last line of a CLI's stdout, as JSON. */
function cliJson(out: string) {
  const lines = out.trim().split('\n');
  return JSON.parse(lines[lines.length - 1] as string);
}

// The audit trail is storage through and through: every backend.
onEveryBackend('audit trail', () => {
  let a: Arbiter;
  let agentKey: string;
  let reviewer: string;
  let acmeKey: string;

  before(async () => {
    a = await Arbiter.start();
    agentKey = a.createKey('deploy-bot-key', ['authorize', 'tokens:mint', 'queue:read'], {
      agent: 'deploy-bot',
    });
    reviewer = a.createKey('sre-reviewer', ['queue:read', 'queue:review']);
    acmeKey = a.createKey('acme-app', ['authorize'], { tenant: 'acme' });
  });
  after(async () => {
    await a.close();
  });

  describe('events for everything', () => {
    /** The one event of `kind` whose `field` equals `value`, read back over the API. */
    async function oneEvent(kind: string, field: string, value: unknown) {
      const events = (await auditEvents(a, `kind=${encodeURIComponent(kind)}`)).filter(
        (e) => e[field] === value,
      );
      expect(events, `${kind} events with ${field}=${String(value)}`).to.have.length(1);
      const e = events[0];
      expectSpecFields(e);
      expect(e.kind).to.equal(kind);
      return e;
    }

    it('records an agent decision with every SPEC field, its outcome, revision and latency', async () => {
      const r = await decide(a, { ...AGENT.allow, context: { ticket: 'T-1' } }, { key: agentKey });
      const e = await oneEvent('decision', 'request_id', r.json.request_id);
      expect(e).to.include({
        trace_id: r.json.trace_id,
        actor: 'deploy-bot-key',
        agent_id: 'deploy-bot',
        user_id: null,
        action: 'read',
        resource: 'repo/arbiter',
        outcome: 'allow',
        confidence: 0.95,
      });
      expect(e.policy_revision).to.be.a('number');
      expect(e.latency_us).to.be.a('number').and.at.least(0);
      expect(e.details.context).to.deep.equal({ ticket: 'T-1' });
    });

    it('records a human decision with user, tenant and structured resource', async () => {
      const r = await decide(a, HUMAN.deny, { key: acmeKey });
      expect(r.status).to.equal(403);
      const e = await oneEvent('decision', 'request_id', r.json.request_id);
      expect(e).to.include({ user_id: 'bob', tenant_id: 'acme', agent_id: null, outcome: 'deny' });
      expect(e.resource).to.deep.equal({ type: 'project', id: 'p1' });
      expect(e.message).to.be.a('string').and.not.equal('');
    });

    it('records approve and deny queue transitions with the reviewer as actor', async () => {
      const one = await decide(a, AGENT.approval, { key: agentKey });
      const two = await decide(a, AGENT.approval, { key: agentKey });
      expect(one.status).to.equal(202);
      expect(two.status).to.equal(202);
      const ok = await call('POST', `${a.engine}/v1/queue/${one.json.request_id}/approve`, {
        key: reviewer,
        body: { note: 'window open' },
      });
      expect(ok.status, ok.text).to.equal(200);
      const no = await call('POST', `${a.engine}/v1/queue/${two.json.request_id}/deny`, {
        key: reviewer,
        body: { note: 'not today' },
      });
      expect(no.status, no.text).to.equal(200);

      const approved = await oneEvent('queue.approve', 'request_id', one.json.request_id);
      expect(approved).to.include({
        actor: 'sre-reviewer',
        outcome: 'approved',
        trace_id: one.json.trace_id,
        message: 'window open',
      });
      const denied = await oneEvent('queue.deny', 'request_id', two.json.request_id);
      expect(denied).to.include({
        actor: 'sre-reviewer',
        outcome: 'denied',
        trace_id: two.json.trace_id,
        message: 'not today',
      });
    });

    it('records token mint and token revoke', async () => {
      const d = await decide(a, AGENT.allow, { key: agentKey });
      const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
        key: agentKey,
        body: { request_id: d.json.request_id },
      });
      expect(minted.status, minted.text).to.equal(201);
      const tokenId = minted.json.token_id as string;
      const revoked = await call('DELETE', `${a.engine}/v1/tokens/${tokenId}`);
      expect(revoked.status, revoked.text).to.equal(200);

      const mint = await oneEvent('token.mint', 'resource', tokenId);
      expect(mint).to.include({
        outcome: 'minted',
        request_id: d.json.request_id,
        trace_id: d.json.trace_id,
      });
      const revoke = await oneEvent('token.revoke', 'resource', tokenId);
      expect(revoke).to.include({ outcome: 'revoked', actor: 'admin', trace_id: d.json.trace_id });
    });

    it('records policy PUT and DELETE with the request id and new revision', async () => {
      const url = `${a.platform}/api/v1/policies/audit-probe`;
      const put = await call('PUT', url, { body: { rego: 'package lib.audit_probe\n\nx := 1\n' } });
      expect(put.status, put.text).to.equal(201);
      const putEvent = await oneEvent('policy.put', 'request_id', put.headers.get('x-request-id'));
      expect(putEvent).to.include({ resource: 'audit-probe', outcome: 'success', actor: 'admin' });
      expect(putEvent.policy_revision).to.equal(put.json.revision);

      const del = await call('DELETE', url);
      expect(del.status, del.text).to.equal(204);
      const delEvent = await oneEvent('policy.delete', 'request_id', del.headers.get('x-request-id'));
      expect(delEvent).to.include({ resource: 'audit-probe', outcome: 'success' });
      expect(delEvent.policy_revision).to.be.greaterThan(putEvent.policy_revision);
    });

    it('records data PUT and DELETE', async () => {
      const url = `${a.platform}/api/v1/data/audit_probe`;
      const put = await call('PUT', url, { body: { on: true } });
      expect(put.status, put.text).to.equal(201);
      const putEvent = await oneEvent('data.put', 'request_id', put.headers.get('x-request-id'));
      expect(putEvent.outcome).to.equal('success');
      expect(JSON.stringify(putEvent.resource)).to.match(/audit_probe/);
      // Which value went live, by content, as a policy PUT and a bundle's data_sha256 record it.
      const sha = (v: unknown) => createHash('sha256').update(canonicalJson(v), 'utf8').digest('hex');
      expect(putEvent.details).to.deep.equal({ sha256: sha({ on: true }), created: true });
      const again = await call('PUT', url, { body: { on: false } });
      expect(again.status, again.text).to.equal(200);
      const againEvent = await oneEvent('data.put', 'request_id', again.headers.get('x-request-id'));
      expect(againEvent.details).to.deep.equal({ sha256: sha({ on: false }), created: false });

      const del = await call('DELETE', url);
      expect(del.status, del.text).to.be.oneOf([200, 204]);
      const delEvent = await oneEvent('data.delete', 'request_id', del.headers.get('x-request-id'));
      expect(delEvent.outcome).to.equal('success');
      expect(JSON.stringify(delEvent.resource)).to.match(/audit_probe/);
    });

    it('records key creation and revocation done with the CLI', async () => {
      a.createKey('audited-key', ['audit:read'], { tenant: 'acme', agent: 'audited-bot' });
      const created = await oneEvent('key.create', 'resource', 'audited-key');
      expect(created).to.include({ outcome: 'success', tenant_id: 'acme', agent_id: 'audited-bot' });
      expect(created.details.scopes).to.deep.equal(['audit:read']);

      const r = a.cli(['keys', 'revoke', 'audited-key']);
      expect(r.code, r.stderr).to.equal(0);
      const revoked = await oneEvent('key.revoke', 'resource', 'audited-key');
      // The revocation names the same key, tenant and agent as its creation, so the filters that
      // find one find the other.
      expect(revoked).to.include({ outcome: 'success', tenant_id: 'acme', agent_id: 'audited-bot' });
      expect(revoked.details.key_id).to.equal(created.details.key_id);
      const ofTenant = await auditEvents(a, 'tenant_id=acme&agent_id=audited-bot');
      expect(ofTenant.map((e) => e.kind)).to.have.members(['key.create', 'key.revoke']);
    });

    it('records the policies seeded at first start', async () => {
      const seeded = await auditEvents(a, 'kind=policy.seed');
      expect(seeded.length).to.be.greaterThan(0);
      for (const e of seeded) expectSpecFields(e);
    });
  });

  describe('GET /api/v1/audit/trace/{traceID}', () => {
    it('reads a traced flow back as one ordered story: decision, approve, mint, revoke', async () => {
      const trace = '0af7651916cd43dd8448eb211c80319c';
      const asked = await decide(a, AGENT.approval, { key: agentKey, trace });
      expect(asked.status).to.equal(202);
      expect(asked.json.trace_id).to.equal(trace);
      const requestId = asked.json.request_id as string;
      const ok = await call('POST', `${a.engine}/v1/queue/${requestId}/approve`, { key: reviewer });
      expect(ok.status, ok.text).to.equal(200);
      const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
        key: agentKey,
        body: { request_id: requestId },
      });
      expect(minted.status, minted.text).to.equal(201);
      const revoked = await call('DELETE', `${a.engine}/v1/tokens/${minted.json.token_id}`);
      expect(revoked.status, revoked.text).to.equal(200);

      const r = await call('GET', `${a.platform}/api/v1/audit/trace/${trace}`);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.trace_id).to.equal(trace);
      const kinds = r.json.events.map((e: { kind: string }) => e.kind);
      expect(kinds).to.deep.equal(['decision', 'queue.approve', 'token.mint', 'token.revoke']);
      for (const e of r.json.events) {
        expectSpecFields(e);
        expect(e.trace_id).to.equal(trace);
        expect(e.request_id).to.equal(requestId);
      }
      // Oldest first: chain order and time order.
      const seqs = await chainPositions(
        a,
        r.json.events.map((e: { id: string }) => e.id),
      );
      expect([...seqs].sort((x, y) => x - y)).to.deep.equal(seqs);
      const times = r.json.events.map((e: { time: string }) => Date.parse(e.time));
      expect([...times].sort((x, y) => x - y)).to.deep.equal(times);
    });

    it('answers 404 {"error"} for a trace with no events', async () => {
      expectError(
        await call('GET', `${a.platform}/api/v1/audit/trace/ffffffffffffffffffffffffffffffff`),
        404,
        /ffffffffffffffffffffffffffffffff/,
      );
    });
  });

  it('has every answered decision in the audit, found by its request_id', async () => {
    const bodies: Record<string, unknown>[] = [
      AGENT.allow,
      AGENT.approval,
      AGENT.deny,
      AGENT.lowConfidence,
      AGENT.unknownAgent,
      HUMAN.allow,
      HUMAN.approval,
      HUMAN.deny,
    ];
    const answered: { request_id: string; trace_id: string; status: string }[] = [];
    for (let i = 0; i < 30; i++) {
      const body = bodies[i % bodies.length] as Record<string, unknown>;
      const url =
        'user_id' in body
          ? a.engine + '/v1/authorize'
          : (i % 2 ? a.platform : a.engine) + '/api/v1/authorize';
      const r = await call('POST', url, { body });
      expect([200, 202, 403], r.text).to.include(r.status);
      answered.push(r.json);
    }
    expect(new Set(answered.map((d) => d.status))).to.have.all.keys('allow', 'requires_approval', 'deny');
    for (const d of answered) {
      const events = await auditEvents(a, `request_id=${d.request_id}`);
      expect(events, d.request_id).to.have.length(1);
      expect(events[0]).to.include({ kind: 'decision', outcome: d.status, trace_id: d.trace_id });
    }
  });

  describe('filters', () => {
    let filtReader: string;
    const agentReq = (agent: string, action: string) => ({
      agent_id: agent,
      action,
      resource: 'repo/arbiter',
      confidence: 0.99,
    });
    const humanReq = (user: string, action: string) => ({
      tenant_id: 'filtco',
      user_id: user,
      action,
      resource: { type: 'project', id: 'p1' },
    });
    const ids: Record<string, string[]> = { agent: [], user1: [], user2: [] };
    let allowed: { request_id: string; trace_id: string };
    const trace = '5c2ae0a0d8c14f7a9a8a3c2b1e0f9d8c';

    before(async () => {
      const filtKey = a.createKey('filtco-app', ['authorize'], { tenant: 'filtco' });
      filtReader = a.createKey('filtco-auditor', ['audit:read'], { tenant: 'filtco' });
      for (const action of ['read', 'read', 'list']) {
        ids.agent!.push((await decide(a, agentReq('filt-agent-1', action))).json.request_id);
      }
      ids.user1!.push((await decide(a, humanReq('filt-user-1', 'read'), { key: filtKey })).json.request_id);
      ids.user1!.push((await decide(a, humanReq('filt-user-1', 'read'), { key: filtKey })).json.request_id);
      ids.user2!.push((await decide(a, humanReq('filt-user-2', 'list'), { key: filtKey })).json.request_id);
      allowed = (await decide(a, AGENT.allow, { trace })).json;
    });

    const reqIds = (events: { request_id: string }[]) => events.map((e) => e.request_id);

    it('filters by kind, newest first', async () => {
      const events = await auditEvents(a, 'kind=decision');
      expect(events.length).to.be.greaterThan(30);
      for (const e of events) expect(e.kind).to.equal('decision');
      expect(reqIds(events)).to.include.members([...ids.agent!, ...ids.user1!, allowed.request_id]);
      await expectNewestFirst(a, events);
    });

    it('filters by agent_id, newest first', async () => {
      const events = await auditEvents(a, 'agent_id=filt-agent-1');
      expect(reqIds(events)).to.deep.equal([...ids.agent!].reverse());
      for (const e of events) expect(e.agent_id).to.equal('filt-agent-1');
      await expectNewestFirst(a, events);
    });

    it('filters by user_id', async () => {
      const events = await auditEvents(a, 'user_id=filt-user-1');
      expect(reqIds(events)).to.deep.equal([...ids.user1!].reverse());
    });

    it('filters by tenant_id, set from the tenant-bound key on human requests', async () => {
      const events = await auditEvents(a, 'tenant_id=filtco&kind=decision');
      expect(reqIds(events)).to.deep.equal([...ids.user1!, ...ids.user2!].reverse());
      for (const e of events) expect(e.tenant_id).to.equal('filtco');
    });

    it('filters by action', async () => {
      const events = await auditEvents(a, 'action=list');
      for (const e of events) expect(e.action).to.equal('list');
      expect(reqIds(events)).to.include.members([ids.agent![2], ids.user2![0]]);
      expect(reqIds(events)).to.not.include(ids.agent![0]);
      await expectNewestFirst(a, events);
    });

    it('filters by outcome', async () => {
      const denied = await auditEvents(a, 'outcome=deny');
      for (const e of denied) expect(e.outcome).to.equal('deny');
      expect(reqIds(denied)).to.include.members(ids.agent!);
      const allow = await auditEvents(a, 'outcome=allow');
      for (const e of allow) expect(e.outcome).to.equal('allow');
      expect(reqIds(allow)).to.include(allowed.request_id);
      expect(await auditEvents(a, 'outcome=allow&agent_id=filt-agent-1')).to.deep.equal([]);
    });

    it('filters by request_id', async () => {
      const events = await auditEvents(a, `request_id=${ids.agent![1]}`);
      expect(reqIds(events)).to.deep.equal([ids.agent![1]]);
    });

    it('filters by trace_id', async () => {
      const events = await auditEvents(a, `trace_id=${trace}`);
      expect(reqIds(events)).to.deep.equal([allowed.request_id]);
      expect(events[0].trace_id).to.equal(trace);
    });

    it('combines filters (all must match)', async () => {
      const events = await auditEvents(
        a,
        'kind=decision&tenant_id=filtco&user_id=filt-user-1&action=read&outcome=deny',
      );
      expect(reqIds(events)).to.deep.equal([...ids.user1!].reverse());
      expect(await auditEvents(a, 'agent_id=filt-agent-1&action=list&kind=decision')).to.have.length(1);
      expect(await auditEvents(a, 'agent_id=filt-agent-1&user_id=filt-user-1')).to.deep.equal([]);
    });

    it('filters by since (inclusive) and until (exclusive) around a known event time, any offset', async () => {
      const all = await auditEvents(a, 'agent_id=filt-agent-1');
      const known = all.find((e) => e.request_id === ids.agent![1]);
      const t = Date.parse(known.time);
      const z = new Date(t).toISOString();
      // The same instant written with a +02:00 offset.
      const plus2 = (ms: number) => new Date(ms + 2 * 3600_000).toISOString().replace('Z', '+02:00');

      const since = await auditEvents(a, `agent_id=filt-agent-1&since=${encodeURIComponent(plus2(t))}`);
      expect(reqIds(since)).to.deep.equal(reqIds(all.filter((e) => Date.parse(e.time) >= t)));
      expect(reqIds(since)).to.include(ids.agent![1]);

      const until = await auditEvents(a, `agent_id=filt-agent-1&until=${z}`);
      expect(reqIds(until)).to.deep.equal(reqIds(all.filter((e) => Date.parse(e.time) < t)));
      expect(reqIds(until)).to.not.include(ids.agent![1]);

      const window = await auditEvents(
        a,
        `agent_id=filt-agent-1&since=${z}&until=${encodeURIComponent(plus2(t + 1))}`,
      );
      expect(reqIds(window)).to.include(ids.agent![1]);
      for (const e of window) expect(Date.parse(e.time)).to.equal(t);

      const future = new Date(Date.now() + 3600_000).toISOString();
      expect(await auditEvents(a, `agent_id=filt-agent-1&since=${future}`)).to.deep.equal([]);
    });

    it('compares since and until finer than a millisecond as the instants they name', async () => {
      const all = await auditEvents(a, 'agent_id=filt-agent-1');
      const known = all.find((e) => e.request_id === ids.agent![1]);
      // Half a millisecond after the event (times are stored to the millisecond): since excludes
      // it, until includes it. Both used to be cut to the millisecond, and answered the opposite.
      const after = (known.time as string).replace('Z', '5Z');
      const since = await auditEvents(a, `agent_id=filt-agent-1&since=${after}`);
      expect(reqIds(since)).to.not.include(ids.agent![1]);
      expect(reqIds(since)).to.deep.equal(reqIds(all.filter((e) => e.time > known.time)));
      const until = await auditEvents(a, `agent_id=filt-agent-1&until=${after}`);
      expect(reqIds(until)).to.include(ids.agent![1]);
      expect(reqIds(until)).to.deep.equal(reqIds(all.filter((e) => e.time <= known.time)));
      // Nine digits; and an instant whose next millisecond is in year 10000, which no stored time
      // reaches and no time text of four-digit years can name: 400, as for year 10000 itself.
      const nine = (known.time as string).replace('Z', '000001Z');
      expect(reqIds(await auditEvents(a, `agent_id=filt-agent-1&until=${nine}`))).to.include(ids.agent![1]);
      expectError(await audit(a, 'since=9999-12-31T23:59:59.9995Z'), 400, /since/);
      expectError(await audit(a, 'until=9999-12-31T23:59:59.9995Z'), 400, /until/);
    });

    it('confines a tenant-bound key to its tenant', async () => {
      const events = await auditEvents(a, 'kind=decision', filtReader);
      expect(reqIds(events)).to.deep.equal([...ids.user1!, ...ids.user2!].reverse());
      expectError(await audit(a, 'tenant_id=acme', filtReader), 403);
    });
  });

  describe('pagination', () => {
    it('walks every page newest first, neither skipping nor repeating while new events arrive', async () => {
      const existing = (await everyAuditEvent(a.platform, { kind: 'decision' })).map((e) => e.id as string);
      expect(existing.length).to.be.greaterThan(10);
      expect(await a.count('audit_events', "kind = 'decision'")).to.equal(existing.length);

      const collected: string[] = [];
      const arrivedDuringWalk: string[] = [];
      let cursor: string | null = null;
      let pages = 0;
      for (;;) {
        const r: Response = await audit(
          a,
          `kind=decision&limit=3${cursor === null ? '' : `&cursor=${encodeURIComponent(cursor)}`}`,
        );
        expect(r.status, r.text).to.equal(200);
        expect(r.json.events.length).to.be.at.most(3);
        collected.push(...r.json.events.map((e: { id: string }) => e.id));
        pages++;
        cursor = r.json.next_cursor;
        if (cursor === null) break;
        expect(r.json.events).to.have.length(3);
        expect(cursor)
          .to.be.a('string')
          .and.match(/^[A-Za-z0-9_-]+$/);
        // A new decision arrives between pages.
        const d = await decide(a, pages % 2 ? AGENT.allow : AGENT.deny);
        arrivedDuringWalk.push(d.json.request_id);
        expect(pages, 'too many pages').to.be.lessThan(1000);
      }
      expect(pages).to.be.greaterThan(3);
      expect(new Set(collected).size, 'an id repeated').to.equal(collected.length);
      expect(collected).to.have.members(existing);
      const seqs = await chainPositions(a, collected);
      for (let i = 1; i < seqs.length; i++) expect(seqs[i]).to.be.lessThan(seqs[i - 1] as number);
      for (const rid of arrivedDuringWalk) {
        const arrived = await everyAuditEvent(a.platform, { request_id: rid });
        expect(arrived, rid).to.have.length(1);
        expect(collected).to.not.include(arrived[0].id);
      }
    });

    it("seals cursors: a tenant's reader cannot read a position in the shared chain from them", async () => {
      // Found by a tenancy probe: the cursor was base64url of "audit:<seq>", so two of an acme
      // reader's cursors told how many other tenants' events came between them.
      const acmeReader = a.createKey('acme-auditor', ['audit:read'], { tenant: 'acme' });
      for (let i = 0; i < 3; i++) await decide(a, AGENT.allow, { key: acmeKey });
      const seen = new Set<string>();
      for (const query of [
        'limit=1',
        'limit=1',
        'kind=decision&limit=1',
        'since=2000-01-01T00:00:00Z&limit=1',
      ]) {
        const r = await audit(a, query, acmeReader);
        expect(r.status, r.text).to.equal(200);
        const cursor = r.json.next_cursor as string;
        expect(cursor).to.be.a('string');
        // It was "audit:<seq>" in the clear; now a fresh IV each time, so never the same text.
        expect(Buffer.from(cursor, 'base64url').toString('latin1')).to.not.include('audit');
        expect(seen.has(cursor), 'the same page gave the same cursor twice').to.equal(false);
        seen.add(cursor);
        // It still pages, within the tenant.
        const next = await audit(a, `${query}&cursor=${encodeURIComponent(cursor)}`, acmeReader);
        expect(next.status, next.text).to.equal(200);
        expect(next.json.events).to.have.length(1);
        expect(next.json.events[0].tenant_id).to.equal('acme');
      }
    });

    it('answers 400 for a cursor written from a real position, as the unsealed format gave it', async () => {
      // Unsealed, "audit:<seq>" of an event that exists paged from there.
      const [row] = await a.stored<{ seq: number | string }>('SELECT max(seq) AS seq FROM audit_events');
      expectError(await audit(a, `cursor=${b64url(`audit:${Number(row!.seq)}`)}`), 400, /cursor/);
      // A cursor is as long wherever its event is in the chain: a sealed text keeps its length, so
      // the text is padded (event 9's and event 10^15's are one length).
      const lengths = new Set(
        ['9', '10', '1000000', '1234567890123456'].map((seq) => encodeCursor('audit', seq).length),
      );
      expect(lengths.size).to.equal(1);
    });

    it('answers 400 for a cursor altered by one character, and pages with it unaltered', async () => {
      const r = await audit(a, 'limit=2');
      const cursor = r.json.next_cursor as string;
      const i = Math.floor(cursor.length / 2);
      const altered = cursor.slice(0, i) + (cursor[i] === 'A' ? 'B' : 'A') + cursor.slice(i + 1);
      expectError(await audit(a, `limit=2&cursor=${altered}`), 400, /cursor/);
      expect((await audit(a, `limit=2&cursor=${cursor}`)).status).to.equal(200);
    });

    it('keeps a cursor valid across a restart (the key is stored with the data)', async () => {
      const first = await audit(a, 'kind=decision&limit=2');
      const cursor = first.json.next_cursor as string;
      const before = await audit(a, `kind=decision&limit=2&cursor=${cursor}`);
      await a.restart();
      const after = await audit(a, `kind=decision&limit=2&cursor=${cursor}`);
      expect(after.status, after.text).to.equal(200);
      expect(after.json.events.map((e: { id: string }) => e.id)).to.deep.equal(
        before.json.events.map((e: { id: string }) => e.id),
      );
    });

    it('answers 100 events per page when no limit is given (SPEC §3), and the rest after the cursor', async () => {
      const events = Array.from({ length: 101 }, (_, i) => ({ kind: 'page.default', message: `n${i}` }));
      const sent = await call('POST', `${a.platform}/api/v1/audit/ingest`, { body: { events } });
      expect(sent.status, sent.text).to.equal(202);
      const first = await audit(a, 'kind=page.default');
      expect(first.status).to.equal(200);
      expect(first.json.events).to.have.length(100);
      expect(first.json.next_cursor).to.be.a('string');
      const rest = await audit(a, `kind=page.default&cursor=${encodeURIComponent(first.json.next_cursor)}`);
      expect(rest.json.events.map((e: { message: string }) => e.message)).to.deep.equal(['n0']);
      expect(rest.json.next_cursor).to.equal(null);
    });

    it('returns next_cursor null when everything fits on one page', async () => {
      const r = await audit(a, 'kind=decision&agent_id=filt-agent-1&limit=3');
      expect(r.status).to.equal(200);
      expect(r.json.events).to.have.length(3);
      expect(r.json.next_cursor).to.equal(null);
    });
  });

  describe('bad query parameters', () => {
    let queueCursor: string;

    before(async () => {
      await decide(a, AGENT.approval);
      await decide(a, AGENT.approval);
      const r = await call('GET', `${a.engine}/v1/queue/pending?limit=1`);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.next_cursor).to.be.a('string');
      queueCursor = r.json.next_cursor;
    });

    const cases: [string, string, RegExp][] = [
      ['since that is not RFC 3339', 'since=yesterday', /since/],
      ['until that is not a real date', 'until=2026-13-45T00:00:00Z', /until/],
      ['since without a time zone', 'since=2026-01-01T00:00:00', /since/],
      ['an unknown outcome', 'outcome=maybe', /outcome/],
      ['limit 0', 'limit=0', /limit/],
      ['limit -1', 'limit=-1', /limit/],
      ['limit 10001', 'limit=10001', /limit/],
      ['limit abc', 'limit=abc', /limit/],
      ['a cursor that is not base64url', 'cursor=garbage!', /cursor/],
      ['a cursor of audit:abc', 'cursor=SEALED(audit:abc)', /cursor/],
      ['a cursor of audit:0', 'cursor=SEALED(audit:0)', /cursor/],
      ['a cursor of audit:-1', 'cursor=SEALED(audit:-1)', /cursor/],
      ['a cursor of audit: and 17 digits', 'cursor=SEALED(audit:12345678901234567)', /cursor/],
      [
        'a cursor of another list (trace)',
        'cursor=SEALED(trace:0af7651916cd43dd8448eb211c80319c|1)',
        /cursor/,
      ],
      ['an unknown query parameter', 'colour=blue', /colour/],
      ['a repeated parameter', 'kind=decision&kind=token.mint', /kind/],
      ['an empty kind', 'kind=', /kind/],
    ];
    for (const [what, query, field] of cases) {
      it(`answers 400 naming the parameter for ${what}`, async () => {
        // SEALED(kind:position): sealed with the service's key, so that the list's own checks of
        // the position are what refuses it, not the seal.
        const m = /SEALED\(([^:]+):(.*)\)/.exec(query);
        const sent = m ? query.replace(m[0], await sealedCursor(a, m[1]!, m[2]!)) : query;
        expectError(await audit(a, sent), 400, field);
      });
    }

    it('answers 400 for a cursor forged from another list (the review queue)', async () => {
      expectError(await audit(a, `cursor=${encodeURIComponent(queueCursor)}`), 400, /cursor/);
    });

    it('needs audit:read to query, read a trace or verify', async () => {
      const writer = a.createKey('audit-writer-only', ['audit:write']);
      expectError(await audit(a, '', writer), 403);
      expectError(await call('GET', `${a.platform}/api/v1/audit/verify`, { key: writer }), 403);
      expectError(
        await call('GET', `${a.platform}/api/v1/audit/trace/0af7651916cd43dd8448eb211c80319c`, {
          key: writer,
        }),
        403,
      );
      expectError(await audit(a, '', null), 401);
    });
  });

  describe('POST /api/v1/audit/ingest', () => {
    let writer: string;
    let reader: string;
    before(() => {
      writer = a.createKey('edge-engine', ['audit:write']);
      reader = a.createKey('auditor', ['audit:read']);
    });

    /** The event with this id, as the API shows it (the stored body and hash). */
    async function stored(id: string) {
      return (await everyAuditEvent(a.platform)).find((e) => e.id === id) as
        (RawRow & Record<string, unknown>) | undefined;
    }

    /** Posts `body`, expects a 400 naming `field`, and checks that nothing was stored. */
    async function rejected(body: unknown, field: RegExp) {
      const before = await auditCount(a.platform);
      expectError(await ingest(a, body, writer), 400, field);
      expect(await auditCount(a.platform), 'events stored by a rejected ingest').to.equal(before);
    }

    it('accepts one event with 202 {accepted: 1, ids: [id]}', async () => {
      const r = await ingest(
        a,
        {
          kind: 'edge.decision',
          agent_id: 'edge-bot',
          action: 'read',
          resource: 'repo/x',
          outcome: 'allow',
          confidence: 0.9,
          time: '2026-01-02T03:04:05+02:00',
        },
        writer,
      );
      expect(r.status, r.text).to.equal(202);
      expect(r.json).to.have.keys('accepted', 'ids');
      expect(r.json.accepted).to.equal(1);
      expect(r.json.ids).to.have.length(1);
      expect(r.json.ids[0]).to.match(UUID);
      const events = await auditEvents(a, 'kind=edge.decision');
      expect(events).to.have.length(1);
      expectSpecFields(events[0]);
      expect(events[0]).to.include({
        id: r.json.ids[0],
        agent_id: 'edge-bot',
        outcome: 'allow',
        resource: 'repo/x',
        actor: 'edge-engine',
        time: '2026-01-02T01:04:05.000Z',
      });
    });

    // An offset can move an instant across a year boundary: the UTC form must still have four
    // digits of year, or it is stored as +010000-… (not RFC 3339) and breaks filters and cursors.
    it('refuses a time whose UTC instant falls outside years 0000-9999 (400, nothing stored)', async () => {
      await rejected({ kind: 'edge.late', time: '9999-12-31T23:59:59-23:59' }, /^time must be an RFC 3339/);
      await rejected({ kind: 'edge.early', time: '0000-01-01T00:00:00+00:01' }, /^time must be an RFC 3339/);
      await rejected(
        { events: [{ kind: 'ok' }, { kind: 'edge.late', time: '9999-12-31T23:30:00-01:00' }] },
        /time/,
      );
      expectError(await audit(a, 'until=9999-12-31T23:59:59-23:59'), 400, /until/);
      // The extremes that stay within them are accepted, and paging past them works.
      const r = await ingest(
        a,
        {
          events: [
            { kind: 'edge.bounds', time: '9999-12-31T23:59:59Z' },
            { kind: 'edge.bounds', time: '0000-01-01T00:00:00Z' },
            { kind: 'edge.bounds', time: '9999-12-31T23:59:59+23:59' },
          ],
        },
        writer,
      );
      expect(r.status, r.text).to.equal(202);
      // A time window pages by time: each cursor carries the last event's time.
      const times: string[] = [];
      let cursor: string | null = null;
      do {
        const page: Response = await audit(
          a,
          `kind=edge.bounds&since=0000-01-01T00:00:00Z&limit=1${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
        );
        expect(page.status, page.text).to.equal(200);
        times.push(...page.json.events.map((e: { time: string }) => e.time));
        cursor = page.json.next_cursor;
      } while (cursor !== null);
      expect(times).to.deep.equal([
        '9999-12-31T23:59:59.000Z',
        '9999-12-31T00:00:59.000Z',
        '0000-01-01T00:00:00.000Z',
      ]);
    });

    it('accepts a batch of 3 and stores them in order', async () => {
      const r = await ingest(
        a,
        { events: [{ kind: 'batch.one' }, { kind: 'batch.two' }, { kind: 'batch.three' }] },
        writer,
      );
      expect(r.status, r.text).to.equal(202);
      expect(r.json.accepted).to.equal(3);
      expect(r.json.ids).to.have.length(3);
      const kinds = [];
      for (const id of r.json.ids as string[]) kinds.push((await stored(id))?.kind);
      expect(kinds).to.deep.equal(['batch.one', 'batch.two', 'batch.three']);
      const seqs = await chainPositions(a, r.json.ids);
      expect(seqs[1]).to.equal((seqs[0] as number) + 1);
      expect(seqs[2]).to.equal((seqs[1] as number) + 1);
    });

    it('keeps unknown fields under details', async () => {
      const r = await ingest(
        a,
        { kind: 'edge.extra', engine: 'edge-7', region: 'eu-west-1', details: { note: 'kept' } },
        writer,
      );
      expect(r.status, r.text).to.equal(202);
      const [e] = await auditEvents(a, 'kind=edge.extra');
      expect(e.details).to.include({ engine: 'edge-7', region: 'eu-west-1', note: 'kept' });
      expect(e).to.not.have.property('engine');
      expect(e).to.not.have.property('region');
    });

    it('ignores a caller-supplied hash and prev_hash, and the chain still verifies', async () => {
      const fake = 'f'.repeat(64);
      const r = await ingest(a, { kind: 'edge.forged', hash: fake, prev_hash: fake }, writer);
      expect(r.status, r.text).to.equal(202);
      const row = await stored(r.json.ids[0]);
      expect(row?.hash).to.match(HEX64).and.not.equal(fake);
      expect(row?.prev_hash).to.not.equal(fake);
      expect(row?.details as Record<string, unknown>).to.not.have.any.keys('hash', 'prev_hash');
      const v = await call('GET', `${a.platform}/api/v1/audit/verify`, { key: reader });
      expect(v.status).to.equal(200);
      expect(v.json.ok, v.text).to.equal(true);
    });

    it('keeps a caller id as details.source_id and assigns a fresh id', async () => {
      const r = await ingest(a, { kind: 'edge.with-id', id: 'upstream-42' }, writer);
      expect(r.status, r.text).to.equal(202);
      expect(r.json.ids[0]).to.match(UUID);
      expect(r.json.ids[0]).to.not.equal('upstream-42');
      const row = await stored(r.json.ids[0]);
      expect((row?.details as Record<string, unknown>).source_id).to.equal('upstream-42');
      expect(await stored('upstream-42')).to.equal(undefined);
    });

    it('accepts a batch of 1000 events', async () => {
      const before = await auditCount(a.platform);
      const events = Array.from({ length: 1000 }, (_, i) => ({ kind: 'bulk.event', message: `n${i}` }));
      const r = await ingest(a, { events }, writer);
      expect(r.status, r.text).to.equal(202);
      expect(r.json.accepted).to.equal(1000);
      expect(new Set(r.json.ids).size).to.equal(1000);
      expect(await auditCount(a.platform)).to.equal(before + 1000);
    });

    it('rejects a batch of 1001 events, storing none', async () => {
      const events = Array.from({ length: 1001 }, () => ({ kind: 'bulk.too-many' }));
      await rejected({ events }, /events/);
    });

    it('rejects an empty batch', async () => {
      await rejected({ events: [] }, /events/);
    });

    it('rejects an event without kind, naming it', async () => {
      await rejected({ events: [{ kind: 'ok.one' }, { message: 'no kind' }] }, /events\.1\.kind/);
      await rejected({ message: 'no kind' }, /kind/);
    });

    it('rejects a non-string kind', async () => {
      await rejected({ events: [{ kind: 42 }] }, /events\.0\.kind/);
      await rejected({ kind: 42 }, /kind/);
    });

    // Kinds that an auditor reading the trail could take for Arbiter's own (found by a probe).
    const READS_AS_ARBITERS: [string, string][] = [
      ['another letter case', 'Decision'],
      ['all capitals', 'DECISION'],
      ['a trailing space', 'decision '],
      ['a leading space', ' decision'],
      ['a trailing line feed', 'decision\n'],
      ['a capital in a namespace', 'Queue.approve'],
      ['a plural namespace', 'tokens.mint'],
      ['a plural namespace in y', 'POLICIES.put'],
      ['another separator after the word', 'Token_mint'],
      ['a sub-kind of decision', 'decision.override'],
      ['an exact reserved kind', 'signing_key.rotate'],
      ['a reserved kind in capitals', 'Signing_Key.rotate'],
      ['a webhook kind', 'Webhook.put'],
      ['a zero-width space', 'decision\u200b'],
      ['a Cyrillic о', 'decisi\u043en'],
      ['a one-dot leader for the dot', 'queue\u2024approve'],
      ['a fullwidth letter', '\uff44ecision'],
      ['a right-to-left override', '\u202enoisiced'],
    ];
    for (const [what, kind] of READS_AS_ARBITERS) {
      it(`refuses a kind with ${what} (${JSON.stringify(kind)}): 400 naming kind, nothing stored`, async () => {
        await rejected({ kind }, /^kind /);
        // In a batch: the valid event before it is not stored either.
        await rejected({ events: [{ kind: 'batch.before-bad' }, { kind }] }, /^events\.1\.kind /);
        expect(await auditEvents(a, 'kind=batch.before-bad')).to.deep.equal([]);
      });
    }

    it('refuses a kind outside ASCII letters and digits joined by . _ : - (400 naming kind)', async () => {
      for (const kind of [
        'edge decision',
        'edge/decision',
        '.edge',
        'edge.',
        'edge-',
        'caf\u00e9.open',
        'a\tb',
      ]) {
        await rejected({ kind }, /^kind must be ASCII letters and digits, joined by \. _ : or -/);
      }
      const r = await ingest(a, { kind: 'Decision' }, writer);
      expectError(r, 400, /^kind Decision is reserved for events Arbiter records itself/);
    });

    it('accepts the kinds engines use: other words, any case, . _ : - inside', async () => {
      const kinds = [
        'edge.decision',
        'engine.decision',
        'Approved',
        'x.y',
        'encoded.ok',
        'bulk.too-many',
        'aws:s3.put-object',
        'Edge_V2.step',
        'tokenizer.run',
        'dataset.loaded',
        'keystone.auth',
        'queued',
        '9',
      ];
      const r = await ingest(a, { events: kinds.map((kind) => ({ kind, message: 'kind-probe' })) }, writer);
      expect(r.status, r.text).to.equal(202);
      const got = (await auditEvents(a, ''))
        .filter((e) => e.message === 'kind-probe')
        .map((e) => e.kind as string);
      expect(got.reverse()).to.deep.equal(kinds);
    });

    it('shows the kind pattern in the OpenAPI document', async () => {
      const doc = (await call('GET', `${a.platform}/openapi.json`)).json;
      const body = doc.paths['/api/v1/audit/ingest'].post.requestBody.content['application/json'].schema;
      for (const kind of [
        body.oneOf[0].properties.kind,
        body.oneOf[1].properties.events.items.properties.kind,
      ]) {
        expect(kind.pattern).to.equal(ASCII_NAME);
        expect(kind.description).to.include('decision, queue, token');
      }
    });

    it('rejects a time that is not RFC 3339', async () => {
      await rejected({ events: [{ kind: 'ok.one', time: 'last tuesday' }] }, /events\.0\.time/);
      await rejected({ kind: 'ok.one', time: '2026-02-30T00:00:00Z' }, /time/);
      // ISO 8601's end of day, which Date.parse reads as the next midnight; out-of-range fields;
      // a leap second, which JavaScript's clock cannot hold.
      for (const time of [
        '2026-11-29T24:00:00Z',
        '2026-11-29T23:60:00Z',
        '2026-11-29T23:59:60Z',
        '2026-11-29T12:00:00+24:00',
        '2026-11-29T12:00:00+01:60',
      ]) {
        await rejected({ kind: 'ok.one', time }, /^time must be an RFC 3339/);
      }
    });

    it('rejects a confidence outside 0..1', async () => {
      await rejected({ events: [{ kind: 'ok.one', confidence: 2 }] }, /events\.0\.confidence/);
    });

    it('rejects an unknown outcome', async () => {
      await rejected({ events: [{ kind: 'ok.one', outcome: 'maybe' }] }, /events\.0\.outcome/);
    });

    it('stores nothing when only the 5th event of a batch is bad (all or nothing)', async () => {
      const events: unknown[] = [1, 2, 3, 4].map((i) => ({ kind: `atomic.${i}` }));
      events.push({ kind: 'atomic.5', time: 'not a time' });
      await rejected({ events }, /events\.4\.time/);
      expect(await auditEvents(a, 'kind=atomic.1')).to.deep.equal([]);
    });

    it('rejects wrong types in optional fields with 400 naming the field (never 500)', async () => {
      await rejected({ kind: 'ok.one', agent_id: 5 }, /^agent_id must be a string or null$/);
      await rejected({ kind: 'ok.one', confidence: '0.5' }, /^confidence must be a number or null$/);
      await rejected(
        { events: [{ kind: 'ok.one', user_id: ['u'] }] },
        /^events\.0\.user_id must be a string or null$/,
      );
      await rejected(
        { kind: 'ok.one', policy_revision: 1.5 },
        /^policy_revision must be an integer or null$/,
      );
      await rejected({ kind: 'ok.one', latency_us: 'fast' }, /^latency_us must be an integer or null$/);
      await rejected({ kind: 'ok.one', details: [] }, /^details must be an object$/);
    });

    it('rejects a body that is not an object, and unknown batch fields', async () => {
      await rejected([{ kind: 'in.array' }], /body|object/);
      await rejected({ events: [{ kind: 'ok.one' }], extra: 1 }, /extra/);
    });

    it('needs audit:write (403 with an audit:read key)', async () => {
      const before = await auditCount(a.platform);
      expectError(await ingest(a, { kind: 'no.scope' }, reader), 403);
      expect(await auditCount(a.platform)).to.equal(before);
    });

    it('adds to a queue item’s trail only events of the item’s own tenant', async () => {
      const queued = async (body: Record<string, unknown>, key?: string) => {
        const r = await decide(a, body, { key });
        expect(r.status, r.text).to.equal(202);
        return r.json.request_id as string;
      };
      // Three pending items: one of acme, one of globex (where bob is an editor), one of no tenant.
      const acmeItem = await queued(HUMAN.approval, acmeKey);
      const globexItem = await queued({ ...HUMAN.approval, tenant_id: 'globex', user_id: 'bob' });
      const agentItem = await queued(AGENT.approval, agentKey);
      const acmeWriter = a.createKey('acme-edge', ['audit:write'], { tenant: 'acme' });
      const globexReviewer = a.createKey('globex-reviewer', ['queue:read'], { tenant: 'globex' });
      const acmeReviewer = a.createKey('acme-reviewer', ['queue:read'], { tenant: 'acme' });
      // A forged approval of each item: by the acme-bound key (its tenant is filled in), and by
      // an unbound key naming the item's tenant, and naming none.
      const forge = async (key: string, request_id: string, tenant_id?: string) => {
        const body = { kind: 'Approved', outcome: 'approved', request_id, message: 'forged', tenant_id };
        const r = await ingest(a, body, key);
        expect(r.status, r.text).to.equal(202);
        return r.json.ids[0] as string;
      };
      const acmeOnAcme = await forge(acmeWriter, acmeItem);
      const acmeOnGlobex = await forge(acmeWriter, globexItem);
      const acmeOnAgent = await forge(acmeWriter, agentItem);
      const unboundOnGlobex = await forge(writer, globexItem, 'globex');
      const unboundUntenantedOnGlobex = await forge(writer, globexItem);
      const unboundOnAgent = await forge(writer, agentItem);

      const trail = async (id: string, key: string) => {
        const r = await call('GET', `${a.engine}/v1/queue/${id}/events`, { key });
        expect(r.status, r.text).to.equal(200);
        return (r.json.events as { id: string; kind: string; tenant_id: string | null }[]).map((e) =>
          e.kind === 'decision' ? e.kind : e.id,
        );
      };
      expect(await trail(globexItem, globexReviewer)).to.deep.equal(['decision', unboundOnGlobex]);
      expect(await trail(acmeItem, acmeReviewer)).to.deep.equal(['decision', acmeOnAcme]);
      expect(await trail(agentItem, reviewer)).to.deep.equal(['decision', unboundOnAgent]);
      // Still in the audit log itself, where audit:read sees every tenant's events.
      const logged = (await auditEvents(a, 'kind=Approved')).map((e) => e.id as string);
      expect(logged).to.include.members([acmeOnGlobex, acmeOnAgent, unboundUntenantedOnGlobex]);
    });
  });
});

// Masking happens before storage, so the stored rows of either backend are searched for the secrets.
onEveryBackend('audit masking', () => {
  let m: Arbiter;
  before(async () => {
    m = await Arbiter.start({ ARBITER_AUDIT_MASK_FIELDS: 'context.ssn,context.api_token' });
  });
  after(async () => {
    await m.close();
  });

  // A decision records its identifiers in the clear beyond its stored input (the event's own
  // fields, the queue item, tokens, webhooks): a mask path naming one would mask the input only.
  it('refuses to start with a mask path it could not honour, naming the setting and the path', async () => {
    for (const fields of [
      'context.ssn,resource',
      'agent_id',
      'on_behalf_of.user_id',
      'context',
      'authzen.subject.id',
      'context..x',
    ]) {
      let failed: Error | undefined;
      try {
        const a = await Arbiter.start({ ARBITER_AUDIT_MASK_FIELDS: fields });
        await a.close();
      } catch (e) {
        failed = e as Error;
      }
      const path = fields.split(',').at(-1)!;
      expect(failed?.message, fields).to.contain(`ARBITER_AUDIT_MASK_FIELDS: "${path}"`);
    }
  });

  it('replaces configured context fields before storage in the audit and the queue', async () => {
    const r = await decide(m, {
      ...AGENT.approval,
      context: { ssn: '123-45-6789', api_token: 'sk-live-xyz', reason: 'ok' },
    });
    expect(r.status).to.equal(202);
    const id = r.json.request_id as string;

    const rows = {
      audit: await m.stored('SELECT * FROM audit_events'),
      queue: await m.stored('SELECT * FROM queue_items'),
      decisions: await m.stored('SELECT * FROM decisions'),
    };
    expect(rows.queue).to.have.length(1);
    expect(rows.decisions).to.have.length(1);
    expect(JSON.stringify(rows.audit)).to.include(id);
    for (const [table, list] of Object.entries(rows)) {
      const text = JSON.stringify(list);
      expect(text, table).to.not.include('123-45-6789');
      expect(text, table).to.not.include('sk-live-xyz');
    }
    // Nor in any other table.
    const everything = await storedText(m);
    expect(everything).to.not.include('123-45-6789');
    expect(everything).to.not.include('sk-live-xyz');
    const queued = JSON.parse((rows.queue[0] as { context: string }).context);
    expect(queued).to.deep.equal({ ssn: '[masked]', api_token: '[masked]', reason: 'ok' });

    const [event] = await auditEvents(m, `request_id=${id}`);
    expect(event.details.context).to.deep.equal({ ssn: '[masked]', api_token: '[masked]', reason: 'ok' });
    const item = await call('GET', `${m.engine}/v1/queue/${id}`);
    expect(item.status).to.equal(200);
    expect(item.json.context).to.deep.equal({ ssn: '[masked]', api_token: '[masked]', reason: 'ok' });
  });

  it('masks ingested events under details.context', async () => {
    const r = await ingest(m, {
      kind: 'edge.decision',
      context: { ssn: '987-65-4321', api_token: 'sk-live-abc', reason: 'kept' },
    });
    expect(r.status, r.text).to.equal(202);
    const [event] = await auditEvents(m, 'kind=edge.decision');
    expect(event.details.context).to.deep.equal({ ssn: '[masked]', api_token: '[masked]', reason: 'kept' });
    const text = JSON.stringify(await m.stored('SELECT * FROM audit_events'));
    expect(text).to.include(r.json.ids[0]);
    expect(text).to.not.include('987-65-4321');
    expect(text).to.not.include('sk-live-abc');
  });
});

// An untouched chain verifies over HTTP and with the CLI, on whatever storage the run uses.
onEveryBackend('audit verification', () => {
  const started: Arbiter[] = [];
  afterEach(async () => {
    while (started.length) await started.pop()!.close();
  });

  it('verifies an untouched database: {ok: true, checked: N, head} over HTTP and the CLI (exit 0)', async () => {
    const t = await Arbiter.start();
    started.push(t);
    for (const body of [AGENT.allow, AGENT.deny, HUMAN.approval]) await decide(t, body);
    const v = await call('GET', `${t.platform}/api/v1/audit/verify`);
    expect(v.status, v.text).to.equal(200);
    const rows = await auditRows(t);
    expect(v.json).to.deep.equal({ ok: true, checked: rows.length, head: rows[rows.length - 1]!.hash });
    expect(v.json.head).to.match(HEX64);

    await t.stop();
    const r = t.cli(['audit', 'verify']);
    expect(r.code, r.stderr).to.equal(0);
    expect(cliJson(r.stdout)).to.deep.equal(v.json);
  });
});

// Edits the SQLite file behind the stopped service: SQLite's own. The same promises are checked
// on PostgreSQL below, by editing its rows.
onSqliteOnly('audit tamper evidence', () => {
  const started: Arbiter[] = [];
  afterEach(async () => {
    while (started.length) await started.pop()!.close();
  });

  /** A fresh instance with a few decisions on its chain, stopped so its file can be edited. */
  async function stoppedWithEvents(): Promise<Arbiter> {
    const t = await Arbiter.start();
    started.push(t);
    for (const body of [AGENT.allow, AGENT.deny, AGENT.approval, HUMAN.allow, HUMAN.deny, AGENT.allow]) {
      await decide(t, body);
    }
    expect(await t.stop()).to.equal(0);
    expect((await auditRows(t)).length).to.be.greaterThan(6);
    return t;
  }

  it('points at a middle event whose message was changed (CLI exit 1, and HTTP after restart)', async () => {
    const t = await stoppedWithEvents();
    const rows = await auditRows(t);
    const mid = Math.floor(rows.length / 2);
    const victim = rows[mid]!;
    writeDb(t, (db) => {
      db.prepare(`UPDATE audit_events SET body = json_set(body, '$.message', ?) WHERE ${ID} = ?`).run(
        'nothing to see here',
        victim.id,
      );
    });

    const cli = t.cli(['audit', 'verify']);
    expect(cli.code, cli.stdout + cli.stderr).to.equal(1);
    const out = cliJson(cli.stdout);
    expect(out).to.include({ ok: false, first_bad: victim.id, checked: mid });
    expect(out.reason).to.match(/modified/);

    await t.restart();
    const v = await call('GET', `${t.platform}/api/v1/audit/verify`);
    expect(v.status, v.text).to.equal(200);
    expect(v.json).to.include({ ok: false, first_bad: victim.id, checked: mid });
    expect(v.json.reason).to.match(/modified/);
  });

  it('points at the earliest of two events whose outcome and details were changed, after restart', async () => {
    const t = await stoppedWithEvents();
    const rows = await auditRows(t);
    const first = rows[rows.length - 3]!;
    const second = rows[rows.length - 2]!;
    writeDb(t, (db) => {
      db.prepare(
        `UPDATE audit_events SET outcome = CASE outcome WHEN 'allow' THEN 'deny' ELSE 'allow' END WHERE ${ID} = ?`,
      ).run(first.id);
      db.prepare(`UPDATE audit_events SET body = json_set(body, '$.details.forged', 1) WHERE ${ID} = ?`).run(
        second.id,
      );
    });
    await t.restart();
    const v = await call('GET', `${t.platform}/api/v1/audit/verify`);
    expect(v.status, v.text).to.equal(200);
    expect(v.json).to.include({ ok: false, first_bad: first.id, checked: rows.length - 3 });
  });

  it('points at the event after a deleted middle row (CLI exit 1)', async () => {
    const t = await stoppedWithEvents();
    const rows = await auditRows(t);
    const mid = Math.floor(rows.length / 2);
    writeDb(t, (db) => {
      db.prepare(`DELETE FROM audit_events WHERE ${ID} = ?`).run(rows[mid]!.id);
    });
    const cli = t.cli(['audit', 'verify']);
    expect(cli.code, cli.stdout + cli.stderr).to.equal(1);
    const out = cliJson(cli.stdout);
    expect(out).to.include({ ok: false, first_bad: rows[mid + 1]!.id, checked: mid });
    expect(out.reason).to.match(/deleted/);
  });

  it('detects a deleted last row: the chain was cut at its end (CLI exit 1, and HTTP after restart)', async () => {
    const t = await stoppedWithEvents();
    const rows = await auditRows(t);
    writeDb(t, (db) => {
      db.prepare(`DELETE FROM audit_events WHERE ${ID} = ?`).run(rows[rows.length - 1]!.id);
    });
    const cli = t.cli(['audit', 'verify']);
    expect(cli.code, cli.stdout + cli.stderr).to.equal(1);
    const out = cliJson(cli.stdout);
    expect(out.ok).to.equal(false);
    expect(out.checked).to.equal(rows.length - 1);
    expect(out.reason).to.match(/removed from its end/);

    await t.restart();
    const v = await call('GET', `${t.platform}/api/v1/audit/verify`);
    expect(v.json.ok, v.text).to.equal(false);
    expect(v.json.reason).to.match(/removed from its end/);
  });
});

// The tamper-evidence promises on PostgreSQL: rows of audit_events are edited, deleted or cut off
// behind the running service (as someone with access to the database could), and verification
// over HTTP and with the CLI points at the first bad event.
onPostgresOnly('audit tamper evidence', () => {
  const started: Arbiter[] = [];
  afterEach(async () => {
    while (started.length) await started.pop()!.close();
  });

  /** A fresh instance with a few decisions on its chain (it keeps running). */
  async function withEvents(): Promise<Arbiter> {
    const t = await Arbiter.start();
    started.push(t);
    for (const body of [AGENT.allow, AGENT.deny, AGENT.approval, HUMAN.allow, HUMAN.deny, AGENT.allow]) {
      await decide(t, body);
    }
    expect((await auditRows(t)).length).to.be.greaterThan(6);
    return t;
  }

  /** Runs one statement against the instance's PostgreSQL database. */
  const tamper = (t: Arbiter, sql: string, params: unknown[] = []) =>
    queryDatabase(t.databaseUrl as string, sql, params);

  /** Rewrites the stored body of event `seq` after `edit` changed its content (the hash is left). */
  async function editBody(t: Arbiter, seq: number, edit: (content: Record<string, unknown>) => void) {
    const [row] = await tamper(t, 'SELECT body FROM audit_events WHERE seq = $1', [seq]);
    const content = JSON.parse((row as { body: string }).body) as Record<string, unknown>;
    edit(content);
    await tamper(t, 'UPDATE audit_events SET body = $1 WHERE seq = $2', [JSON.stringify(content), seq]);
  }

  async function verify(t: Arbiter) {
    const v = await call('GET', `${t.platform}/api/v1/audit/verify`);
    expect(v.status, v.text).to.equal(200);
    const cli = t.cli(['audit', 'verify']);
    expect(cli.code, cli.stdout + cli.stderr).to.equal(v.json.ok ? 0 : 1);
    expect(cliJson(cli.stdout)).to.deep.equal(v.json);
    return v.json;
  }

  it('points at a middle event whose message was changed (HTTP, and the CLI exits 1)', async () => {
    const t = await withEvents();
    const rows = await auditRows(t);
    const mid = Math.floor(rows.length / 2);
    const victim = rows[mid]!;
    await editBody(t, victim.seq, (c) => (c.message = 'nothing to see here'));
    const v = await verify(t);
    expect(v).to.include({ ok: false, first_bad: victim.id, checked: mid });
    expect(v.reason).to.match(/modified/);
  });

  it('points at the earliest of two events: an edited index column (outcome), an edited body', async () => {
    const t = await withEvents();
    const rows = await auditRows(t);
    const first = rows[rows.length - 3]!;
    const second = rows[rows.length - 2]!;
    // The outcome column alone: a filter on outcome would now hide or misfile the event.
    await tamper(
      t,
      "UPDATE audit_events SET outcome = CASE outcome WHEN 'allow' THEN 'deny' ELSE 'allow' END WHERE seq = $1",
      [first.seq],
    );
    await editBody(t, second.seq, (c) => ((c.details as Record<string, unknown>).forged = 1));
    const v = await verify(t);
    expect(v).to.include({ ok: false, first_bad: first.id, checked: rows.length - 3 });
    expect(v.reason).to.match(/indexed columns/);
  });

  it('points at the event after one whose body was edited and hash recomputed', async () => {
    const t = await withEvents();
    const rows = await auditRows(t);
    const mid = Math.floor(rows.length / 2);
    const [row] = await tamper(t, 'SELECT body FROM audit_events WHERE seq = $1', [rows[mid]!.seq]);
    const content = JSON.parse((row as { body: string }).body) as Record<string, unknown>;
    content.message = 'rewritten, and re-hashed';
    const body = JSON.stringify(content);
    await tamper(t, 'UPDATE audit_events SET body = $1, hash = $2 WHERE seq = $3', [
      body,
      createHash('sha256').update(body).digest('hex'),
      rows[mid]!.seq,
    ]);
    const v = await verify(t);
    expect(v).to.include({ ok: false, first_bad: rows[mid + 1]!.id, checked: mid + 1 });
    expect(v.reason).to.match(/prev_hash/);
  });

  it('points at the event after a deleted middle row', async () => {
    const t = await withEvents();
    const rows = await auditRows(t);
    const mid = Math.floor(rows.length / 2);
    await tamper(t, 'DELETE FROM audit_events WHERE seq = $1', [rows[mid]!.seq]);
    const v = await verify(t);
    expect(v).to.include({ ok: false, first_bad: rows[mid + 1]!.id, checked: mid });
    expect(v.reason).to.match(/deleted/);
  });

  it('detects a truncated tail: the last rows deleted, the chain cut at its end', async () => {
    const t = await withEvents();
    const rows = await auditRows(t);
    await tamper(t, 'DELETE FROM audit_events WHERE seq >= $1', [rows[rows.length - 2]!.seq]);
    const v = await verify(t);
    expect(v).to.include({ ok: false, first_bad: null, checked: rows.length - 2 });
    expect(v.reason).to.match(/removed from its end/);
  });
});
