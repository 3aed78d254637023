import { Worker } from 'node:worker_threads';
import { failClosed, type PolicyDecision } from './evaluator.js';
import { uncheckedThresholds } from './thresholds.js';

/** What an evaluation thread needs to build the set's Evaluator (all structured-cloneable). */
export interface ThreadSet {
  module: WebAssembly.Module;
  data: Record<string, unknown>;
  revision: number;
  budgetMs: number;
}

/**
 * Serving thread → evaluation thread (eval-worker.ts). Evaluations go in batches: `inputs[i]` has the
 * id `first + i`. Ids are one sequence per thread, loads included, in the order sent.
 */
export type ThreadRequest =
  | ({ type: 'load'; id: number } & ThreadSet)
  | { type: 'evaluate'; first: number; inputs: unknown[] }
  | { type: 'thresholds'; id: number }
  | { type: 'stop' };

/**
 * Evaluation thread → serving thread: a load done, a batch's answers (`decisions[i]` for
 * `first + i`, which the set took `ms[i]` milliseconds to give; null when the thread holds no
 * set that could answer), or the set's threshold errors.
 */
export type ThreadAnswer =
  | { id: number; loaded: true }
  | { first: number; decisions: PolicyDecision[]; ms: (number | null)[] }
  | { id: number; thresholdErrors: string[] };

/**
 * An evaluation unanswered this long after the thread reached it (the eval budget plus this
 * margin) is a timeout: the thread is stuck in an evaluation that wasm cannot interrupt in-thread.
 */
export const EVAL_TIMEOUT_MARGIN_MS = 1_000;
/** Loading a set in the thread (instantiating the module, writing the data) may take this long. */
const LOAD_TIMEOUT_MS = 30_000;
/** How often a busy thread's oldest request is checked against its deadline. */
const WATCH_MS = 100;

/**
 * The reason of an outcome the thread could not give (it failed, exited, timed out, or the input
 * could not be sent): the fail-closed shape the evaluator uses, with `error` set.
 */
export const THREAD_FAILURE = 'evaluation_thread_failed';

const failed = (error: string): PolicyDecision => failClosed(error, THREAD_FAILURE);

/** Why a thread without a set answers nothing (here and in eval-worker.ts). */
export const NO_SET = 'no policy set is loaded on the evaluation thread';

interface Outstanding {
  /** How long the thread may take once it reaches this request. */
  allowance: number;
  /**
   * The answer (a decision, or threshold errors), or the reason there is none; for a decision,
   * how long the thread took to evaluate it (ms).
   */
  settle: (answer: PolicyDecision | string[] | string, ms?: number) => void;
}

/**
 * One worker thread and the requests it holds. The thread answers in order, so the oldest
 * outstanding request is the one it works on, since the previous answer (or since it was sent,
 * when nothing was outstanding). When that request is overdue, or the thread fails or exits,
 * every request it holds settles with an error and the thread is terminated.
 *
 * Evaluations requested during one turn of the event loop are sent as one message (at the end of
 * the turn, or before anything else is sent), and answered as one: a message costs the serving
 * thread about as much as a small evaluation, a batch's share of it does not.
 */
class WorkerThread {
  private readonly worker: Worker;
  private readonly outstanding = new Map<number, Outstanding>();
  /** When the oldest outstanding request became the oldest (performance.now()). */
  private headSince = 0;
  private nextId = 0;
  /** Evaluations not sent yet: ids `batchFirst`, `batchFirst + 1`, … */
  private batch: unknown[] = [];
  private batchFirst = 0;
  private flushing = false;
  private readonly watch: NodeJS.Timeout;
  private dead = false;

  /** Failed, exited, timed out or terminated: it answers nothing more. */
  get stopped(): boolean {
    return this.dead;
  }

