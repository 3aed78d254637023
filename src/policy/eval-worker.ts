/**
 * An evaluation thread (eval-thread.ts: shadow mode, impact replay): holds one policy set in its
 * own Evaluator and answers the serving thread's evaluations (in batches, one message per batch),
 * so that an evaluation costs the serving thread a share of a message.
 * Messages are handled strictly in the order they arrive: an evaluation that arrives while a set
 * is still loading waits for it (it is never answered by the previous set, nor dropped).
 */
import { parentPort } from 'node:worker_threads';
import { Evaluator, failClosed } from './evaluator.js';
import { NO_SET, type ThreadAnswer, type ThreadRequest } from './eval-thread.js';
import { uncheckedThresholds } from './thresholds.js';

let evaluator: Evaluator | undefined;
/** Why the last set could not be loaded here (every evaluation answers an error until the next). */
let loadFailure: string | undefined;
/** Messages not yet handled: while any is (a load), the next ones queue behind it. */
let queued = 0;
let tail: Promise<void> = Promise.resolve();

const port = parentPort;
if (!port) throw new Error('eval-worker.js runs as a worker thread only');

async function handle(m: ThreadRequest): Promise<void> {
  switch (m.type) {
    case 'load':
      try {
        evaluator = await Evaluator.create(m.module, m.data, m.revision, m.budgetMs);
        loadFailure = undefined;
      } catch (e) {
        evaluator = undefined;
        loadFailure = `the policy set could not be loaded on the evaluation thread: ${e instanceof Error ? e.message : String(e)}`;
      }
      answer({ id: m.id, loaded: true });
      return;
    case 'evaluate': {
      // No time for an answer the set did not give (it could not be loaded): that proves nothing.
      const ms: (number | null)[] = [];
      const decisions = m.inputs.map((input) => {
        if (!evaluator) {
          ms.push(null);
          return failClosed(loadFailure ?? NO_SET);
        }
        const d = evaluator.evaluate(input);
        ms.push(evaluator.lastMs);
        return d;
      });
      answer({ first: m.first, decisions, ms });
      return;
    }
    case 'thresholds':
      answer({
        id: m.id,
        thresholdErrors: evaluator ? evaluator.thresholdErrors() : uncheckedThresholds(loadFailure ?? NO_SET),
      });
      return;
    case 'stop':
      evaluator = undefined;
      port?.close();
      return;
  }
}

function answer(a: ThreadAnswer): void {
  port?.postMessage(a);
}

port.on('message', (m: ThreadRequest) => {
  // Nothing pending: an evaluation is answered at once (the common case, no promise involved).
  if (queued === 0 && m.type === 'evaluate') {
    void handle(m);
    return;
  }
  queued++;
  tail = tail
    .then(() => handle(m))
    .catch(() => undefined)
    .finally(() => queued--);
});
