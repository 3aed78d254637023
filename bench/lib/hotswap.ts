// Policy hot swap under load: a PUT every second through the Platform API while autocannon
// drives the Engine API, then the audit trail is read to check which revision decided what.
import Database from 'better-sqlite3';
import http from 'node:http';
import path from 'node:path';
import { arbiterSpec, runLoad, type LoadResult } from './load.js';
import { sleep } from './proc.js';
import { ADMIN_KEY, type ArbiterProc } from './targets.js';

export interface SwapRecord {
  n: number;
  status: number;
  revision: number | null;
  /** PUT sent → response (compiled, stored and swapped in on the process that answered). */
  putMs: number;
  /** PUT sent → N consecutive /healthz reads on fresh connections report the new revision. */
  liveMs: number | null;
}

export interface HotSwapResult {
  seconds: number;
  swaps: SwapRecord[];
  putMs: { p50: number; max: number };
  liveMaxMs: number | null;
  failedPuts: number;
  load: LoadResult;
  audit: {
    decisions: number;
    byRevision: Record<string, number>;
    knownRevisions: number[];
    /** Decisions stamped with a revision that never existed: must be 0. */
    unknownRevision: number;
    /** Decisions recorded after one with a newer revision (informative; 0 with one process). */
    revisionRegressions: number;
  };
  /** Zero failed decisions, zero decisions on an unknown revision, every PUT accepted. */
  ok: boolean;
}

const HEALTH_CONFIRMATIONS = 5;

function toggleRego(n: number): string {
  return `package authz.agent

# Written by the benchmark (bench/run.ts): harmless, the load never uses this resource.
deny contains "bench toggle ${n}" if input.resource == "bench/never"
`;
}

/** GET /healthz on a new connection each time (so that every serving process can be asked). */
function healthRevision(base: string): Promise<number | null> {
  return new Promise((resolve) => {
    const req = http.get(`${base}/healthz`, { agent: false, timeout: 2_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => {
        try {
          resolve((JSON.parse(body) as { revision?: number }).revision ?? null);
        } catch {
          resolve(null);
        }
      });
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(null));
  });
}

async function waitLive(base: string, revision: number, deadlineMs: number): Promise<boolean> {
  let confirmations = 0;
  while (Date.now() < deadlineMs) {
    const r = await healthRevision(base);
    if (r !== null && r >= revision) {
      if (++confirmations >= HEALTH_CONFIRMATIONS) return true;
    } else {
      confirmations = 0;
      await sleep(5);
    }
  }
  return false;
}

function openAudit(a: ArbiterProc): Database.Database {
  return new Database(path.join(a.dataDir, 'arbiter.db'), { readonly: true, fileMustExist: true });
}

export async function runHotSwap(
  a: ArbiterProc,
  seconds: number,
  connections: number,
): Promise<HotSwapResult> {
  const r0 = await healthRevision(a.engine);
  if (r0 === null) throw new Error('arbiter /healthz has no revision before the hot-swap run');
  const db0 = openAudit(a);
  const startSeq =
    (db0.prepare('SELECT COALESCE(MAX(seq), 0) FROM audit_events').pluck().get() as number) ?? 0;
  db0.close();

  const loadDone = runLoad(arbiterSpec(a.engine, a.agentKey), { connections, duration: seconds + 1 });
  const swaps: SwapRecord[] = [];
  const t0 = Date.now();
  for (let n = 1; n <= seconds; n++) {
    const due = t0 + n * 1000 - 500;
    if (Date.now() < due) await sleep(due - Date.now());
    const started = performance.now();
    let status = 0;
    let revision: number | null = null;
    try {
      const res = await fetch(`${a.platform}/api/v1/policies/bench-toggle`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'text/plain' },
        body: toggleRego(n),
        signal: AbortSignal.timeout(30_000),
      });
      status = res.status;
      const body = (await res.json()) as { revision?: number };
      revision = typeof body.revision === 'number' ? body.revision : null;
    } catch {
      /* status 0 (no answer) or a body that is not JSON: counted as a failed PUT below */
    }
    const putMs = performance.now() - started;
    let liveMs: number | null = null;
    if (revision !== null && (await waitLive(a.engine, revision, Date.now() + 10_000))) {
      liveMs = performance.now() - started;
    }
    swaps.push({
      n,
      status,
      revision,
      putMs: Math.round(putMs * 10) / 10,
      liveMs: liveMs && Math.round(liveMs * 10) / 10,
    });
  }
  const load = await loadDone;

  const known = [r0, ...swaps.map((s) => s.revision).filter((r): r is number => r !== null)];
  const db = openAudit(a);
  let decisions = 0;
  let unknownRevision = 0;
  let revisionRegressions = 0;
  const byRevision: Record<string, number> = {};
  try {
    let maxSeen = -Infinity;
    const rows = db
      .prepare(
        "SELECT json_extract(body, '$.policy_revision') AS r FROM audit_events WHERE kind = 'decision' AND seq > ? ORDER BY seq",
      )
      .pluck()
      .iterate(startSeq) as Iterable<number | null>;
    for (const r of rows) {
      decisions++;
      byRevision[String(r)] = (byRevision[String(r)] ?? 0) + 1;
      if (r === null || !known.includes(r)) unknownRevision++;
      if (r !== null) {
        if (r < maxSeen) revisionRegressions++;
        maxSeen = Math.max(maxSeen, r);
      }
    }
  } finally {
    db.close();
  }
  const putSorted = swaps.map((s) => s.putMs).sort((x, y) => x - y);
  const lives = swaps.map((s) => s.liveMs);
  const failedPuts = swaps.filter((s) => s.status !== 200 && s.status !== 201).length;
  return {
    seconds,
    swaps,
    putMs: {
      p50: putSorted[Math.floor((putSorted.length - 1) / 2)] ?? 0,
      max: putSorted[putSorted.length - 1] ?? 0,
    },
    liveMaxMs: lives.includes(null) ? null : Math.max(...(lives as number[])),
    failedPuts,
    load,
    audit: { decisions, byRevision, knownRevisions: known, unknownRevision, revisionRegressions },
    ok: load.errors.total === 0 && unknownRevision === 0 && failedPuts === 0,
  };
}
