/**
 * The planning thread (plan-thread.ts): parses the modules it is sent with its own RegoCompiler
 * (which keeps their trees), plans the paired module (paired.ts planRules) and answers the plan or
 * why there is none, one request at a time, in the order they came; it says when it begins each
 * (its compiler started), as its time limit counts from then. Asked to end, it ends its `opa`
 * processes at once (the plan in progress fails; no answer is sent for it or for those waiting),
 * removes its files and exits. A compiler that does not start ends the thread too (the next plan
 * starts a new one).
 */
import { type MessagePort, parentPort, workerData } from 'node:worker_threads';
import { RegoCompiler } from './compiler.js';
import { planRules } from './paired.js';
import { Unsupported } from './paired-rules.js';
import type { PlanAnswer, PlanRequest } from './plan-thread.js';

if (!parentPort) throw new Error('plan-worker.js runs as a worker thread only');
const port: MessagePort = parentPort;

const compiler = new RegoCompiler((workerData as { opaBin: string }).opaBin);
/** Why the compiler did not start, or undefined once it has. */
const started: Promise<Error | undefined> = compiler.init().then(
  () => undefined,
  (e: unknown) => (e instanceof Error ? e : new Error(String(e))),
);
let tail: Promise<void> = Promise.resolve();
let ending = false;

async function plan(m: Extract<PlanRequest, { live: unknown }>): Promise<PlanAnswer> {
  const failed = await started;
  if (failed) {
    return {
      id: m.id,
      error: `its compiler did not start: ${failed.message}`,
      unsupported: false,
      ended: true,
    };
  }
  port.postMessage({ id: m.id, began: true } satisfies PlanAnswer);
  try {
    const [l, s] = await Promise.all([compiler.parse(m.live), compiler.parse(m.shadow)]);
    return { id: m.id, ...planRules(l.modules, s.modules, l.builtin) };
  } catch (e) {
    return {
      id: m.id,
      error: e instanceof Error ? e.message : String(e),
      unsupported: e instanceof Unsupported,
    };
  }
}

async function end(): Promise<void> {
  if (ending) return;
  ending = true;
  // Its `opa` processes end first: the compiler may still be starting, and wait on one of them.
  await compiler.close();
  await started;
  await compiler.close();
  port.close();
}

port.on('message', (m: PlanRequest) => {
  if ('close' in m) return void end();
  tail = tail.then(async () => {
    if (ending) return;
    const a = await plan(m);
    if (ending) return;
    port.postMessage(a);
    if ('ended' in a) await end();
  });
});
