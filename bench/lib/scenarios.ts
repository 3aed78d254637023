// Scenarios (issue 13): the example policies and a small agent policy, each loaded into Arbiter
// and OPA's own server, driven to saturation and at a fixed rate, with Arbiter's CPU per decision
// on its serving thread and its writer thread, and its event-loop delay during the fixed-rate run.
import { arbiterSpec, opaSpec, runLoad, round, type LoadResult } from './load.js';
import { stopAll } from './proc.js';
import { ADMIN_KEY, POLICY_DIR, SMALL_POLICY_DIR, startArbiter, startOpa } from './targets.js';

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
  /** Arbiter only (fixed rate): event-loop delay percentiles over the run, ms. */
  eventLoopMs?: { p50: number; p99: number; max: number };
}

/** The Prometheus text of an Arbiter process, read with the admin key. */
async function scrape(platform: string): Promise<string> {
  const r = await fetch(`${platform}/metrics`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  if (!r.ok) throw new Error(`GET /metrics answered ${r.status}`);
  return r.text();
}

/** `name{label="value"} number` lines of one metric, by the value of `label`. */
function byLabel(text: string, name: string, label: string): Record<string, number> {
  const out: Record<string, number> = {};
  const re = new RegExp(`^${name}\\{[^}]*${label}="([^"]+)"[^}]*\\} ([0-9.e+-]+)$`, 'gm');
  for (const m of text.matchAll(re)) out[m[1]!] = (out[m[1]!] ?? 0) + Number(m[2]);
  return out;
}

function plain(text: string, name: string): number | undefined {
  const m = new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
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
}): Promise<ScenarioRow[]> {
  const rows: ScenarioRow[] = [];
  for (const [scenario, dir] of [
    ['example', POLICY_DIR],
    ['small', SMALL_POLICY_DIR],
  ] as const) {
    o.log(`  scenario ${scenario} (${dir})`);
    const arbiter = await startArbiter([], { policyDir: dir });
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
            const el = (q: string) =>
              round((plain(after, `nodejs_eventloop_lag_${q}_seconds`) ?? NaN) * 1e3, 2);
            if (run === 'fixed-rate') x.eventLoopMs = { p50: el('p50'), p99: el('p99'), max: el('max') };
          }
          rows.push(x);
          o.log(
            `    ${run.padEnd(10)} ${s.name.padEnd(7)} ${x.rps.toFixed(0).padStart(6)} req/s  p50 ${x.p50.toFixed(2)} ms  p99 ${x.p99.toFixed(2)} ms  errors ${x.errors}` +
              (x.cpuUsPerDecision ? `  cpu/decision µs ${JSON.stringify(x.cpuUsPerDecision)}` : '') +
              (x.eventLoopMs ? `  event-loop delay ms ${JSON.stringify(x.eventLoopMs)}` : ''),
          );
        }
      }
    } finally {
      await stopAll();
    }
  }
  return rows;
}
