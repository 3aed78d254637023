import { EVAL_TIMEOUT_MARGIN_MS, EvaluationThread, THREAD_FAILURE, type ThreadSet } from './eval-thread.js';
import { failClosed, type Evaluator, type PairedDecisions, type PolicyDecision } from './evaluator.js';
import {
  INLINE_MAX_MS,
  MAX_PROVING_DECISIONS,
  MAX_SKIP_MS,
  PAIR_CHECKED_DECISIONS,
  PAIR_SAMPLED_EVERY,
  PROVING_DECISIONS,
  SKIP_MS,
} from './shadow-limits.js';

/** What ShadowRunner uses of its set's thread. */
export type ShadowThread = Pick<
  EvaluationThread,
  'active' | 'load' | 'clear' | 'close' | 'evaluateTimed' | 'restart'
>;

/**
 * Where the shadow set (SPEC §11) is evaluated. A new set starts on its own thread
 * (eval-thread.ts), where an evaluation that never finishes is stopped and counted as an error
 * and the serving thread never waits for it. Once the set has answered PROVING_DECISIONS
 * decisions in a row there, each within INLINE_MAX_MS, it is evaluated on the serving thread,
 * right after the live set, like the live set: a thread hop costs the decision path more than the
 * evaluation itself (docs/performance.md). An inline evaluation slower than INLINE_MAX_MS has its
 * input evaluated again on the thread, off the decision path: if the set takes longer than
 * INLINE_MAX_MS there too, or gives no answer in time, or a second inline evaluation is slow before
 * the thread answers, the set goes back to the thread, to prove itself again over twice as many
 * decisions. A thread that answers within INLINE_MAX_MS says the slowness was the machine's (a
 * pause, a garbage collection): the set stays (ADR 0010, amended 2026-11-28). A new set (any
 * shadow or live change rebuilds it) starts over on the thread, with the first count.
 *
 * On the thread, a decision waits for its shadow answer at most the thread's own allowance (the
 * eval budget plus EVAL_TIMEOUT_MARGIN_MS), counted from when it asked, however many evaluations
 * are queued ahead of it. A set that timed out is then not evaluated for
 * SKIP_MS, doubling while it keeps timing out (up to MAX_SKIP_MS): those decisions count a shadow
 * error at once, and its thread is restarted (what it held is dropped). So an untested candidate
 * that is slow or never finishes costs only the decisions that ask while one wait runs, once per
 * skip period, not every decision (it used to cost each decision the full wait).
 *
 * What this leaves (docs/adr/0010): a proven set that never finishes on an input unlike every one
 * before it stalls the serving thread, as the live set would, until the stall watchdog ends the
 * process (ADR 0011). `inline: false` keeps every evaluation on the thread.
 *
 * Once inline, a set with a paired module (paired.ts, ADR 0012) is evaluated in one pass with the
 * live set (`pair`), sharing every rule it does not change. The first PAIR_CHECKED_DECISIONS
 * paired answers, and then one in PAIR_SAMPLED_EVERY, are checked against the two sets evaluated
 * on their own, and those answers stand; one difference and the pair is not used again for this
 * set.
 */
export class ShadowRunner {
  private readonly thread: ShadowThread;
  /** The set's evaluator on the serving thread: evaluating with it once `inline` is set. */
  private local: Evaluator | undefined;
  private inline = false;
  /** Decisions in a row the thread answered within INLINE_MAX_MS (for the current set). */
  private proven = 0;
  private required = PROVING_DECISIONS;
  /** Changes with every set: answers for an earlier set prove nothing about this one. */
  private epoch = 0;
  /** How long a decision waits for the thread's answer (ms), from the set's eval budget. */
  private waitMs = 0;
  /** The set's paired module (paired.ts), evaluated instead of both sets once the set is inline. */
  private paired: Evaluator | undefined;
  /** Paired answers given, and checked against the two sets' own, so far (shadow-limits.ts). */
  private pairAnswered = 0;
  private pairChecked = 0;
  /** Whether `pair` answers now (told through `options.paired`). */
  private pairing = false;
  /**
   * The epoch of the set whose slow inline evaluation its thread is timing again (slowInline);
   * undefined when none is.
   */
  private confirming: number | undefined;
  /** The current skip period after a timeout (ms; 0: none), and when it ends (performance.now()). */
  private skipMs = 0;
  private skipUntil = 0;

