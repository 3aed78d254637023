import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import { decodeJwt } from 'jose';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { ADMIN_KEY, Arbiter, auditCount, auditEvents, call, REPO, storedText } from './helpers/harness.js';

const INTEROP_POLICY = readFileSync(path.join(REPO, 'test', 'fixtures', 'authzen-interop.rego'), 'utf8');

/** The example policies' agent and human requests (policies/agent.rego, human.rego) in AuthZEN form. */
const agent = (action: string, type: string, id: string, confidence: number) => ({
  subject: { type: 'agent', id: 'deploy-bot', properties: { confidence } },
  action: { name: action },
  resource: { type, id },
});
const user = (id: string, action = 'delete') => ({
  subject: { type: 'user', id, properties: { tenant_id: 'acme' } },
  action: { name: action },
  resource: { type: 'project', id: 'p1' },
});
const AZ = {
  allow: agent('read', 'repo', 'arbiter', 0.95),
  approval: agent('deploy', 'prod', 'api', 0.95),
  deny: agent('delete', 'prod', 'db', 0.99),
};

/** The interop scenario's users: PID (Authorization API 1.0), e-mail (earlier drafts), roles. */
const pid = (n: number) => `CiRmZD${'AEIMQ'[n]}2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs`;
const PEOPLE = [
  {
    pid: pid(0),
    email: 'rick@the-citadel.com',
    admin: true,
    editor: true,
    otherOwner: 'morty@the-citadel.com',
  },
  {
    pid: pid(1),
    email: 'morty@the-citadel.com',
    admin: false,
    editor: true,
    otherOwner: 'rick@the-citadel.com',
  },
  {
    pid: pid(2),
    email: 'summer@the-smiths.com',
    admin: false,
    editor: true,
    otherOwner: 'rick@the-citadel.com',
  },
  {
    pid: pid(3),
    email: 'beth@the-smiths.com',
    admin: false,
    editor: false,
    otherOwner: 'rick@the-citadel.com',
  },
  {
    pid: pid(4),
    email: 'jerry@the-smiths.com',
    admin: false,
    editor: false,
    otherOwner: 'rick@the-citadel.com',
  },
];
/**
 * The interop decision files as request/expected pairs (openid/authzen interop/ and a copy in
 * aws-samples/sample-authzen-interface-verified-permissions; each set's first line names its
 * file and commit): todo backend requests in the 1.0 and earlier-draft forms, one batch file's
 * `evaluations`, and the API gateway requests. Replayed against our own policy,
 * authzen-interop-replay.rego, with the interop user directory below as data.
 */
type InteropCase = {
  source: string;
  endpoint: 'evaluation' | 'evaluations';
  request: Record<string, unknown>;
  expected: boolean | boolean[];
};
const INTEROP_CASES: InteropCase[] = (() => {
  let source = '';
  const out: InteropCase[] = [];
  const text = readFileSync(path.join(REPO, 'test', 'fixtures', 'authzen-interop-decisions.jsonl'), 'utf8');
  for (const line of text.split('\n').filter((l) => l !== '')) {
    const row = JSON.parse(line);
    if (row.source !== undefined) source = row.source;
    else out.push({ source, ...row });
  }
  return out;
})();
const REPLAY_POLICY = readFileSync(
  path.join(REPO, 'test', 'fixtures', 'authzen-interop-replay.rego'),
  'utf8',
);
/** The interop users (by PID), the e-mails the files name them by, and their roles. */
const INTEROP_DIRECTORY = {
  users: Object.fromEntries(
    (
      [
        ['rick@the-citadel.com', 'richard_roe@example.com', ['admin', 'evil_genius']],
        ['morty@the-citadel.com', 'john_doe@example.com', ['editor']],
        ['summer@the-smiths.com', 'nikki_wolf@example.com', ['editor']],
        ['beth@the-smiths.com', 'jane_doe@example.com', ['viewer']],
        ['jerry@the-smiths.com', 'jorge_souza@example.com', ['viewer']],
      ] as const
    ).map(([email, aws, roles], n) => [pid(n), { emails: [email, aws], roles }]),
  ),
};

/** A human policy that decides on an AuthZEN action property (input.authzen.action.properties). */
const TRANSFER_POLICY = `package authz.human

allow if {
  input.action == "transfer"
  input.authzen.action.properties.amount <= 100
}

require_approval contains "large transfer" if {
  input.action == "transfer"
  input.authzen.action.properties.amount > 100
}
`;

/** SPEC §13's recipe, as the README gives it to a resource server: JCS, SHA-256, base64url. */
const jcs = (v: unknown): string =>
  v === null || typeof v !== 'object'
    ? JSON.stringify(v)
    : Array.isArray(v)
      ? '[' + v.map(jcs).join(',') + ']'
      : '{' +
        Object.keys(v)
          .sort()
          .map((k) => JSON.stringify(k) + ':' + jcs((v as Record<string, unknown>)[k]))
          .join(',') +
        '}';
const digestOf = (call: unknown) => createHash('sha256').update(jcs(call), 'utf8').digest('base64url');

const TODO = '7240d0db-8ff0-41ec-98b2-34a096273b9f';

/**
 * The interop decisions (openid/authzen interop/authzen-todo-backend/test): every user may read
 * users and todos; admins and editors create; an editor updates and deletes only their own todo;
 * rick (admin, evil_genius) updates and deletes any. `draft` writes them as earlier drafts did.
 */
