import { Worker } from 'node:worker_threads';
import type { Logger } from '../observability/logger.js';
import type { EvaluatedSet } from './evaluator.js';

/** How often the watchdog thread looks (ms). */
const POLL_MS = 250;

/** At most this many UTF-16 units of what is being evaluated are kept for the fatal log line. */
const LABEL_UNITS = 480;

/** The shared state's layout: three Int32 slots, then the label's UTF-16 units. */
const RUNNING = 0;
const WHICH = 1;
const LABEL_LENGTH = 2;
const LABEL_OFFSET = 12;

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
 * a few stores); a thread of its own looks every POLL_MS and counts the looks that find the
 * same evaluation still running. It counts looks, not wall time, so a machine that was suspended
 * mid-evaluation is not mistaken for a stuck one: the evaluation ends right after it resumes.
 * `enter` also copies what is evaluated — which set and revision, the subject, action and
 * resource of the input, never its context — so that the fatal log line says what an operator
 * needs to find the input and the policy: the decision was never recorded.
 */
export class StallWatchdog {
  /** RUNNING: 1 while an evaluation runs; WHICH: bumped by each `enter`; LABEL_LENGTH. */
  private readonly state: Int32Array;
  /** What the running evaluation evaluates (see `enter`), for the fatal log line. */
  private readonly label: Uint16Array;
  private length = 0;
  private closing = false;

  private constructor(
    private readonly worker: Worker,
    state: SharedArrayBuffer,
  ) {
    this.state = new Int32Array(state, 0, 3);
    this.label = new Uint16Array(state, LABEL_OFFSET, LABEL_UNITS);
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
    const state = new SharedArrayBuffer(LABEL_OFFSET + 2 * LABEL_UNITS);
    const worker = new Worker(WATCHDOG_SOURCE, {
      eval: true,
      workerData: {
        state,
        polls: Math.ceil((seconds * 1000) / POLL_MS),
        pollMs: POLL_MS,
        seconds,
        labelOffset: LABEL_OFFSET,
        labelUnits: LABEL_UNITS,
      },
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

  /**
   * An evaluation of `input` by the `set` set of `revision` starts. The label is written before
   * the evaluation is marked running, so a look that finds it running reads a whole label. Only
   * the strings the input names are copied, unit by unit: no string is built per decision.
   */
  enter(input: unknown, revision: number, set: EvaluatedSet): void {
    this.length = 0;
    this.write(set);
    this.write(' set, revision ');
    this.write(String(revision));
    if (typeof input === 'object' && input !== null) {
      const i = input as Record<string, unknown>;
      this.field(' kind=', i.kind);
      this.field(' agent_id=', i.agent_id);
      this.field(' tenant_id=', i.tenant_id);
      this.field(' user_id=', i.user_id);
      this.field(' action=', i.action);
      const r = i.resource;
      if (typeof r === 'object' && r !== null) {
        this.field(' resource.type=', (r as Record<string, unknown>).type);
        this.field(' resource.id=', (r as Record<string, unknown>).id);
      } else this.field(' resource=', r);
    }
    Atomics.store(this.state, LABEL_LENGTH, this.length);
    Atomics.add(this.state, WHICH, 1);
    Atomics.store(this.state, RUNNING, 1);
  }

  leave(): void {
    Atomics.store(this.state, RUNNING, 0);
  }

  private field(name: string, value: unknown): void {
    if (typeof value !== 'string') return;
    this.write(name);
    this.write(JSON_QUOTE);
    this.write(value);
    this.write(JSON_QUOTE);
  }

  private write(text: string): void {
    const n = Math.min(text.length, LABEL_UNITS - this.length);
    for (let k = 0; k < n; k++) this.label[this.length + k] = text.charCodeAt(k);
    this.length += n;
  }

  async close(): Promise<void> {
    this.closing = true;
    await this.worker.terminate();
  }
}

const JSON_QUOTE = '"';

/**
 * The watchdog thread. It logs with a direct write to stdout, in the service's log format: the
 * serving thread, which would otherwise carry a worker's output, is the one that is stuck. A
 * write that fails (a full or closed pipe) never stands in the way of the kill. SIGKILL, because
 * a stuck serving thread would never run the SIGTERM handler. It fires once.
 */
const WATCHDOG_SOURCE = `
const { workerData } = require('node:worker_threads');
const { writeSync } = require('node:fs');
const state = new Int32Array(workerData.state, 0, 3);
const label = new Uint16Array(workerData.state, workerData.labelOffset, workerData.labelUnits);
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
    '(ARBITER_EVAL_STALL_SECONDS): ending the process, so that it can be restarted; the decision ' +
    'is not recorded: "evaluating" names the set and what was asked';
  let evaluating = '';
  try {
    evaluating = String.fromCharCode.apply(null, label.subarray(0, Atomics.load(state, 2)));
  } catch {
    // The label is a help, never in the way of the kill.
  }
  try {
    writeSync(1, JSON.stringify({ level: 'fatal', time: new Date().toISOString(), pid: process.pid, msg, evaluating }) + '\\n');
  } catch {
    // Nothing to report it with: the kill below is what matters.
  }
  process.kill(process.pid, 'SIGKILL');
}, workerData.pollMs);
`;
