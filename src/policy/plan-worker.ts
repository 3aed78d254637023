/**
 * The planning thread (plan-thread.ts): reads the parse trees it is given, plans the paired
 * module (paired.ts planRules) and posts the plan, or why there is none. One plan per thread.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { parsedPolicy, planRules, Unsupported } from './paired.js';
import type { PlanAnswer, PlanRequest } from './plan-thread.js';

const port = parentPort;
if (!port) throw new Error('plan-worker.js runs as a worker thread only');

const request = workerData as PlanRequest;
let answer: PlanAnswer;
try {
  answer = planRules(
    request.live.map(parsedPolicy),
    request.shadow.map(parsedPolicy),
    parsedPolicy(request.builtin),
  );
} catch (e) {
  answer = { error: e instanceof Error ? e.message : String(e), unsupported: e instanceof Unsupported };
}
port.postMessage(answer);
