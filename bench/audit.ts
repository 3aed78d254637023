/**
 * Audit query benchmark (issue 4): fills a database with N audit events (default 1,000,000)
 * through the real store (hash chain included), starts the real service on it, and times over
 * HTTP, with an audit:read key: a trace lookup, filtered first pages and a cursor page.
 *
 *   npm run bench:audit -- [--events 1000000] [--repeat 200]
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { NewAuditEvent } from '../src/audit/types.js';
import { openDatabase } from '../src/storage/sqlite/db.js';
import { sqliteStores } from '../src/storage/sqlite/index.js';
import { serveDataDir } from './lib/serve.js';
import { ADMIN_KEY as ADMIN, REPO } from './lib/targets.js';

const TARGET_MS = 20;

const { values } = parseArgs({
  options: { events: { type: 'string', default: '1000000' }, repeat: { type: 'string', default: '200' } },
});
const total = Number(values.events);
const repeat = Number(values.repeat);

const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-audit-bench-'));
const outcomes = ['allow', 'allow', 'allow', 'deny', 'requires_approval'] as const;
const actions = ['read', 'deploy', 'delete', 'export', 'payments.transfer', 'query'];

async function fill(): Promise<{ traceId: string; sinceIso: string; untilIso: string }> {
  // Filling is not what is measured: normal sync makes it take seconds, not minutes.
  const stores = sqliteStores(openDatabase(dir, 'normal'));
  const start = Date.now() - total; // one event per millisecond of history
  let traceId = '';
  const batch = 10_000;
  for (let i = 0; i < total; i += batch) {
    const events: NewAuditEvent[] = [];
    for (let j = i; j < Math.min(i + batch, total); j++) {
      // Flows of 4 events (decision, approval, mint, revoke) share a trace id.
      const flow = Math.floor(j / 4);
      const trace = flow.toString(16).padStart(32, '0');
      if (j === Math.floor(total / 2)) traceId = trace;
      events.push({
        kind: ['decision', 'queue.approve', 'token.mint', 'token.revoke'][j % 4] as string,
        time: new Date(start + j).toISOString(),
        trace_id: trace,
        request_id: `req-${flow}`,
        actor: `key-${flow % 50}`,
        agent_id: `agent-${flow % 1000}`,
        tenant_id: `tenant-${flow % 20}`,
        action: actions[flow % actions.length] as string,
        resource: `repo/r${flow % 5000}`,
        outcome: outcomes[flow % outcomes.length] as string,
        message: 'benchmark event',
        confidence: 0.9,
        policy_revision: 1,
        latency_us: 40,
        details: { reasons: [] },
      });
    }
    void stores.audit.append(events);
    if ((i / batch) % 10 === 0)
      process.stdout.write(`\r  filled ${i.toLocaleString()} / ${total.toLocaleString()}`);
  }
  process.stdout.write(`\r  filled ${total.toLocaleString()} events\n`);
  await stores.close();
  return {
    traceId,
    sinceIso: new Date(start + total * 0.3).toISOString(),
    untilIso: new Date(start + total * 0.31).toISOString(),
  };
}

async function time(url: string): Promise<{ p50: number; p99: number; max: number; count: number }> {
  const headers = { authorization: `Bearer ${ADMIN}` };
  let count = 0;
  for (let i = 0; i < 5; i++) await (await fetch(url, { headers })).text(); // warm
  const ms: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const t = process.hrtime.bigint();
    const res = await fetch(url, { headers });
    const body = (await res.json()) as { events?: unknown[] };
    ms.push(Number(process.hrtime.bigint() - t) / 1e6);
    if (res.status !== 200) throw new Error(`${url}: ${res.status} ${JSON.stringify(body)}`);
    count = body.events?.length ?? 0;
  }
  ms.sort((x, y) => x - y);
  const q = (p: number) => ms[Math.min(ms.length - 1, Math.floor(ms.length * p))] as number;
  return { p50: q(0.5), p99: q(0.99), max: ms[ms.length - 1] as number, count };
}

async function main(): Promise<void> {
  console.log(`audit benchmark: ${total.toLocaleString()} events, ${repeat} requests per query`);
  const t0 = Date.now();
  const { traceId, sinceIso, untilIso } = await fill();
  console.log(`  fill took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  const svc = await serveDataDir(dir, ADMIN);
  try {
    const first = (await (
      await fetch(`${svc.platform}/api/v1/audit?kind=decision&limit=100`, {
        headers: { authorization: `Bearer ${ADMIN}` },
      })
    ).json()) as { next_cursor: string };
    const queries: [string, string][] = [
      ['trace (4 events)', `/api/v1/audit/trace/${traceId}`],
      ['page: agent_id', '/api/v1/audit?agent_id=agent-17&limit=100'],
      ['page: outcome=deny', '/api/v1/audit?outcome=deny&limit=100'],
      ['page: tenant + action', '/api/v1/audit?tenant_id=tenant-3&action=deploy&limit=100'],
      ['page: since/until window', `/api/v1/audit?since=${sinceIso}&until=${untilIso}&limit=100`],
      ['page: kind, 2nd page (cursor)', `/api/v1/audit?kind=decision&limit=100&cursor=${first.next_cursor}`],
      ['page: request_id', `/api/v1/audit?request_id=req-${Math.floor(total / 8)}`],
    ];
    const results: Record<string, unknown>[] = [];
    console.log('\n  query                           events   p50 ms   p99 ms   max ms   target');
    for (const [name, q] of queries) {
      const r = await time(svc.platform + q);
      const pass = r.p99 <= TARGET_MS;
      results.push({ name, query: q, ...r, target_ms: TARGET_MS, pass });
      console.log(
        `  ${name.padEnd(31)} ${String(r.count).padStart(6)} ${r.p50.toFixed(2).padStart(8)} ${r.p99.toFixed(2).padStart(8)} ${r.max.toFixed(2).padStart(8)}   ${pass ? 'PASS' : 'FAIL'} (p99 ≤ ${TARGET_MS} ms)`,
      );
    }
    const outDir = path.join(REPO, 'bench', 'results');
    mkdirSync(outDir, { recursive: true });
    const file = path.join(outDir, `audit-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
    const report = { kind: 'audit', events: total, repeat, machine: { cpus: os.cpus().length }, results };
    writeFileSync(file, JSON.stringify(report, null, 2));
    writeFileSync(path.join(outDir, 'audit-latest.json'), JSON.stringify(report, null, 2));
    console.log(`\n  results: ${path.relative(REPO, file)}`);
  } finally {
    svc.stop();
    await new Promise((r) => setTimeout(r, 500));
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => {
  console.error(e);
  rmSync(dir, { recursive: true, force: true });
  process.exit(1);
});
