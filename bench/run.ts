// `npm run bench`: Arbiter against OPA's own server and a bare node:http server under the same
// load, in interleaved rounds, plus in-process micro-benchmarks, an RSS soak and a policy hot swap
// under load. Prints a report and writes it as JSON to bench/results/. See docs/performance.md.
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { runHotSwap, type HotSwapResult } from './lib/hotswap.js';
import {
  arbiterSpec,
  KINDS,
  nodeHttpSpec,
  opaSpec,
  policyInput,
  round,
  runLoad,
  type Kind,
  type LoadResult,
  type TargetSpec,
} from './lib/load.js';
import { benchBackends, type BackendRow } from './lib/storage.js';
import { median } from './lib/stats.js';
import { benchScenarios, type ScenarioRow } from './lib/scenarios.js';
import {
  benchAuditAppend,
  benchCounterSweep,
  benchDecideLimits,
  benchEvaluation,
  benchTokens,
  type EvalResult,
  type Timing,
} from './lib/micro.js';
import { killAllSync, RssSampler, stopAll } from './lib/proc.js';
import { summarizeProfile, type ProfileSummary } from './lib/profile.js';
import {
  removeTempDirs,
  REPO,
  startArbiter,
  startNodeHttp,
  startOpa,
  tempDir,
  type ArbiterProc,
} from './lib/targets.js';

const USAGE = `usage: npm run bench -- [--duration S] [--rounds N] [--connections C] [--decisions D] [--quick]
                        [--cpu-prof] [--skip-micro]
  --duration     seconds per target per round (default 10)
  --rounds       interleaved rounds (default 3)
  --connections  autocannon connections (default 32)
  --decisions    decisions answered in the RSS soak (default 1000000)
  --quick        smoke run: duration 3, rounds 1, decisions 20000
  --cpu-prof     run Arbiter under node --cpu-prof and summarize where it spends time
                 (the figures of a profiled run are not comparable)
  --skip-micro   skip the in-process micro-benchmarks
  --skip-backends  skip the storage-backend comparison (SQLite, PostgreSQL × 1 and × 2 processes)
  --skip-scenarios skip the scenarios (example and small policy; saturation and fixed rate)
  --rate         the fixed-rate run's requests per second (default 1000, at 16 connections)`;

// Targets from the issue; never adjusted to fit the results.
const TARGET = {
  vsOpa: 1.0,
  p99Ms: 5,
  connections: 32,
  vsNodeHttp: 0.5,
  evalP50Us: 20,
  rssBytes: 250e6,
  rssDecisions: 1_000_000,
  liveMs: 1000,
};