  constructor(private readonly onDead: (t: WorkerThread) => void) {
    this.worker = new Worker(new URL('./eval-worker.js', import.meta.url));
    this.worker.on('message', (a: ThreadAnswer) => {
      if ('loaded' in a) {
        this.answered(a.id, '');
        return;
      }
      if ('thresholdErrors' in a) {
        this.answered(a.id, a.thresholdErrors);
        return;
      }
      for (let i = 0; i < a.decisions.length; i++)
        this.answered(a.first + i, a.decisions[i] as PolicyDecision, a.ms[i] ?? undefined);
    });
    this.worker.on('error', (e) => this.fail(`the evaluation thread failed: ${e.message}`));
    this.worker.on('exit', (code) => this.fail(`the evaluation thread exited with code ${code}`));
    // An idle thread never keeps its process alive; one with requests outstanding does (someone
    // awaits their answers: see track/answered). After the listeners, which ref the worker again.
    this.worker.unref();
    this.watch = setInterval(() => this.check(), WATCH_MS);
    this.watch.unref();
  }

  /**
   * Sends a set to load; evaluations requested after this are answered by it. Resolves once the
   * thread has loaded it, or failed meanwhile (its evaluations then answer errors, and the next
   * one starts a thread again); never rejects. Resolves to the reason when the set cannot be sent
   * at all (no thread ever could take it).
   */
  load(set: ThreadSet): Promise<string | undefined> {
    if (this.dead) return Promise.resolve(undefined);
    this.flush();
    const id = this.nextId++;
    return new Promise((resolve) => {
      this.track(id, LOAD_TIMEOUT_MS, () => resolve(undefined));
      try {
        this.worker.postMessage({ type: 'load', id, ...set } satisfies ThreadRequest);
      } catch (e) {
        const reason = `the policy set could not be sent to the evaluation thread: ${(e as Error).message}`;
        this.outstanding.delete(id);
        this.fail(reason);
        resolve(reason);
      }
    });
  }

  /** Queues an evaluation for this turn's batch; `settle` is called exactly once. */
  evaluate(input: unknown, allowance: number, settle: Outstanding['settle']): void {
    if (this.dead) {
      settle('the evaluation thread has stopped');
      return;
    }
    if (this.batch.length === 0) this.batchFirst = this.nextId;
    const id = this.nextId++;
    this.batch.push(input);
    this.track(id, allowance, settle);
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => this.flush());
    }
  }

  /** Asks for the loaded set's threshold errors (after every evaluation queued before). */
  thresholds(allowance: number, settle: Outstanding['settle']): void {
    if (this.dead) {
      settle('the evaluation thread has stopped');
      return;
    }
    this.flush();
    const id = this.nextId++;
    this.track(id, allowance, settle);
    try {
      this.worker.postMessage({ type: 'thresholds', id } satisfies ThreadRequest);
    } catch (e) {
      this.answered(id, `could not be sent: ${(e as Error).message}`);
    }
  }

  /** Answers what it holds, then exits. */
  stop(): void {
    if (this.dead) return;
    this.flush();
    this.worker.postMessage({ type: 'stop' } satisfies ThreadRequest);
  }

  async terminate(): Promise<void> {
    this.fail('the evaluation thread was shut down');
    await this.worker.terminate();
  }

  /** Sends the batch; an input that cannot be sent answers an error, the others are sent. */
  private flush(): void {
    this.flushing = false;
    if (this.batch.length === 0 || this.dead) return;
    const inputs = this.batch;
    const first = this.batchFirst;
    this.batch = [];
    try {
      this.worker.postMessage({ type: 'evaluate', first, inputs } satisfies ThreadRequest);
    } catch {
      // Rare (an input structured clone refuses): one by one, so that only that one fails.
      inputs.forEach((input, i) => {
        try {
          this.worker.postMessage({
            type: 'evaluate',
            first: first + i,
            inputs: [input],
          } satisfies ThreadRequest);
        } catch (e) {
          this.answered(first + i, `evaluation could not be sent: ${(e as Error).message}`);
        }
      });
    }
  }

  private track(id: number, allowance: number, settle: Outstanding['settle']): void {
    if (this.outstanding.size === 0) {
      this.headSince = performance.now();
      this.worker.ref();
    }
    this.outstanding.set(id, { allowance, settle });
  }

  private answered(id: number, answer: PolicyDecision | string[] | string, ms?: number): void {
    const o = this.outstanding.get(id);
    if (!o) return;
    this.outstanding.delete(id);
    this.headSince = performance.now();
    if (this.outstanding.size === 0) this.worker.unref();
    o.settle(answer, ms);
  }

  private check(): void {
    const overdue = () => {
      const head = this.outstanding.values().next();
      return !head.done && performance.now() - this.headSince > head.value.allowance ? head.value : undefined;
    };
    if (!overdue()) return;
    // Answers may be waiting behind a busy serving thread: look again once they are delivered.
    setImmediate(() => {
      const head = overdue();
      if (head) this.fail(`evaluation timed out: no answer within ${head.allowance} ms`);
    });
  }

  private fail(reason: string): void {
    if (this.dead) return;
    this.dead = true;
    clearInterval(this.watch);
    const held = [...this.outstanding.values()];
    this.outstanding.clear();
    this.batch = [];
    // A stuck evaluation cannot be interrupted in its thread: terminate it (a no-op once exited).
    void this.worker.terminate();
    this.onDead(this);
    for (const o of held) o.settle(reason);
  }
}

