/**
 * Plans a paired module (paired.ts, ADR 0012) on a thread of its own. Planning reads every
 * module's parse tree with its locations: for the example policies that is about 10 ms of work,
 * for a set of a few thousand rules about 100 ms, all of it one synchronous stretch that would
 * hold up every decision in flight on the serving thread each time a shadow or live change
 * rebuilds the pair. Here the serving thread only hands over the trees as `opa parse` printed them
 * (text, copied at memory speed) and takes back the generated modules; the data, which can be
 * large, stays with it (checkPairedData). One short-lived thread per plan: plans are made once
 * per change, and a thread that ends with its plan holds nothing between changes.
 */
import { Worker } from 'node:worker_threads';
import type { ParsedJson } from './compiler.js';
import { Unsupported, type PairedPlan } from './paired.js';

/** What the planning thread is given: planRules' arguments, each tree as JSON text. */
export interface PlanRequest {
  live: ParsedJson[];
  shadow: ParsedJson[];
  builtin: ParsedJson;
}

/** What it answers: planRules' result, or why there is none (`unsupported`: it threw Unsupported). */
export type PlanAnswer =
  { plan: PairedPlan; changedPackages: string[][] } | { error: string; unsupported: boolean };

/** How long a plan may take before its thread is stopped and the set is evaluated on its own. */
export const PLAN_TIMEOUT_MS = 60_000;

/**
 * planRules of `request` on a new thread. Rejects with Unsupported when the planner refuses the
 * sets, and with an Error when the thread fails, exits without a plan or takes longer than
 * `timeoutMs` (it is then stopped). The thread never keeps the process alive.
 */
export function planOnThread(
  request: PlanRequest,
  timeoutMs: number = PLAN_TIMEOUT_MS,
): Promise<{ plan: PairedPlan; changedPackages: string[][] }> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL('./plan-worker.js', import.meta.url), { workerData: request });
    worker.unref();
    let settled = false;
    const settle = (done: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      void worker.terminate();
      done();
    };
    const failed = (why: string) => settle(() => reject(new Error(`planning the paired module ${why}`)));
    const timer = setTimeout(() => failed(`took longer than ${timeoutMs} ms`), timeoutMs);
    timer.unref();
    worker.once('message', (a: PlanAnswer) => {
      if ('plan' in a) settle(() => resolve(a));
      else if (a.unsupported) settle(() => reject(new Unsupported(a.error)));
      else failed(`failed: ${a.error}`);
    });
    worker.once('error', (e) => failed(`failed: ${e.message}`));
    worker.once('exit', (code) => failed(`failed: its thread exited (code ${code}) without a plan`));
  });
}
