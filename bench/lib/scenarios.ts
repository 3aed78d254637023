// Scenarios (issue 13): the example policies and a small agent policy, each loaded into Arbiter
// and OPA's own server, driven to saturation and at a fixed rate, with Arbiter's CPU per decision
// on its serving thread and its writer thread, and its event-loop delay during the fixed-rate run.
import { arbiterSpec, opaSpec, runLoad, round, type LoadResult } from './load.js';
import { stopAll } from './proc.js';
import { byLabel, plain, scrape } from './metrics.js';
import { POLICY_DIR, SMALL_POLICY_DIR, startArbiter, startOpa } from './targets.js';

export interface ScenarioRow {
  scenario: 'example' | 'small';
  run: 'saturation' | 'fixed-rate';
  target: 'arbiter' | 'opa';
  rps: number;
  p50: number;
  p99: number;
  p99_9: number;
  errors: number;
  /** Arbiter only: CPU microseconds per decision by thread, over the run. */
  cpuUsPerDecision?: Record<string, number>;
  /**
   * Arbiter only (fixed rate): how late the event loop ran, ms — prom-client's
   * monitorEventLoopDelay samples every 10 ms and reports the interval, so 10 ms is subtracted.
   */
  eventLoopLateMs?: { p50: number; p99: number; max: number };
  /** Arbiter only: where a tail could come from, over the run (see tailOf). */
  tail?: Tail;
}

/**
 * The suspects of a latency tail, from the process's own metrics over one run: garbage
 * collection (total pause time per second of run, and the longest pause's histogram bucket), and
 * the decision writer's commits (mean batch size, mean commit time, and the bucket holding the
 * 99th percentile commit — a WAL checkpoint or an fsync stall shows there).
 */
export interface Tail {
  gcMsPerSecond: number;
  gcLongestPauseBucketMs: number | null;
  batchMean: number;
  commitMeanMs: number;
  commitP99BucketMs: number | null;
}

/** Values of a histogram's buckets, by upper bound `le`, summed over label sets. */
function buckets(text: string, name: string): Map<number, number> {
  const out = new Map<number, number>();
  const re = new RegExp(`^${name}_bucket\\{([^}]*)\\} ([0-9.e+-]+)$`, 'gm');
  for (const m of text.matchAll(re)) {
    const le = /le="([^"]+)"/.exec(m[1]!)?.[1];
    if (le === undefined || le === '+Inf') continue;
    out.set(Number(le), (out.get(Number(le)) ?? 0) + Number(m[2]));
  }
  return out;
}

/** Sum of a histogram's `_sum` or `_count` lines over label sets. */
function total(text: string, name: string): number {
  const re = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'gm');
  let n = 0;
  for (const m of text.matchAll(re)) n += Number(m[1]);
  return n;
}

/** The smallest bucket bound holding fraction `q` of the observations made between two scrapes. */
function bucketQuantile(before: string, after: string, name: string, q: number): number | null {
  const b0 = buckets(before, name);
  const b1 = buckets(after, name);
  const count = total(after, `${name}_count`) - total(before, `${name}_count`);
  if (count <= 0) return null;
  for (const le of [...b1.keys()].sort((x, y) => x - y)) {
    if ((b1.get(le) ?? 0) - (b0.get(le) ?? 0) >= q * count) return le;
  }
  return Infinity;
}

function tailOf(before: string, after: string, seconds: number): Tail {
  const delta = (name: string) => total(after, name) - total(before, name);
  const commits = delta('arbiter_decision_commit_seconds_count');
  const gcCount = delta('nodejs_gc_duration_seconds_count');
  const longest = gcCount > 0 ? bucketQuantile(before, after, 'nodejs_gc_duration_seconds', 1) : null;
  const p99 = bucketQuantile(before, after, 'arbiter_decision_commit_seconds', 0.99);
  return {
    gcMsPerSecond: round((delta('nodejs_gc_duration_seconds_sum') * 1e3) / seconds, 2),
    gcLongestPauseBucketMs: longest === null ? null : round(longest * 1e3, 1),
    batchMean: commits > 0 ? round(delta('arbiter_decision_batch_size_sum') / commits, 1) : 0,
    commitMeanMs: commits > 0 ? round((delta('arbiter_decision_commit_seconds_sum') * 1e3) / commits, 2) : 0,
    commitP99BucketMs: p99 === null ? null : round(p99 * 1e3, 1),
  };
}

