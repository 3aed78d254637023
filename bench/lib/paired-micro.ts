// In-process: what the shadow set's evaluation itself costs, apart from HTTP, storage and the
// machine's other work. The example set live, the candidate as the shadow set, over the bench's
// request mix: the live set alone, the live then the shadow set each on its own (as before ADR
// 0012, and as a set that cannot be paired is evaluated), and one pass of their paired module.
import { dataTree } from '../../src/policy/documents.js';
import { RegoCompiler } from '../../src/policy/compiler.js';
import { Evaluator } from '../../src/policy/evaluator.js';
import { planPaired, type PairedPlan } from '../../src/policy/paired.js';
import { readPolicyDir } from '../../src/policy/policy-dir.js';
import { shadowModules } from '../../src/policy/shadow-set.js';
import { MIX, policyInput } from './load.js';
import { opaBin, POLICY_DIR } from './targets.js';

export interface PairedMicro {
  plan: Pick<PairedPlan, 'copied' | 'compared' | 'comparedByChanges'>;
  /** µs per evaluation, one figure per run. */
  live: number[];
  apart: number[];
  paired: number[];
}

/** `calls` evaluations per figure, `runs` runs, in an order that alternates from run to run. */
export async function pairedMicro(
  candidate: { name: string; rego: string },
  calls: number,
  runs: number,
): Promise<PairedMicro> {
  const compiler = new RegoCompiler(opaBin());
  await compiler.init();
  try {
    const dir = await readPolicyDir(POLICY_DIR);
    const live = dir.modules.map(({ name, rego }) => ({ name, rego }));
    const shadow = shadowModules(live, [candidate]);
    const data = dataTree(dir.data);
    const [l, s] = await Promise.all([compiler.parse(live), compiler.parse(shadow)]);
    const plan = planPaired(l.modules, s.modules, l.builtin, data);
    const [liveSet, shadowSet, paired] = await Promise.all(
      [compiler.compile(live), compiler.compile(shadow), compiler.compilePaired(live, plan.modules)].map(
        async (w) => Evaluator.create(await w, data, 1, 10_000),
      ),
    );
    const inputs = MIX.map((k) => policyInput(k));
    const ways: Record<'live' | 'apart' | 'paired', (input: unknown) => unknown> = {
      live: (input) => liveSet!.evaluate(input),
      apart: (input) => [liveSet!.evaluate(input), shadowSet!.evaluate(input, 'shadow')],
      paired: (input) => paired!.evaluatePair(input),
    };
    // The pass answers exactly what the two sets answer on their own, or its figure means nothing.
    for (const input of inputs) {
      const both = paired!.evaluatePair(input);
      const own = { live: liveSet!.evaluate(input), shadow: shadowSet!.evaluate(input, 'shadow') };
      if (JSON.stringify(both) !== JSON.stringify(own)) {
        throw new Error(`paired pass differs: ${JSON.stringify(both)} against ${JSON.stringify(own)}`);
      }
    }
    const time = (fn: (input: unknown) => unknown, n: number): number => {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) fn(inputs[i % inputs.length]);
      return Number(process.hrtime.bigint() - t0) / 1000 / n;
    };
    for (const fn of Object.values(ways)) time(fn, Math.min(calls, 5_000)); // warm-up
    const out: PairedMicro = {
      plan: { copied: plan.copied, compared: plan.compared, comparedByChanges: plan.comparedByChanges },
      live: [],
      apart: [],
      paired: [],
    };
    const names = Object.keys(ways) as (keyof typeof ways)[];
    for (let r = 0; r < runs; r++) {
      for (const name of r % 2 === 0 ? names : [...names].reverse()) {
        out[name].push(Math.round(time(ways[name], calls) * 10) / 10);
      }
    }
    return out;
  } finally {
    await compiler.close();
  }
}
