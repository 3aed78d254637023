import { expect } from 'chai';
import fc from 'fast-check';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { ADMIN_KEY, Arbiter, call, REPO, type Response } from './helpers/harness.js';
import { runSync, sleep } from './helpers/process.js';
import { intEnv } from './helpers/env.js';

/**
 * Model-based testing of the stateful contract over the real HTTP API (SPEC §5 decisions and
 * Idempotency-Key, §6 queue, §7 tokens, §8 audit, §13 on_behalf_of, budgets and approvals that
 * charge them, and API key revocation): fast-check generates random sequences of commands, runs
 * each against one real server and against a small model of what the contract says, and after
 * every command compares the server's answer (status, decision, item state, token activity,
 * budget used) with the model's. After each sequence: the queue lists exactly the model's items
 * per state, the audit trail holds exactly the events the model expects (no more, no fewer), and
 * `GET /api/v1/audit/verify` is ok.
 *
 * Time: the server runs with test/fixtures/skew-clock.mjs, and a Jump command steps its wall clock
 * forward by one hour (SIGUSR2): the 1-hour budget window rolls over, every grant leaves the
 * 5-minute exchange window, an item lives through one jump and expires at the second (queue TTL
 * 90 min: approved after one, it charges the new window), a token minted for 90 minutes likewise
 * and every other token (TTL ≤ 30 min) at the first. At most three jumps per sequence, far from
 * the 24-hour idempotency window.
 *
 * Environment: ARBITER_STATEFUL_RUNS (sequences, default 30), ARBITER_STATEFUL_SEED (default
 * 20261130), ARBITER_STATEFUL_COMMANDS (longest sequence, default 30), ARBITER_STATEFUL_REPLAY and
 * ARBITER_STATEFUL_REPLAY_COMMANDS (the `path` and `replayPath` a failure printed: with the same
 * seed, they replay its shrunk sequence), ARBITER_STATEFUL_STATS=1
 * (prints how often each outcome was exercised). A failure prints the seed, the replay path and
 * the shrunk sequence of commands.
 */

const RUNS = intEnv('ARBITER_STATEFUL_RUNS', 30);
const SEED = intEnv('ARBITER_STATEFUL_SEED', 20261130);
const MAX_COMMANDS = intEnv('ARBITER_STATEFUL_COMMANDS', 30);

const HOUR = 3600_000;
/** Queue TTL and the longest token: 90 minutes, so each lives through one jump of the clock. */
const LONG_TTL = 5400;
/** Jumps a pending item lives through, and a token minted for LONG_TTL: one. */
const ITEM_LIVES = 2;
const BUDGET_MAX = 3;
const MAX_JUMPS = 3;

/**
 * The agent side: read, pay and deploy are allowed, deploy needs a reviewer, delete is denied,
 * anything else (write) is the default deny. pay and deploy charge `context.amount` to the
 * agent's hourly budget of 3.
 */
const AGENT_REGO = `package authz.agent

allow if input.action in {"read", "pay", "deploy"}

deny contains "delete is never allowed" if input.action == "delete"

require_approval contains "deploy needs a reviewer" if input.action == "deploy"

limits contains {
	"key": concat(":", ["stateful", input.agent_id]),
	"window": "1h",
	"max": ${BUDGET_MAX},
	"cost": input.context.amount,
} if input.action in {"pay", "deploy"}
`;

/** The user side (on_behalf_of): alice allows, carol needs a reviewer, bob denies, dave has no allow. */
const HUMAN_REGO = `package authz.human

allow if input.user_id in {"alice", "carol"}

require_approval contains "carol's delegates need a reviewer" if input.user_id == "carol"

deny contains "bob's delegates are refused" if input.user_id == "bob"
`;

type Outcome = 'allow' | 'requires_approval' | 'deny';
type ItemState = 'pending' | 'approved' | 'denied' | 'expired';
const STATUS_CODE: Record<Outcome, number> = { allow: 200, requires_approval: 202, deny: 403 };
const SEVERITY: Record<Outcome, number> = { allow: 0, requires_approval: 1, deny: 2 };

interface Spec {
  action: 'read' | 'pay' | 'deploy' | 'delete' | 'write';
  resource: number;
  confidence: number;
  amount: number;
  obo: 'alice' | 'carol' | 'bob' | 'dave' | null;
}

interface AgentBody {
  agent_id: string;
  action: string;
  resource: string;
  confidence: number;
  context: { amount: number };
  on_behalf_of?: { tenant_id: string; user_id: string };
}

interface Req {
  id: string;
  traceId: string;
  body: AgentBody;
  outcome: Outcome;
  /** The budget cost its limit declares (pay and deploy), charged on allow or approval. */
  cost: number | null;
  item?: { state: ItemState; epoch: number; decidedBy?: string };
  /** The epoch of its allow or approval: a token can be had for it only in that epoch. */
  grantedEpoch: number | null;
  exchanged: boolean;
}

interface Idem {
  key: string;
  body: AgentBody;
  outcome: Outcome;
  /** The first answer's body: a retry replays it (SPEC §5). */
  first: Record<string, unknown>;
}

interface Tok {
  token: string;
  tokenId: string;
  requestId: string;
  scope: string;
  by: 'agent' | 'admin';
  epoch: number;
  /** Jumps after which it has expired. */
  lives: number;
  revoked: boolean;
  revokedAt?: string;
}