interface Options {
  duration: number;
  rounds: number;
  connections: number;
  decisions: number;
  quick: boolean;
  cpuProf: boolean;
  skipMicro: boolean;
  skipBackends: boolean;
  skipScenarios: boolean;
  rate: number;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      duration: { type: 'string' },
      rounds: { type: 'string' },
      connections: { type: 'string' },
      decisions: { type: 'string' },
      quick: { type: 'boolean', default: false },
      'cpu-prof': { type: 'boolean', default: false },
      'skip-micro': { type: 'boolean', default: false },
      'skip-backends': { type: 'boolean', default: false },
      'skip-scenarios': { type: 'boolean', default: false },
      rate: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const quick = values.quick;
  const num = (raw: string | undefined, def: number, name: string) => {
    if (raw === undefined) return def;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer, got ${raw}`);
    return n;
  };
  return {
    duration: num(values.duration, quick ? 3 : 10, 'duration'),
    rounds: num(values.rounds, quick ? 1 : 3, 'rounds'),
    connections: num(values.connections, 32, 'connections'),
    decisions: num(values.decisions, quick ? 20_000 : 1_000_000, 'decisions'),
    quick,
    cpuProf: values['cpu-prof'],
    skipMicro: values['skip-micro'],
    skipBackends: values['skip-backends'],
    skipScenarios: values['skip-scenarios'],
    rate: num(values.rate, 1000, 'rate'),
  };
}

const log = (s = '') => console.log(s);
const mb = (kb: number) => round((kb * 1024) / 1e6, 1);

/** Sends each request kind once to Arbiter and OPA and insists they decide alike. */
async function verifyAnswers(
  a: ArbiterProc,
  opaUrl: string,
  nodeUrl: string,
): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const kind of Object.keys(KINDS) as Kind[]) {
    const want = KINDS[kind];
    const ar = await fetch(`${a.engine}/v1/agent/authorize`, {
      method: 'POST',
      headers: { authorization: `Bearer ${a.agentKey}`, 'content-type': 'application/json' },
      body: JSON.stringify(want.body),
    });
    const arBody = (await ar.json()) as { status?: string; message?: string };
    const or = await fetch(`${opaUrl}/v1/data/authz/decision`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input: policyInput(kind) }),
    });
    const orText = await or.text();
    const orBody = JSON.parse(orText) as { result?: { status?: string; message?: string } };
    out[kind] = { arbiter: { http: ar.status, ...arBody }, opa: { http: or.status, ...orBody.result } };
    if (ar.status !== want.http || arBody.status !== want.status) {
      problems.push(
        `${kind}: Arbiter answered ${ar.status} ${arBody.status}, expected ${want.http} ${want.status}`,
      );
    }
    if (or.status !== 200 || orBody.result?.status !== arBody.status) {
      problems.push(`${kind}: OPA answered ${or.status} ${orBody.result?.status}, Arbiter ${arBody.status}`);
    }
    if (arBody.message !== undefined && arBody.message !== orBody.result?.message) {
      problems.push(`${kind}: messages differ: Arbiter "${arBody.message}", OPA "${orBody.result?.message}"`);
    }
    // The load checks OPA's answers by substring: make sure it would find them.
    if (!orText.includes(`"status":"${want.status}"`)) {
      problems.push(`${kind}: OPA's body does not contain "status":"${want.status}": ${orText}`);
    }
  }
  const nr = await fetch(nodeUrl, { method: 'POST', body: '{}' });
  await nr.arrayBuffer();
  if (nr.status !== 200) problems.push(`node_http answered ${nr.status}`);
  if (problems.length)
    throw new Error(`the targets do not answer the mix alike:\n  ${problems.join('\n  ')}`);
  return out;
}

/** A crashed server ends the run: the figures after it would mean nothing. */
function assertAlive(procs: { name: string; proc: import('./lib/proc.js').Managed }[], phase: string): void {
  for (const { name, proc } of procs) {
    if (proc.child.exitCode !== null || proc.child.signalCode !== null) {
      throw new Error(
        `${name} exited (${proc.child.exitCode ?? proc.child.signalCode}) during ${phase}:\n` +
          proc.logs.slice(-60).join('\n'),
      );
    }
  }
}

interface Summary {
  target: string;
  rps: number;
  p50: number;
  p99: number;
  p99_9: number;
  errors: number;
  rounds: number;
}

function summarize(target: string, rs: LoadResult[]): Summary {
  const lat = (k: 'p50' | 'p99' | 'p99_9') => round(median(rs.map((r) => r.latencyMs?.[k] ?? NaN)), 3);
  return {
    target,
    rps: round(median(rs.map((r) => r.rps)), 1),
    p50: lat('p50'),
    p99: lat('p99'),
    p99_9: lat('p99_9'),
    errors: rs.reduce((s, r) => s + r.errors.total, 0),
    rounds: rs.length,
  };
}

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return rows
    .map((r) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  '))
    .join('\n');
}

function loadLine(r: LoadResult): string {
  const l = r.latencyMs;
  const codes = Object.entries(r.statusCodes)
    .map(([c, n]) => `${c}:${n}`)
    .join(' ');
  return (
    `${r.target.padEnd(9)} ${String(r.rps).padStart(9)} req/s  p50 ${l?.p50 ?? '-'} ms  p99 ${l?.p99 ?? '-'} ms` +
    `  p99.9 ${l?.p99_9 ?? '-'} ms  errors ${r.errors.total}  [${codes}]` +
    (r.errors.connection
      ? ` connection errors ${JSON.stringify(r.errorCodes)} (timeouts ${r.errors.timeouts})`
      : '')
  );
}