function row(scenario: ScenarioRow['scenario'], run: ScenarioRow['run'], r: LoadResult): ScenarioRow {
  const l = r.latencyMs;
  return {
    scenario,
    run,
    target: r.target as 'arbiter' | 'opa',
    rps: r.rps,
    p50: l?.p50 ?? NaN,
    p99: l?.p99 ?? NaN,
    p99_9: l?.p99_9 ?? NaN,
    errors: r.errors.total,
  };
}

export async function benchScenarios(o: {
  duration: number;
  connections: number;
  rate: number;
  rateConnections: number;
  log: (s: string) => void;
  /** Only this scenario (default: both). */
  only?: ScenarioRow['scenario'];
  /** Node flags for Arbiter (e.g. --cpu-prof). */
  nodeFlags?: string[];
}): Promise<ScenarioRow[]> {
  const rows: ScenarioRow[] = [];
  const all = [
    ['example', POLICY_DIR],
    ['small', SMALL_POLICY_DIR],
  ] as const;
  for (const [scenario, dir] of all.filter(([s]) => o.only === undefined || s === o.only)) {
    o.log(`  scenario ${scenario} (${dir})`);
    const arbiter = await startArbiter(o.nodeFlags ?? [], { policyDir: dir });
    const opa = await startOpa(dir);
    try {
      const a = arbiterSpec(arbiter.engine, arbiter.agentKey);
      const p = opaSpec(opa.url);
      for (const s of [a, p])
        await runLoad(s, { connections: o.connections, duration: 2, recordLatency: false });
      for (const run of ['saturation', 'fixed-rate'] as const) {
        for (const s of [a, p]) {
          const before = s === a ? await scrape(arbiter.platform) : '';
          const r = await runLoad(s, {
            connections: run === 'saturation' ? o.connections : o.rateConnections,
            duration: o.duration,
            ...(run === 'fixed-rate' ? { rate: o.rate } : {}),
          });
          const x = row(scenario, run, r);
          if (s === a) {
            const after = await scrape(arbiter.platform);
            const cpu0 = byLabel(before, 'arbiter_thread_cpu_seconds', 'thread');
            const cpu1 = byLabel(after, 'arbiter_thread_cpu_seconds', 'thread');
            x.cpuUsPerDecision = Object.fromEntries(
              Object.keys(cpu1).map((t) => [t, round(((cpu1[t]! - (cpu0[t] ?? 0)) * 1e6) / r.requests, 1)]),
            );
            // prom-client resets its event-loop delay histogram at every scrape: `after` covers the run.
            const late = (q: string) =>
              round(Math.max(0, (plain(after, `nodejs_eventloop_lag_${q}_seconds`) ?? NaN) * 1e3 - 10), 2);
            if (run === 'fixed-rate') {
              x.eventLoopLateMs = { p50: late('p50'), p99: late('p99'), max: late('max') };
            }
            x.tail = tailOf(before, after, o.duration);
          }
          rows.push(x);
          o.log(
            `    ${run.padEnd(10)} ${s.name.padEnd(7)} ${x.rps.toFixed(0).padStart(6)} req/s  p50 ${x.p50.toFixed(2)} ms  p99 ${x.p99.toFixed(2)} ms  errors ${x.errors}` +
              (x.cpuUsPerDecision ? `  cpu/decision µs ${JSON.stringify(x.cpuUsPerDecision)}` : '') +
              (x.eventLoopLateMs ? `  event loop late ms ${JSON.stringify(x.eventLoopLateMs)}` : '') +
              (x.tail ? `\n${' '.repeat(16)}tail ${JSON.stringify(x.tail)}` : ''),
          );
        }
      }
    } finally {
      await stopAll();
    }
  }
  return rows;
}
