import { loadPolicy, type LoadedPolicy } from '@open-policy-agent/opa-wasm';
import { invalid } from '../errors.js';
import { ENTRYPOINT, THRESHOLD_ERRORS } from './compiler.js';
import { PAIRED_ENTRYPOINT } from './paired.js';
import type { ThreadSet } from './eval-thread.js';
import { hostBuiltins, type EvalClock } from './host-builtins.js';
import { uncheckedThresholds } from './thresholds.js';

export type DecisionStatus = 'allow' | 'requires_approval' | 'deny';

export interface PolicyDecision {
  status: DecisionStatus;
  message: string;
  reasons: string[];
  /** Set when evaluation failed and the decision is the fail-closed deny. */
  error?: string;
  /** The budgets the policies declared (`limits`), unchecked: the decision service checks them. */
  limits?: unknown;
}

/** The live and the shadow set's decisions on one input, from one evaluation (paired.ts). */
export interface PairedDecisions {
  live: PolicyDecision;
  shadow: PolicyDecision;
}

/** wasm memory: 2 MiB to start, 256 MiB at most; a policy that needs more fails closed. */
const MEMORY = { initial: 32, maximum: 4096 };

const STATUSES: ReadonlySet<string> = new Set(['allow', 'requires_approval', 'deny']);

/** Which set an evaluation is of: `live+shadow` is both in one pass (paired.ts). */
export type EvaluatedSet = 'live' | 'shadow' | 'live+shadow';

/** Told when an evaluation on this thread starts (of what, by which set) and ends (stall-watchdog.ts). */
export interface EvaluationGuard {
  enter(input: unknown, revision: number, set: EvaluatedSet): void;
  leave(): void;
}

/** Set on the serving thread only: the evaluation threads stop a stuck evaluation themselves. */
let guard: EvaluationGuard | undefined;

/** Guards every evaluation on this thread from now on. */
export function guardEvaluations(g: EvaluationGuard): void {
  guard = g;
}

/** Stops guarding with `g` (a guard set since is kept). */
export function unguardEvaluations(g: EvaluationGuard): void {
  if (guard === g) guard = undefined;
}

/**
 * One compiled policy set loaded into one wasm instance with its data. Immutable once built: a
 * policy or data change builds a new Evaluator and swaps it in whole, so a decision sees one
 * revision only. Evaluation is synchronous, so it never interleaves with a swap.
 */
export class Evaluator {
  /** How long the last evaluate() took (ms, wall time): what the budget was held against. */
  lastMs = 0;

  private constructor(
    readonly revision: number,
    readonly module: WebAssembly.Module,
    readonly data: Record<string, unknown>,
    private readonly policy: LoadedPolicy,
    private readonly clock: EvalClock,
    private readonly budgetMs: number,
  ) {}

  static async create(
    wasm: Buffer | WebAssembly.Module,
    data: Record<string, unknown>,
    revision: number,
    budgetMs: number,
  ): Promise<Evaluator> {
    const module = wasm instanceof WebAssembly.Module ? wasm : await WebAssembly.compile(wasm);
    const clock: EvalClock = { nowNs: 0 };
    const policy = await loadPolicy(module, { ...MEMORY }, hostBuiltins(clock));
    try {
      policy.setData(data);
    } catch (e) {
      // The data documents, as the policy's wasm holds them, outgrow its memory: a refused change.
      if (/opa_malloc/.test(errorText(e))) {
        throw invalid(
          `the policy set's data does not fit in the evaluation memory (at most ${(MEMORY.maximum * 64) / 1024} MiB): ${errorText(e)}`,
        );
      }
      throw e;
    }
    return new Evaluator(revision, module, data, policy, clock, budgetMs);
  }

  /** What an evaluation thread needs to build this evaluator again (src/policy/eval-thread.ts). */
  get threadSet(): ThreadSet {
    return { module: this.module, data: this.data, revision: this.revision, budgetMs: this.budgetMs };
  }

  /** A new evaluator over the same compiled module with other data (no compilation). */
  withData(data: Record<string, unknown>, revision: number): Promise<Evaluator> {
    return Evaluator.create(this.module, data, revision, this.budgetMs);
  }

  /**
   * Evaluates data.authz.decision. Never throws: any fault (trap, builtin error, memory limit,
   * over-budget evaluation, undefined or malformed result) yields a deny carrying `error`.
   */
  evaluate(input: unknown, set: 'live' | 'shadow' = 'live'): PolicyDecision {
    const started = performance.now();
    let result: unknown;
    guard?.enter(input, this.revision, set);
    try {
      this.clock.nowNs = Date.now() * 1_000_000;
      result = this.policy.evaluate(input, ENTRYPOINT);
    } catch (e) {
      return failClosed(`policy evaluation failed: ${errorText(e)}`);
    } finally {
      guard?.leave();
      this.lastMs = performance.now() - started;
    }
    if (this.lastMs > this.budgetMs) {
      return failClosed(
        `policy evaluation exceeded its ${this.budgetMs} ms budget (took ${this.lastMs.toFixed(1)} ms)`,
      );
    }
    return checkDecision(result);
  }

