// In-process: what a shadow set costs each part of the decision path, apart from HTTP, the load
// generator and the machine's other work (the HTTP rounds of bench:shadow see all of those).
// Two decision services over the example set, each on its own SQLite database, the second with
// the candidate as its shadow set (proven and paired, as it stands once it has been up a while).
// Each round times, for each service in an order that alternates from round to round:
//   - serving: DecisionService.authorizeAgent over the bench's request mix, one at a time, with
//     the store's record() serializing the record (as posting it to the writer thread does) and
//     answering at once: evaluation, the shadow's pass and bookkeeping, the record and its audit
//     event, the metrics (the server's own, prom-client);
//   - writer: as many records again, built untimed, then recorded for real, `concurrency` at a
//     time: rows, the audit chain, the shadow report's tallies.
// Each figure is the CPU of this process's main thread (/proc/self/task/<pid>/schedstat), where
// both parts run here, per decision; not the threads beside it (garbage-collection helpers, the
// shadow set's and the planning thread). Left out: the HTTP layer, and the writer thread's
// deserializing of the records. Masking is the default (no mask paths).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import type { DecisionToRecord, RecordOutcome } from '../../src/decisions/store.js';
import { DecisionService } from '../../src/decisions/service.js';
import { makeMasker } from '../../src/audit/mask.js';
import { newId, newTraceId } from '../../src/ids.js';
import { ADMIN_PRINCIPAL } from '../../src/keys/service.js';
import { createMetrics } from '../../src/observability/metrics.js';
import { RegoCompiler } from '../../src/policy/compiler.js';
import { decisionMetrics } from '../../src/services.js';
import { PolicyService } from '../../src/policy/service.js';
import { openDatabase } from '../../src/storage/sqlite/db.js';
import { sqliteStores } from '../../src/storage/sqlite/index.js';
import { KINDS, MIX } from './load.js';
import { opaBin, POLICY_DIR } from './targets.js';

export interface DecisionMicro {
  /** µs of CPU per decision, one figure per round. */
  serving: { without: number[]; with: number[] };
  writer: { without: number[]; with: number[] };
  /**
   * What the shadow set did during the timed rounds. Any `sentBack` or `unpaired` means some
   * decisions were not evaluated paired on this thread, and the `with` figures mean less.
   */
  moves: Moves;
}

interface Moves {
  /** Moves onto and off the serving thread. */
  inline: number;
  offInline: number;
  /** Slow passes that sent the set back to its thread, and those its thread found quick. */
  sentBack: number;
  slowKept: number;
  unpaired: number;
}

interface Side {
  decisions: DecisionService;
  /** The store's own record(), and the one DecisionService calls (swapped per phase). */
  record: (r: DecisionToRecord) => Promise<RecordOutcome>;
  setRecord: (fn: (r: DecisionToRecord) => Promise<RecordOutcome>) => void;
}

/**
 * A full collection before a timed phase, so that the garbage of the phase before (the records
 * kept for the writer part) is not collected inside it.
 */
function settler(): () => Promise<void> {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  return async () => {
    gc();
    await new Promise((r) => setTimeout(r, 100));
  };
}

/** CPU of this process's main thread so far, in µs (Linux); the whole process's elsewhere. */
function mainThreadCpuUs(): number {
  try {
    const ns = Number(readFileSync(`/proc/self/task/${process.pid}/schedstat`, 'utf8').split(' ')[0]);
    if (Number.isFinite(ns)) return ns / 1000;
  } catch {
    // not Linux: the process's CPU, every thread
  }
  const c = process.cpuUsage();
  return c.user + c.system;
}

