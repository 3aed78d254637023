/**
 * Plans paired modules (paired.ts, ADR 0012) on a thread of its own. Planning reads every
 * module's parse tree with its locations (`opa parse` prints about 2.5 KB of JSON per line of
 * Rego): for the example policies that is 9-23 ms of work, for a set of 4 000 rules 65-136 ms
 * plus reading the trees (JSON.parse of tens of MB), all of it on the serving thread each time a
 * shadow or live change rebuilt the pair, holding up every decision in flight. Here the serving
 * thread sends the modules' text and takes back the generated modules; the thread runs `opa parse`
 * itself (RegoCompiler, with its cache of trees), reads the trees and plans. The data stays with
 * the serving thread, which checks it against the packages the plan changes (paired.ts
 * checkPairedData).
 *
 * One thread, started at the first plan and kept (its cache of trees saves parsing the modules a
 * change leaves alone); plans are made one at a time, in the order asked. A plan that takes longer
 * than the timeout, counted from when the thread began it (not from when it was asked: a plan
 * waiting behind others is not late), stops the thread: every plan it held fails, and the next
 * starts a new one; the set is then evaluated on its own, as a set that cannot be paired is. A
 * stopped thread is asked to end its `opa` processes and remove its files, and is terminated if
 * it has not exited 5 s later. The thread never keeps the process alive, except for those 5 s at
 * most while it is being stopped; after close() no plan starts one again.
 */
import { Worker } from 'node:worker_threads';
import type { Module } from './compiler.js';
import type { PlannedRules } from './paired.js';
import { Unsupported } from './paired-rules.js';

/** What the planning thread is asked: the live set's modules and the shadow set's (text), or to end. */
export type PlanRequest = { id: number; live: Module[]; shadow: Module[] } | { id: 0; close: true };

/**
 * What it answers: that it began a plan, planRules' result, or why there is none (`unsupported`:
 * planRules refused). `ended`: it cannot plan any more (its compiler did not start) and is ending.
 */
export type PlanAnswer = { id: number } & (
  { began: true } | PlannedRules | { error: string; unsupported: boolean; ended?: true }
);

/** How long one plan may take, from when the thread began it, before the thread is stopped (ms). */
export const PLAN_TIMEOUT_MS = 120_000;
/** How long a stopped or closed thread has to end its `opa` processes and exit before it is terminated (ms). */
const EXIT_GRACE_MS = 5_000;

interface Waiting {
  resolve: (r: PlannedRules) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout | undefined;
}

export class PlanThread {
  private worker: Worker | undefined;
  private readonly waiting = new Map<number, Waiting>();
  private next = 1;
  private closed = false;

  /** `opaBin`: the compiler the thread parses with; `timeoutMs`: PLAN_TIMEOUT_MS unless a test says. */
  constructor(
    private readonly opaBin: string,
    private readonly timeoutMs: number = PLAN_TIMEOUT_MS,
  ) {}

  /**
   * paired.ts planRules of the two sets (each without the built-in module, which the thread's
   * compiler adds). Rejects with Unsupported when the planner refuses them, and with an Error when
   * a module does not parse, the thread fails or was closed, or the plan takes longer than the
   * timeout.
   */
  plan(live: Module[], shadow: Module[]): Promise<PlannedRules> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(new Error('the planning thread was closed'));
      const worker = this.started();
      const id = this.next++;
      this.waiting.set(id, { resolve, reject, timer: undefined });
      worker.postMessage({ id, live, shadow } satisfies PlanRequest);
    });
  }

  /** Ends the thread (its `opa` processes and temporary files with it); waiting plans fail. */
  async close(): Promise<void> {
    this.closed = true;
    await this.stop('the planning thread was closed');
  }

  private started(): Worker {
    if (this.worker) return this.worker;
    const worker = new Worker(new URL('./plan-worker.js', import.meta.url), {
      workerData: { opaBin: this.opaBin },
    });
    worker.unref();
    worker.on('message', (a: PlanAnswer) => {
      const w = this.waiting.get(a.id);
      if ('began' in a) {
        if (w && this.worker === worker) w.timer = this.deadline(worker);
        return;
      }
      if (w) {
        this.waiting.delete(a.id);
        clearTimeout(w.timer);
        if ('plan' in a) w.resolve({ plan: a.plan, changedPackages: a.changedPackages });
        else if (a.unsupported) w.reject(new Unsupported(a.error));
        else w.reject(new Error(`planning the paired module failed: ${a.error}`));
      }
      if ('ended' in a && this.worker === worker)
        void this.stop(`planning the paired module failed: ${a.error}`);
    });
    worker.on('error', (e) => {
      if (this.worker === worker) void this.stop(`planning the paired module failed: ${e.message}`);
    });
    worker.on('exit', (code) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.failAll(`planning the paired module failed: its thread exited (code ${code})`);
    });
    this.worker = worker;
    return worker;
  }

  /** The timer of the plan the thread has begun: past the timeout, the thread is stopped. */
  private deadline(worker: Worker): NodeJS.Timeout {
    const timer = setTimeout(() => {
      if (this.worker === worker)
        void this.stop(`planning the paired module took longer than ${this.timeoutMs} ms`);
    }, this.timeoutMs);
    timer.unref();
    return timer;
  }

  /**
   * Stops the thread, failing every plan it held (the next plan starts a new thread): asks it to
   * end its `opa` processes and remove its files, and terminates it if it has not exited in time.
   */
  private async stop(why: string): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    this.failAll(why);
    if (!worker) return;
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    worker.postMessage({ id: 0, close: true } satisfies PlanRequest);
    // Not unref'd: a process closing must not end before the thread has (it would leave its `opa`
    // processes and files); the thread is unref'd, so only this timer keeps the wait alive.
    const late = setTimeout(() => void worker.terminate(), EXIT_GRACE_MS);
    await exited;
    clearTimeout(late);
  }

  private failAll(why: string): void {
    for (const [id, w] of this.waiting) {
      this.waiting.delete(id);
      clearTimeout(w.timer);
      w.reject(new Error(why));
    }
  }
}
