import { forbidden } from '../errors.js';
import type { Principal } from '../keys/types.js';
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

/**
 * Budget usage (SPEC §13): the counters the engine keeps for the limits policies declare. A
 * counter whose newest window has ended shows the current window, unused, with the last known
 * maximum (the policy may declare another one on the next decision).
 */
export class BudgetService {
  constructor(
    private readonly store: LimitStore,
    private readonly clock: () => number = Date.now,
  ) {}

  async usage(principal: Principal, key: string): Promise<BudgetUsage[]> {
    // Limit keys are strings a policy chooses, not tenant-scoped: a bound key could read the
    // counters of other tenants' users, so only unbound keys may read them (docs/decisions.md).
    if (principal.tenant !== null || principal.agent !== null) {
      throw forbidden('API key is bound to a tenant or an agent and cannot read budget counters');
    }
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
