/**
 * Impact replay benchmark (SPEC §11): fills a database with N decision audit events (default
 * 100,000) carrying their policy input, through the real store, starts the real service on it
 * and times POST /api/v1/impact replaying all of them against a candidate set, over HTTP. The
 * target is under 30 s for 100,000 replays.
 *
 *   npm run bench:impact -- [--events 100000] [--repeat 3]
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

const TARGET_S = 30;

const { values } = parseArgs({
  options: { events: { type: 'string', default: '100000' }, repeat: { type: 'string', default: '3' } },
});
const total = Number(values.events);
const repeat = Number(values.repeat);

const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-impact-bench-'));
/** Agent requests of the example policies (policies/agent.rego), in every outcome. */
const requests = [
  { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 },
  { agent_id: 'deploy-bot', action: 'deploy', resource: 'prod/api', confidence: 0.95 },
  { agent_id: 'deploy-bot', action: 'delete', resource: 'prod/db', confidence: 0.99 },
  { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.3 },
  { agent_id: 'unknown-agent', action: 'read', resource: 'repo/arbiter', confidence: 0.99 },
];
const outcomes = ['allow', 'requires_approval', 'deny', 'deny', 'deny'];

async function fill(): Promise<void> {
  // Filling is not what is measured: normal sync makes it take seconds, not minutes.
  const stores = sqliteStores(openDatabase(dir, 'normal'));
  const start = Date.now() - total;
  const batch = 10_000;
  for (let i = 0; i < total; i += batch) {
    const events: NewAuditEvent[] = [];
    for (let j = i; j < Math.min(i + batch, total); j++) {
      const req = requests[j % requests.length] as (typeof requests)[number];
      events.push({
        kind: 'decision',
        time: new Date(start + j).toISOString(),
        trace_id: j.toString(16).padStart(32, '0'),
        request_id: `req-${j}`,
        actor: 'bench',
        agent_id: req.agent_id,
        action: req.action,
        resource: req.resource,
        outcome: outcomes[j % outcomes.length] as string,
        confidence: req.confidence,
        policy_revision: 1,
        latency_us: 20,
        details: {
          subject_kind: 'agent',
          reasons: [],
          context: { ticket: `T-${j % 100}` },
          input: {
            kind: 'agent',
            ...req,
            principal: { name: 'bench', tenant: null, agent: null },
          },
        },
      });
    }
    await stores.audit.append(events);
  }
  await stores.close();
}

async function main(): Promise<void> {
  console.log(`impact benchmark: ${total.toLocaleString()} recorded decisions, ${repeat} replays`);
  const t0 = Date.now();
  await fill();
  console.log(`  fill took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  const svc = await serveDataDir(dir, ADMIN);
  try {
    const body = JSON.stringify({
      policies: {
        'deny-read': 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n',
      },
      limit: total,
    });
    const runs: { seconds: number; replayed: number; changed: number }[] = [];
    for (let i = 0; i < repeat; i++) {
      const t = process.hrtime.bigint();
      const res = await fetch(`${svc.platform}/api/v1/impact`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
        body,
      });
      const r = (await res.json()) as { replayed: number; changed: number };
      const seconds = Number(process.hrtime.bigint() - t) / 1e9;
      if (res.status !== 200) throw new Error(`impact: ${res.status} ${JSON.stringify(r)}`);
      runs.push({ seconds, replayed: r.replayed, changed: r.changed });
      console.log(
        `  run ${i + 1}: ${r.replayed.toLocaleString()} replayed, ${r.changed.toLocaleString()} changed in ${seconds.toFixed(2)} s`,
      );
    }
    const worst = Math.max(...runs.map((r) => r.seconds));
    const pass = worst < TARGET_S && runs.every((r) => r.replayed === total);
    console.log(
      `  worst ${worst.toFixed(2)} s: ${pass ? 'PASS' : 'FAIL'} (${total} replays < ${TARGET_S} s)`,
    );
    const outDir = path.join(REPO, 'bench', 'results');
    mkdirSync(outDir, { recursive: true });
    const report = {
      kind: 'impact',
      events: total,
      machine: { cpus: os.cpus().length },
      runs,
      target_s: TARGET_S,
      pass,
    };
    writeFileSync(path.join(outDir, 'impact-latest.json'), JSON.stringify(report, null, 2));
    if (!pass) process.exitCode = 1;
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
