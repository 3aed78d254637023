/**
 * Shadow-mode benchmark (SPEC §11): the same decision load against the real service without and
 * then with a shadow set (every decision is also evaluated against the candidate set and the
 * comparison recorded), in interleaved rounds; reports latency and throughput of each.
 *
 *   npm run bench:shadow -- [--requests 4000] [--concurrency 16] [--rounds 3]
 *                           [--duration 8]   (then autocannon runs too: 32 connections, and 1 000/s)
 *                           [--warmup 3] [--candidate add-deny|edit-rule|agree|none] [--paired false]
 *                           [--inprocess 30000]
 *
 * The first load is a closed loop from this process (fetch, 16 at a time): its throughput follows
 * latency. In each round's run with the shadow set, the first --requests decisions after the
 * shadow PUT are timed apart ("first after the change": the set proving itself on its thread and
 * its paired module compiling, ADR 0010 and 0012, a cost paid once per change); then the load
 * goes on until the set is evaluated where it will stay (paired, or inline with --paired false)
 * and a paired set's first answers have been checked against the two sets apart
 * (PAIR_CHECKED_DECISIONS); only then is the run compared with the run without a set timed.
 *
 * With --duration, the scenario load of `npm run bench` (autocannon, its request mix) also runs
 * at saturation and at a fixed 1 000 req/s, with and without the shadow set, each configuration
 * after --warmup seconds of unrecorded load: a shadow set is a standing thing, and what it costs
 * once it stands is measured, not its first seconds (on its own thread while it proves itself,
 * its paired module compiling: docs/adr/0010, 0012). Each row says where the set
 * was evaluated at its start and end, how often a slow evaluation sent it back to its thread or
 * was found quick there (kept), and the CPU per decision of the serving and the writer thread.
 * `--paired false` sets ARBITER_SHADOW_PAIRED=false: the set evaluated apart, as before ADR 0012.
 * First, unless `--inprocess 0`, the evaluation alone is timed in this process (lib/paired-micro.ts):
 * the live set, the two sets apart and their paired pass, `--inprocess` calls each, 4 runs; then
 * the serving and the writer part of the whole decision path, without and with the shadow set
 * (lib/decision-micro.ts), a third as many decisions each, 12 rounds: the CPU per decision that
 * the HTTP rounds below measure per thread, without HTTP, the load generator and their noise.
 *
 * Within a round the two configurations run in turn, and the order alternates from round to round
 * (without → with, then with → without): every run appends to the same database and heap, so a
 * fixed order would charge the later configuration with whatever grows (the audit table, the
 * WAL, the heap) and call it the shadow set's cost. `--candidate none` is the control: the "with"
 * runs put no shadow set at all, so what it reports is the bench's own spread and bias.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { arbiterSpec, runLoad, type LoadResult } from './lib/load.js';
import { byLabel, plain, scrape } from './lib/metrics.js';
import { decisionMicro, type DecisionMicro } from './lib/decision-micro.js';
import { pairedMicro, type PairedMicro } from './lib/paired-micro.js';
import { processCpuSeconds, stopAll } from './lib/proc.js';
import { ADMIN_KEY, removeTempDirs, REPO, startArbiter } from './lib/targets.js';
import { PAIR_CHECKED_DECISIONS } from '../src/policy/shadow-limits.js';

const { values } = parseArgs({
  options: {
    requests: { type: 'string', default: '4000' },
    concurrency: { type: 'string', default: '16' },
    rounds: { type: 'string', default: '3' },
    duration: { type: 'string' },
    warmup: { type: 'string', default: '3' },
    candidate: { type: 'string', default: 'add-deny' },
    paired: { type: 'string', default: 'true' },
    inprocess: { type: 'string', default: '30000' },
  },
});
const warmup = Number(values.warmup);
const duration = values.duration === undefined ? undefined : Number(values.duration);
const requests = Number(values.requests);
const concurrency = Number(values.concurrency);
const rounds = Number(values.rounds);

/**
 * The candidate. `add-deny` (the default): one more deny rule, so that a share of decisions
 * disagree (every read: 70% of the autocannon mix). `edit-rule`: the example agent.rego with one
 * require_approval rule's message changed (a change to a rule every decision evaluates; the
 * deploys disagree). `agree`: a deny rule that never holds.
 */