function interopCases(draft: boolean) {
  const out: { request: Record<string, unknown>; expected: boolean }[] = [];
  for (const p of PEOPLE) {
    const subject = draft ? { type: 'user', id: p.email, identity: p.pid } : { type: 'user', id: p.pid };
    const todo = (owner: string) =>
      draft
        ? { type: 'todo', id: TODO, ownerID: owner }
        : { type: 'todo', id: TODO, properties: { ownerID: owner } };
    const ask = (name: string, resource: Record<string, unknown>, expected: boolean) =>
      out.push({ request: { subject, action: { name }, resource }, expected });
    ask('can_read_user', { type: 'user', id: 'beth@the-smiths.com' }, true);
    ask('can_read_todos', { type: 'todo', id: 'todo-1' }, true);
    ask('can_create_todo', { type: 'todo', id: 'todo-1' }, p.editor);
    for (const action of ['can_update_todo', 'can_delete_todo']) {
      ask(action, todo(p.email), p.editor);
      ask(action, todo(p.otherOwner), p.admin);
    }
  }
  return out;
}

onEveryBackend('AuthZEN Authorization API 1.0 (SPEC §14)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const evaluation = (body: unknown, opts: { key?: string | null; headers?: Record<string, string> } = {}) =>
    call('POST', `${a.engine}/access/v1/evaluation`, { body, ...opts });
  const evaluations = (body: unknown, opts: { key?: string | null; headers?: Record<string, string> } = {}) =>
    call('POST', `${a.engine}/access/v1/evaluations`, { body, ...opts });

  describe('POST /access/v1/evaluation', () => {
    it('answers an agent allow as decision true, and records it with the request as input.authzen', async () => {
      const r = await evaluation(AZ.allow);
      expect(r.status, r.text).to.equal(200);
      expect(r.json).to.have.keys('decision', 'context');
      expect(r.json.decision).to.equal(true);
      expect(r.json.context).to.have.keys('status', 'request_id');
      expect(r.json.context.status).to.equal('allow');
      const [ev] = await auditEvents(a.platform, { request_id: r.json.context.request_id });
      expect(ev).to.include({
        kind: 'decision',
        outcome: 'allow',
        agent_id: 'deploy-bot',
        resource: 'repo/arbiter',
      });
      expect(ev.details.input.authzen).to.deep.equal({ ...AZ.allow, context: {} });
      expect(ev.confidence).to.equal(0.95);
    });

    it('answers a deny as 200 decision false with the reason, and takes confidence from context', async () => {
      const { subject, ...rest } = AZ.deny;
      const r = await evaluation({
        ...rest,
        subject: { type: 'agent', id: subject.id },
        context: { confidence: 0.99 },
      });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.decision).to.equal(false);
      expect(r.json.context.status).to.equal('deny');
      expect(r.json.context.reason).to.match(/destructive/);
      expect(r.json.context).to.not.have.property('access_request');
    });

    it("takes the subject's confidence over the context's when both are given", async () => {
      // 0.95 (the subject's) reads repo/arbiter; 0.3 (the context's) is below the deny threshold.
      const r = await evaluation({ ...AZ.allow, context: { confidence: 0.3 } });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.decision).to.equal(true);
      const [ev] = await auditEvents(a.platform, { request_id: r.json.context.request_id });
      expect(ev.confidence).to.equal(0.95);
      // The other way round: the subject's low confidence decides, whatever the context says.
      const low = await evaluation({
        ...agent('read', 'repo', 'arbiter', 0.3),
        context: { confidence: 0.95 },
      });
      expect(low.json.decision).to.equal(false);
      expect(low.json.context.reason).to.match(/below the deny threshold/);
    });

    it('answers requires_approval as decision false with the queue item as access_request', async () => {
      const before = await a.count('queue_items');
      const r = await evaluation(AZ.approval);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.decision).to.equal(false);
      const c = r.json.context;
      expect(c.status).to.equal('requires_approval');
      expect(c.reason).to.be.a('string').and.not.equal('');
      expect(c.access_request).to.have.keys('id', 'status_endpoint', 'expires_at');
      expect(c.access_request.id).to.equal(c.request_id);
      expect(c.access_request.status_endpoint).to.equal(`${a.engine}/v1/queue/${c.request_id}`);
      expect(Date.parse(c.access_request.expires_at)).to.be.greaterThan(Date.now());
      expect(await a.count('queue_items')).to.equal(before + 1);
      const item = await call('GET', c.access_request.status_endpoint);
      expect(item.status, item.text).to.equal(200);
      expect(item.json).to.include({
        id: c.request_id,
        status: 'pending',
        agent_id: 'deploy-bot',
        resource: 'prod/api',
      });
      expect(item.json.expires_at).to.equal(c.access_request.expires_at);
    });

    it('maps any other subject type to a human decision in subject.properties.tenant_id', async () => {
      const alice = await evaluation(user('alice'));
      expect(alice.json).to.deep.include({ decision: true });
      const bob = await evaluation(user('bob'));
      expect(bob.json.decision).to.equal(false);
      expect(bob.json.context.status).to.equal('deny');
      const carol = await evaluation(user('carol'));
      expect(carol.json.decision).to.equal(false);
      expect(carol.json.context.status).to.equal('requires_approval');
      const [ev] = await auditEvents(a.platform, { request_id: alice.json.context.request_id });
      expect(ev).to.deep.include({
        user_id: 'alice',
        tenant_id: 'acme',
        resource: { type: 'project', id: 'p1' },
      });
      expect(ev.details.subject_kind).to.equal('human');
    });

    it('puts a human subject without tenant_id in the default tenant ("default")', async () => {
      const r = await evaluation({ ...user('alice'), subject: { type: 'user', id: 'alice' } });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.decision).to.equal(false); // alice is an admin of acme, not of "default"
      const [ev] = await auditEvents(a.platform, { request_id: r.json.context.request_id });
      expect(ev.tenant_id).to.equal('default');
    });

    it('echoes an incoming X-Request-ID', async () => {
      const id = 'bfe9eb29-ab87-4ca3-be83-a1d5d8305716';
      const r = await evaluation(AZ.allow, { headers: { 'X-Request-ID': id } });
      expect(r.status).to.equal(200);
      expect(r.headers.get('x-request-id')).to.equal(id);
      const b = await evaluations({ evaluations: [AZ.allow] }, { headers: { 'X-Request-ID': id } });
      expect(b.headers.get('x-request-id')).to.equal(id);
      const bad = await evaluation({ subject: AZ.allow.subject }, { headers: { 'X-Request-ID': id } });
      expectError(bad, 400);
      expect(bad.headers.get('x-request-id')).to.equal(id);
      // Also on answers refused before the handler runs: no key, malformed JSON, another type.
      const refusals = [
        await evaluation(AZ.allow, { key: null, headers: { 'X-Request-ID': id } }),
        await call('POST', `${a.engine}/access/v1/evaluation`, {
          raw: '{"subject":',
          headers: { 'content-type': 'application/json', 'X-Request-ID': id },
        }),
        await call('POST', `${a.engine}/access/v1/evaluations`, {
          raw: 'subject=alice',
          headers: { 'content-type': 'text/plain', 'X-Request-ID': id },
        }),
      ];
      expect(refusals.map((x) => x.status)).to.deep.equal([401, 400, 415]);
      for (const x of refusals) expect(x.headers.get('x-request-id')).to.equal(id);
      // An arbitrary string is echoed too, spaces inside it included (AuthZEN §11.1).
      const spaced = await evaluation(AZ.allow, { headers: { 'X-Request-ID': 'req 42 from pep' } });
      expect(spaced.headers.get('x-request-id')).to.equal('req 42 from pep');
      // One that is not bounded printable ASCII is not echoed: Arbiter's own id stays.
      const long = await evaluation(AZ.allow, { headers: { 'X-Request-ID': 'x'.repeat(300) } });
      expect(long.headers.get('x-request-id')).to.match(/^[0-9a-f-]{36}$/);
    });

    it("logs the caller's X-Request-ID beside Arbiter's own, so the PEP's id finds the request", async () => {
      const id = `pep-${Date.now()}-log`;
      const r = await evaluation(AZ.allow, { headers: { 'X-Request-ID': id } });
      expect(r.status, r.text).to.equal(200);
      const bad = await evaluation(
        { subject: AZ.allow.subject },
        { headers: { 'X-Request-ID': `${id}-bad` } },
      );
      expectError(bad, 400);
      const access = (callerId: string) => (l: Record<string, unknown>) =>
        l.msg === 'request' && l.callerRequestId === callerId;
      const recs = await a.logsWith([access(id), access(`${id}-bad`)]);
      const lineOf = (callerId: string) => recs.find(access(callerId));
      const line = lineOf(id);
      expect(line, 'the access line of the evaluation').to.not.equal(undefined);
      expect(line?.route).to.equal('/access/v1/evaluation');
      // Arbiter's own request id is the one the decision (and its audit event) carries.
      expect(line?.requestId).to.equal(r.json.context.request_id);
      expect(lineOf(`${id}-bad`)?.status).to.equal(400);
    });

    it('replays an Idempotency-Key retry, and refuses the key with other properties (422)', async () => {
      const headers = { 'Idempotency-Key': 'authzen-retry-1' };
      const events = await auditCount(a.platform);
      const first = await evaluation(AZ.allow, { headers });
      const again = await evaluation(AZ.allow, { headers });
      expect(again.status).to.equal(200);
      expect(again.headers.get('idempotent-replayed')).to.equal('true');
      expect(again.json).to.deep.equal(first.json);
      expect(await auditCount(a.platform)).to.equal(events + 1);
      const other = {
        ...AZ.allow,
        subject: { ...AZ.allow.subject, properties: { confidence: 0.95, team: 'x' } },
      };
      expectError(await evaluation(other, { headers }), 422, /Idempotency-Key/);
      expect(await auditCount(a.platform)).to.equal(events + 1);
    });

    it('replays a batch retried with its Idempotency-Key item by item, saying so when every item is a replay', async () => {
      const headers = { 'Idempotency-Key': 'authzen-batch-retry-1' };
      const body = { evaluations: [AZ.allow, AZ.deny] };
      const events = await auditCount(a.platform);
      const first = await evaluations(body, { headers });
      expect(first.status, first.text).to.equal(200);
      expect(first.headers.get('idempotent-replayed')).to.equal(null);
      const again = await evaluations(body, { headers });
      expect(again.status).to.equal(200);
      expect(again.headers.get('idempotent-replayed')).to.equal('true');
      expect(again.json).to.deep.equal(first.json);
      expect(await auditCount(a.platform)).to.equal(events + 2);
      // One more item: the first two are replays, the third a new decision, so not the whole batch.
      const longer = await evaluations({ evaluations: [AZ.allow, AZ.deny, AZ.allow] }, { headers });
      expect(longer.status).to.equal(200);
      expect(longer.headers.get('idempotent-replayed')).to.equal(null);
      expect(await auditCount(a.platform)).to.equal(events + 3);
    });

    it('holds a tenant-bound key to its tenant (403), recording nothing', async () => {
      const key = a.createKey('authzen-globex', ['authorize'], { tenant: 'globex' });
      const events = await auditCount(a.platform);
      expectError(await evaluation(user('alice'), { key }), 403, /acme/);
      expect(await auditCount(a.platform)).to.equal(events);
    });

    it('holds a tenant-bound key to its tenant for an agent subject claiming another (403), recording nothing', async () => {
      const key = a.createKey('authzen-globex-agent', ['authorize'], { tenant: 'globex' });
      const events = await auditCount(a.platform);
      const claim = {
        ...AZ.allow,
        subject: { ...AZ.allow.subject, properties: { ...AZ.allow.subject.properties, tenant_id: 'acme' } },
      };
      expectError(await evaluation(claim, { key }), 403, /globex/);
      expect(await auditCount(a.platform)).to.equal(events);
      const own = {
        ...AZ.allow,
        subject: { ...AZ.allow.subject, properties: { ...AZ.allow.subject.properties, tenant_id: 'globex' } },
      };
      expect((await evaluation(own, { key })).status).to.equal(200);
    });

    it("records the tenant an agent subject claims, so that the tenant's reviewers see its item", async () => {
      const claim = (tenant: string) => ({
        ...AZ.approval,
        subject: {
          ...AZ.approval.subject,
          properties: { ...AZ.approval.subject.properties, tenant_id: tenant },
        },
      });
      const r = await evaluation(claim('acme'));
      expect(r.json.context.status, r.text).to.equal('requires_approval');
      const id = r.json.context.request_id as string;
      const [event] = await auditEvents(a.platform, { kind: 'decision', request_id: id });
      expect(event.tenant_id).to.equal('acme');
      const acmeReviewer = a.createKey('authzen-acme-reviewer', ['queue:read'], { tenant: 'acme' });
      const item = await call('GET', `${a.engine}/v1/queue/${id}`, { key: acmeReviewer });
      expect(item.status, item.text).to.equal(200);
      expect(item.json.tenant_id).to.equal('acme');
      const listed = await call('GET', `${a.engine}/v1/queue/pending`, { key: acmeReviewer });
      expect((listed.json.items as { id: string }[]).map((i) => i.id)).to.include(id);
      // Another tenant's reviewer does not see it.
      const globexReviewer = a.createKey('authzen-globex-reviewer', ['queue:read'], { tenant: 'globex' });
      expectError(await call('GET', `${a.engine}/v1/queue/${id}`, { key: globexReviewer }), 403);
    });

    it('needs a key with the authorize scope', async () => {
      expectError(await evaluation(AZ.allow, { key: null }), 401);
      const key = a.createKey('authzen-reader', ['queue:read']);
      expectError(await evaluation(AZ.allow, { key }), 403, 'API key lacks scope authorize');
    });
  });

  describe('POST /access/v1/evaluations', () => {
    const three = (semantic?: string) => ({
      subject: AZ.allow.subject,
      action: { name: 'read' },
      ...(semantic ? { options: { evaluations_semantic: semantic } } : {}),
      evaluations: [
        { resource: { type: 'repo', id: 'arbiter' } },
        { action: { name: 'delete' }, resource: { type: 'prod', id: 'db' } },
        { resource: { type: 'repo', id: 'other' } },
      ],
    });

    it('decides every item with the top-level defaults, in order (execute_all), each an audited decision', async () => {
      const events = await auditCount(a.platform);
      const r = await evaluations(three());
      expect(r.status, r.text).to.equal(200);
      expect(r.json).to.have.keys('evaluations');
      expect(r.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([
        true,
        false,
        true,
      ]);
      expect(r.json.evaluations[1].context.reason).to.match(/destructive/);
      const ids = r.json.evaluations.map((e: { context: { request_id: string } }) => e.context.request_id);
      expect(new Set(ids).size).to.equal(3);
      expect(await auditCount(a.platform)).to.equal(events + 3);
      const [ev] = await auditEvents(a.platform, { request_id: ids[1] });
      expect(ev).to.include({ action: 'delete', resource: 'prod/db', outcome: 'deny' });
      const explicit = await evaluations({ ...three('execute_all') });
      expect(explicit.json.evaluations).to.have.length(3);
    });

    it('stops at the first deny with deny_on_first_deny', async () => {
      const events = await auditCount(a.platform);
      const r = await evaluations(three('deny_on_first_deny'));
      expect(r.status, r.text).to.equal(200);
      expect(r.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([true, false]);
      expect(await auditCount(a.platform)).to.equal(events + 2);
    });

    it('stops at the first permit with permit_on_first_permit', async () => {
      const events = await auditCount(a.platform);
      const r = await evaluations(three('permit_on_first_permit'));
      expect(r.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([true]);
      expect(await auditCount(a.platform)).to.equal(events + 1);
      const laterPermit = await evaluations({
        ...three('permit_on_first_permit'),
        evaluations: three().evaluations.slice(1),
      });
      expect(laterPermit.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([
        false,
        true,
      ]);
    });

    it('answers a failing item as decision false with context.error, and decides the others', async () => {
      const key = a.createKey('authzen-bound', ['authorize'], { agent: 'deploy-bot' });
      const r = await evaluations(
        {
          evaluations: [
            { ...AZ.allow, subject: { type: 'agent', id: 'deploy-bot' } }, // no confidence
            AZ.allow,
            { ...AZ.allow, subject: { type: 'agent', id: 'other-bot', properties: { confidence: 0.99 } } },
          ],
        },
        { key },
      );
      expect(r.status, r.text).to.equal(200);
      const [noConfidence, ok, otherAgent] = r.json.evaluations;
      expect(noConfidence.decision).to.equal(false);
      expect(noConfidence.context.error.status).to.equal(400);
      expect(noConfidence.context.error.message).to.match(/confidence/);
      expect(ok).to.deep.include({ decision: true });
      expect(otherAgent.decision).to.equal(false);
      expect(otherAgent.context.error.status).to.equal(403);
      expect(otherAgent.context.error.message).to.match(/other-bot/);
    });

    it('counts a failing item as a deny for deny_on_first_deny', async () => {
      const r = await evaluations({
        options: { evaluations_semantic: 'deny_on_first_deny' },
        evaluations: [{ ...AZ.allow, subject: { type: 'agent', id: 'deploy-bot' } }, AZ.allow],
      });
      expect(r.json.evaluations).to.have.length(1);
      expect(r.json.evaluations[0].context.error.status).to.equal(400);
    });

    it('answers a request without evaluations, or with none, as a single evaluation (AuthZEN 1.0 §7.1)', async () => {
      const events = await auditCount(a.platform);
      const single = await evaluations(AZ.allow);
      expect(single.status, single.text).to.equal(200);
      expect(single.json).to.have.keys('decision', 'context');
      expect(single.json.decision).to.equal(true);
      expect(single.json.context).to.have.keys('status', 'request_id');
      const [ev] = await auditEvents(a.platform, { request_id: single.json.context.request_id });
      expect(ev).to.include({ kind: 'decision', outcome: 'allow', agent_id: 'deploy-bot' });
      expect(ev.details.input.authzen).to.deep.equal({ ...AZ.allow, context: {} });
      // An empty array, and options (which then decide nothing), are the same.
      const empty = await evaluations({
        ...AZ.deny,
        evaluations: [],
        options: { evaluations_semantic: 'permit_on_first_permit' },
      });
      expect(empty.status, empty.text).to.equal(200);
      expect(empty.json.decision).to.equal(false);
      expect(empty.json.context.status).to.equal('deny');
      const queued = await evaluations(AZ.approval);
      expect(queued.json.decision).to.equal(false);
      expect(queued.json.context.access_request.id).to.equal(queued.json.context.request_id);
      expect(await auditCount(a.platform)).to.equal(events + 3);
      // A retry with the same Idempotency-Key is the first answer again, recorded once.
      const headers = { 'Idempotency-Key': 'authzen-single-on-batch-1' };
      const first = await evaluations(AZ.allow, { headers });
      const again = await evaluations(AZ.allow, { headers });
      expect(again.headers.get('idempotent-replayed')).to.equal('true');
      expect(again.json).to.deep.equal(first.json);
      expect(await auditCount(a.platform)).to.equal(events + 4);
    });

    it('gives a requires_approval item its access_request', async () => {
      const r = await evaluations({ evaluations: [AZ.approval] });
      const [item] = r.json.evaluations;
      expect(item.decision).to.equal(false);
      expect(item.context.access_request.id).to.equal(item.context.request_id);
      expect((await call('GET', item.context.access_request.status_endpoint)).json.status).to.equal(
        'pending',
      );
    });
  });

  describe('the interop scenario as an ordinary authz.human policy over input.authzen', () => {
    before(async () => {
      const r = await call('PUT', `${a.platform}/api/v1/policies/authzen-interop`, {
        body: { rego: INTEROP_POLICY },
      });
      expect(r.status, r.text).to.equal(201);
    });

    it('decides every Authorization API 1.0 interop request as expected (one evaluation each)', async () => {
      for (const c of interopCases(false)) {
        const r = await evaluation(c.request);
        expect(r.status, r.text).to.equal(200);
        expect(r.json.decision, JSON.stringify(c.request)).to.equal(c.expected);
      }
    });

    it('decides the earlier-draft requests (attributes on the resource itself) in one batch', async () => {
      const cases = interopCases(true);
      const r = await evaluations({ evaluations: cases.map((c) => c.request) });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal(
        cases.map((c) => c.expected),
      );
    });

    it('denies an unknown user by default', async () => {
      const r = await evaluation({
        subject: { type: 'user', id: 'squanchy@example.com' },
        action: { name: 'can_read_todos' },
        resource: { type: 'todo', id: 'todo-1' },
      });
      expect(r.json.decision).to.equal(false);
      expect(r.json.context.reason).to.match(/no policy allows/);
    });
  });

  describe('replays the interop decision files (todo backend, batch, API gateway) as the interop harnesses do', () => {
    before(async () => {
      let r = await call('PUT', `${a.platform}/api/v1/data/todo`, { body: INTEROP_DIRECTORY });
      expect(r.status, r.text).to.be.oneOf([200, 201]);
      r = await call('PUT', `${a.platform}/api/v1/policies/authzen-interop-replay`, {
        body: { rego: REPLAY_POLICY },
      });
      expect(r.status, r.text).to.equal(201);
    });
    after(async () => {
      await call('DELETE', `${a.platform}/api/v1/policies/authzen-interop-replay`);
      await call('DELETE', `${a.platform}/api/v1/data/todo`);
    });
    const singles = INTEROP_CASES.filter((c) => c.endpoint === 'evaluation');
    const batches = INTEROP_CASES.filter((c) => c.endpoint === 'evaluations');

    it('answers every single request as expected, echoing each X-Request-ID', async () => {
      expect(singles).to.have.length(185);
      const before = await auditCount(a.platform);
      for (const [i, c] of singles.entries()) {
        const r = await evaluation(c.request, { headers: { 'X-Request-ID': `interop-${i}` } });
        const what = `${c.source}: ${JSON.stringify(c.request)}`;
        expect(r.status, what).to.equal(200);
        expect(r.json.decision, what).to.equal(c.expected);
        expect(r.headers.get('x-request-id'), what).to.equal(`interop-${i}`);
      }
      expect(await auditCount(a.platform)).to.equal(before + singles.length);
    });

    it("answers the batch file's evaluations as expected", async () => {
      expect(batches).to.have.length(3);
      for (const c of batches) {
        const r = await evaluations(c.request);
        expect(r.status, r.text).to.equal(200);
        expect(r.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal(c.expected);
      }
    });

    it('answers each file as batches under every evaluations_semantic, stopping where it says', async () => {
      const sources = [...new Set(singles.map((c) => c.source))];
      expect(sources).to.have.length(5);
      for (const source of sources) {
        const cases = singles.filter((c) => c.source === source);
        const expected = cases.map((c) => c.expected as boolean);
        const upTo = (i: number) => (i < 0 ? expected : expected.slice(0, i + 1));
        for (const [semantic, want] of [
          ['execute_all', expected],
          ['deny_on_first_deny', upTo(expected.indexOf(false))],
          ['permit_on_first_permit', upTo(expected.indexOf(true))],
        ] as const) {
          const r = await evaluations({
            options: { evaluations_semantic: semantic },
            evaluations: cases.map((c) => c.request),
          });
          expect(r.status, r.text).to.equal(200);
          const got = r.json.evaluations.map((e: { decision: boolean }) => e.decision);
          expect(got, `${source} ${semantic}`).to.deep.equal(want);
        }
      }
    });
  });

  describe('binds request_digest to the whole evaluation the policy sees (input.authzen)', () => {
    before(async () => {
      const r = await call('PUT', `${a.platform}/api/v1/policies/authzen-transfer`, {
        body: { rego: TRANSFER_POLICY },
      });
      expect(r.status, r.text).to.equal(201);
    });
    after(async () => {
      await call('DELETE', `${a.platform}/api/v1/policies/authzen-transfer`);
    });

    const transfer = (amount: number) => ({
      subject: { type: 'user', id: 'alice', properties: { tenant_id: 'acme' } },
      action: { name: 'transfer', properties: { amount } },
      resource: { type: 'account', id: 'acc-1' },
    });
    const digestOfDecision = async (requestId: string) => {
      const [ev] = await auditEvents(a.platform, { kind: 'decision', request_id: requestId });
      return ev.details.request_digest as string;
    };

    it('gives evaluations differing only in a property different digests, and the token the allowed one', async () => {
      const small = await evaluation(transfer(10));
      expect(small.status, small.text).to.equal(200);
      expect(small.json.decision).to.equal(true);
      const large = await evaluation(transfer(1_000_000));
      expect(large.status, large.text).to.equal(200);
      expect(large.json.context.status).to.equal('requires_approval');
      const smallDigest = await digestOfDecision(small.json.context.request_id);
      const largeDigest = await digestOfDecision(large.json.context.request_id);
      expect(smallDigest).to.not.equal(largeDigest);
      // What a resource server recomputes (README): the native call plus the evaluation as sent.
      const native = {
        user_id: 'alice',
        tenant_id: 'acme',
        action: 'transfer',
        resource: { type: 'account', id: 'acc-1' },
        context: {},
      };
      expect(smallDigest).to.equal(digestOf({ ...native, authzen: { ...transfer(10), context: {} } }));
      expect(smallDigest).to.equal('ULJtlIm2Nw-Ta9aREKBBf82Oa868nA9pfWNs3C--has'); // the README's example
      expect(largeDigest).to.equal(digestOf({ ...native, authzen: { ...transfer(1_000_000), context: {} } }));
      const item = await call('GET', large.json.context.access_request.status_endpoint);
      expect(item.json.request_digest).to.equal(largeDigest);
      // The allow's token is bound to the 10 transfer: it does not pass for the 1,000,000 one.
      const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
        body: { request_id: small.json.context.request_id },
      });
      expect(minted.status, minted.text).to.equal(201);
      const claims = decodeJwt(minted.json.token as string);
      expect(claims.request_digest).to.equal(smallDigest);
      expect(claims.request_digest).to.not.equal(largeDigest);
    });

    it('tells apart evaluations differing only in context, a subject property or a resource property', async () => {
      const base = transfer(10);
      const variants = [
        base,
        { ...base, context: { note: 'x' } },
        { ...base, subject: { ...base.subject, properties: { tenant_id: 'acme', role: 'admin' } } },
        { ...base, resource: { ...base.resource, properties: { owner: 'bob' } } },
      ];
      const digests = [];
      for (const v of variants) {
        const r = await evaluation(v);
        expect(r.status, r.text).to.equal(200);
        digests.push(await digestOfDecision(r.json.context.request_id));
      }
      expect(new Set(digests).size).to.equal(variants.length);
    });

    it('tells apart an agent resource split differently into type and id ("repo"+"a/b", "repo/a"+"b")', async () => {
      const split = (type: string, id: string) => agent('read', type, id, 0.95);
      const one = await evaluation(split('repo', 'a/b'));
      const other = await evaluation(split('repo/a', 'b'));
      expect(one.status, one.text).to.equal(200);
      expect(other.status, other.text).to.equal(200);
      const [d1, d2] = [
        await digestOfDecision(one.json.context.request_id),
        await digestOfDecision(other.json.context.request_id),
      ];
      expect(d1).to.not.equal(d2);
      const native = {
        agent_id: 'deploy-bot',
        tenant_id: null,
        action: 'read',
        resource: 'repo/a/b',
        context: {},
      };
      expect(d1).to.equal(digestOf({ ...native, authzen: { ...split('repo', 'a/b'), context: {} } }));
    });

    it('replays an Idempotency-Key retry with its digest, and refuses the key with another property (422)', async () => {
      const headers = { 'Idempotency-Key': 'authzen-digest-retry-1' };
      const first = await evaluation(transfer(10), { headers });
      const again = await evaluation(transfer(10), { headers });
      expect(again.headers.get('idempotent-replayed')).to.equal('true');
      expect(again.json).to.deep.equal(first.json);
      expectError(await evaluation(transfer(11), { headers }), 422, /Idempotency-Key/);
    });
  });

  it("runs the README's AuthZEN examples as written and shows the outcomes they promise", () => {
    const readme = readFileSync(path.join(REPO, 'README.md'), 'utf8');
    const start = readme.indexOf('## AuthZEN');
    const open = readme.indexOf('```sh\n', start) + '```sh\n'.length;
    const script = readme
      .slice(open, readme.indexOf('```\n', open))
      .replace('dev-admin-key-change-me', ADMIN_KEY)
      .replace('E=http://127.0.0.1:8080', `E=${a.engine}`);
    const r = spawnSync('bash', ['-c', script], { cwd: REPO, encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stderr).to.equal(0);
    const answers = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(answers).to.have.length(4);
    const [metadata, allow, approval, batch] = answers;
    expect(metadata.access_evaluation_endpoint).to.equal(`${a.engine}/access/v1/evaluation`);
    expect(allow).to.deep.include({ decision: true });
    expect(approval.decision).to.equal(false);
    expect(approval.context.access_request.id).to.equal(approval.context.request_id);
    expect(batch.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([true, false]);
  });

  describe('fails closed', () => {
    // Two values for one complete rule: a conflict OPA reports only at evaluation time.
    const CONFLICT = `package authz.human

authzen_conflict := 1 if input.authzen.action.name == "explode"

authzen_conflict := 2 if input.authzen.action.name == "explode"

allow if authzen_conflict
`;
    before(async () => {
      const r = await call('PUT', `${a.platform}/api/v1/policies/authzen-conflict`, {
        body: { rego: CONFLICT },
      });
      expect(r.status, r.text).to.equal(201);
    });
    after(async () => {
      await call('DELETE', `${a.platform}/api/v1/policies/authzen-conflict`);
    });

    it('answers decision false when evaluation fails, and records the error', async () => {
      const body = { ...user('alice', 'explode') };
      const r = await evaluation(body);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.decision).to.equal(false);
      expect(r.json.context.status).to.equal('deny');
      expect(r.json.context.reason).to.match(/evaluation/i);
      const [ev] = await auditEvents(a.platform, { request_id: r.json.context.request_id });
      expect(ev.outcome).to.equal('deny');
      expect(ev.details.error).to.be.a('string').and.not.equal('');
      const batch = await evaluations({ evaluations: [body, user('alice')] });
      expect(batch.json.evaluations.map((e: { decision: boolean }) => e.decision)).to.deep.equal([
        false,
        true,
      ]);
    });
  });

  describe('bad input: the right status, a clear error, nothing recorded', () => {
    const many = (n: number) => ({ evaluations: Array.from({ length: n }, () => AZ.allow) });
    const cases: [string, 'evaluation' | 'evaluations', unknown, number, RegExp][] = [
      [
        'missing subject',
        'evaluation',
        { action: AZ.allow.action, resource: AZ.allow.resource },
        400,
        /subject/,
      ],
      [
        'missing action',
        'evaluation',
        { subject: AZ.allow.subject, resource: AZ.allow.resource },
        400,
        /action/,
      ],
      [
        'missing resource',
        'evaluation',
        { subject: AZ.allow.subject, action: AZ.allow.action },
        400,
        /resource/,
      ],
      ['missing subject.id', 'evaluation', { ...AZ.allow, subject: { type: 'agent' } }, 400, /subject\.id/],
      [
        'a numeric subject id',
        'evaluation',
        { ...AZ.allow, subject: { type: 'user', id: 7 } },
        400,
        /subject\.id must be a string/,
      ],
      ['a string action', 'evaluation', { ...AZ.allow, action: 'read' }, 400, /action must be an object/],
      ['an array context', 'evaluation', { ...AZ.allow, context: [] }, 400, /context must be an object/],
      [
        'string resource.properties',
        'evaluation',
        { ...AZ.allow, resource: { type: 'r', id: 'x', properties: 'p' } },
        400,
        /resource\.properties/,
      ],
      [
        'an unknown top-level member',
        'evaluation',
        { ...AZ.allow, evaluations: [] },
        400,
        /unknown field: evaluations/,
      ],
      [
        'an agent without confidence',
        'evaluation',
        { ...AZ.allow, subject: { type: 'agent', id: 'deploy-bot' } },
        400,
        /confidence/,
      ],
      [
        'confidence out of range',
        'evaluation',
        agent('read', 'repo', 'arbiter', 1.5),
        400,
        /confidence out of range/,
      ],
      [
        'a non-string tenant_id',
        'evaluation',
        { ...user('alice'), subject: { type: 'user', id: 'alice', properties: { tenant_id: 3 } } },
        400,
        /tenant_id/,
      ],
      [
        'no evaluations and no action (a single evaluation, incomplete)',
        'evaluations',
        { subject: AZ.allow.subject },
        400,
        /a request without evaluations is a single evaluation \(AuthZEN 1\.0 §7\.1\): action is missing/,
      ],
      [
        'empty evaluations and no tuple',
        'evaluations',
        { evaluations: [] },
        400,
        /without evaluations is a single evaluation .*: subject is missing/,
      ],
      [
        'no evaluations and an agent without confidence',
        'evaluations',
        { ...AZ.allow, subject: { type: 'agent', id: 'deploy-bot' } },
        400,
        /confidence/,
      ],
      [
        'a dot-segment in an agent resource id',
        'evaluation',
        agent('delete', 'repo', '../prod/db', 0.99),
        400,
        /^resource\.id must not contain a "\." or "\.\." path segment$/,
      ],
      [
        'a dot-segment in a human resource type',
        'evaluation',
        { ...user('alice'), resource: { type: 'project/..', id: 'p1' } },
        400,
        /^resource\.type must not contain a "\." or "\.\." path segment$/,
      ],
      [
        'a dot-segment in a batch item after an allowed one (nothing of the batch is recorded)',
        'evaluations',
        { evaluations: [AZ.allow, agent('delete', 'staging', '../prod/db', 0.99)] },
        400,
        /^evaluations\.1\.resource\.id must not contain a "\." or "\.\." path segment$/,
      ],
      [
        'a dot-segment in a batch default resource',
        'evaluations',
        { ...AZ.allow, resource: { type: '.', id: 'x' }, evaluations: [{}] },
        400,
        /^resource\.type must not contain/,
      ],
      ['more than 100 evaluations', 'evaluations', many(101), 400, /evaluations must have at most 100 items/],
      [
        // 22 KB of body; every item is recorded whole, so it would have been 60 × 22 KB of audit trail.
        'a batch whose shared context, copied into each item, exceeds the body limit',
        'evaluations',
        {
          ...AZ.allow,
          context: { note: 'x'.repeat(22_000) },
          evaluations: Array.from({ length: 60 }, () => ({})),
        },
        413,
        /^the batch with its defaults applied to each of its 60 evaluations is more than the 1048576-byte body limit \(each evaluation is recorded whole\): send fewer evaluations, or a smaller shared context$/,
      ],
      [
        'an unknown semantic',
        'evaluations',
        { ...many(1), options: { evaluations_semantic: 'first_wins' } },
        400,
        /evaluations_semantic must be one of execute_all, deny_on_first_deny, permit_on_first_permit/,
      ],
      ['evaluations not an array', 'evaluations', { evaluations: {} }, 400, /evaluations must be an array/],
      [
        'an item with no resource and no default',
        'evaluations',
        { evaluations: [AZ.allow, { subject: AZ.allow.subject, action: AZ.allow.action }] },
        400,
        /evaluations\[1\] has no resource/,
      ],
      [
        'a malformed item',
        'evaluations',
        { evaluations: [AZ.allow, { ...AZ.allow, action: { name: 5 } }] },
        400,
        /evaluations\.1\.action\.name must be a string/,
      ],
    ];
    for (const [what, endpoint, body, status, message] of cases) {
      it(`answers ${status} to ${what} (${endpoint})`, async () => {
        const events = await auditCount(a.platform);
        const decisions = await a.count('decisions');
        const r = await (endpoint === 'evaluation' ? evaluation(body) : evaluations(body));
        expectError(r, status, message);
        expect(await auditCount(a.platform)).to.equal(events);
        expect(await a.count('decisions')).to.equal(decisions);
      });
    }

    it('answers 400 to malformed JSON on both endpoints, recording nothing', async () => {
      const events = await auditCount(a.platform);
      for (const p of ['evaluation', 'evaluations']) {
        const r = await call('POST', `${a.engine}/access/v1/${p}`, {
          raw: '{"subject": ',
          headers: { 'content-type': 'application/json' },
        });
        expectError(r, 400, /malformed JSON/);
      }
      expect(await auditCount(a.platform)).to.equal(events);
    });

    it('answers 100 evaluations (the maximum)', async () => {
      const r = await evaluations(many(100));
      expect(r.status, r.text).to.equal(200);
      expect(r.json.evaluations).to.have.length(100);
    });

    it('decides a batch whose shared context, copied into each item, stays within the body limit', async () => {
      const events = await auditCount(a.platform);
      const body = {
        ...AZ.allow,
        context: { note: 'x'.repeat(8_000) },
        evaluations: Array.from({ length: 100 }, () => ({})),
      };
      const r = await evaluations(body);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.evaluations).to.have.length(100);
      expect(await auditCount(a.platform)).to.equal(events + 100);
    });
  });
});

onEveryBackend('AuthZEN with ARBITER_AUDIT_MASK_FIELDS', () => {
  it('masks the context in input.authzen as everywhere else: the secret is stored nowhere', async () => {
    const a = await Arbiter.start({
      ARBITER_AUDIT_MASK_FIELDS: 'context.ssn,authzen.subject.properties.passport',
    });
    try {
      const secret = 'ssn-123-45-6789';
      const passport = 'passport-X1234567';
      const approval = {
        ...AZ.approval,
        subject: { ...AZ.approval.subject, properties: { ...AZ.approval.subject.properties, passport } },
      };
      const r = await call('POST', `${a.engine}/access/v1/evaluation`, {
        body: { ...approval, context: { ssn: secret, ticket: 'CHG-1' } },
      });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.context.status).to.equal('requires_approval');
      const [ev] = await auditEvents(a.platform, { request_id: r.json.context.request_id });
      expect(ev.details.input.authzen.context).to.deep.equal({ ssn: '[masked]', ticket: 'CHG-1' });
      expect(ev.details.input.authzen.subject.properties.passport).to.equal('[masked]');
      expect(await storedText(a)).to.not.include(passport);
      expect(await storedText(a)).to.not.include(secret);
    } finally {
      await a.close();
    }
  });
});

