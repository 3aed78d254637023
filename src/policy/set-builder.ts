import { invalid } from '../errors.js';
import { CompileError, type Module, type RegoCompiler } from './compiler.js';
import { dataTree, ruleDataConflict } from './documents.js';
import { evaluationConflict, Evaluator } from './evaluator.js';
import { EvaluationThread, THREAD_FAILURE, thresholdErrorsOn } from './eval-thread.js';
import { checkPairedData } from './paired.js';
import { PlanThread } from './plan-thread.js';
import { shadowModules } from './shadow-set.js';
import { thresholdErrorMessage } from './thresholds.js';
import type { PolicySnapshot, PolicyStore, RecordedInput } from './types.js';

/** A set about to go live must finish evaluating this many of the latest recorded decisions. */
const PREFLIGHT_DECISIONS = 64;

/**
 * How `prepare` checks a set (see `checked`): `live`, a set about to go live (thresholds and the
 * latest decisions); `candidate`, a shadow set (thresholds), both within PolicyService's
 * serialized section and so on the one check thread; `isolated`, an impact candidate, on a thread
 * of its own (not serialized).
 */
export type Check = 'live' | 'candidate' | 'isolated';

/**
 * Turns a policy set (modules and data) into an evaluator that may be used: compiled with the
 * real OPA compiler (through the store's cache of compiled sets), instantiated, and checked off
 * the serving thread (no rule where the data hold a value, thresholds, the latest recorded
 * decisions). Keeps no set of its own: PolicyService decides which set is live and when.
 */
export class SetBuilder {
  /**
   * Where a changed set (live or shadow) is checked before it is used (its thresholds; a live one
   * also against recent decisions): its rules are user code, and one that never finishes must not
   * stall the serving thread (the change is refused). Changes are serialized: one thread serves them.
   */
  private readonly checkThread = new EvaluationThread();
  /** Where paired modules are planned: started at the first plan (plan-thread.ts). */
  private planner: PlanThread | undefined;

  constructor(
    private readonly store: Pick<PolicyStore, 'getCompiled' | 'putCompiled' | 'shadow'>,
    private readonly compiler: RegoCompiler,
    private readonly evalBudgetMs: number,
    private readonly observer: { compiled(ok: boolean, seconds: number): void },
    /** The live evaluator, to tell a failure the change brings from one the live set has too. */
    private readonly live: () => Evaluator | undefined,
    /** The policy inputs of the most recent recorded decisions, newest first (the audit trail). */
    private readonly recentInputs?: (n: number) => Promise<RecordedInput[]>,
  ) {}

  /** Stops the check and plan threads. */
  async close(): Promise<void> {
    await Promise.allSettled([this.checkThread.close(), this.planner?.close()]);
  }

  /**
   * Builds the next evaluator before anything is stored, so that a set which cannot be
   * instantiated, or whose thresholds are malformed (when `modules` is given), is refused with
   * the live set and the store untouched.
   */
  async prepare(
    module: WebAssembly.Module,
    data: Record<string, unknown>,
    revision: number,
    modules?: Module[],
    check: Check = 'candidate',
  ): Promise<Evaluator> {
    const e = await Evaluator.create(module, data, revision, this.evalBudgetMs);
    return modules ? this.checked(e, modules, check) : e;
  }

  /** 400 when a rule of `modules` sits where `data` hold a value (documents.ts, ruleDataConflict). */
  private async refuseRuleDataConflict(
    modules: Module[],
    data: Record<string, unknown>,
    set: '' | 'shadow ',
  ): Promise<void> {
    const clash = ruleDataConflict((await this.compiler.parse(modules)).modules, data);
    if (clash) {
      throw invalid(
        `conflicting rule for data path ${clash.path}: ${set}policy ${clash.policy} defines a rule there ` +
          `(row ${clash.row}) and the data hold a value at ${clash.held}; OPA refuses such a set: ` +
          'move the document or the rule; nothing changed',
      );
    }
  }