interface Model {
  /** Clock jumps in this sequence. */
  epoch: number;
  keyRevoked: boolean;
  requests: Req[];
  idem: Idem[];
  /** Idempotency keys sent only with bodies that were refused: still unused. */
  spareKeys: string[];
  tokens: Tok[];
  /** Budget used per absolute one-hour window (server clock). */
  budget: Map<number, number>;
  charged: boolean;
  /** `kind request_id outcome` of every audit event the sequence must leave. */
  events: string[];
}

/** One server shared by every sequence (each has an agent and a key of its own). */
interface Server {
  a: Arbiter;
  reviewerKey: string;
  /** Clock jumps sent to the server so far: its wall clock is this many hours ahead. */
  jumps: number;
  runs: number;
}

interface Real {
  s: Server;
  agentId: string;
  keyName: string;
  agentKey: string;
  /** The newest audit event before the sequence began. */
  baseline: string | null;
}

const ev = (kind: string, requestId: string, outcome: string) => `${kind} ${requestId} ${outcome}`;

/** The decision the policies above make, before budgets. */
function policyOutcome(spec: Spec): Outcome {
  let agent: Outcome;
  if (spec.action === 'delete' || spec.confidence < 0.5) agent = 'deny';
  else if (spec.action === 'write') agent = 'deny';
  else if (spec.action === 'deploy' || spec.confidence < 0.9) agent = 'requires_approval';
  else agent = 'allow';
  if (spec.obo === null) return agent;
  const user: Outcome =
    spec.obo === 'bob' || spec.obo === 'dave' ? 'deny' : spec.obo === 'carol' ? 'requires_approval' : 'allow';
  return SEVERITY[user] > SEVERITY[agent] ? user : agent;
}

const windowOf = (s: Server) => Math.floor((Date.now() + s.jumps * HOUR) / HOUR);

/** Waits out the last 3 s of a budget window, so that no command straddles two windows. */
async function clearOfWindowEdge(s: Server): Promise<void> {
  const into = (Date.now() + s.jumps * HOUR) % HOUR;
  if (into > HOUR - 3000) await sleep(HOUR - into + 200);
}

const used = (m: Model, s: Server) => m.budget.get(windowOf(s)) ?? 0;

function charge(m: Model, s: Server, cost: number): void {
  m.budget.set(windowOf(s), used(m, s) + cost);
  m.charged = true;
}

function expectUnauthenticated(r: Response): void {
  expectError(r, 401);
  expect(r.headers.get('www-authenticate') ?? '').to.match(/^Bearer/);
}

/** A body's members in reverse order, at every level: the same JSON value, other text. */
function permuted(v: unknown): unknown {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return v;
  return Object.fromEntries(
    Object.entries(v as Record<string, unknown>)
      .reverse()
      .map(([k, x]) => [k, permuted(x)]),
  );
}

type Cmd = fc.AsyncCommand<Model, Real>;
/** What the sequences did, by outcome (printed with ARBITER_STATEFUL_STATS=1: is anything exercised?). */
const TALLY = new Map<string, number>();
const tally = (k: string) => TALLY.set(k, (TALLY.get(k) ?? 0) + 1);

function bodyOf(spec: Spec, r: Real): AgentBody {
  return {
    agent_id: r.agentId,
    action: spec.action,
    resource: `res/${spec.resource}`,
    confidence: spec.confidence,
    context: { amount: spec.amount },
    ...(spec.obo ? { on_behalf_of: { tenant_id: 'acme', user_id: spec.obo } } : {}),
  };
}

const authorize = (r: Real, body: unknown, idemKey?: string) =>
  call('POST', `${r.s.a.engine}/v1/agent/authorize`, {
    key: r.agentKey,
    body,
    headers: idemKey ? { 'idempotency-key': idemKey } : {},
  });

const costOf = (spec: Spec) => (spec.action === 'pay' || spec.action === 'deploy' ? spec.amount : null);

/** The model's answer to a decision request now: its outcome, with the budget charged on an allow. */
function modelDecision(m: Model, r: Real, spec: Spec): { outcome: Outcome; budgetDenied: boolean } {
  const outcome = policyOutcome(spec);
  const cost = costOf(spec);
  if (outcome !== 'allow' || cost === null) return { outcome, budgetDenied: false };
  if (used(m, r.s) + cost > BUDGET_MAX) return { outcome: 'deny', budgetDenied: true };
  charge(m, r.s, cost);
  return { outcome, budgetDenied: false };
}

/** Records a decision the server made in the model: its request, item and audit event. */
function recordDecision(
  m: Model,
  spec: Spec,
  body: AgentBody,
  id: unknown,
  traceId: unknown,
  outcome: Outcome,
) {
  expect(id).to.be.a('string');
  expect(traceId).to.be.a('string');
  tally(`decision ${outcome}`);
  m.requests.push({
    id: id as string,
    traceId: traceId as string,
    body,
    outcome,
    cost: costOf(spec),
    item: outcome === 'requires_approval' ? { state: 'pending', epoch: m.epoch } : undefined,
    grantedEpoch: outcome === 'allow' ? m.epoch : null,
    exchanged: false,
  });
  m.events.push(ev('decision', id as string, outcome));
}

/** Checks a decision's answer against the model's, and records it in the model. */
function expectDecision(
  m: Model,
  r: Real,
  spec: Spec,
  body: AgentBody,
  key: string | undefined,
  res: Response,
): void {
  if (m.keyRevoked) return expectUnauthenticated(res);
  const { outcome, budgetDenied } = modelDecision(m, r, spec);
  expect(res.status, res.text).to.equal(STATUS_CODE[outcome]);
  expect(res.json.status, res.text).to.equal(outcome);
  if (budgetDenied) expect(res.json.message).to.match(/^budget exhausted/);
  recordDecision(m, spec, body, res.json.request_id, res.json.trace_id, outcome);
  if (key) m.idem.push({ key, body, outcome, first: res.json as Record<string, unknown> });
}