  /**
   * Both decisions of a paired module (paired.ts) from one evaluation of PAIRED_ENTRYPOINT, or
   * undefined when it gave no clean pair: a fault, an evaluation over the budget, or either side
   * undefined, malformed or a fail-closed deny. The caller then evaluates each set on its own,
   * which answers exactly as without pairing and says why.
   */
  evaluatePair(input: unknown): PairedDecisions | undefined {
    const started = performance.now();
    let result: unknown;
    guard?.enter(input, this.revision, 'live+shadow');
    try {
      this.clock.nowNs = Date.now() * 1_000_000;
      result = this.policy.evaluate(input, PAIRED_ENTRYPOINT);
    } catch {
      return undefined;
    } finally {
      guard?.leave();
      this.lastMs = performance.now() - started;
    }
    if (this.lastMs > this.budgetMs || !Array.isArray(result) || result.length !== 1) return undefined;
    const both = (result[0] as { result?: unknown }).result as Record<string, unknown> | undefined;
    if (!both || typeof both !== 'object') return undefined;
    const live = decisionOf(both.live);
    // `same`: every rule the shadow set changes has its live value here, so its decision is the
    // live one, which the pass did not write out twice (paired.ts).
    const shadow = decisionOf(both.same === true ? both.live : both.shadow);
    return live.error === undefined && shadow.error === undefined ? { live, shadow } : undefined;
  }

  /**
   * Every problem with the thresholds this set defines (built-in module, `threshold_errors`): a
   * change that leaves any is refused. A set that cannot say is treated as having one.
   */
  thresholdErrors(): string[] {
    try {
      this.clock.nowNs = Date.now() * 1_000_000;
      const r = this.policy.evaluate({}, THRESHOLD_ERRORS) as { result?: unknown }[];
      const errors = r[0]?.result;
      if (!Array.isArray(errors) || !errors.every((e) => typeof e === 'string')) {
        return uncheckedThresholds('threshold_errors is malformed');
      }
      return (errors as string[]).sort();
    } catch (e) {
      return uncheckedThresholds(errorText(e));
    }
  }
}

function checkDecision(result: unknown): PolicyDecision {
  if (!Array.isArray(result) || result.length === 0) {
    return failClosed('policy evaluation failed: data.authz.decision is undefined');
  }
  if (result.length > 1)
    return failClosed('policy evaluation failed: data.authz.decision has several values');
  return decisionOf((result[0] as { result?: unknown }).result);
}

/** A value of data.authz.decision, checked; the fail-closed deny when it is malformed. */
function decisionOf(value: unknown): PolicyDecision {
  const d = value as Record<string, unknown> | undefined;
  if (
    !d ||
    typeof d !== 'object' ||
    typeof d.status !== 'string' ||
    !STATUSES.has(d.status) ||
    typeof d.message !== 'string' ||
    !Array.isArray(d.reasons) ||
    !d.reasons.every((r) => typeof r === 'string')
  ) {
    return failClosed('policy evaluation failed: data.authz.decision is malformed');
  }
  return {
    status: d.status as DecisionStatus,
    message: d.message,
    reasons: d.reasons as string[],
    ...(d.limits !== undefined ? { limits: d.limits } : {}),
  };
}

/**
 * Whether `d` is the deny of an evaluation that met a conflict: a rule or function with two
 * values for one input (OPA's wasm runtime says "var assignment conflict" or "object insert
 * conflict"). That is a fault of the set, whatever the input; unlike a budget overrun (the
 * machine's load) or a builtin refusing an odd input (which any caller can send).
 */
export const evaluationConflict = (d: PolicyDecision): boolean =>
  // Anchored to the runtime's own message (an optional location, then the conflict): builtins
  // that refuse an input quote it, and a caller must not be able to make a refusal read as this.
  /^policy evaluation failed: (?:[^\s"]+:\d+:\d+: )?(?:var assignment|object insert) conflict$/.test(
    d.error ?? '',
  );

/** The fail-closed deny for an evaluation that gave no decision, saying why (`error`). */
export function failClosed(error: string, reason = 'evaluation_error'): PolicyDecision {
  return { status: 'deny', message: error, reasons: [reason], error };
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.message;
  if (typeof e === 'string') return e;
  try {
    return JSON.stringify(e);
  } catch {
    return String(e);
  }
}
