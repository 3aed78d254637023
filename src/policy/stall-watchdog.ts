import { Worker } from 'node:worker_threads';
import type { Logger } from '../observability/logger.js';

/** How often the watchdog thread looks (ms). */
const POLL_MS = 250;

/**
 * Ends the process when one policy evaluation on the serving thread has run for too long
 * (ARBITER_EVAL_STALL_SECONDS; docs/adr/0011). A wasm evaluation cannot be interrupted on the
 * thread that runs it, and the eval budget is only checked once it finishes: a live set (or a
 * proven shadow set, ADR 0010) that never finishes on some input would leave the process
 * listening but answering nothing, for ever. Killed instead, it is restarted by whatever runs it
 * (the primary with --workers, systemd's Restart=, an orchestrator); every decision it answered
 * was committed first.
 *
 * The serving thread marks each evaluation in shared memory (`enter`/`leave`: an atomic add and
 * two atomic stores); a thread of its own looks every POLL_MS and counts the looks that find the
 * same evaluation still running. It counts looks, not wall time, so a machine that was suspended
 * mid-evaluation is not mistaken for a stuck one: the evaluation ends right after it resumes.
 */
export class StallWatchdog {
  /** [0]: 1 while an evaluation runs; [1]: which evaluation (bumped by each `enter`). */
  private readonly state: Int32Array;
  private closing = false;

  private constructor(
    private readonly worker: Worker,
    state: SharedArrayBuffer,
  ) {
    this.state = new Int32Array(state);
  }

  /** Starts the watchdog thread; `seconds` of one evaluation end the process. */
  static start(seconds: number, log: Logger): StallWatchdog {
    if (process.pid === 1) {
      // The kernel drops a signal that a PID namespace's init sends itself without a handler.
      log.warn(
        'running as PID 1: the stall watchdog (ARBITER_EVAL_STALL_SECONDS) cannot end this process; ' +
          'run it under an init (docker run --init, tini) so that a stuck process can be ended',
      );
    }
    const state = new SharedArrayBuffer(8);
    const worker = new Worker(WATCHDOG_SOURCE, {
      eval: true,
      workerData: { state, polls: Math.ceil((seconds * 1000) / POLL_MS), pollMs: POLL_MS, seconds },
    });
    // Never what keeps the process alive.
    worker.unref();
    const watchdog = new StallWatchdog(worker, state);
    worker.on('error', (err) => log.error({ err }, 'the stall watchdog failed'));
    worker.on('exit', () => {
      if (!watchdog.closing) log.error('the stall watchdog stopped: evaluations are no longer watched');
    });
    return watchdog;
  }

  enter(): void {
    Atomics.add(this.state, 1, 1);
    Atomics.store(this.state, 0, 1);
  }

  leave(): void {
    Atomics.store(this.state, 0, 0);
  }

  async close(): Promise<void> {
    this.closing = true;
    await this.worker.terminate();
  }
}

/**
 * The watchdog thread. It logs with a direct write to stdout, in the service's log format: the
 * serving thread, which would otherwise carry a worker's output, is the one that is stuck. A
 * write that fails (a full or closed pipe) never stands in the way of the kill. SIGKILL, because
 * a stuck serving thread would never run the SIGTERM handler. It fires once.
 */
const WATCHDOG_SOURCE = `
const { workerData } = require('node:worker_threads');
const { writeSync } = require('node:fs');
const state = new Int32Array(workerData.state);
let seen = -1;
let looks = 0;
const timer = setInterval(() => {
  const running = Atomics.load(state, 0) === 1;
  const which = Atomics.load(state, 1);
  looks = running && which === seen ? looks + 1 : 0;
  seen = which;
  if (looks < workerData.polls) return;
  clearInterval(timer);
  const msg = 'a policy evaluation has run for ' + workerData.seconds + ' s without finishing ' +
    '(ARBITER_EVAL_STALL_SECONDS): ending the process, so that it can be restarted';
  try {
    writeSync(1, JSON.stringify({ level: 'fatal', time: new Date().toISOString(), pid: process.pid, msg }) + '\\n');
  } catch {
    // Nothing to report it with: the kill below is what matters.
  }
  process.kill(process.pid, 'SIGKILL');
}, workerData.pollMs);
`;