onceOnly('AuthZEN PDP metadata', () => {
  it('serves /.well-known/authzen-configuration without a key, from the request host', async () => {
    const a = await Arbiter.start();
    try {
      const r = await call('GET', `${a.engine}/.well-known/authzen-configuration`, { key: null });
      expect(r.status, r.text).to.equal(200);
      expect(r.json).to.deep.equal({
        policy_decision_point: a.engine,
        access_evaluation_endpoint: `${a.engine}/access/v1/evaluation`,
        access_evaluations_endpoint: `${a.engine}/access/v1/evaluations`,
      });
      // The Platform API does not serve it: AuthZEN is on the Engine API.
      expect(
        (await call('GET', `${a.platform}/.well-known/authzen-configuration`, { key: null })).status,
      ).to.equal(404);
    } finally {
      await a.close();
    }
  });

  it('names ARBITER_PUBLIC_URL when set, there and in access_request, and honours the default tenant setting', async () => {
    const a = await Arbiter.start({
      ARBITER_PUBLIC_URL: 'https://pdp.example.com/',
      ARBITER_AUTHZEN_DEFAULT_TENANT: 'acme',
    });
    try {
      const r = await call('GET', `${a.engine}/.well-known/authzen-configuration`, { key: null });
      expect(r.json).to.deep.equal({
        policy_decision_point: 'https://pdp.example.com',
        access_evaluation_endpoint: 'https://pdp.example.com/access/v1/evaluation',
        access_evaluations_endpoint: 'https://pdp.example.com/access/v1/evaluations',
      });
      // carol is an editor of acme, the default tenant here: her delete needs approval.
      const q = await call('POST', `${a.engine}/access/v1/evaluation`, {
        body: { ...user('carol'), subject: { type: 'user', id: 'carol' } },
      });
      expect(q.json.context.status).to.equal('requires_approval');
      expect(q.json.context.access_request.status_endpoint).to.equal(
        `https://pdp.example.com/v1/queue/${q.json.context.request_id}`,
      );
    } finally {
      await a.close();
    }
  });

  it('refuses to start with a malformed ARBITER_AUTHZEN_DEFAULT_TENANT', async () => {
    let failed: Error | undefined;
    try {
      const a = await Arbiter.start({ ARBITER_AUTHZEN_DEFAULT_TENANT: 'two words' });
      await a.close();
    } catch (e) {
      failed = e as Error;
    }
    expect(failed?.message).to.match(/ARBITER_AUTHZEN_DEFAULT_TENANT/);
  });
});