  /**
   * `e`, once checked: no rule where the data hold a value (OPA refuses such a set; documents.ts,
   * ruleDataConflict), then off the serving thread (each evaluation under the eval budget plus 1 s
   * of its own): its thresholds, and — for a set about to go live (`live`) — that it finishes
   * evaluating each of the most recent recorded decisions, so that a set that would stall the
   * serving thread on inputs like those is never installed. Any error — a malformed threshold, a
   * check that failed or did not finish — refuses the change (400) with the live set and the
   * store untouched. Changes (live and shadow) are serialized and share one check thread; an
   * impact candidate, which is not, is checked on a thread of its own, closed after, so that one
   * which never finishes cannot fail anyone else's check.
   */
  async checked(e: Evaluator, modules: Module[], check: Check): Promise<Evaluator> {
    const thread = check === 'isolated' ? new EvaluationThread() : this.checkThread;
    try {
      const recent =
        check === 'live' && this.recentInputs ? await this.recentInputs(PREFLIGHT_DECISIONS) : [];
      await this.refuseRuleDataConflict(modules, e.data, '');
      // A change to go live leaves the shadow set (the live set with the shadow modules in place)
      // compiling too: a data document on a rule only a shadow module defines is refused here,
      // as the shadow module would be refused after it.
      if (check === 'live') {
        const shadow = (await this.store.shadow()).policies;
        if (shadow.length > 0) {
          await this.refuseRuleDataConflict(shadowModules(modules, shadow), e.data, 'shadow ');
        }
      }
      const errors = await thresholdErrorsOn(thread, e.threadSet);
      if (errors.length > 0) throw invalid(thresholdErrorMessage(modules, errors));
      // One at a time: each has its own allowance, and none is left running when this returns.
      for (const { requestId, input, failed } of recent) {
        const d = await thread.evaluate(input);
        if (d.reasons[0] === THREAD_FAILURE) {
          throw invalid(
            `the new policy set did not finish evaluating recorded decision ${requestId} ` +
              `(${d.error ?? 'the evaluation thread failed'}): decisions like it would stall the engine; nothing changed`,
          );
        }
        if (evaluationConflict(d) && !failed && (await this.liveEvaluates(input))) {
          throw invalid(
            `the new policy set meets a conflict on recorded decision ${requestId}, which the live set decides: ` +
              `${d.error}; every decision like it would be a deny with an evaluation error; nothing changed`,
          );
        }
      }
      return e;
    } finally {
      if (thread !== this.checkThread) await thread.close();
    }
  }

  /**
   * Whether the live set evaluates `input` (a recorded input, masked as recorded) without an
   * error, on a thread of its own: only asked when a new set fails on it, to refuse only the
   * failures the change itself brings. No live set yet: nothing to compare with.
   */
  private async liveEvaluates(input: Record<string, unknown>): Promise<boolean> {
    const live = this.live();
    if (!live) return false;
    const thread = new EvaluationThread();
    try {
      thread.load(live.threadSet);
      const d = await thread.evaluate(input);
      return d.error === undefined;
    } finally {
      await thread.close();
    }
  }

  /**
   * The paired module (paired.ts, ADR 0012) of the live set of `snap` and the shadow set it makes
   * with `shadow`, loaded with the live data: from the store's cache when any process built it.
   * Rejects, saying why, when the two cannot be paired.
   */
  async paired(snap: PolicySnapshot | undefined, shadow: Module[]): Promise<Evaluator> {
    if (!snap) throw new Error('no live set');
    const live = snap.policies.map(({ name, rego }) => ({ name, rego }));
    // Parsed and planned on a thread of its own: a large set's would hold up decisions here.
    this.planner ??= new PlanThread(this.compiler.opaBin);
    const { plan, changedPackages } = await this.planner.plan(live, shadowModules(live, shadow));
    const data = dataTree(snap.data);
    checkPairedData(data, changedPackages);
    // Generated modules are named with a "/", which no policy name has: their hash is theirs alone.
    const setHash = this.compiler.setHash([
      ...live,
      ...plan.modules.map((m) => ({ ...m, name: `paired/${m.name}` })),
    ]);
    let wasm = await this.store.getCompiled(setHash);
    if (!wasm) {
      wasm = await this.compiler.compilePaired(live, plan.modules);
      await this.store.putCompiled(setHash, wasm);
    }
    return Evaluator.create(wasm, data, snap.revision, this.evalBudgetMs);
  }

  /**
   * The wasm module for a set: from the store's cache when any process compiled this exact set
   * (same modules, same built-in module, same compiler), else compiled and cached.
   */
  async compiled(modules: Module[]): Promise<WebAssembly.Module> {
    const setHash = this.compiler.setHash(modules);
    const cached = await this.store.getCompiled(setHash);
    if (cached) return WebAssembly.compile(cached);
    const wasm = await this.compile(modules);
    await this.store.putCompiled(setHash, wasm);
    return WebAssembly.compile(wasm);
  }

  /** The wasm module for a set: from the store's cache when present, else compiled (not cached). */
  async compiledWithoutStoring(modules: Module[]): Promise<WebAssembly.Module> {
    const cached = await this.store.getCompiled(this.compiler.setHash(modules));
    return WebAssembly.compile(cached ?? (await this.compile(modules)));
  }

  /** Compiles with the real compiler; a refused set is a 400 naming policy, row and column. */
  private async compile(modules: Module[]): Promise<Buffer> {
    const started = process.hrtime.bigint();
    try {
      const wasm = await this.compiler.compile(modules);
      this.observer.compiled(true, Number(process.hrtime.bigint() - started) / 1e9);
      return wasm;
    } catch (e) {
      this.observer.compiled(false, Number(process.hrtime.bigint() - started) / 1e9);
      if (e instanceof CompileError) throw invalid(`policy set does not compile: ${e.message}`);
      throw e;
    }
  }
}
