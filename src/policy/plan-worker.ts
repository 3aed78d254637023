/**
 * The planning thread (plan-thread.ts): parses the modules it is sent with its own RegoCompiler
 * (which keeps their trees), plans the paired module (paired.ts planRules) and answers the plan or
 * why there is none, one request at a time, in the order they came.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { RegoCompiler } from './compiler.js';
import { planRules, Unsupported } from './paired.js';
import type { PlanAnswer, PlanRequest } from './plan-thread.js';

const port = parentPort;
if (!port) throw new Error('plan-worker.js runs as a worker thread only');

const compiler = new RegoCompiler((workerData as { opaBin: string }).opaBin);
const ready = compiler.init();
let tail: Promise<void> = Promise.resolve();

async function plan(m: Extract<PlanRequest, { live: unknown }>): Promise<PlanAnswer> {
  try {
    await ready;
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

port.on('message', (m: PlanRequest) => {
  if ('close' in m) {
    tail = tail.then(async () => {
      await ready.catch(() => undefined);
      await compiler.close();
      port.close();
    });
    return;
  }
  tail = tail.then(async () => port.postMessage(await plan(m)));
});