/** The same agent decision through AuthZEN (SPEC §14): one more door to the same model. */
class AuthzenEvaluation implements Cmd {
  constructor(readonly spec: Spec) {}
  check(): boolean {
    return true;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const spec = { ...this.spec, obo: null };
    const traceId = randomUUID().replace(/-/g, '');
    const res = await call('POST', `${r.s.a.engine}/access/v1/evaluation`, {
      key: r.agentKey,
      headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` },
      body: {
        subject: { type: 'agent', id: r.agentId, properties: { confidence: spec.confidence } },
        action: { name: spec.action },
        resource: { type: 'res', id: String(spec.resource) },
        context: { amount: spec.amount },
      },
    });
    if (m.keyRevoked) return expectUnauthenticated(res);
    const { outcome } = modelDecision(m, r, spec);
    expect(res.status, res.text).to.equal(200);
    expect(res.json.decision, res.text).to.equal(outcome === 'allow');
    expect(res.json.context.status, res.text).to.equal(outcome);
    const id = res.json.context.request_id as string;
    if (outcome === 'requires_approval') expect(res.json.context.access_request.id).to.equal(id);
    else expect(res.json.context.access_request).to.equal(undefined);
    recordDecision(m, spec, bodyOf(spec, r), id, traceId, outcome);
  }
  toString(): string {
    return `AuthzenEvaluation(${JSON.stringify({ ...this.spec, obo: null })})`;
  }
}

/**
 * `n` payments of `amount` at once, each with its own request: exactly as many are allowed as the
 * budget left holds (SPEC §13: N concurrent requests against a budget of M allow min(N, M)).
 */
class Burst implements Cmd {
  constructor(
    readonly n: number,
    readonly amount: number,
  ) {}
  check(m: Readonly<Model>): boolean {
    return !m.keyRevoked;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const spec: Spec = { action: 'pay', resource: 9, confidence: 0.99, amount: this.amount, obo: null };
    const body = bodyOf(spec, r);
    const answers = await Promise.all(Array.from({ length: this.n }, () => authorize(r, body)));
    const fits = Math.min(this.n, Math.floor((BUDGET_MAX - used(m, r.s)) / this.amount));
    const allowed = answers.filter((x) => x.status === 200);
    expect(allowed.length, answers.map((x) => x.text).join('\n')).to.equal(fits);
    for (const x of answers) {
      const outcome: Outcome = x.status === 200 ? 'allow' : 'deny';
      expect(x.json.status, x.text).to.equal(outcome);
      if (outcome === 'deny') expect(x.json.message).to.match(/^budget exhausted/);
      else charge(m, r.s, this.amount);
      recordDecision(m, spec, body, x.json.request_id, x.json.trace_id, outcome);
    }
  }
  toString(): string {
    return `Burst(${this.n} x pay ${this.amount})`;
  }
}

/**
 * A decision request. With `copies` > 1, that many identical requests with one fresh
 * Idempotency-Key are sent at once: they are one decision, every answer the same (SPEC §5).
 */
class Authorize implements Cmd {
  constructor(
    readonly spec: Spec,
    readonly idem: 'none' | 'fresh' | 'spare',
    readonly copies = 1,
  ) {}
  check(m: Readonly<Model>): boolean {
    return this.idem !== 'spare' || m.spareKeys.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const key =
      this.idem === 'none' ? undefined : this.idem === 'spare' ? m.spareKeys.shift() : `idem-${randomUUID()}`;
    if (this.idem === 'spare') tally('authorize with a key first sent with a refused body');
    const body = bodyOf(this.spec, r);
    const [first, ...rest] = await Promise.all(
      Array.from({ length: this.copies }, () => authorize(r, body, key)),
    );
    expectDecision(m, r, this.spec, body, key, first!);
    for (const res of rest) {
      expect(res.status, res.text).to.equal(first!.status);
      if (res.status !== 401) expect(res.json.request_id, res.text).to.equal(first!.json.request_id);
    }
  }
  toString(): string {
    return `Authorize(${JSON.stringify(this.spec)}, idem=${this.idem}${this.copies > 1 ? `, copies=${this.copies}` : ''})`;
  }
}

class Retry implements Cmd {
  constructor(
    readonly i: number,
    readonly variant: 'same' | 'permuted' | 'changed' | 'platform' | 'human',
  ) {}
  check(m: Readonly<Model>): boolean {
    return m.idem.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    const idem = m.idem[this.i % m.idem.length]!;
    const body =
      this.variant === 'same' || this.variant === 'platform'
        ? JSON.stringify(idem.body)
        : this.variant === 'permuted'
          ? JSON.stringify(permuted(idem.body))
          : JSON.stringify({ ...idem.body, resource: `${idem.body.resource}-other` });
    // The Platform API serves agent decisions too, and a retry there is the same retry; a human
    // request under the key is another body.
    const url =
      this.variant === 'platform'
        ? `${r.s.a.platform}/api/v1/authorize`
        : this.variant === 'human'
          ? `${r.s.a.engine}/v1/authorize`
          : `${r.s.a.engine}/v1/agent/authorize`;
    const sent =
      this.variant === 'human'
        ? JSON.stringify({
            tenant_id: 'acme',
            user_id: 'alice',
            action: 'read',
            resource: { type: 'res', id: '0' },
          })
        : body;
    const res = await call('POST', url, {
      key: r.agentKey,
      body: sent,
      headers: { 'idempotency-key': idem.key },
    });
    if (m.keyRevoked) return expectUnauthenticated(res);
    tally('retry ' + this.variant);
    if (this.variant === 'changed' || this.variant === 'human') {
      expectError(res, 422);
      return;
    }
    expect(res.status, res.text).to.equal(STATUS_CODE[idem.outcome]);
    expect(res.json).to.deep.equal(idem.first);
  }
  toString(): string {
    return `Retry(${this.i}, ${this.variant})`;
  }
}

/** A request the schema refuses (confidence out of range), with or without an Idempotency-Key. */
class Invalid implements Cmd {
  constructor(readonly withKey: boolean) {}
  check(): boolean {
    return true;
  }
  async run(m: Model, r: Real): Promise<void> {
    const key = this.withKey ? `idem-${randomUUID()}` : undefined;
    const res = await call('POST', `${r.s.a.engine}/v1/agent/authorize`, {
      key: r.agentKey,
      body: { agent_id: r.agentId, action: 'read', resource: 'res/0', confidence: 1.5 },
      headers: key ? { 'idempotency-key': key } : {},
    });
    if (m.keyRevoked) return expectUnauthenticated(res);
    expectError(res, 400, 'confidence out of range: must be between 0.0 and 1.0, got 1.5');
    if (key) m.spareKeys.push(key);
  }
  toString(): string {
    return `Invalid(withKey=${this.withKey})`;
  }
}

/** Why the model refuses a reviewer's decision now: [status, message], or undefined (it is taken). */
function decideRefusal(m: Model, r: Real, req: Req, to: 'approve' | 'deny'): [number, RegExp?] | undefined {
  const item = req.item;
  if (!item) return [404];
  if (item.state !== 'pending') return [409, new RegExp(`already ${item.state}`)];
  if (to === 'approve' && req.cost !== null && used(m, r.s) + req.cost > BUDGET_MAX) {
    return [409, /^budget exhausted/];
  }
  return undefined;
}

/** Records a decision the server took (checked against the answer). */
function applyDecide(
  m: Model,
  r: Real,
  req: Req,
  to: 'approve' | 'deny',
  by: string,
  note: string | null,
  res: Response,
): void {
  const state = to === 'approve' ? 'approved' : 'denied';
  expect(res.status, res.text).to.equal(200);
  expect(res.json).to.include({ id: req.id, status: state, decided_by: by, note });
  tally(`decide ${state}`);
  req.item!.state = state;
  req.item!.decidedBy = by;
  if (to === 'approve') {
    if (req.cost !== null) charge(m, r.s, req.cost);
    req.grantedEpoch = m.epoch;
  }
  m.events.push(ev(to === 'approve' ? 'queue.approve' : 'queue.deny', req.id, state));
}

const decide = (r: Real, id: string, to: 'approve' | 'deny', key: string, note: string | null) =>
  call('POST', `${r.s.a.engine}/v1/queue/${id}/${to}`, { key, body: note === null ? {} : { note } });

class Decide implements Cmd {
  constructor(
    readonly i: number,
    readonly to: 'approve' | 'deny',
    readonly by: 'reviewer' | 'self',
    readonly note: string | null,
  ) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const req = m.requests[this.i % m.requests.length]!;
    const res = await decide(
      r,
      req.id,
      this.to,
      this.by === 'self' ? r.agentKey : r.s.reviewerKey,
      this.note,
    );
    if (this.by === 'self') {
      // The key that made a request cannot decide it (SPEC §6).
      if (m.keyRevoked) return expectUnauthenticated(res);
      expectError(res, req.item ? 403 : 404);
      return;
    }
    const refused = decideRefusal(m, r, req, this.to);
    if (refused) {
      tally(`${this.to} refused ${refused[0]}${refused[1] ? ` ${refused[1].source}` : ''}`);
      expectError(res, refused[0], refused[1]);
      return;
    }
    applyDecide(m, r, req, this.to, 'stateful-reviewer', this.note, res);
  }
  toString(): string {
    return `Decide(${this.i}, ${this.to}, by=${this.by}, note=${JSON.stringify(this.note)})`;
  }
}

/** An approval and a denial of one item at once, by two reviewers: at most one wins (SPEC §6). */
class RaceDecide implements Cmd {
  constructor(readonly i: number) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const req = m.requests[this.i % m.requests.length]!;
    const [ok, no] = await Promise.all([
      decide(r, req.id, 'approve', r.s.reviewerKey, null),
      decide(r, req.id, 'deny', ADMIN_KEY, 'racing'),
    ]);
    const approveRefused = decideRefusal(m, r, req, 'approve');
    const denyRefused = decideRefusal(m, r, req, 'deny');
    if (denyRefused) {
      // Not pending (or no item): both are refused alike.
      expectError(ok!, denyRefused[0], denyRefused[1]);
      expectError(no!, denyRefused[0], denyRefused[1]);
      return;
    }
    const winners = [ok!, no!].filter((x) => x.status === 200).length;
    expect(winners, `one winner: ${ok!.text} / ${no!.text}`).to.equal(1);
    if (ok!.status === 200) {
      expectError(no!, 409, /already approved/);
      applyDecide(m, r, req, 'approve', 'stateful-reviewer', null, ok!);
    } else {
      // An approval the budget refuses may also come after the denial (either is the truth).
      expectError(ok!, 409, approveRefused ? /^budget exhausted|already denied/ : /already denied/);
      applyDecide(m, r, req, 'deny', 'admin', 'racing', no!);
    }
  }
  toString(): string {
    return `RaceDecide(${this.i})`;
  }
}

/** A long-poll on a pending item while a reviewer denies it: the wait answers the denial (SPEC §6). */
class WaitDecided implements Cmd {
  constructor(readonly i: number) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.some((q) => q.item?.state === 'pending');
  }
  async run(m: Model, r: Real): Promise<void> {
    const pending = m.requests.filter((q) => q.item?.state === 'pending');
    const req = pending[this.i % pending.length]!;
    const wait = call('GET', `${r.s.a.engine}/v1/queue/${req.id}?wait=30`, { key: r.s.reviewerKey });
    const res = await decide(r, req.id, 'deny', ADMIN_KEY, null);
    applyDecide(m, r, req, 'deny', 'admin', null, res);
    const waited = await wait;
    expect(waited.status, waited.text).to.equal(200);
    expect(waited.json).to.include({ id: req.id, status: 'denied', decided_by: 'admin' });
  }
  toString(): string {
    return `WaitDecided(${this.i})`;
  }
}

class GetItem implements Cmd {
  constructor(readonly i: number) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    const req = m.requests[this.i % m.requests.length]!;
    const res = await call('GET', `${r.s.a.engine}/v1/queue/${req.id}`, { key: r.s.reviewerKey });
    const item = req.item;
    if (!item) {
      expectError(res, 404);
      return;
    }
    expect(res.status, res.text).to.equal(200);
    expect(res.json.status).to.equal(item.state);
    expect(res.json.decided_by).to.equal(item.decidedBy ?? null);
  }
  toString(): string {
    return `GetItem(${this.i})`;
  }
}

class ListPending implements Cmd {
  check(): boolean {
    return true;
  }
  async run(m: Model, r: Real): Promise<void> {
    const res = await call(
      'GET',
      `${r.s.a.engine}/v1/queue/pending?agent_id=${encodeURIComponent(r.agentId)}&limit=1000`,
      { key: r.s.reviewerKey },
    );
    expect(res.status, res.text).to.equal(200);
    const want = m.requests.filter((q) => q.item?.state === 'pending').map((q) => q.id);
    expect((res.json.items as { id: string }[]).map((it) => it.id)).to.deep.equal(want);
  }
  toString(): string {
    return 'ListPending';
  }
}

/** Steps the server's wall clock one hour forward. */
class Jump implements Cmd {
  check(m: Readonly<Model>): boolean {
    return m.epoch < MAX_JUMPS;
  }
  async run(m: Model, r: Real): Promise<void> {
    const stepped = () => r.s.a.logs.filter((l) => /wall clock stepped/.test(l)).length;
    const before = stepped();
    process.kill(r.s.a.pid!, 'SIGUSR2');
    for (let i = 0; i < 200 && stepped() === before; i++) await sleep(25);
    expect(stepped(), 'the server logged its clock step').to.equal(before + 1);
    r.s.jumps++;
    tally('jump');
    m.epoch++;
    for (const q of m.requests) {
      if (q.item?.state === 'pending' && m.epoch - q.item.epoch >= ITEM_LIVES) {
        q.item.state = 'expired';
        m.events.push(ev('queue.expire', q.id, 'expired'));
      }
    }
  }
  toString(): string {
    return 'Jump(+1h)';
  }
}

/** Why the model refuses to exchange `req` for a token now: [status, message], or undefined. */
function mintRefusal(m: Model, req: Req, by: 'agent' | 'admin'): [number, RegExp?] | undefined {
  if (by === 'agent' && m.keyRevoked) return [401];
  if (req.outcome === 'deny') return [403, /was denied/];
  const item = req.item;
  if (item?.state === 'pending') return [409, /still pending/];
  if (item && item.state !== 'approved') return [403, new RegExp(`was ${item.state}, not approved`)];
  if (req.grantedEpoch !== m.epoch) return [403, /granted more than/];
  if (req.exchanged) return [409, /already exchanged/];
  return undefined;
}

const mint = (r: Real, req: Req, by: 'agent' | 'admin', ttl: number | undefined) =>
  call('POST', `${r.s.a.engine}/v1/tokens/mint`, {
    key: by === 'agent' ? r.agentKey : ADMIN_KEY,
    body: { request_id: req.id, ...(ttl === undefined ? {} : { ttl_seconds: ttl }) },
  });

function expectRefusal(res: Response, [status, message]: [number, RegExp?]): void {
  tally(`mint refused ${status}${message ? ` ${message.source}` : ''}`);
  if (status === 401) expectUnauthenticated(res);
  else expectError(res, status, message);
}

/** Records a token the server minted (checked against the answer). */
function applyMint(
  m: Model,
  r: Real,
  req: Req,
  by: 'agent' | 'admin',
  ttl: number | undefined,
  res: Response,
): void {
  tally('mint ok');
  expect(res.status, res.text).to.equal(201);
  const scope = `${req.body.action}:${req.body.resource}`;
  expect(res.json).to.include({ token_type: 'Bearer', subject: r.agentId });
  expect(res.json.scopes).to.deep.equal([scope]);
  req.exchanged = true;
  m.tokens.push({
    token: res.json.token as string,
    tokenId: res.json.token_id as string,
    requestId: req.id,
    scope,
    by,
    epoch: m.epoch,
    lives: ttl === LONG_TTL ? ITEM_LIVES : 1,
    revoked: false,
  });
  m.events.push(ev('token.mint', req.id, 'minted'));
}

class Mint implements Cmd {
  constructor(
    readonly i: number,
    readonly by: 'agent' | 'admin',
    readonly ttl: number | undefined,
  ) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    const req = m.requests[this.i % m.requests.length]!;
    const res = await mint(r, req, this.by, this.ttl);
    const refused = mintRefusal(m, req, this.by);
    if (refused) return expectRefusal(res, refused);
    applyMint(m, r, req, this.by, this.ttl, res);
  }
  toString(): string {
    return `Mint(${this.i}, by=${this.by}, ttl=${this.ttl})`;
  }
}

/** Two exchanges of one request at once (the agent's key and admin): at most one token (SPEC §7). */
class RaceMint implements Cmd {
  constructor(readonly i: number) {}
  check(m: Readonly<Model>): boolean {
    return m.requests.length > 0 && !m.keyRevoked;
  }
  async run(m: Model, r: Real): Promise<void> {
    const req = m.requests[this.i % m.requests.length]!;
    const [x, y] = await Promise.all([mint(r, req, 'agent', undefined), mint(r, req, 'admin', undefined)]);
    const refused = mintRefusal(m, req, 'agent');
    if (refused) {
      expectRefusal(x!, refused);
      expectRefusal(y!, refused);
      return;
    }
    expect([x!, y!].filter((z) => z.status === 201).length, `one token: ${x!.text} / ${y!.text}`).to.equal(1);
    const [won, lost] = x!.status === 201 ? [x!, y!] : [y!, x!];
    expectError(lost, 409, /already exchanged/);
    applyMint(m, r, req, won === x ? 'agent' : 'admin', undefined, won);
  }
  toString(): string {
    return `RaceMint(${this.i})`;
  }
}

const tokenActive = (m: Model, t: Tok) => !t.revoked && m.epoch - t.epoch < t.lives;

class Introspect implements Cmd {
  constructor(readonly j: number) {}
  check(m: Readonly<Model>): boolean {
    return m.tokens.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    const t = m.tokens[this.j % m.tokens.length]!;
    const res = await call('POST', `${r.s.a.engine}/v1/tokens/introspect`, {
      key: r.s.reviewerKey,
      body: { token: t.token },
    });
    expect(res.status, res.text).to.equal(200);
    tally('introspect ' + tokenActive(m, t));
    if (!tokenActive(m, t)) {
      expect(res.json).to.deep.equal({ active: false });
      return;
    }
    expect(res.json).to.include({ active: true, scope: t.scope, sub: r.agentId, request_id: t.requestId });
  }
  toString(): string {
    return `Introspect(${this.j})`;
  }
}

class RevokeToken implements Cmd {
  constructor(readonly j: number | 'unknown') {}
  check(m: Readonly<Model>): boolean {
    return this.j === 'unknown' || m.tokens.length > 0;
  }
  async run(m: Model, r: Real): Promise<void> {
    const t = this.j === 'unknown' ? undefined : m.tokens[this.j % m.tokens.length]!;
    const id = t?.tokenId ?? '01900000-0000-7000-8000-000000000000';
    const res = await call('DELETE', `${r.s.a.engine}/v1/tokens/${id}`, { key: r.s.reviewerKey });
    if (!t) {
      expectError(res, 404);
      return;
    }
    expect(res.status, res.text).to.equal(200);
    expect(res.json).to.include({ token_id: t.tokenId, revoked: true });
    if (t.revokedAt !== undefined) expect(res.json.revoked_at).to.equal(t.revokedAt);
    t.revokedAt = res.json.revoked_at as string;
    if (!t.revoked) {
      t.revoked = true;
      m.events.push(ev('token.revoke', t.requestId, 'revoked'));
    }
  }
  toString(): string {
    return `RevokeToken(${this.j})`;
  }
}

/** `arbiter keys revoke` of the sequence's agent key: it and the live tokens it minted are done. */
class RevokeKey implements Cmd {
  check(m: Readonly<Model>): boolean {
    return !m.keyRevoked;
  }
  async run(m: Model, r: Real): Promise<void> {
    // The CLI runs on the server's (stepped) clock, as an operator's CLI on the server's machine
    // would: whether a token has expired is read on the revoking process's clock.
    const out = runSync(['keys', 'revoke', r.keyName], {
      ...r.s.a.fullEnv(),
      TEST_CLOCK_OFFSET_MS: String(r.s.jumps * HOUR),
    });
    expect(out.code, out.stderr).to.equal(0);
    tally('revoke key');
    m.keyRevoked = true;
    for (const t of m.tokens) {
      if (t.by === 'agent' && tokenActive(m, t)) {
        t.revoked = true;
        m.events.push(ev('token.revoke', t.requestId, 'revoked'));
      }
    }
    m.events.push(ev('key.revoke', r.keyName, 'success'));
  }
  toString(): string {
    return 'RevokeKey';
  }
}

class Limits implements Cmd {
  check(): boolean {
    return true;
  }
  async run(m: Model, r: Real): Promise<void> {
    await clearOfWindowEdge(r.s);
    const key = `stateful:${r.agentId}`;
    const res = await call('GET', `${r.s.a.platform}/api/v1/limits?key=${encodeURIComponent(key)}`);
    expect(res.status, res.text).to.equal(200);
    const limits = res.json.limits as { window: string; used: number; max: number }[];
    if (!m.charged) {
      expect(limits).to.deep.equal([]);
      return;
    }
    expect(limits.map((l) => ({ window: l.window, used: l.used, max: l.max }))).to.deep.equal([
      { window: '1h', used: used(m, r.s), max: BUDGET_MAX },
    ]);
  }
  toString(): string {
    return 'Limits';
  }
}

const specArb: fc.Arbitrary<Spec> = fc.record({
  action: fc.constantFrom<Spec['action']>(
    'read',
    'read',
    'read',
    'pay',
    'pay',
    'pay',
    'deploy',
    'deploy',
    'delete',
    'write',
  ),
  resource: fc.nat(3),
  confidence: fc.constantFrom(0.3, 0.5, 0.7, 0.9, 0.95, 0.95, 0.99),
  amount: fc.constantFrom(1, 2),
  obo: fc.constantFrom<Spec['obo']>(null, null, null, null, null, 'alice', 'carol', 'bob', 'dave'),
});
const idx = fc.nat(50);

const Auth = fc.constantFrom('none', 'fresh', 'fresh', 'spare') as fc.Arbitrary<'none' | 'fresh' | 'spare'>;
const To = fc.constantFrom('approve', 'deny') as fc.Arbitrary<'approve' | 'deny'>;
const Variant = fc.constantFrom('same', 'permuted', 'changed', 'platform', 'human') as fc.Arbitrary<
  'same' | 'permuted' | 'changed' | 'platform' | 'human'
>;
const By = fc.constantFrom('reviewer', 'reviewer', 'reviewer', 'self') as fc.Arbitrary<'reviewer' | 'self'>;
const Minter = fc.constantFrom('agent', 'agent', 'admin') as fc.Arbitrary<'agent' | 'admin'>;

/** One command, weighted so that a sequence mostly decides, reviews and mints. */
const command: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 16, arbitrary: fc.tuple(specArb, Auth).map(([s, i]): Cmd => new Authorize(s, i)) },
  {
    weight: 2,
    arbitrary: fc
      .tuple(specArb, fc.integer({ min: 2, max: 4 }))
      .map(([s, n]): Cmd => new Authorize(s, 'fresh', n)),
  },
  { weight: 3, arbitrary: specArb.map((s): Cmd => new AuthzenEvaluation(s)) },
  {
    weight: 2,
    arbitrary: fc
      .tuple(fc.integer({ min: 2, max: 5 }), fc.constantFrom(1, 2))
      .map(([n, amount]): Cmd => new Burst(n, amount)),
  },
  { weight: 6, arbitrary: fc.tuple(idx, Variant).map(([i, v]): Cmd => new Retry(i, v)) },
  { weight: 2, arbitrary: fc.boolean().map((k): Cmd => new Invalid(k)) },
  {
    weight: 10,
    arbitrary: fc
      .tuple(idx, To, By, fc.constantFrom(null, 'ok', 'looks fine'))
      .map(([i, to, by, note]): Cmd => new Decide(i, to, by, note)),
  },
  { weight: 2, arbitrary: idx.map((i): Cmd => new RaceDecide(i)) },
  { weight: 2, arbitrary: idx.map((i): Cmd => new RaceMint(i)) },
  { weight: 3, arbitrary: idx.map((i): Cmd => new GetItem(i)) },
  { weight: 1, arbitrary: idx.map((i): Cmd => new WaitDecided(i)) },
  { weight: 2, arbitrary: fc.constant<Cmd>(new ListPending()) },
  { weight: 2, arbitrary: fc.constant<Cmd>(new Jump()) },
  {
    weight: 8,
    arbitrary: fc
      .tuple(idx, Minter, fc.constantFrom(undefined, 120, 1800, LONG_TTL))
      .map(([i, by, ttl]): Cmd => new Mint(i, by, ttl)),
  },
  { weight: 5, arbitrary: idx.map((j): Cmd => new Introspect(j)) },
  {
    weight: 3,
    arbitrary: fc.oneof(idx, fc.constant('unknown' as const)).map((j): Cmd => new RevokeToken(j)),
  },
  { weight: 1, arbitrary: fc.constant<Cmd>(new RevokeKey()) },
  { weight: 2, arbitrary: fc.constant<Cmd>(new Limits()) },
);

/**
 * ARBITER_STATEFUL_REPLAY: the `path` a failure printed, and ARBITER_STATEFUL_REPLAY_COMMANDS the
 * `replayPath` in its counterexample's comment: with the same seed, they run the shrunk sequence
 * again, at once.
 */
const REPLAY = process.env.ARBITER_STATEFUL_REPLAY || undefined;
const REPLAY_COMMANDS = process.env.ARBITER_STATEFUL_REPLAY_COMMANDS || undefined;

const commands = fc.commands([command], {
  maxCommands: MAX_COMMANDS,
  size: 'max',
  replayPath: REPLAY_COMMANDS,
});

/** Every audit event appended after `baseline`, newest first. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- audit events are read as plain JSON
async function eventsSince(platform: string, baseline: string | null): Promise<any[]> {
  const out: unknown[] = [];
  let cursor: string | null = null;
  for (;;) {
    const q = new URLSearchParams({ limit: '200', ...(cursor ? { cursor } : {}) });
    const r = await call('GET', `${platform}/api/v1/audit?${q}`);
    expect(r.status, r.text).to.equal(200);
    for (const e of r.json.events as { id: string }[]) {
      if (e.id === baseline) return out as never[];
      out.push(e);
    }
    cursor = r.json.next_cursor as string | null;
    if (cursor === null) {
      expect(baseline, 'the baseline event is still in the trail').to.equal(null);
      return out as never[];
    }
  }
}

async function newestEvent(platform: string): Promise<string | null> {
  const r = await call('GET', `${platform}/api/v1/audit?limit=1`);
  expect(r.status, r.text).to.equal(200);
  return (r.json.events[0]?.id as string | undefined) ?? null;
}

async function setup(s: Server): Promise<{ model: Model; real: Real }> {
  const n = ++s.runs;
  const agentId = `sm-${n}-${randomUUID().slice(0, 8)}`;
  const keyName = `stateful-agent-${agentId}`;
  const agentKey = s.a.createKey(keyName, ['authorize', 'tokens:mint', 'queue:read', 'queue:review']);
  const baseline = await newestEvent(s.a.platform);
  return {
    model: {
      epoch: 0,
      keyRevoked: false,
      requests: [],
      idem: [],
      spareKeys: [],
      tokens: [],
      budget: new Map(),
      charged: false,
      events: [],
    },
    real: { s, agentId, keyName, agentKey, baseline },
  };
}

/** After a sequence: the queue per state, the audit trail and its chain. */
async function finalChecks(m: Model, r: Real): Promise<void> {
  const a = r.s.a;
  for (const state of ['expired', 'approved', 'denied', 'pending'] as const) {
    const res = await call(
      'GET',
      `${a.engine}/v1/queue?status=${state}&agent_id=${encodeURIComponent(r.agentId)}&limit=1000`,
      { key: r.s.reviewerKey },
    );
    expect(res.status, res.text).to.equal(200);
    const got = (res.json.items as { id: string }[]).map((it) => it.id).sort();
    const want = m.requests
      .filter((q) => q.item?.state === state)
      .map((q) => q.id)
      .sort();
    expect(got, `${state} items`).to.deep.equal(want);
  }
  const events = await eventsSince(a.platform, r.baseline);
  const mine = events.filter(
    (e) => e.agent_id === r.agentId || (e.kind === 'key.revoke' && e.resource === r.keyName),
  );
  const got = mine
    .map((e) =>
      ev(
        e.kind as string,
        e.kind === 'key.revoke' ? r.keyName : (e.request_id as string),
        e.outcome as string,
      ),
    )
    .sort();
  expect(got, `the audit events of the sequence: ${JSON.stringify(got)}`).to.deep.equal([...m.events].sort());
  // Every event of a request's flow carries the trace id its decision answered (SPEC §3).
  const byId = new Map(m.requests.map((q) => [q.id, q]));
  for (const e of mine) {
    const q = byId.get(e.request_id as string);
    if (q) expect(e.trace_id, `trace of ${e.kind} ${q.id}`).to.equal(q.traceId);
  }
  // An item's own trail (GET /v1/queue/{id}/events) holds its decision, transitions and tokens.
  for (const q of m.requests.filter((x) => x.item)) {
    const res = await call('GET', `${a.engine}/v1/queue/${q.id}/events?limit=1000`, { key: r.s.reviewerKey });
    expect(res.status, res.text).to.equal(200);
    const trail = (res.json.events as { kind: string; request_id: string; outcome: string }[])
      .map((e) => ev(e.kind, e.request_id, e.outcome))
      .sort();
    expect(trail, `the trail of ${q.id}`).to.deep.equal(
      m.events.filter((x) => x.includes(` ${q.id} `)).sort(),
    );
  }
  // Others' events in the window: only expirations of earlier sequences' items, recorded late.
  const others = events.filter((e) => !mine.includes(e)).map((e) => `${e.kind} ${e.agent_id}`);
  for (const o of others) expect(o, 'an event of no sequence').to.match(/^queue\.expire sm-/);
  const v = await call('GET', `${a.platform}/api/v1/audit/verify`);
  expect(v.status, v.text).to.equal(200);
  expect(v.json.ok, v.text).to.equal(true);
}

onEveryBackend('stateful contract: random sequences against a model (SPEC §5–8, §13)', function () {
  // Long runs (ARBITER_STATEFUL_RUNS) take about 2 s per sequence.
  this.timeout(Math.max(600_000, RUNS * 10_000));
  let dir: string;
  let s: Server;
  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-stateful-'));
    writeFileSync(path.join(dir, 'agent.rego'), AGENT_REGO);
    writeFileSync(path.join(dir, 'human.rego'), HUMAN_REGO);
    const a = await Arbiter.start({
      ARBITER_POLICY_DIR: dir,
      NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'skew-clock.mjs')}`,
      TEST_CLOCK_JUMP_MS: String(HOUR),
      ARBITER_QUEUE_TTL_SECONDS: String(LONG_TTL),
      ARBITER_TOKEN_MAX_TTL_SECONDS: String(LONG_TTL),
    });
    s = {
      a,
      reviewerKey: a.createKey('stateful-reviewer', [
        'queue:read',
        'queue:review',
        'tokens:read',
        'tokens:revoke',
      ]),
      jumps: 0,
      runs: 0,
    };
  });
  after(async () => {
    if (process.env.ARBITER_STATEFUL_STATS === '1') console.log(Object.fromEntries(TALLY));
    await s?.a.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it(`answers every command of ${RUNS} random sequences as the model does (seed ${SEED})`, async () => {
    await fc.assert(
      fc.asyncProperty(commands, async (cmds) => {
        const env = await setup(s);
        await fc.asyncModelRun(() => Promise.resolve(env), cmds);
        await finalChecks(env.model, env.real);
      }),
      { numRuns: RUNS, seed: SEED, verbose: 1, ...(REPLAY ? { path: REPLAY } : {}) },
    );
  });
});
