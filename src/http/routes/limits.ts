import type { BudgetService } from '../../decisions/budgets.js';
import type { RouteDef } from '../context.js';
import { filterParam, queryOf } from '../query.js';
import { invalid } from '../../errors.js';
import { PLATFORM } from './shared.js';

const LIMITS_QUERY = [filterParam('key', 'the limit key a policy declared (required)')] as const;

const usageSchema = {
  type: 'object',
  required: ['key', 'window', 'window_start', 'resets_at', 'used', 'max', 'remaining'],
  additionalProperties: false,
  properties: {
    key: { type: 'string' },
    window: { type: 'string', description: 'the window as the policy wrote it, e.g. "1h"' },
    window_start: { type: 'string', format: 'date-time' },
    resets_at: { type: 'string', format: 'date-time' },
    used: { type: 'number', minimum: 0 },
    max: { type: 'number', minimum: 0 },
    remaining: { type: 'number', minimum: 0 },
  },
} as const;

/** SPEC §13: budget usage on the Platform API. */
export function limitRoutes(budgets: BudgetService): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/limits',
      template: '/api/v1/limits',
      ok: {
        status: 200,
        description: '{"key", "limits": [usage]}: the current window of each window length of the key',
        schema: {
          type: 'object',
          required: ['key', 'limits'],
          additionalProperties: false,
          properties: { key: { type: 'string' }, limits: { type: 'array', items: usageSchema } },
        },
      },
      query: LIMITS_QUERY,
      apis: PLATFORM,
      scope: 'audit:read',
      // Limit keys are strings a policy chooses, not tenant-scoped: a bound key could read the
      // counters of other tenants' users (docs/decisions.md).
      global: 'cannot read budget counters, which are not kept per tenant',
      body: 'none',
      summary: 'Current budget usage of one limit key, per window',
      handler: async (ctx) => {
        const { key } = queryOf(ctx, LIMITS_QUERY);
        if (key === undefined) throw invalid('query parameter key is required');
        ctx.body = { key, limits: await budgets.usage(key) };
      },
    },
  ];
}
