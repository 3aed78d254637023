// In-process: what a shadow set costs each part of the decision path, apart from HTTP, the load
// generator and the machine's other work (the HTTP rounds of bench:shadow see all of those).
// Two decision services over the example set, each on its own SQLite database, the second with
// the candidate as its shadow set (proven and paired, as it stands once it has been up a while).
// Each round times, for each service in an order that alternates from round to round:
//   - serving: DecisionService.authorizeAgent over the bench's request mix, one at a time, with
//     the store's record() answering at once (what the serving thread does per decision:
//     evaluation, the shadow's pass and bookkeeping, building the record and its audit event);
//   - writer: the records that run built, recorded for real, `concurrency` at a time (what the
//     writer does per decision: rows, the audit chain, the shadow report's tallies).
// Both are CPU per decision of this process (process.cpuUsage), so they are on a par with the
// HTTP rounds' per-thread figures, without their noise.
import type { DecisionToRecord, RecordOutcome } from '../../src/decisions/store.js';
import { DecisionService } from '../../src/decisions/service.js';
import { newId, newTraceId } from '../../src/ids.js';
import { ADMIN_PRINCIPAL } from '../../src/keys/service.js';
import { RegoCompiler } from '../../src/policy/compiler.js';
import { PolicyService } from '../../src/policy/service.js';
import { openDatabase } from '../../src/storage/sqlite/db.js';
import { sqliteStores } from '../../src/storage/sqlite/index.js';
import { KINDS, MIX } from './load.js';
import { opaBin, POLICY_DIR, tempDir } from './targets.js';

export interface DecisionMicro {
  /** µs of CPU per decision, one figure per round. */
  serving: { without: number[]; with: number[] };
  writer: { without: number[]; with: number[] };
  /** Counted from the start of the timed rounds. */
  moves: { inline: number; offInline: number; sentBack: number; slowKept: number; unpaired: number };
}

interface Side {
  decisions: DecisionService;
  /** The store's own record(), and the one DecisionService calls (swapped per phase). */
  record: (r: DecisionToRecord) => Promise<RecordOutcome>;
  setRecord: (fn: (r: DecisionToRecord) => Promise<RecordOutcome>) => void;
  close: () => Promise<void>;
}

/** A pause before a timed phase: the garbage of the one before is collected outside it. */
const settle = () => new Promise((r) => setTimeout(r, 200));

const cpuUs = (since: NodeJS.CpuUsage): number => {
  const c = process.cpuUsage(since);
  return c.user + c.system;
};

export async function decisionMicro(
  candidate: { name: string; rego: string },
  { decisions: n, rounds, concurrency }: { decisions: number; rounds: number; concurrency: number },
): Promise<DecisionMicro> {
  const compiler = new RegoCompiler(opaBin());
  await compiler.init();
  const ctx = { actor: 'bench', traceId: newTraceId(), requestId: newId() };
  let paired = false;
  /** What the shadow set did meanwhile: moves off or back onto the serving thread, slow passes kept. */
  const moves = { inline: 0, offInline: 0, sentBack: 0, slowKept: 0, unpaired: 0 };
  const side = async (shadow: boolean): Promise<Side> => {
    const stores = sqliteStores(openDatabase(tempDir('arbiter-bench-decide-'), 'normal'));
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
    await policies.start(POLICY_DIR, ctx);
    if (shadow) await policies.putShadow(candidate.name, candidate.rego, false, ctx);
    const store = stores.decisions;
    const record = store.record.bind(store);
    return {
      decisions: new DecisionService(
        policies,
        store,
        3600,
        (d) => d,
        { decided: () => undefined, shadowed: () => undefined },
        65536,
      ),
      record,
      setRecord: (fn) => {
        store.record = fn;
      },
      close: async () => {
        await policies.close();
        await stores.close();
      },
    };
  };
  const sides: Side[] = [];
  try {
    sides.push(await side(false), await side(true));
    const [without, withShadow] = sides as [Side, Side];
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

    for (const k of Object.keys(moves) as (keyof typeof moves)[]) moves[k] = 0;
    const out: DecisionMicro = {
      serving: { without: [], with: [] },
      writer: { without: [], with: [] },
      moves,
    };
    const us = (total: number) => Math.round((total / n) * 10) / 10;
    for (let r = 0; r < rounds; r++) {
      for (const shadow of r % 2 === 0 ? [false, true] : [true, false]) {
        const s = shadow ? withShadow : without;
        const key = shadow ? 'with' : 'without';
        // Serving: the records are dropped as they come (kept, they would grow the heap, and
        // its garbage collections would be timed too).
        s.setRecord(async (rec) => ({ decision: rec.decision }) as RecordOutcome);
        await settle();
        const c0 = process.cpuUsage();
        await run(s, n);
        out.serving[key].push(us(cpuUs(c0)));
        // Writer: as many records again, built untimed, then recorded for real.
        const built: DecisionToRecord[] = [];
        s.setRecord(async (rec) => {
          built.push(rec);
          return { decision: rec.decision } as RecordOutcome;
        });
        await run(s, n);
        s.setRecord(s.record);
        await settle();
        const c1 = process.cpuUsage();
        let at = 0;
        await Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (at < built.length) await s.record(built[at++]!);
          }),
        );
        out.writer[key].push(us(cpuUs(c1)));
      }
    }
    return out;
  } finally {
    for (const s of sides) await s.close();
    await compiler.close();
  }
}