const CANDIDATES: Record<string, { name: string; rego: () => string }> = {
  'add-deny': {
    name: 'bench-candidate',
    rego: () => 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n',
  },
  'edit-rule': {
    name: 'agent',
    rego: () =>
      readFileSync(path.join(REPO, 'policies', 'agent.rego'), 'utf8').replace(
        'require_approval contains "deploy to production requires approval"',
        'require_approval contains "deploy to prod needs approval"',
      ),
  },
  agree: {
    name: 'bench-candidate',
    rego: () => 'package authz.agent\n\ndeny contains "never" if input.action == "never-sent"\n',
  },
};
const control = values.candidate === 'none';
const candidate = control ? undefined : CANDIDATES[values.candidate];
if (!control && !candidate) {
  throw new Error(`--candidate: one of ${[...Object.keys(CANDIDATES), 'none'].join(', ')}`);
}
const SENT_BACK = 'arbiter_shadow_sent_back_total';
const SLOW_KEPT = 'arbiter_shadow_slow_kept_total';
/** Where the shadow set is evaluated, by the metrics' text. */
const where = (metrics: string): string =>
  plain(metrics, 'arbiter_shadow_paired') === 1
    ? 'paired'
    : plain(metrics, 'arbiter_shadow_inline') === 1
      ? 'inline'
      : 'thread';
/** Round r's configurations in the order they run: without first in even rounds, with first in odd. */
const order = (r: number): boolean[] => (r % 2 === 0 ? [false, true] : [true, false]);
const BODIES = [
  { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 },
  { agent_id: 'deploy-bot', action: 'deploy', resource: 'prod/api', confidence: 0.95 },
  { agent_id: 'deploy-bot', action: 'delete', resource: 'prod/db', confidence: 0.99 },
].map((b) => JSON.stringify(b));

interface Run {
  shadow: boolean;
  /** `first`: the first decisions after a shadow change; `standing`: once the set has settled. */
  phase: 'first' | 'standing';
  p50_ms: number;
  p99_ms: number;
  per_second: number;
  /** CPU of the whole Arbiter process (every thread) per decision, in microseconds. */
  cpu_us: number;
}

async function load(
  engine: string,
  key: string,
  shadow: boolean,
  pid: number,
  phase: Run['phase'] = 'standing',
): Promise<Run> {
  const ms: number[] = [];
  const cpu0 = processCpuSeconds(pid);
  let next = 0;
  const started = process.hrtime.bigint();
  const worker = async () => {
    while (next < requests) {
      const body = BODIES[next++ % BODIES.length] as string;
      const t = process.hrtime.bigint();
      const res = await fetch(`${engine}/v1/agent/authorize`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body,
      });
      await res.text();
      if (![200, 202, 403].includes(res.status)) throw new Error(`authorize answered ${res.status}`);
      ms.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const cpu_us = ((processCpuSeconds(pid) - cpu0) * 1e6) / requests;
  ms.sort((x, y) => x - y);
  const q = (p: number) => ms[Math.min(ms.length - 1, Math.floor(ms.length * p))] as number;
  return { shadow, phase, p50_ms: q(0.5), p99_ms: q(0.99), per_second: requests / seconds, cpu_us };
}

async function setShadow(platform: string, on: boolean): Promise<void> {
  if (!candidate) return; // --candidate none: the control
  const res = await fetch(`${platform}/api/v1/policies/${candidate!.name}?mode=shadow`, {
    method: on ? 'PUT' : 'DELETE',
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'text/plain' },
    ...(on ? { body: candidate!.rego() } : {}),
  });
  if (res.status >= 300)
    throw new Error(`shadow ${on ? 'put' : 'delete'}: ${res.status} ${await res.text()}`);
}

/** What it took a shadow set to settle after a change, and where it was then. */
interface Settled {
  decisions: number;
  seconds: number;
  evaluated: string;
}

/**
 * Load in closed-loop runs until the shadow set is evaluated where a standing set stays: paired
 * with the live set, or inline beside it with `--paired false` (ADR 0010, 0012); at most 60 s.
 * A paired set's first PAIR_CHECKED_DECISIONS answers are each checked against the two sets
 * evaluated apart (shadow-runner.ts), so the load goes on for that many more decisions.
 * Returns how many decisions and seconds that took, and where the set was at the end.
 */