/**
 * Evaluates one policy set on a worker thread, off the serving thread: the shadow set (SPEC §11)
 * until it has proven itself (shadow-runner.ts), the two sets of an impact replay, and the
 * threshold check of every new set — untested code that must never stall decisions. The thread is started with the first set and stopped when the set is cleared (it
 * answers what it holds first), so that nothing runs while there is no set. Requests and set changes go through
 * one port, in order: an evaluation requested after `load` is answered by that set, waiting in the
 * thread for the load to finish if need be. A failed, exited or stuck thread makes every request
 * it holds an error (see EVAL_TIMEOUT_MARGIN_MS); the next request starts a new thread, which
 * loads the current set first. `evaluate` never rejects.
 */
export class EvaluationThread {
  private set: ThreadSet | undefined;
  private thread: WorkerThread | undefined;
  /** Threads stopped by clear() that may still be answering. */
  private readonly retiring = new Set<WorkerThread>();
  private closed = false;

  /** Whether a set is loaded (for the shadow set: decisions are shadowed). */
  get active(): boolean {
    return this.set !== undefined;
  }

  /**
   * Makes `set` the thread's set: every evaluation requested from now on is answered by it. The
   * promise resolves once the thread has it loaded (a first set also waits for the thread to
   * start, ~0.1–0.2 s): a caller that awaits it before going on (a shadow change before it answers)
   * leaves no later evaluation waiting for the load. Never rejects; resolves to the reason when
   * the set cannot be sent to a thread at all, and then holds no set (`active` is false).
   */
  async load(set: ThreadSet): Promise<string | undefined> {
    if (this.closed) return undefined;
    this.set = set;
    let loaded: Promise<string | undefined>;
    // A thread that died (even while it was being started) is replaced, never reused.
    if (this.thread && !this.thread.stopped) loaded = this.thread.load(set);
    else {
      let started: ReturnType<EvaluationThread['start']>;
      try {
        started = this.start();
      } catch (e) {
        // No thread can be started (a thread or memory limit): this set cannot be loaded now.
        if (this.set === set) this.set = undefined;
        return `the evaluation thread could not be started: ${(e as Error).message}`;
      }
      this.thread = started.thread;
      loaded = started.loaded;
    }
    const unsendable = await loaded;
    if (unsendable !== undefined && this.set === set) this.set = undefined;
    return unsendable;
  }

  /** No set any more: the thread answers what it holds, then exits. */
  clear(): void {
    this.set = undefined;
    const t = this.thread;
    this.thread = undefined;
    if (t) {
      this.retiring.add(t);
      t.stop();
    }
  }

  /**
   * The set's decision on `input`; a decision with `error` when there is none (no set, the
   * thread failed or timed out, the input could not be sent). Queued before this returns, so it
   * is sent before any later set change.
   */
  evaluate(input: unknown): Promise<PolicyDecision> {
    return this.evaluateTimed(input).then((t) => t.decision);
  }

