/**
 * Plans paired modules (paired.ts, ADR 0012) on a thread of its own. Planning reads every
 * module's parse tree with its locations (`opa parse` prints about 2.5 KB of JSON per line of
 * Rego): for the example policies that is about 10 ms of work, for a set of a few thousand rules
 * about a third of a second, plus reading the trees (JSON.parse of tens of MB), all of it on
 * the serving thread each time a shadow or live change rebuilt the pair, holding up every decision
 * in flight. Here the serving thread sends the modules' text and takes back the generated
 * modules; the thread runs `opa parse` itself (RegoCompiler, with its cache of trees), reads the
 * trees and plans. The data stays with the serving thread, which checks it against the packages
 * the plan changes (paired.ts checkPairedData).
 *
 * One thread, started at the first plan and kept (its cache of trees saves parsing the modules a
 * change leaves alone); plans are made one at a time, in the order asked. A plan that takes longer
 * than the timeout stops the thread (every plan it held fails; the next starts a new one): the
 * set is then evaluated on its own, as a set that cannot be paired is. The thread never keeps
 * the process alive.
 */
import { Worker } from 'node:worker_threads';
import type { Module } from './compiler.js';
import { Unsupported, type PairedPlan } from './paired.js';

/** What the planning thread is asked: the live set's modules and the shadow set's (text). */
export type PlanRequest = { id: number; live: Module[]; shadow: Module[] } | { id: 0; close: true };

/** What it answers: planRules' result, or why there is none (`unsupported`: planRules refused). */
export type PlanAnswer = { id: number } & (
  { plan: PairedPlan; changedPackages: string[][] } | { error: string; unsupported: boolean }
);

/** How long one plan may take, from when it was asked, before the thread is stopped (ms). */
export const PLAN_TIMEOUT_MS = 120_000;

interface Waiting {
  resolve: (r: { plan: PairedPlan; changedPackages: string[][] }) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export class PlanThread {
  private worker: Worker | undefined;
  private readonly waiting = new Map<number, Waiting>();
  private next = 1;

  /** `opaBin`: the compiler the thread parses with; `timeoutMs`: PLAN_TIMEOUT_MS unless a test says. */
  constructor(
    private readonly opaBin: string,
    private readonly timeoutMs: number = PLAN_TIMEOUT_MS,
  ) {}

  /**
   * paired.ts planRules of the two sets (each without the built-in module, which the thread's
   * compiler adds). Rejects with Unsupported when the planner refuses them, and with an Error when
   * a module does not parse, the thread fails, or the plan takes longer than the timeout.
   */
  plan(live: Module[], shadow: Module[]): Promise<{ plan: PairedPlan; changedPackages: string[][] }> {
    return new Promise((resolve, reject) => {
      const worker = this.started();
      const id = this.next++;
      const timer = setTimeout(() => {
        if (this.worker !== worker) return;
        this.stop(`planning the paired module took longer than ${this.timeoutMs} ms`);
      }, this.timeoutMs);
      timer.unref();
      this.waiting.set(id, { resolve, reject, timer });
      worker.postMessage({ id, live, shadow } satisfies PlanRequest);
    });
  }

  /** Ends the thread (its compiler's temporary files with it); waiting plans fail. */
  async close(): Promise<void> {
    const worker = this.worker;
    if (!worker) return;
    this.worker = undefined;
    this.failAll('the planning thread was closed');
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    worker.postMessage({ id: 0, close: true } satisfies PlanRequest);
    const late = setTimeout(() => void worker.terminate(), 5_000);
    late.unref();
    await exited;
    clearTimeout(late);
  }

  private started(): Worker {
    if (this.worker) return this.worker;
    const worker = new Worker(new URL('./plan-worker.js', import.meta.url), {
      workerData: { opaBin: this.opaBin },
    });
    worker.unref();
    worker.on('message', (a: PlanAnswer) => {
      const w = this.waiting.get(a.id);
      if (!w) return;
      this.waiting.delete(a.id);
      clearTimeout(w.timer);
      if ('plan' in a) w.resolve({ plan: a.plan, changedPackages: a.changedPackages });
      else if (a.unsupported) w.reject(new Unsupported(a.error));
      else w.reject(new Error(`planning the paired module failed: ${a.error}`));
    });
    worker.on('error', (e) => {
      if (this.worker === worker) this.stop(`planning the paired module failed: ${e.message}`);
    });
    worker.on('exit', (code) => {
      if (this.worker === worker)
        this.stop(`planning the paired module failed: its thread exited (code ${code})`);
    });
    this.worker = worker;
    return worker;
  }

  /** Stops the thread, failing every plan it held; the next plan starts a new one. */
  private stop(why: string): void {
    const worker = this.worker;
    this.worker = undefined;
    this.failAll(why);
    if (worker) void worker.terminate();
  }

  private failAll(why: string): void {
    for (const [id, w] of this.waiting) {
      this.waiting.delete(id);
      clearTimeout(w.timer);
      w.reject(new Error(why));
    }
  }
}
