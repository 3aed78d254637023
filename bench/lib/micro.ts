// In-process micro-benchmarks against the compiled service code (dist/src): one policy
// evaluation, one durable audit append, one token mint and one introspection.
import { cpSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { loadConfig } from '../../src/config.js';
import { BudgetService } from '../../src/decisions/budgets.js';
import { DecisionService } from '../../src/decisions/service.js';
import { RegoCompiler } from '../../src/policy/compiler.js';
import { Evaluator } from '../../src/policy/evaluator.js';
import { dataTree } from '../../src/policy/documents.js';
import { readPolicyDir } from '../../src/policy/policy-dir.js';
import { PolicyService } from '../../src/policy/service.js';
import { openDatabase } from '../../src/storage/sqlite/db.js';
import { sqliteStores } from '../../src/storage/sqlite/index.js';
import { QueueService } from '../../src/queue/service.js';
import { TokenService } from '../../src/tokens/service.js';
import { SigningKeyService } from '../../src/tokens/signing-keys.js';
import { ADMIN_PRINCIPAL } from '../../src/keys/service.js';
import { newId, newTraceId } from '../../src/ids.js';
import { KINDS, MIX, policyInput, round, type Kind } from './load.js';
import { opaBin, POLICY_DIR, tempDir } from './targets.js';

export interface Timing {
  n: number;
  p50: number;
  p99: number;
  mean: number;
  max: number;
  /** Operations per second over the timed loop (including the timer overhead). */
  perSecond: number;
}

/** Percentiles of per-operation times given in nanoseconds, reported in microseconds. */
function timing(ns: Float64Array, totalNs: number): Timing {
  const s = Float64Array.from(ns).sort();
  const at = (q: number) => (s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)] as number) / 1000;
  let sum = 0;
  for (const v of s) sum += v;
  return {
    n: s.length,
    p50: round(at(0.5), 2),
    p99: round(at(0.99), 2),
    mean: round(sum / s.length / 1000, 2),
    max: round((s[s.length - 1] ?? 0) / 1000, 2),
    perSecond: round((s.length * 1e9) / totalNs, 0),
  };
}

async function timeAsync(n: number, fn: (i: number) => Promise<unknown>): Promise<Timing> {
  const ns = new Float64Array(n);
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const a = process.hrtime.bigint();
    await fn(i);
    ns[i] = Number(process.hrtime.bigint() - a);
  }
  return timing(ns, Number(process.hrtime.bigint() - t0));
}

export interface EvalResult extends Timing {
  warmup: number;
  byKind: Record<Kind, { p50: number; p99: number }>;
}

/** (a) One in-process evaluation of the example set, over the request mix. */
export async function benchEvaluation(n = 100_000, warmup = 10_000): Promise<EvalResult> {
  const compiler = new RegoCompiler(opaBin());
  await compiler.init();
  let evaluator: Evaluator;
  try {
    const { modules, data } = await readPolicyDir(POLICY_DIR);
    const wasm = await compiler.compile(modules);
    evaluator = await Evaluator.create(wasm, dataTree(data), 1, 250);
  } finally {
    await compiler.close();
  }
  const inputs = MIX.map((k) => policyInput(k));
  for (let i = 0; i < inputs.length; i++) {
    const kind = MIX[i] as Kind;
    const got = evaluator.evaluate(inputs[i]).status;
    if (got !== KINDS[kind].status) {
      throw new Error(`in-process evaluation of ${kind} answered ${got}, expected ${KINDS[kind].status}`);
    }
  }
  for (let i = 0; i < warmup; i++) evaluator.evaluate(inputs[i % inputs.length]);
  const ns = new Float64Array(n);
  const kindNs = Object.fromEntries(Object.keys(KINDS).map((k) => [k, [] as number[]])) as Record<
    Kind,
    number[]
  >;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const j = i % inputs.length;
    const a = process.hrtime.bigint();
    evaluator.evaluate(inputs[j]);
    const d = Number(process.hrtime.bigint() - a);
    ns[i] = d;
    kindNs[MIX[j] as Kind].push(d);
  }
  const total = Number(process.hrtime.bigint() - t0);
  const byKind = Object.fromEntries(
    Object.entries(kindNs).map(([k, v]) => {
      const t = timing(Float64Array.from(v), 1);
      return [k, { p50: t.p50, p99: t.p99 }];
    }),
  ) as Record<Kind, { p50: number; p99: number }>;
  return { ...timing(ns, total), warmup, byKind };
}