  /**
   * As evaluate(), with how long the set took to evaluate the input (ms); undefined when the set
   * gave no decision (none loaded or one that could not be loaded, a thread failure or timeout,
   * an input that could not be sent).
   */
  evaluateTimed(input: unknown): Promise<{ decision: PolicyDecision; ms?: number }> {
    const set = this.set;
    if (!set) return Promise.resolve({ decision: failed(NO_SET) });
    return new Promise((resolve) => {
      try {
        // A thread that died is replaced here, for the next request (it loads the current set first).
        const t = this.live();
        t.evaluate(input, set.budgetMs + EVAL_TIMEOUT_MARGIN_MS, (a, ms) =>
          resolve(
            typeof a === 'string'
              ? { decision: failed(a) }
              : Array.isArray(a)
                ? { decision: failed('unexpected answer') }
                : { decision: a, ms },
          ),
        );
      } catch (e) {
        resolve({ decision: failed(`evaluation could not be sent: ${(e as Error).message}`) });
      }
    });
  }

  /**
   * The threshold errors of the set (the built-in module's `threshold_errors`, which evaluates the
   * set's `thresholds` rules: user code), evaluated on the thread like any evaluation and held to
   * the same allowance. A set that cannot say — none loaded, the thread failed or timed out —
   * answers one error saying so: a change checked with it is refused. Never rejects.
   */
  thresholdErrors(): Promise<string[]> {
    const set = this.set;
    if (!set) return Promise.resolve(uncheckedThresholds(NO_SET));
    return new Promise((resolve) => {
      try {
        const t = this.live();
        t.thresholds(set.budgetMs + EVAL_TIMEOUT_MARGIN_MS, (a) =>
          resolve(
            Array.isArray(a) ? a : uncheckedThresholds(typeof a === 'string' ? a : 'unexpected answer'),
          ),
        );
      } catch (e) {
        resolve(uncheckedThresholds(`the evaluation thread could not be started: ${(e as Error).message}`));
      }
    });
  }

  /**
   * Ends the current thread now: what it holds answers an error, as on a timeout, and a new
   * thread starts loading the current set at once (so that a set slow to load is loaded while
   * the shadow set is skipped, not while a decision waits for it). For a set that did not keep
   * up: its backlog is dropped rather than evaluated for nobody, and nothing later waits behind it.
   */
  restart(): void {
    const t = this.thread;
    this.thread = undefined;
    if (t) void t.terminate();
    if (!this.set || this.closed) return;
    try {
      this.thread = this.start().thread;
    } catch {
      // No thread can be started now: the next evaluation tries again (and answers an error).
    }
  }

  /** Terminates every thread; evaluations still waiting answer an error. */
  async close(): Promise<void> {
    this.closed = true;
    this.set = undefined;
    const threads = [...(this.thread ? [this.thread] : []), ...this.retiring];
    this.thread = undefined;
    this.retiring.clear();
    await Promise.all(threads.map((t) => t.terminate()));
  }

  /** The thread, or a new one (loading the current set first) when there is none or it died. */
  private live(): WorkerThread {
    if (!this.thread || this.thread.stopped) this.thread = this.start().thread;
    return this.thread;
  }

  /** A new thread, loading the current set first. */
  private start(): { thread: WorkerThread; loaded: Promise<string | undefined> } {
    const thread = new WorkerThread((dead) => {
      if (this.thread === dead) this.thread = undefined;
      this.retiring.delete(dead);
    });
    return { thread, loaded: this.set ? thread.load(this.set) : Promise.resolve(undefined) };
  }
}

/**
 * The threshold errors of `set`, checked on `thread` (the set is loaded there first): every
 * problem with the thresholds it defines, or one error saying why they could not be checked (a
 * `thresholds` rule that did not finish within the eval budget plus 1 s, a set that could not be
 * loaded). The service's changes and `arbiter policy check` ask the same. Never rejects.
 */
export async function thresholdErrorsOn(thread: EvaluationThread, set: ThreadSet): Promise<string[]> {
  const loading = thread.load(set);
  const checking = thread.thresholdErrors();
  const unsendable = await loading;
  return unsendable === undefined ? await checking : uncheckedThresholds(unsendable);
}