async function settle(
  a: { engine: string; platform: string; agentKey: string },
  pid: number,
): Promise<Settled> {
  const target = values.paired === 'false' ? 'inline' : 'paired';
  const started = process.hrtime.bigint();
  const elapsed = () => Number(process.hrtime.bigint() - started) / 1e9;
  let decisions = 0;
  let evaluated = where(await scrape(a.platform));
  while (evaluated !== target && elapsed() < 60) {
    await load(a.engine, a.agentKey, true, pid);
    decisions += requests;
    evaluated = where(await scrape(a.platform));
  }
  for (let checked = 0; evaluated === 'paired' && checked < PAIR_CHECKED_DECISIONS; checked += requests) {
    await load(a.engine, a.agentKey, true, pid);
    decisions += requests;
  }
  if (evaluated === 'paired') evaluated = where(await scrape(a.platform));
  return { decisions, seconds: elapsed(), evaluated };
}

async function main(): Promise<void> {
  console.log(
    `shadow benchmark: ${requests} decisions × ${rounds} rounds, ${concurrency} concurrent; candidate ${values.candidate}` +
      (values.paired === 'false' ? ', never paired' : ''),
  );
  const calls = Number(values.inprocess);
  /** The in-process figures, kept in the results file with the HTTP rounds'. */
  let inprocess: { evaluation: PairedMicro; decision: DecisionMicro } | undefined;
  if (candidate && calls > 0) {
    const m = await pairedMicro({ name: candidate.name, rego: candidate.rego() }, calls, 4);
    const range = (xs: number[]) => `${Math.min(...xs)}–${Math.max(...xs)} µs`;
    console.log(
      `  in-process, µs per evaluation (${calls} calls × 4 runs, the bench's mix): live set alone ` +
        `${range(m.live)}, live then shadow set apart ${range(m.apart)}, paired pass ${range(m.paired)}; ` +
        `copied ${m.plan.copied.length} rules, compared ${JSON.stringify(m.plan.compared)}` +
        (m.plan.comparedByChanges.length > 0
          ? ` (by changes: ${JSON.stringify(m.plan.comparedByChanges)})`
          : ''),
    );
    const decisions = Math.ceil(calls / 3);
    const d = await decisionMicro(
      { name: candidate.name, rego: candidate.rego() },
      { decisions, rounds: 12, concurrency: 32 },
    );
    const part = (x: { without: number[]; with: number[] }) => {
      const diffs = x.with.map((w, i) => w - (x.without[i] as number));
      const f = (v: number) => (v >= 0 ? '+' : '') + v.toFixed(1);
      return (
        `${quantile(x.without, 0.5).toFixed(1)} → ${quantile(x.with, 0.5).toFixed(1)} µs, ` +
        `per round ${f(quantile(diffs, 0.5))} (${f(quantile(diffs, 0.25))} … ${f(quantile(diffs, 0.75))})`
      );
    };
    const { sentBack, unpaired, slowKept } = d.moves;
    console.log(
      `  in-process, main-thread CPU per decision without → with the shadow set (${decisions} decisions × 12 rounds, ` +
        `lib/decision-micro.ts): serving ${part(d.serving)}; writer ${part(d.writer)}; ` +
        (sentBack + unpaired > 0
          ? `the set was sent back ${sentBack}× and unpaired ${unpaired}× during the rounds: the "with" figures are not all paired`
          : `paired throughout (${slowKept} slow passes kept)`),
    );
    inprocess = { evaluation: m, decision: d };
  }
  const a = await startArbiter([], {
    settings: values.paired === 'false' ? { ARBITER_SHADOW_PAIRED: 'false' } : {},
  });
  try {
    const pid = a.proc.pid;
    await load(a.engine, a.agentKey, false, pid); // warm-up
    const runs: Run[] = [];
    const line = (run: Run) =>
      `p50 ${run.p50_ms.toFixed(2)} ms, p99 ${run.p99_ms.toFixed(2)} ms, ${Math.round(run.per_second)} decisions/s, cpu ${Math.round(run.cpu_us)} µs/decision`;
    const settled: Settled[] = [];
    for (let r = 0; r < rounds; r++) {
      for (const shadow of order(r)) {
        if (shadow && candidate) {
          await setShadow(a.platform, true);
          const first = await load(a.engine, a.agentKey, true, pid, 'first');
          runs.push(first);
          const s = await settle(a, pid);
          settled.push(s);
          console.log(
            `  round ${r + 1} first after the change: ${line(first)}; then ${s.decisions} more decisions ` +
              `in ${s.seconds.toFixed(1)} s until evaluated ${s.evaluated}` +
              (s.evaluated === 'paired'
                ? ` and its first ${PAIR_CHECKED_DECISIONS} paired answers checked`
                : ''),
          );
        }
        const run = await load(a.engine, a.agentKey, shadow, pid);
        runs.push(run);
        console.log(`  round ${r + 1} ${shadow ? 'with shadow   ' : 'without shadow'}: ${line(run)}`);
        if (shadow) await setShadow(a.platform, false);
      }
    }
    const median = (xs: number[]) => quantile(xs, 0.5);
    const scenario: {
      run: string;
      shadow: boolean;
      rps: number;
      p50: number;
      p99: number;
      errors: number;
      cpu_us: number;
      thread_cpu_us: Record<string, number>;
      evaluated: string;
      sent_back: number;
      slow_kept: number;
    }[] = [];
    if (duration !== undefined) {
      const spec = arbiterSpec(a.engine, a.agentKey);
      for (let r = 0; r < rounds; r++) {
        for (const shadow of order(r)) {
          if (shadow) await setShadow(a.platform, true);
          if (warmup > 0) await runLoad(spec, { connections: 32, duration: warmup, recordLatency: false });
          for (const [run, opts] of [
            ['saturation', { connections: 32 }],
            ['1000/s', { connections: 16, rate: 1000 }],
          ] as const) {
            const cpu0 = processCpuSeconds(pid);
            const before = await scrape(a.platform);
            const x: LoadResult = await runLoad(spec, { ...opts, duration });
            const after = await scrape(a.platform);
            const [t0, t1] = [before, after].map((t) => byLabel(t, 'arbiter_thread_cpu_seconds', 'thread'));
            const row = {
              cpu_us: Math.round(((processCpuSeconds(pid) - cpu0) * 1e6) / Math.max(1, x.requests)),
              thread_cpu_us: Object.fromEntries(
                Object.keys(t1!).map((t) => [
                  t,
                  Math.round(((t1![t]! - (t0![t] ?? 0)) * 1e6) / Math.max(1, x.requests)),
                ]),
              ),
              // Where the shadow set was evaluated when the run began and when it ended, and how
              // often a slow pass sent it back to its thread in between (ADR 0010).
              evaluated: !shadow
                ? '-'
                : control
                  ? 'none (control)'
                  : where(before) === where(after)
                    ? where(after)
                    : `${where(before)} → ${where(after)}`,
              sent_back: (plain(after, SENT_BACK) ?? 0) - (plain(before, SENT_BACK) ?? 0),
              // Slow evaluations beside the live set that its thread found quick: the set stayed.
              slow_kept: (plain(after, SLOW_KEPT) ?? 0) - (plain(before, SLOW_KEPT) ?? 0),
              run,
              shadow,
              rps: x.rps,
              p50: x.latencyMs?.p50 ?? NaN,
              p99: x.latencyMs?.p99 ?? NaN,
              errors: x.errors.total,
            };
            scenario.push(row);
            console.log(
              `  autocannon round ${r + 1} ${run.padEnd(10)} ${shadow ? 'with shadow   ' : 'without shadow'}: ` +
                `${Math.round(row.rps)} req/s, p50 ${row.p50} ms, p99 ${row.p99} ms, errors ${row.errors}, ` +
                `cpu ${row.cpu_us} µs/decision ${JSON.stringify(row.thread_cpu_us)}` +
                (shadow ? `, evaluated ${row.evaluated}` : '') +
                (row.sent_back > 0 ? `, sent back ${row.sent_back}×` : '') +
                (row.slow_kept > 0 ? `, slow but kept ${row.slow_kept}×` : ''),
            );
          }
          if (shadow) await setShadow(a.platform, false);
        }
      }
      compareRounds(scenario);
      for (const run of ['saturation', '1000/s']) {
        for (const shadow of [false, true]) {
          const rs = scenario.filter((x) => x.run === run && x.shadow === shadow);
          console.log(
            `  autocannon median ${run.padEnd(10)} ${shadow ? 'with   ' : 'without'}: ${Math.round(median(rs.map((x) => x.rps)))} req/s, ` +
              `p50 ${median(rs.map((x) => x.p50))} ms, p99 ${median(rs.map((x) => x.p99))} ms, ` +
              `cpu ${median(rs.map((x) => x.cpu_us))} µs/decision (serving ${median(rs.map((x) => x.thread_cpu_us.serving ?? NaN))}, ` +
              `writer ${median(rs.map((x) => x.thread_cpu_us.writer ?? NaN))})`,
          );
        }
      }
    }
    const summary = (shadow: boolean, phase: Run['phase'] = 'standing') => {
      const rs = runs.filter((r) => r.shadow === shadow && r.phase === phase);
      return {
        p50_ms: median(rs.map((r) => r.p50_ms)),
        p99_ms: median(rs.map((r) => r.p99_ms)),
        per_second: median(rs.map((r) => r.per_second)),
        cpu_us: median(rs.map((r) => r.cpu_us)),
      };
    };
    const report = {
      kind: 'shadow',
      candidate: values.candidate,
      paired: values.paired !== 'false',
      warmup_s: warmup,
      requests,
      concurrency,
      machine: { cpus: os.cpus().length },
      without: summary(false),
      with: summary(true),
      ...(candidate ? { first_after_change: summary(true, 'first'), settled } : {}),
      runs,
      autocannon: scenario,
      ...(inprocess ? { inprocess } : {}),
    };
    console.log(
      `  closed loop, median: without ${Math.round(report.without.per_second)}/s p99 ${report.without.p99_ms.toFixed(2)} ms; ` +
        `with ${Math.round(report.with.per_second)}/s p99 ${report.with.p99_ms.toFixed(2)} ms` +
        (report.first_after_change
          ? `; the first ${requests} after each change ${Math.round(report.first_after_change.per_second)}/s ` +
            `p99 ${report.first_after_change.p99_ms.toFixed(2)} ms, then a median ` +
            `${median(settled.map((s) => s.decisions))} decisions (${median(settled.map((s) => s.seconds)).toFixed(1)} s) until settled`
          : ''),
    );
    const outDir = path.join(REPO, 'bench', 'results');
    mkdirSync(outDir, { recursive: true });
    writeFileSync(path.join(outDir, 'shadow-latest.json'), JSON.stringify(report, null, 2));
  } finally {
    await stopAll();
    removeTempDirs();
  }
}