/** (b) One single-event audit append on a fresh SQLite file with the default sync (FULL). */
export async function benchAuditAppend(n = 20_000): Promise<Timing & { sync: 'full' }> {
  const db = openDatabase(tempDir('arbiter-bench-audit-'), 'full');
  const stores = sqliteStores(db);
  try {
    const event = (i: number) => ({
      kind: 'decision',
      time: new Date().toISOString(),
      trace_id: newTraceId(),
      request_id: newId(),
      actor: 'bench',
      agent_id: 'deploy-bot',
      action: 'read',
      resource: 'repo/arbiter',
      outcome: 'allow',
      message: 'allowed',
      confidence: 0.95,
      policy_revision: 1,
      latency_us: 12,
      details: { subject_kind: 'agent', reasons: [], context: {}, i },
    });
    for (let i = 0; i < 200; i++) await stores.audit.append([event(i)]);
    return { ...(await timeAsync(n, (i) => stores.audit.append([event(i)]))), sync: 'full' };
  } finally {
    await stores.close();
  }
}

/** (c) Token mint (free-form, admin) and introspection, wired as src/app.ts wires them. */
export async function benchTokens(
  mints = 2_000,
  introspections = 10_000,
): Promise<{ mint: Timing; introspect: Timing }> {
  const stores = sqliteStores(openDatabase(tempDir('arbiter-bench-tokens-'), 'full'));
  try {
    const { maxLongPolls, maxLongPollsPerKey } = loadConfig({});
    const queue = new QueueService(
      stores.queue,
      { transitioned: () => undefined },
      { maxLongPolls, maxLongPollsPerKey },
    );
    const tokens = new TokenService(
      stores.tokens,
      stores.decisions,
      queue,
      { issuer: 'arbiter', defaultTtlSeconds: 300, maxTtlSeconds: 3600, exchangeWindowSeconds: 300 },
      { minted: () => undefined, revoked: () => undefined },
      new SigningKeyService(stores.tokens),
    );
    await tokens.init();
    const minted: string[] = [];
    const mintBody = { subject: 'deploy-bot', scopes: ['read:repo/arbiter'] };
    for (let i = 0; i < 100; i++) await tokens.mint(mintBody, ADMIN_PRINCIPAL, newTraceId());
    const mint = await timeAsync(mints, async () => {
      minted.push((await tokens.mint(mintBody, ADMIN_PRINCIPAL, newTraceId())).token);
    });
    const first = await tokens.introspect({ token: minted[0] }, ADMIN_PRINCIPAL);
    if (first.active !== true) throw new Error('a freshly minted token introspects as inactive');
    for (let i = 0; i < 500; i++)
      await tokens.introspect({ token: minted[i % minted.length] }, ADMIN_PRINCIPAL);
    const introspect = await timeAsync(introspections, (i) =>
      tokens.introspect({ token: minted[i % minted.length] }, ADMIN_PRINCIPAL),
    );
    return { mint, introspect };
  } finally {
    await stores.close();
  }
}

/**
 * (d) What budgets cost a decision: the whole decide path (validate, evaluate the example set,
 * record the decision with its audit event through group commit) for the same request, an invoice
 * payment by finance-bot, against the example set without and with policies/budgets.rego (which
 * declares two limits for it), interleaved in rounds. SQLite with synchronous=NORMAL, so that the
 * fsync does not drown the difference.
 */
