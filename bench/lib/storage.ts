// The storage backends side by side under the same load: SQLite (one process), PostgreSQL with
// one engine process, and PostgreSQL with two engine processes sharing the database (the load
// split evenly between them). See docs/performance.md, "Storage backends".
import pg from 'pg';
import { arbiterSpec, round, runLoad, type LoadResult } from './load.js';
import { stopAll } from './proc.js';
import { startArbiter, type ArbiterProc } from './targets.js';

export interface BackendRow {
  setup: string;
  processes: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  /** Audit chain verified after the run (one chain across processes). */
  chainOk: boolean;
  events: number;
}

/** The server the bench creates its databases on (ARBITER_BENCH_DATABASE_URL, default the local one). */
const SERVER = process.env.ARBITER_BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

async function admin(sql: string): Promise<void> {
  const c = new pg.Client({ connectionString: SERVER });
  await c.connect();
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

async function verified(a: ArbiterProc): Promise<{ ok: boolean; checked: number }> {
  const r = await fetch(`${a.platform}/api/v1/audit/verify`, {
    headers: { authorization: 'Bearer bench-admin-key-0123456789abcdef' },
  });
  return (await r.json()) as { ok: boolean; checked: number };
}

/** Runs the same load against each setup, several rounds, and reports the median. */
export async function benchBackends(o: {
  duration: number;
  rounds: number;
  connections: number;
  log: (s: string) => void;
}): Promise<BackendRow[]> {
  const out: BackendRow[] = [];
  const setups: { name: string; processes: number; db: boolean }[] = [
    { name: 'SQLite', processes: 1, db: false },
    { name: 'PostgreSQL', processes: 1, db: true },
    { name: 'PostgreSQL', processes: 2, db: true },
  ];
  for (const s of setups) {
    const name = `arbiter_bench_${process.pid}_${s.processes}`;
    let url: string | undefined;
    if (s.db) {
      await admin(`DROP DATABASE IF EXISTS ${name}`);
      await admin(`CREATE DATABASE ${name}`);
      const u = new URL(SERVER);
      u.pathname = `/${name}`;
      url = u.toString();
    }
    try {
      const first = await startArbiter([], { databaseUrl: url });
      const procs = [first];
      for (let i = 1; i < s.processes; i++) {
        procs.push(await startArbiter([], { databaseUrl: url, agentKey: first.agentKey }));
      }
      const per = Math.max(1, Math.floor(o.connections / s.processes));
      // Warm-up (JIT, pools), then the measured rounds.
      await Promise.all(
        procs.map((p) =>
          runLoad(arbiterSpec(p.engine, p.agentKey), { connections: per, duration: 2, recordLatency: false }),
        ),
      );
      const rounds: { rps: number; p50: number; p99: number; errors: number }[] = [];
      for (let r = 0; r < o.rounds; r++) {
        const res: LoadResult[] = await Promise.all(
          procs.map((p) =>
            runLoad(arbiterSpec(p.engine, p.agentKey), { connections: per, duration: o.duration }),
          ),
        );
        rounds.push({
          rps: res.reduce((n, x) => n + x.rps, 0),
          p50: Math.max(...res.map((x) => x.latencyMs?.p50 ?? 0)),
          p99: Math.max(...res.map((x) => x.latencyMs?.p99 ?? 0)),
          errors: res.reduce((n, x) => n + x.errors.total, 0),
        });
      }
      const mid = [...rounds].sort((a, b) => a.rps - b.rps)[Math.floor(rounds.length / 2)]!;
      const v = await verified(first);
      const row: BackendRow = {
        setup: s.name,
        processes: s.processes,
        rps: round(mid.rps, 0),
        p50: mid.p50,
        p99: mid.p99,
        errors: rounds.reduce((n, x) => n + x.errors, 0),
        chainOk: v.ok,
        events: v.checked,
      };
      o.log(
        `  ${s.name} × ${s.processes}: ${row.rps} req/s, p50 ${row.p50} ms, p99 ${row.p99} ms, errors ${row.errors}, ` +
          `chain ${row.chainOk ? 'verified' : 'BROKEN'} (${row.events} events)`,
      );
      out.push(row);
    } finally {
      await stopAll();
      if (s.db) await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    }
  }
  return out;
}