  constructor(
    private readonly options: {
      /** Whether a proven set moves to the serving thread (ARBITER_SHADOW_INLINE). */
      inline: boolean;
      /** Told each time the set moves to the serving thread or away from it. */
      moved?: (inline: boolean) => void;
      /** Told when a slow evaluation on the serving thread sent the set back (after `moved`). */
      sentBack?: () => void;
      /**
       * Told when a slow evaluation on the serving thread was not the set's: its thread evaluated
       * the same input within INLINE_MAX_MS, and the set stayed.
       */
      slowKept?: () => void;
      /** Told each time the set starts or stops being evaluated in one pass with the live set. */
      paired?: (paired: boolean) => void;
      /** Told when a paired answer differed from the two sets' own: the pair is dropped. */
      pairDiffered?: (detail: string) => void;
      /** The set's own thread: an EvaluationThread unless a test gives one with chosen timings. */
      thread?: ShadowThread;
      /** How long a decision waits for the thread (ms); by default the thread's own allowance. */
      waitMs?: number;
    },
  ) {
    this.thread = options.thread ?? new EvaluationThread();
  }

  /** Whether a set is loaded (decisions are shadowed). */
  get active(): boolean {
    return this.thread.active;
  }

  /** Whether the set is evaluated on the serving thread now (proven). */
  get evaluatedInline(): boolean {
    return this.inline;
  }

  /**
   * Makes the set (`set` for the thread, `local` its evaluator on this thread) the shadow set;
   * it starts on the thread. Resolves as EvaluationThread.load.
   */
  load(set: ThreadSet, local: Evaluator): Promise<string | undefined> {
    this.reset(local);
    this.waitMs = this.options.waitMs ?? set.budgetMs + EVAL_TIMEOUT_MARGIN_MS;
    return this.thread.load(set);
  }

  /**
   * The paired module of the set loaded last, built for the live set of its revision (it is used
   * only while the live set has that revision). `epoch` is `loadedEpoch` as it was right after
   * that set's `load`: a module built for an earlier set is ignored.
   */
  setPaired(paired: Evaluator, epoch: number): void {
    if (epoch !== this.epoch || !this.local) return;
    this.paired = paired;
    this.pairAnswered = 0;
    this.pairChecked = 0;
    this.notePairing();
  }

  /** Identifies the set loaded last (for setPaired). */
  get loadedEpoch(): number {
    return this.epoch;
  }

  /**
   * Both decisions from one pass of the paired module, when the set is evaluated inline and its
   * paired module was built for `live`; undefined otherwise, and whenever the pass gave no clean
   * pair: the caller then evaluates the live set and asks `evaluate`, as without a pair. While
   * the pair is being checked, the two sets are also evaluated on their own, and their answers
   * are the ones returned. Never throws.
   */
  pair(input: unknown, live: Evaluator): PairedDecisions | undefined {
    const paired = this.paired;
    const local = this.local;
    if (
      !this.pairing ||
      !paired ||
      !local ||
      paired.revision !== live.revision ||
      local.revision !== live.revision
    ) {
      return undefined;
    }
    let both: PairedDecisions | undefined;
    try {
      both = paired.evaluatePair(input);
    } catch {
      both = undefined;
    }
    if (paired.lastMs > INLINE_MAX_MS) this.slowInline(input);
    if (!both) return undefined;
    this.pairAnswered++;
    const check = this.pairChecked < PAIR_CHECKED_DECISIONS || this.pairAnswered % PAIR_SAMPLED_EVERY === 0;
    if (!check) return both;
    const own = { live: live.evaluate(input), shadow: local.evaluate(input, 'shadow') };
    if (JSON.stringify(own) === JSON.stringify(both)) {
      this.pairChecked++;
    } else {
      this.paired = undefined;
      this.notePairing();
      const detail = `paired ${JSON.stringify(both)}, on their own ${JSON.stringify(own)}`;
      this.tell(() => this.options.pairDiffered?.(detail));
    }
    return own;
  }

  /** No shadow set. */
  clear(): void {
    this.reset(undefined);
    this.thread.clear();
  }

  close(): Promise<void> {
    this.reset(undefined);
    return this.thread.close();
  }