export async function benchDecideLimits(
  n = 5_000,
  rounds = 5,
): Promise<{ withoutLimits: Timing; withLimits: Timing }> {
  const compiler = new RegoCompiler(opaBin());
  await compiler.init();
  const opened: { close(): Promise<void> }[] = [];
  /** A decision service over a copy of the example set, with or without its budgets. */
  const service = async (budgets: boolean) => {
    const dir = tempDir('arbiter-bench-limits-policies-');
    cpSync(POLICY_DIR, dir, { recursive: true });
    if (budgets) {
      // Budgets that never run out during the run: the charge is timed, not the deny.
      const dataFile = path.join(dir, 'data.json');
      const doc = JSON.parse(readFileSync(dataFile, 'utf8')) as Record<string, unknown>;
      doc.budgets = { invoice_payments_per_day: 1e9, invoice_spend_per_day: 1e9 };
      writeFileSync(dataFile, JSON.stringify(doc));
    } else {
      rmSync(path.join(dir, 'budgets.rego'));
    }
    const stores = sqliteStores(openDatabase(tempDir('arbiter-bench-limits-'), 'normal'));
    opened.push(stores);
    const policies = new PolicyService(
      stores.policies,
      compiler,
      250,
      { compiled: () => undefined, revision: () => undefined },
      { inline: true, paired: true },
    );
    opened.push(policies);
    await policies.start(dir, { actor: 'bench', traceId: newTraceId(), requestId: newId() });
    return new DecisionService(
      policies,
      stores.decisions,
      3600,
      (d) => d,
      { decided: () => undefined },
      65536,
      // No cap on pending approvals: the bench floods one key's queue by design (docs/performance.md).
      0,
    );
  };
  try {
    const plain = await service(false);
    const limited = await service(true);
    const body = {
      agent_id: 'finance-bot',
      action: 'invoices.pay',
      resource: 'invoices/i-1',
      confidence: 0.95,
      context: { amount: 1 },
    };
    const decide = async (decisions: DecisionService) => {
      const ids = { requestId: newId(), traceId: newTraceId() };
      const r = await decisions.authorizeAgent(body, ADMIN_PRINCIPAL, ids);
      if (r.decision.status !== 'allow') throw new Error(`bench decision answered ${r.decision.status}`);
    };
    for (let i = 0; i < 500; i++) await decide(i % 2 ? plain : limited);
    const per = Math.ceil(n / rounds);
    const times = [new Float64Array(per * rounds), new Float64Array(per * rounds)] as const;
    const totals = [0, 0];
    for (let r = 0; r < rounds; r++) {
      for (const [k, decisions] of [plain, limited].entries()) {
        const t0 = process.hrtime.bigint();
        for (let i = 0; i < per; i++) {
          const s = process.hrtime.bigint();
          await decide(decisions);
          times[k as 0 | 1][r * per + i] = Number(process.hrtime.bigint() - s);
        }
        totals[k]! += Number(process.hrtime.bigint() - t0);
      }
    }
    return { withoutLimits: timing(times[0], totals[0]!), withLimits: timing(times[1], totals[1]!) };
  } finally {
    await compiler.close();
    for (const s of opened) await s.close();
  }
}

/**
 * The budget counter sweep (BudgetService.sweep, ADR 0009) over a table of `keys` keys with
 * `windows` hourly windows each, all but the newest superseded, in a durable SQLite database
 * (synchronous=FULL, as served): how long it takes, and the longest the event loop waited meanwhile
 * (decisions on SQLite would wait as long).
 */
export async function benchCounterSweep(
  keys = 100_000,
  windows = 5,
): Promise<{ rows: number; deleted: number; ms: number; loopMaxMs: number }> {
  const db = openDatabase(tempDir('arbiter-bench-sweep-'), 'full');
  const stores = sqliteStores(db);
  try {
    const hour = 3_600_000;
    const now = Date.now();
    const insert = db.prepare(
      `INSERT INTO limit_counters (key, window_ms, window_start, window, max, used) VALUES (?, ?, ?, '1h', 10, 1)`,
    );
    db.transaction(() => {
      for (let k = 0; k < keys; k++) {
        for (let w = windows; w >= 1; w--) {
          insert.run(
            `user-${k}`,
            hour,
            new Date(Math.floor(now / hour) * hour - (w - 1) * hour).toISOString(),
          );
        }
      }
    })();
    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    const t0 = process.hrtime.bigint();
    const deleted = await new BudgetService(stores.limits, () => now + 2 * hour).sweep();
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    loop.disable();
    return { rows: keys * windows, deleted, ms: round(ms, 0), loopMaxMs: round(loop.max / 1e6, 1) };
  } finally {
    await stores.close();
  }
}