export async function decisionMicro(
  candidate: { name: string; rego: string },
  { decisions: n, rounds, concurrency }: { decisions: number; rounds: number; concurrency: number },
): Promise<DecisionMicro> {
  const compiler = new RegoCompiler(opaBin());
  const settle = settler();
  const ctx = { actor: 'bench', traceId: newTraceId(), requestId: newId() };
  let paired = false;
  const moves: Moves = { inline: 0, offInline: 0, sentBack: 0, slowKept: 0, unpaired: 0 };
  const closers: (() => Promise<void>)[] = [];
  const side = async (shadow: boolean): Promise<Side> => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-bench-decide-'));
    closers.push(async () => rmSync(dir, { recursive: true, force: true }));
    const stores = sqliteStores(openDatabase(dir, 'normal'));
    closers.push(() => stores.close());
    const policies = new PolicyService(
      stores.policies,
      compiler,
      250,
      {
        compiled: () => undefined,
        revision: () => undefined,
        shadowPaired: (p) => {
          if (!shadow) return;
          paired = p;
          if (!p) moves.unpaired++;
        },
        shadowInline: (inline) => {
          if (shadow) moves[inline ? 'inline' : 'offInline']++;
        },
        shadowSentBack: () => moves.sentBack++,
        shadowSlowKept: () => moves.slowKept++,
      },
      { inline: true, paired: true },
    );
    closers.push(() => policies.close());
    await policies.start(POLICY_DIR, ctx);
    if (shadow) await policies.putShadow(candidate.name, candidate.rego, false, ctx);
    const store = stores.decisions;
    const record = store.record.bind(store);
    return {
      // The server's observer, into metrics of its own.
      decisions: new DecisionService(
        policies,
        store,
        3600,
        makeMasker([]),
        decisionMetrics(createMetrics()),
        65536,
        // No cap on pending approvals: the bench floods one key's queue by design (docs/performance.md).
        0,
      ),
      record,
      setRecord: (fn) => {
        store.record = fn;
      },
    };
  };
  try {
    await compiler.init();
    const without = await side(false);
    const withShadow = await side(true);
    const bodies = MIX.map((k) => KINDS[k].body);
    let next = 0;
    const decide = (s: Side) =>
      s.decisions.authorizeAgent(bodies[next++ % bodies.length]!, ADMIN_PRINCIPAL, {
        requestId: newId(),
        traceId: newTraceId(),
      });
    /**
     * `count` decisions one after another. A server's requests arrive as I/O, so its event loop
     * turns between them: here too, every 64 (the shadow set's thread answers the re-evaluation
     * of a slow pass there, and a second slow pass before it would send the set back).
     */
    const run = async (s: Side, count: number) => {
      for (let i = 0; i < count; i++) {
        await decide(s);
        if (i % 64 === 63) await new Promise((r) => setImmediate(r));
      }
    };
    // Warm-up, and the shadow set proven (PROVING_DECISIONS), paired and past its checked answers.
    await run(without, 3_000);
    await run(withShadow, 3_000);
    const until = Date.now() + 60_000;
    while (!paired) {
      if (Date.now() > until) throw new Error('the shadow set was not paired within 60 s');
      await run(withShadow, 200);
      await new Promise((r) => setTimeout(r, 50));
    }
    await run(withShadow, 3_000);

    for (const k of Object.keys(moves) as (keyof Moves)[]) moves[k] = 0;
    const out: DecisionMicro = {
      serving: { without: [], with: [] },
      writer: { without: [], with: [] },
      moves,
    };
    const us = (total: number) => Math.round((total / n) * 10) / 10;
    // What posting a record to the writer thread costs the serving thread (thread-committer.ts).
    const serialized = async (rec: DecisionToRecord) => {
      v8.serialize(rec);
      return { decision: rec.decision } as RecordOutcome;
    };
    for (let r = 0; r < rounds; r++) {
      for (const shadow of r % 2 === 0 ? [false, true] : [true, false]) {
        const s = shadow ? withShadow : without;
        const key = shadow ? 'with' : 'without';
        s.setRecord(serialized);
        await settle();
        const c0 = mainThreadCpuUs();
        await run(s, n);
        out.serving[key].push(us(mainThreadCpuUs() - c0));
        const built: DecisionToRecord[] = [];
        s.setRecord(async (rec) => {
          built.push(rec);
          return { decision: rec.decision } as RecordOutcome;
        });
        await run(s, n);
        s.setRecord(s.record);
        await settle();
        const c1 = mainThreadCpuUs();
        let at = 0;
        await Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (at < built.length) await s.record(built[at++]!);
          }),
        );
        out.writer[key].push(us(mainThreadCpuUs() - c1));
      }
    }
    // As they were at the end of the rounds: closing the services below moves the set too.
    return { ...out, moves: { ...moves } };
  } finally {
    // Policies before their stores before their directories, each attempted whatever the others
    // do; then the compiler.
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await compiler.close();
  }
}