  /**
   * The shadow set's decision on `input`: at once when evaluated inline, else once its thread
   * answers, at most after the wait (a decision with `error` when there is none, also while the
   * set is skipped after a timeout). Never throws, never rejects.
   */
  evaluate(input: unknown): PolicyDecision | Promise<PolicyDecision> {
    if (this.inline && this.local) {
      let d: PolicyDecision;
      let ms = 0;
      try {
        d = this.local.evaluate(input, 'shadow');
        ms = this.local.lastMs;
      } catch (e) {
        // Evaluator.evaluate never throws; should it, the shadow counts an error, never the decision.
        d = failClosed(`shadow evaluation failed: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (ms > INLINE_MAX_MS) this.slowInline(input);
      return d;
    }
    if (performance.now() < this.skipUntil) {
      return skipped(`not evaluated: the shadow set timed out and is skipped for ${this.skipMs / 1000} s`);
    }
    const epoch = this.epoch;
    return this.askThread(input, () => this.timedOut(epoch)).then((answer) => {
      if (!answer) return skipped(`the shadow set did not answer within ${this.waitMs} ms`);
      if (epoch === this.epoch) {
        // The set answered in time: a later timeout skips for the first period again. (A thread
        // failure is no answer of the set's, e.g. the waiters the restart below failed.)
        if (answer.ms !== undefined) this.skipMs = 0;
        if (!this.inline) this.prove(answer.ms);
      }
      return answer.decision;
    });
  }

  /**
   * The thread's answer to `input` (with how long the set took, as evaluateTimed), or undefined
   * when none came within the wait, counted from now: `late` is then told at once, and an answer
   * after it is dropped. Never rejects.
   */
  private askThread(
    input: unknown,
    late: () => void = () => {},
  ): Promise<{ decision: PolicyDecision; ms?: number } | undefined> {
    return new Promise((resolve) => {
      let waiting = true;
      const timer = setTimeout(() => {
        waiting = false;
        late();
        resolve(undefined);
      }, this.waitMs);
      timer.unref();
      void this.thread.evaluateTimed(input).then((answer) => {
        if (!waiting) return;
        clearTimeout(timer);
        resolve(answer);
      });
    });
  }

  /**
   * The thread gave no answer in time: skip the set for a while, twice as long as last time if
   * the set answered nothing in time since, and restart its thread, dropping what it still holds
   * (those decisions answer an error at once). Decisions that were waiting together count once.
   * (The thread's own timeout runs from when it reaches the evaluation, so this wait, as long
   * and counted from when the decision asked, ends first.)
   */
  private timedOut(epoch: number): void {
    if (epoch !== this.epoch || performance.now() < this.skipUntil) return;
    this.skipMs = this.skipMs === 0 ? SKIP_MS : Math.min(this.skipMs * 2, MAX_SKIP_MS);
    this.skipUntil = performance.now() + this.skipMs;
    this.thread.restart();
  }

  /** Counts one answer of the thread: `ms` is undefined when the set itself gave none. */
  private prove(ms: number | undefined): void {
    this.proven = ms !== undefined && ms <= INLINE_MAX_MS ? this.proven + 1 : 0;
    // No `local` when moving is switched off (reset): the set stays on its thread.
    if (this.proven >= this.required && this.local) this.setInline(true);
  }

  /**
   * An evaluation of `input` on the serving thread took longer than INLINE_MAX_MS (wall time,
   * which a pause of the machine or a garbage collection can stretch). Its thread evaluates the
   * input again, off the decision path, and the set goes back there when the set is slow on it
   * there too, gives no answer within the wait, or when another inline evaluation is slow before
   * the thread answers. While the thread times it, the set stays inline: a set slow on some input
   * costs the serving thread at most two slow evaluations, where before it cost one.
   */
  private slowInline(input: unknown): void {
    if (!this.inline) return;
    const epoch = this.epoch;
    if (this.confirming === epoch) {
      this.sendBack();
      return;
    }
    this.confirming = epoch;
    void this.askThread(input).then((answer) => {
      // An answer about an earlier set, or after a second slow evaluation sent this one back.
      if (this.confirming !== epoch || this.epoch !== epoch) return;
      this.confirming = undefined;
      if (!this.inline) return;
      const ms = answer?.ms;
      if (ms !== undefined && ms <= INLINE_MAX_MS) this.tell(() => this.options.slowKept?.());
      else this.sendBack();
    });
  }

  /** Back to the thread, to prove itself again over twice as many decisions. */
  private sendBack(): void {
    this.confirming = undefined;
    this.setInline(false);
    this.proven = 0;
    this.required = Math.min(this.required * 2, MAX_PROVING_DECISIONS);
    this.tell(() => this.options.sentBack?.());
  }

  private setInline(inline: boolean): void {
    if (this.inline === inline) return;
    this.inline = inline;
    this.tell(() => this.options.moved?.(inline));
    this.notePairing();
  }

  /** Tells whether `pair` answers now, when that changed. */
  private notePairing(): void {
    const pairing = this.inline && this.paired !== undefined;
    if (pairing === this.pairing) return;
    this.pairing = pairing;
    this.tell(() => this.options.paired?.(pairing));
  }

  private tell(observe: () => void): void {
    try {
      observe();
    } catch {
      // An observer's fault changes nothing here.
    }
  }

  private reset(local: Evaluator | undefined): void {
    this.epoch++;
    this.confirming = undefined;
    this.paired = undefined;
    this.pairAnswered = 0;
    this.pairChecked = 0;
    // Switched off, the set never moves: no copy of it is kept here.
    this.local = this.options.inline ? local : undefined;
    this.setInline(false);
    this.proven = 0;
    this.required = PROVING_DECISIONS;
    this.skipMs = 0;
    this.skipUntil = 0;
    this.notePairing();
  }
}

/** A shadow answer the set did not give: counted as a shadow error, like a thread failure. */
const skipped = (message: string): PolicyDecision => failClosed(message, THREAD_FAILURE);