type Verdict = 'PASS' | 'FAIL' | 'INCONCLUSIVE';
interface Check {
  target: string;
  verdict: Verdict;
  figure: string;
}

function gitInfo(): { commit: string | null; dirty: boolean | null } {
  const rev = spawnSync('git', ['rev-parse', 'HEAD'], { cwd: REPO, encoding: 'utf8' });
  const st = spawnSync('git', ['status', '--porcelain'], { cwd: REPO, encoding: 'utf8' });
  return {
    // BENCH_COMMIT names the commit when the tree being measured is an export without .git.
    commit: rev.status === 0 ? rev.stdout.trim() : (process.env.BENCH_COMMIT ?? null),
    dirty: st.status === 0 ? st.stdout.trim() !== '' : null,
  };
}

async function main(): Promise<void> {
  const o = options();
  const startedAt = new Date();
  const env = {
    node: process.version,
    cpu: os.cpus()[0]?.model ?? 'unknown',
    cores: os.availableParallelism(),
    memoryGb: round(os.totalmem() / 2 ** 30, 1),
    platform: `${os.type()} ${os.release()}`,
    arbiterWorkers: process.env.ARBITER_WORKERS ?? null,
    ...gitInfo(),
  };
  log(`Arbiter benchmark — ${startedAt.toISOString()}`);
  log(
    `  ${env.cores} cores (${env.cpu}), node ${env.node}; ${o.rounds} round(s) × ${o.duration} s per target, ` +
      `${o.connections} connections, soak ${o.decisions} decisions${o.cpuProf ? ', PROFILED' : ''}`,
  );

  // ---- micro-benchmarks, before any server runs so that nothing competes for the CPU
  let micro: {
    evaluation: EvalResult;
    auditAppend: Timing;
    tokenMint: Timing;
    introspect: Timing;
    decide: { withoutLimits: Timing; withLimits: Timing };
    counterSweep: Awaited<ReturnType<typeof benchCounterSweep>>;
  } | null = null;
  if (!o.skipMicro) {
    log('\n[micro] policy evaluation (in-process, 100k timed after 10k warm-up)…');
    const evaluation = await benchEvaluation();
    log(`[micro] audit append (SQLite, synchronous=FULL, 20k)…`);
    const auditAppend = await benchAuditAppend();
    log('[micro] token mint (2k) and introspection (10k)…');
    const t = await benchTokens();
    log('[micro] decide path without and with budgets (SQLite, synchronous=NORMAL, 2 × 5k)…');
    const decide = await benchDecideLimits();
    log('[micro] budget counter sweep (SQLite, synchronous=FULL, 100k keys × 5 windows)…');
    const counterSweep = await benchCounterSweep();
    micro = { evaluation, auditAppend, tokenMint: t.mint, introspect: t.introspect, decide, counterSweep };
  }

  // ---- servers
  log('\nstarting Arbiter, OPA and node:http…');
  const profDir = o.cpuProf ? tempDir('arbiter-bench-prof-') : null;
  const arbiter = await startArbiter(profDir ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : []);
  const rss = new RssSampler(arbiter.proc.pid);
  rss.start(250);
  const opa = await startOpa();
  const nodeHttp = await startNodeHttp();
  log(
    `  arbiter ${arbiter.engine} (pid ${arbiter.proc.pid}${arbiter.workers ? `, ARBITER_WORKERS=${arbiter.workers}` : ''})`,
  );
  log(`  opa ${opa.version} ${opa.url} (pid ${opa.proc.pid})`);
  log(`  node_http ${nodeHttp.url} (pid ${nodeHttp.proc.pid})`);
  const answers = await verifyAnswers(arbiter, opa.url, nodeHttp.url);
  log('  Arbiter and OPA decide the mix alike (allow / deny / deny low confidence / approval)');

  const servers = [
    { name: 'arbiter', proc: arbiter.proc },
    { name: 'opa', proc: opa.proc },
    { name: 'node_http', proc: nodeHttp.proc },
  ];
  const specs: TargetSpec[] = [
    arbiterSpec(arbiter.engine, arbiter.agentKey),
    opaSpec(opa.url),
    nodeHttpSpec(nodeHttp.url),
  ];
  let arbiterDecisions = Object.keys(KINDS).length;

  // ---- warm-up (JIT, connection pools), not recorded
  const warm = o.quick ? 1 : 2;
  log(`\nwarm-up ${warm} s per target…`);
  for (const s of specs) {
    const w = await runLoad(s, { connections: o.connections, duration: warm, recordLatency: false });
    if (s.name === 'arbiter') arbiterDecisions += w.requests;
    if (w.errors.total) log(`  warning: ${s.name} had ${w.errors.total} errors during warm-up`);
  }

  // ---- interleaved rounds
  const rounds: LoadResult[] = [];
  for (let r = 0; r < o.rounds; r++) {
    log(`\nround ${r + 1}/${o.rounds}`);
    for (let i = 0; i < specs.length; i++) {
      const s = specs[(i + r) % specs.length]!;
      const res = await runLoad(s, { connections: o.connections, duration: o.duration, round: r + 1 });
      if (s.name === 'arbiter') arbiterDecisions += res.requests;
      rounds.push(res);
      log('  ' + loadLine(res));
      assertAlive(servers, `round ${r + 1}`);
    }
  }
  const rssAfterRounds = { peakMb: mb(rss.peakHwmKb), currentMb: mb(rss.lastRssKb) };

  // ---- policy hot swap under load
  const swapSeconds = o.quick ? 4 : 10;
  log(`\nhot swap: a policy PUT every second for ${swapSeconds} s under load…`);
  const hotSwap: HotSwapResult = await runHotSwap(arbiter, swapSeconds, o.connections);
  arbiterDecisions += hotSwap.load.requests;
  for (const s of hotSwap.swaps) {
    log(
      `  PUT ${s.n}: ${s.status} revision ${s.revision} in ${s.putMs} ms, live (healthz) after ${s.liveMs ?? 'never'} ms`,
    );
  }
  log('  ' + loadLine(hotSwap.load));
  assertAlive(servers, 'the hot swap');
  log(
    `  audit: ${hotSwap.audit.decisions} decisions by revision ${JSON.stringify(hotSwap.audit.byRevision)}; ` +
      `unknown revision ${hotSwap.audit.unknownRevision}, regressions ${hotSwap.audit.revisionRegressions}`,
  );
  const rssAfterSwap = { peakMb: mb(rss.peakHwmKb), currentMb: mb(rss.lastRssKb) };

  // ---- RSS soak
  log(`\nRSS soak: ${o.decisions} decisions at ${o.connections} connections…`);
  const soakStart = Date.now();
  const soak = await runLoad(specs[0]!, {
    connections: o.connections,
    amount: o.decisions,
    recordLatency: false,
    onProgress: (n) =>
      log(
        `  ${n} decisions, ${Math.round(n / ((Date.now() - soakStart) / 1000))}/s, RSS ${mb(rss.lastRssKb)} MB, peak ${mb(rss.peakHwmKb)} MB`,
      ),
  });
  arbiterDecisions += soak.requests;
  rss.sample();
  log('  ' + loadLine(soak));
  assertAlive(servers, 'the RSS soak');

  // ---- stop everything; a profiled Arbiter writes its profile on the way out
  rss.stop();
  const peak = {
    peakMb: mb(rss.peakHwmKb),
    currentMb: mb(rss.lastRssKb),
    processes: rss.processes,
    samples: rss.samples,
  };
  await stopAll();

  // ---- storage backends: the same load on SQLite, PostgreSQL × 1 and × 2 engine processes
  let backends: BackendRow[] | null = null;
  if (!o.skipBackends) {
    log('\nstorage backends (same load; PostgreSQL from ARBITER_BENCH_DATABASE_URL or the local server)…');
    backends = await benchBackends({
      duration: o.duration,
      rounds: o.rounds,
      connections: o.connections,
      log,
    });
  }
  // ---- scenarios: example and small policy, Arbiter beside OPA, saturation and fixed rate
  let scenarios: ScenarioRow[] | null = null;
  if (!o.skipScenarios) {
    log(
      `\nscenarios (saturation at ${o.connections} connections; fixed rate ${o.rate} req/s at 16 connections)…`,
    );
    scenarios = await benchScenarios({
      duration: o.duration,
      connections: o.connections,
      rate: o.rate,
      rateConnections: 16,
      log,
    });
  }
  let profile: ProfileSummary | null = null;
  if (profDir) {
    const f = readdirSync(profDir).find((x) => x.endsWith('.cpuprofile'));
    if (f) {
      const keep = path.join(REPO, 'bench', 'results', `arbiter-${stamp(startedAt)}.cpuprofile`);
      mkdirSync(path.dirname(keep), { recursive: true });
      copyFileSync(path.join(profDir, f), keep);
      profile = summarizeProfile(keep);
    } else {
      log('  warning: no .cpuprofile was written by Arbiter');
    }
  }

  // ---- report
  const byTarget = Object.fromEntries(
    specs.map((s) => [
      s.name,
      summarize(
        s.name,
        rounds.filter((r) => r.target === s.name),
      ),
    ]),
  ) as Record<string, Summary>;
  const A = byTarget.arbiter!;
  const O = byTarget.opa!;
  const N = byTarget.node_http!;
  const ratios = { arbiterVsOpa: round(A.rps / O.rps, 3), arbiterVsNodeHttp: round(A.rps / N.rps, 3) };

  log('\n' + '='.repeat(78));
  log(`RESULTS — median of ${o.rounds} round(s), ${o.duration} s each, ${o.connections} connections`);
  log('='.repeat(78));
  log(
    table([
      ['target', 'req/s', 'p50 ms', 'p99 ms', 'p99.9 ms', 'errors'],
      ...[A, O, N].map((s) => [
        s.target,
        s.rps.toFixed(0),
        s.p50.toFixed(2),
        s.p99.toFixed(2),
        s.p99_9.toFixed(2),
        String(s.errors),
      ]),
    ]),
  );
  log(
    `\nArbiter/OPA ${ratios.arbiterVsOpa.toFixed(2)}×   Arbiter/node_http ${ratios.arbiterVsNodeHttp.toFixed(2)}×`,
  );
  log(
    `Arbiter peak RSS (VmHWM) ${peak.peakMb} MB after ${arbiterDecisions} decisions ` +
      `(after rounds ${rssAfterRounds.peakMb} MB, after hot swap ${rssAfterSwap.peakMb} MB; RSS now ${peak.currentMb} MB; MB = 10^6 bytes)`,
  );
  log(`Soak: ${soak.requests} decisions at ${soak.rps} req/s, errors ${soak.errors.total}`);
  if (micro) {
    const m = micro;
    log(
      `\nmicro: evaluation      p50 ${m.evaluation.p50} µs  p99 ${m.evaluation.p99} µs  (${m.evaluation.perSecond}/s; ` +
        Object.entries(m.evaluation.byKind)
          .map(([k, v]) => `${k} p50 ${v.p50}`)
          .join(', ') +
        ')',
    );
    log(
      `micro: audit append    p50 ${m.auditAppend.p50} µs  p99 ${m.auditAppend.p99} µs  (${m.auditAppend.perSecond} appends/s, sync=FULL)`,
    );
    log(
      `micro: token mint      p50 ${m.tokenMint.p50} µs  p99 ${m.tokenMint.p99} µs  (${m.tokenMint.perSecond}/s)`,
    );
    log(
      `micro: introspection   p50 ${m.introspect.p50} µs  p99 ${m.introspect.p99} µs  (${m.introspect.perSecond}/s)`,
    );
    const { withoutLimits: w0, withLimits: w2 } = m.decide;
    log(
      `micro: decide          p50 ${w0.p50} µs  p99 ${w0.p99} µs without limits; ` +
        `p50 ${w2.p50} µs  p99 ${w2.p99} µs with its 2 limits (+${round(w2.mean - w0.mean, 1)} µs mean)`,
    );
    const cs = m.counterSweep;
    log(
      `micro: counter sweep   ${cs.deleted} of ${cs.rows} counters deleted in ${cs.ms} ms; ` +
        `event loop waited at most ${cs.loopMaxMs} ms`,
    );
  }
  log(
    `hot swap: ${hotSwap.swaps.length} PUTs, PUT p50 ${hotSwap.putMs.p50} ms max ${hotSwap.putMs.max} ms, ` +
      `live max ${hotSwap.liveMaxMs ?? 'never'} ms; failed decisions ${hotSwap.load.errors.total}, ` +
      `unknown-revision decisions ${hotSwap.audit.unknownRevision}, failed PUTs ${hotSwap.failedPuts}`,
  );
  if (profile) {
    log(`\nArbiter CPU profile (${profile.totalMs} ms sampled) — self time by area:`);
    for (const a of profile.byArea.slice(0, 12)) log(`  ${String(a.pct).padStart(5)}%  ${a.area}`);
    log('top functions by self time:');
    for (const f of profile.top.slice(0, 15)) log(`  ${String(f.pct).padStart(5)}%  ${f.fn}  ${f.where}`);
  }

  const at32 = o.connections === TARGET.connections;
  const v = (ok: boolean, conclusive = true): Verdict =>
    !conclusive ? 'INCONCLUSIVE' : ok ? 'PASS' : 'FAIL';
  const checks: Check[] = [
    {
      target: `Arbiter throughput ≥ ${TARGET.vsOpa}× OPA server`,
      verdict: v(A.rps >= TARGET.vsOpa * O.rps),
      figure: `${ratios.arbiterVsOpa}× (${A.rps} vs ${O.rps} req/s)`,
    },
    {
      target: `Arbiter p99 ≤ ${TARGET.p99Ms} ms at ${TARGET.connections} connections`,
      verdict: v(A.p99 <= TARGET.p99Ms, at32),
      figure: `p99 ${A.p99} ms at ${o.connections} connections`,
    },
    { target: 'Arbiter: no errors under load', verdict: v(A.errors === 0), figure: `${A.errors} errors` },
    {
      target: `Arbiter ≥ ${TARGET.vsNodeHttp * 100}% of bare node:http`,
      verdict: v(A.rps >= TARGET.vsNodeHttp * N.rps),
      figure: `${round(ratios.arbiterVsNodeHttp * 100, 1)}% (${A.rps} vs ${N.rps} req/s)`,
    },
    {
      target: `in-process evaluation p50 ≤ ${TARGET.evalP50Us} µs`,
      verdict: micro ? v(micro.evaluation.p50 <= TARGET.evalP50Us) : 'INCONCLUSIVE',
      figure: micro ? `p50 ${micro.evaluation.p50} µs (p99 ${micro.evaluation.p99} µs)` : 'skipped',
    },
    {
      target: `Arbiter peak RSS ≤ ${TARGET.rssBytes / 1e6} MB after ${TARGET.rssDecisions} decisions`,
      verdict: v(peak.peakMb * 1e6 <= TARGET.rssBytes, arbiterDecisions >= TARGET.rssDecisions),
      figure: `${peak.peakMb} MB after ${arbiterDecisions} decisions`,
    },
    {
      target: `policy PUT live within ${TARGET.liveMs} ms`,
      verdict: v(
        hotSwap.liveMaxMs !== null && hotSwap.liveMaxMs <= TARGET.liveMs && hotSwap.failedPuts === 0,
      ),
      figure: `max ${hotSwap.liveMaxMs ?? 'never'} ms over ${hotSwap.swaps.length} PUTs (PUT p50 ${hotSwap.putMs.p50} ms)`,
    },
    {
      target: 'hot swap under load: zero failed or mixed-revision decisions',
      verdict: v(hotSwap.load.errors.total === 0 && hotSwap.audit.unknownRevision === 0),
      figure: `${hotSwap.load.errors.total} failed, ${hotSwap.audit.unknownRevision} on an unknown revision, of ${hotSwap.audit.decisions}`,
    },
  ];
  if (backends) {
    log('\nstorage backends — median of rounds, load split evenly across processes');
    log(
      table([
        ['backend', 'processes', 'req/s', 'p50 ms', 'p99 ms', 'errors', 'one chain'],
        ...backends.map((b) => [
          b.setup,
          String(b.processes),
          String(b.rps),
          b.p50.toFixed(2),
          b.p99.toFixed(2),
          String(b.errors),
          b.chainOk ? `yes (${b.events})` : 'NO',
        ]),
      ]),
    );
  }
  if (scenarios) {
    log('\nscenarios — Arbiter beside OPA; CPU per decision by Arbiter thread');
    log(
      table([
        [
          'scenario',
          'run',
          'target',
          'req/s',
          'p50 ms',
          'p99 ms',
          'errors',
          'CPU µs/decision',
          'event loop late p99 ms',
          'GC ms/s',
          'batch',
          'commit p99 ≤ ms',
        ],
        ...scenarios.map((r) => [
          r.scenario,
          r.run,
          r.target,
          r.rps.toFixed(0),
          r.p50.toFixed(2),
          r.p99.toFixed(2),
          String(r.errors),
          r.cpuUsPerDecision
            ? Object.entries(r.cpuUsPerDecision)
                .map(([t, us]) => `${t} ${us}`)
                .join(', ')
            : '',
          r.eventLoopLateMs ? String(r.eventLoopLateMs.p99) : '',
          r.tail ? String(r.tail.gcMsPerSecond) : '',
          r.tail ? String(r.tail.batchMean) : '',
          r.tail ? String(r.tail.commitP99BucketMs) : '',
        ]),
      ]),
    );
    const find = (sc: string, run: string, t: string) =>
      scenarios!.find((r) => r.scenario === sc && r.run === run && r.target === t);
    for (const sc of ['example', 'small']) {
      const sa = find(sc, 'saturation', 'arbiter');
      const so = find(sc, 'saturation', 'opa');
      const fa = find(sc, 'fixed-rate', 'arbiter');
      const fo = find(sc, 'fixed-rate', 'opa');
      if (sa && so) {
        checks.push({
          target: `${sc} policy: saturation throughput ≥ ${TARGET.vsOpa}× OPA server`,
          verdict: v(sa.rps >= TARGET.vsOpa * so.rps && sa.errors === 0),
          figure: `${round(sa.rps / so.rps, 3)}× (${sa.rps} vs ${so.rps} req/s, ${sa.errors} errors)`,
        });
      }
      if (fa && fo) {
        checks.push({
          target: `${sc} policy: p99 at ${o.rate} req/s ≤ OPA's`,
          // Only a run that reached the rate compares tails at that rate.
          verdict: v(fa.p99 <= fo.p99 && fa.errors === 0, fa.rps >= 0.95 * o.rate && fo.rps >= 0.95 * o.rate),
          figure: `${fa.p99} vs ${fo.p99} ms (reached ${fa.rps} and ${fo.rps} req/s)`,
        });
      }
    }
  }
  log('\nTARGETS');
  for (const c of checks) log(`  ${c.verdict.padEnd(12)} ${c.target}: ${c.figure}`);
  if (o.cpuProf) log('  (profiled run: figures are not comparable with unprofiled runs)');

  const result = {
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    options: o,
    environment: { ...env, opa: opa.version },
    targets: TARGET,
    summary: byTarget,
    ratios,
    rss: { ...peak, afterRounds: rssAfterRounds, afterHotSwap: rssAfterSwap, arbiterDecisions },
    soak,
    micro,
    hotSwap,
    checks,
    answers,
    rounds,
    profile,
    backends,
    scenarios,
  };
  const dir = path.join(REPO, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${stamp(startedAt)}.json`);
  const text = JSON.stringify(result, null, 2) + '\n';
  writeFileSync(file, text);
  writeFileSync(path.join(dir, 'latest.json'), text);
  log(`\nwrote ${path.relative(REPO, file)} and bench/results/latest.json`);
}

function stamp(d: Date): string {
  return d.toISOString().replace(/:/g, '-').replace(/\..*$/, 'Z');
}

// ---- cleanup on every way out
process.on('exit', () => {
  killAllSync();
  removeTempDirs();
});
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    console.error(`\n${sig}: stopping the servers…`);
    void stopAll().finally(() => process.exit(130));
  });
}

main().then(
  async () => {
    await stopAll();
    process.exit(0);
  },
  async (err: unknown) => {
    console.error(`\nbenchmark failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    await stopAll();
    process.exit(1);
  },
);
