import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { fromMicro } from './limits.js';
import type { LimitStore } from './store.js';

/** One budget as GET /api/v1/limits shows it: the current fixed window of one (key, window). */
export interface BudgetUsage {
  key: string;
  window: string;
  window_start: string;
  resets_at: string;
  used: number;
  max: number;
  remaining: number;
}

/** Keys swept per batch: short statements beside the decision path, a turn of the loop between. */
const SWEEP_KEYS = 500;

/**
 * Budget usage (SPEC §13): the counters the engine keeps for the limits policies declare. A
 * counter whose newest window has ended shows the current window, unused, with the last known
 * maximum (the policy may declare another one on the next decision).
 */
export class BudgetService {
  private sweeper: NodeJS.Timeout | undefined;
  private sweeping: Promise<number> | undefined;

  constructor(
    private readonly store: LimitStore,
    private readonly clock: () => number = Date.now,
  ) {}

  /**
   * Deletes the counters of windows that a newer window of the same (key, window) replaced at
   * least one whole window length ago by this engine's clock: an engine whose clock is behind by
   * less than a window charges a window that ends after that, never a deleted one, so counters
   * stay exact for any skew smaller than a window (a 5-minute grace once let an engine 10 minutes
   * behind charge an hour's budget again from zero). With a skew of a window or more, budgets are
   * inexact anyway: each engine charges the window its own clock says. The cost is one row more
   * per (key, window) after a sweep at most, the window before the newest, kept up to one window
   * length (366 days for the longest); 1 s windows still go 1 s after their successor began (rows
   * of short windows pile up between sweeps, as they always did). Walks the keys in order,
   * SWEEP_KEYS at a time. Returns how many it deleted. One sweep at a time per process.
   */
  sweep(): Promise<number> {
    this.sweeping ??= (async () => {
      const now = this.clock();
      let deleted = 0;
      let after: string | null = null;
      for (;;) {
        const range = await this.store.counterKeys(after, SWEEP_KEYS);
        if (!range) return deleted;
        for (const windowMs of range.windowLengths) {
          const since = new Date(now - windowMs).toISOString();
          deleted += await this.store.pruneSuperseded(range, windowMs, since);
        }
        after = range.last;
        // SQLite answers synchronously: let decisions through between batches.
        await yieldToLoop();
      }
    })().finally(() => (this.sweeping = undefined));
    return this.sweeping;
  }

  /** Sweeps now and then every `intervalMs`; a failed sweep is retried at the next. */
  startSweeper(intervalMs: number, onError: (e: unknown) => void): void {
    const run = () => void this.sweep().catch(onError);
    run();
    this.sweeper = setInterval(run, intervalMs);
    this.sweeper.unref();
  }

  /** Stops the periodic sweep and waits for one under way. */
  async stop(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await this.sweeping?.catch(() => undefined);
  }

  /** The current window of each window length of `key` (only unbound keys may ask: the route says so). */
  async usage(key: string): Promise<BudgetUsage[]> {
    const now = this.clock();
    return (await this.store.latest(key)).map((c) => {
      const start = Math.floor(now / c.windowMs) * c.windowMs;
      const current = Date.parse(c.windowStart) === start;
      const used = current ? c.used : 0;
      return {
        key: c.key,
        window: c.window,
        window_start: new Date(start).toISOString(),
        resets_at: new Date(start + c.windowMs).toISOString(),
        used: fromMicro(used),
        max: fromMicro(c.max),
        remaining: fromMicro(Math.max(0, c.max - used)),
      };
    });
  }
}