/** The value at quantile q of xs (nearest rank; the medians above are q = 0.5). */
function quantile(xs: number[], q: number): number {
  const sorted = [...xs].sort((x, y) => x - y);
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))] as number;
}

/**
 * Each round's run with the shadow set against its run without, in the same round: throughput
 * at saturation as with ÷ without − 1, p50 at 1 000/s as with − without, and the serving and
 * writer thread's CPU per decision at saturation. Their medians and quartiles over the rounds are
 * what docs/performance.md reports, and what `--candidate none` gives as the bench's own spread.
 */
function compareRounds(
  scenario: {
    run: string;
    shadow: boolean;
    rps: number;
    p50: number;
    thread_cpu_us: Record<string, number>;
  }[],
): void {
  const pairs = (run: string) => {
    const rs = scenario.filter((x) => x.run === run);
    const out: { without: (typeof rs)[number]; with: (typeof rs)[number] }[] = [];
    // Two runs per round, in either order.
    for (let i = 0; i + 1 < rs.length; i += 2) {
      const [x, y] = [rs[i]!, rs[i + 1]!];
      out.push(x.shadow ? { with: x, without: y } : { with: y, without: x });
    }
    return out;
  };
  const spread = (xs: number[], fmt: (x: number) => string) =>
    `${fmt(quantile(xs, 0.5))} (${fmt(quantile(xs, 0.25))} … ${fmt(quantile(xs, 0.75))})`;
  const pct = (x: number) => `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%`;
  const ms = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(2)} ms`;
  const sat = pairs('saturation');
  const ratios = sat.map((p) => p.with.rps / p.without.rps - 1);
  const cpu = (side: 'with' | 'without', thread: string) =>
    quantile(
      sat.map((p) => p[side].thread_cpu_us[thread] ?? NaN),
      0.5,
    );
  console.log(
    `  per round, with against without: saturation ${spread(ratios, pct)}, slower in ` +
      `${ratios.filter((x) => x < 0).length}/${ratios.length} rounds; ` +
      `1000/s p50 ${spread(
        pairs('1000/s').map((p) => p.with.p50 - p.without.p50),
        ms,
      )}; ` +
      `cpu µs/decision at saturation serving ${cpu('without', 'serving')} → ${cpu('with', 'serving')}, ` +
      `writer ${cpu('without', 'writer')} → ${cpu('with', 'writer')} (medians; quartiles in brackets)`,
  );
}

main().catch(async (e: unknown) => {
  console.error(e);
  await stopAll();
  removeTempDirs();
  process.exit(1);
});
