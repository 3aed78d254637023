import type { LimitDeclaration, LimitUse } from '../queue/types.js';
import type { PolicyDecision } from '../policy/evaluator.js';
import { parseDurationNs } from '../policy/host-builtins.js';

/**
 * Budgets as policies declare them (SPEC §13): `limits contains {"key": k, "window": "1h",
 * "max": n, "cost": c}`, checked here before the engine charges them. Amounts become integer
 * micro-units (6 decimal places; costs round up, maxima down), so sums stay exact across
 * processes and backends.
 */
const MICRO = 1_000_000;
/** A window from one second to 366 days: fixed windows aligned to the Unix epoch. */
const MIN_WINDOW_MS = 1_000;
const MAX_WINDOW_MS = 366 * 24 * 3600 * 1000;
const MAX_LIMITS = 16;
/**
 * The largest max or cost: counters hold micro-units in a JavaScript number, exact up to 2^53 − 1
 * (9007199254.740991 units), and the largest double at or below that with 6 decimals is this one
 * (the next, 9007199254.740992, is 2^53 micro-units). Larger is a malformed limit: a deny.
 */
export const MAX_AMOUNT = 9_007_199_254.74099;

export class LimitError extends Error {}

/**
 * An amount in micro-units, rounded against the caller: a cost up (never charged less than
 * declared, or costs below 5e-7 would be free and a cost split into pieces would pay less than it
 * spends), a maximum down (never more allowed than declared). `micro / MICRO` compared with `v`
 * decides, so a number written with 6 decimals or fewer (0.1, whose double is not exactly a tenth)
 * is taken as written rather than nudged by floating-point noise.
 */
function amount(v: unknown, what: 'cost' | 'max', key: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw new LimitError(
      `limit ${JSON.stringify(key)}: ${what} must be a number ≥ 0, got ${JSON.stringify(v) ?? String(v)}`,
    );
  }
  if (v > MAX_AMOUNT) {
    throw new LimitError(
      `limit ${JSON.stringify(key)}: ${what} is too large (at most ${MAX_AMOUNT}), got ${v}`,
    );
  }
  let micro = Math.round(v * MICRO);
  if (what === 'cost' && micro / MICRO < v) micro += 1;
  if (what === 'max' && micro / MICRO > v) micro -= 1;
  return micro;
}

/**
 * A policy decision as the engine answers it, and the budgets it declares: a malformed `limits`
 * makes it the fail-closed deny naming the limit (never an allow whose budgets go unenforced). The
 * one place this is decided, for the live answer, the shadow set's and impact replay's: a
 * candidate is compared by what it would answer live.
 */
export function withLimits(decision: PolicyDecision): {
  decision: PolicyDecision;
  limits: LimitDeclaration[];
} {
  try {
    return { decision, limits: parseLimits(decision.limits) };
  } catch (e) {
    const error = `invalid limit: ${(e as Error).message}`;
    return { decision: { status: 'deny', message: error, reasons: ['invalid_limit'], error }, limits: [] };
  }
}

/**
 * The declarations of one decision, validated: a malformed one is a LimitError, which the
 * decision service answers with a fail-closed deny (the error goes to the audit event).
 */
export function parseLimits(raw: unknown): LimitDeclaration[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw new LimitError('limits must be a set of objects');
  if (raw.length > MAX_LIMITS) throw new LimitError(`at most ${MAX_LIMITS} limits may apply to one decision`);
  return raw.map((l): LimitDeclaration => {
    if (typeof l !== 'object' || l === null || Array.isArray(l)) {
      throw new LimitError(`a limit must be an object {key, window, max, cost}, got ${JSON.stringify(l)}`);
    }
    const o = l as Record<string, unknown>;
    const unknown = Object.keys(o).filter((k) => !['key', 'window', 'max', 'cost'].includes(k));
    if (unknown.length > 0)
      throw new LimitError(`a limit has unknown field ${unknown[0]} (known: key, window, max, cost)`);
    if (typeof o.key !== 'string' || o.key === '' || o.key.length > 256) {
      throw new LimitError(
        `a limit's key must be a string of 1 to 256 characters, got ${JSON.stringify(o.key)}`,
      );
    }
    const key = o.key;
    if (typeof o.window !== 'string') {
      throw new LimitError(
        `limit ${JSON.stringify(key)}: window must be a duration such as "1h", got ${JSON.stringify(o.window)}`,
      );
    }
    let ns: number;
    try {
      ns = parseDurationNs(o.window);
    } catch {
      throw new LimitError(
        `limit ${JSON.stringify(key)}: window ${JSON.stringify(o.window)} is not a duration such as "90s", "15m" or "1h"`,
      );
    }
    const windowMs = ns / 1e6;
    if (!Number.isInteger(windowMs) || windowMs < MIN_WINDOW_MS || windowMs > MAX_WINDOW_MS) {
      throw new LimitError(
        `limit ${JSON.stringify(key)}: window must be whole milliseconds between 1s and 366 days, got ${o.window}`,
      );
    }
    const cost = o.cost === undefined ? MICRO : amount(o.cost, 'cost', key);
    return { key, window: o.window, windowMs, max: amount(o.max, 'max', key), cost };
  });
}

/** The fixed window (aligned to the epoch) that `atMs` falls in, for each declaration. */
export function chargeAt(limits: readonly LimitDeclaration[], atMs: number): LimitUse[] {
  return limits.map((l) => ({
    ...l,
    windowStart: new Date(Math.floor(atMs / l.windowMs) * l.windowMs).toISOString(),
  }));
}

/** Micro-units back to the number a policy wrote. */
export const fromMicro = (micro: number): number => micro / MICRO;

/** The counter a charge goes to: one per key, window length and window start. */
export const counterOf = (l: Pick<LimitUse, 'key' | 'windowMs' | 'windowStart'>): string =>
  `${l.key}\n${l.windowMs}\n${l.windowStart}`;

/**
 * How one decision (or approval) charges its limits, given what each counter has used so far: the
 * rule both stores apply in their transaction. A counter declared more than once in the decision
 * (the same key and window length, maybe with different maxima) is charged the sum of its costs,
 * and every declaration's maximum must hold for the counter's total after the whole decision:
 * checking each against the running total of the declarations before it let the later, larger
 * maximum allow what the earlier one forbids. Answers the first declaration that would be
 * exceeded (nothing is then consumed), or one charge per counter: its cost the sum, its maximum
 * the smallest declared (what the counter stores and GET /api/v1/limits shows; first declared on
 * a tie, with its window as written).
 */
export function chargesOf(
  limits: readonly LimitUse[],
  usedOf: (l: LimitUse) => number,
): { exhausted: LimitUse } | { charges: LimitUse[] } {
  const charges = new Map<string, LimitUse>();
  for (const l of limits) {
    const c = charges.get(counterOf(l));
    if (!c) charges.set(counterOf(l), { ...l });
    else {
      c.cost += l.cost;
      if (l.max < c.max) Object.assign(c, { max: l.max, window: l.window });
    }
  }
  const totals = new Map([...charges].map(([k, c]) => [k, usedOf(c) + c.cost]));
  const exhausted = limits.find((l) => (totals.get(counterOf(l)) ?? 0) > l.max);
  return exhausted ? { exhausted } : { charges: [...charges.values()] };
}
