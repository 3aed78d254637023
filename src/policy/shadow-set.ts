import type { Module } from './compiler.js';
import type { Evaluator, PairedDecisions } from './evaluator.js';
import { ShadowRunner } from './shadow-runner.js';
import type { ShadowState } from './types.js';

/**
 * The shadow set as this process evaluates it (SPEC §11): the live set with each shadow module
 * replacing or adding its name, rebuilt whenever either changes. What a decision asks of it: the
 * runner that answers (none without shadow modules), the generation that answers, and, when the
 * modules no longer compile with the live set, why every decision counts a shadow error.
 */
export class ShadowSet {
  /** Evaluates the set: on its own thread (started with the first set) until proven (shadow-runner.ts). */
  private readonly runner: ShadowRunner;
  /** Why the set is not evaluated although it has modules (it no longer compiles with the live set). */
  private broken: string | undefined;
  /** The generation this process loaded (-1: none yet). */
  private loaded = -1;
  /** Why the set loaded last has no paired module. */
  private noPair: string | undefined;
  /** The paired module being built for the set loaded last (settles, never rejects). */
  private pairing: Promise<void> = Promise.resolve();
  /** The generation whose set answers shadow evaluations requested now (or fails them, broken). */
  private answering = -1;

  constructor(
    private readonly options: ConstructorParameters<typeof ShadowRunner>[0] & {
      /** Told why a loaded set has no paired module: it is evaluated on its own (ADR 0012). */
      unpaired?: (why: string) => void;
    },
  ) {
    this.runner = new ShadowRunner(options);
  }

  /**
   * The runner when shadow modules are being evaluated: on a worker thread until the set has
   * proven itself there, then beside the live set (shadow-runner.ts).
   */
  get evaluator(): ShadowRunner | undefined {
    return this.runner.active ? this.runner : undefined;
  }

  /**
   * The generation of the set that answers a shadow evaluation requested now: the one last loaded
   * (posted to its thread, and evaluated inline once proven), or the broken one whose decisions
   * count errors.
   */
  get generation(): number {
    return this.answering;
  }

  /** The generation this process last read from the store (-1: none yet). */
  get loadedGeneration(): number {
    return this.loaded;
  }

  /**
   * Set when there are shadow modules but the set cannot be evaluated (the live set changed under
   * it and the two no longer compile together): every decision counts a shadow error.
   */
  get failure(): string | undefined {
    return this.broken;
  }

  /**
   * Why the set loaded last has no paired module (paired.ts; undefined while one is being built,
   * once it is built, or without a set): its shape, or the build failed.
   */
  get unpaired(): string | undefined {
    return this.noPair;
  }

  /**
   * Loads the stored shadow modules (`read`) as the set `build` makes of them with the live set.
   * A set that cannot be read, built or loaded leaves the live set alone: it is marked broken.
   * Once it is loaded, its paired module (`pair`, when given) is built in the background: until it
   * is there, or if it cannot be, the set is evaluated on its own. Resolves once the set is loaded.
   */
  async rebuild(
    read: () => Promise<ShadowState>,
    build: (shadow: Module[]) => Promise<Evaluator>,
    pair?: (shadow: Module[]) => Promise<Evaluator>,
  ): Promise<void> {
    this.noPair = undefined;
    try {
      const shadow = await read();
      this.loaded = shadow.generation;
      if (shadow.policies.length === 0) {
        this.runner.clear();
        this.broken = undefined;
        this.answering = shadow.generation;
        return;
      }
      // Instantiated on this thread too (build checks its thresholds): this instance evaluates the
      // set on the serving thread once it has proven itself on its thread.
      const prepared = await build(shadow.policies);
      // Posted to the shadow thread now: any decision shadowed from here on is answered by this set.
      // The change answers once the thread has loaded it (for a first set, once the thread has
      // started), so that decisions made after it never wait for the load.
      this.broken = undefined;
      const loading = this.runner.load(prepared.threadSet, prepared);
      this.answering = shadow.generation;
      const epoch = this.runner.loadedEpoch;
      const unsendable = await loading;
      if (unsendable !== undefined) throw new Error(unsendable);
      if (pair) {
        const policies = shadow.policies;
        this.pairing = pair(policies).then(
          (paired) => this.runner.setPaired(paired, epoch),
          (e: unknown) => {
            if (this.runner.loadedEpoch !== epoch) return;
            const why = e instanceof Error ? e.message : String(e);
            this.noPair = why;
            try {
              this.options.unpaired?.(why);
            } catch {
              // An observer's fault changes nothing here.
            }
          },
        );
      }
    } catch (e) {
      this.runner.clear();
      this.broken = `the shadow set cannot be evaluated: ${(e as Error).message}`;
      this.answering = this.loaded;
    }
  }

  /**
   * Both decisions from one pass, when the set is paired with the live set `live` (ADR 0012);
   * undefined when it is not, and the live set is then evaluated on its own (shadow-runner.ts).
   */
  pair(input: unknown, live: Evaluator): PairedDecisions | undefined {
    return this.runner.active ? this.runner.pair(input, live) : undefined;
  }

  /** Settles once the paired module of the set loaded last is built, or could not be. */
  paired(): Promise<void> {
    return this.pairing;
  }

  /** Stops the shadow thread; shadow evaluations still waiting count an error. */
  async close(): Promise<void> {
    await this.runner.close();
    await this.pairing;
  }
}

/** The live modules with each shadow module replacing or adding its name. */
export function shadowModules(live: Module[], shadow: Module[]): Module[] {
  const set = new Map(live.map((m) => [m.name, m.rego]));
  for (const m of shadow) set.set(m.name, m.rego);
  return [...set].map(([name, rego]) => ({ name, rego }));
}
