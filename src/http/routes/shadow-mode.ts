import { invalid } from '../../errors.js';
import type { PolicyService } from '../../policy/service.js';
import type { Ctx } from '../context.js';
import { queryParam } from '../query.js';
import { change, param } from './shared.js';

// The shadow mode of the policy PUT and DELETE routes (SPEC §11); the other shadow routes are in
// lifecycle.ts.

/** `?mode=shadow` on PUT and DELETE /api/v1/policies/{name}: the shadow set, not the live one. */
export const SHADOW_MODE = queryParam({
  name: 'mode',
  description: 'shadow: put or drop the candidate module in the shadow set; no answer changes',
  schema: { type: 'string', enum: ['shadow'] },
  parse: (raw: string): 'shadow' => {
    if (raw !== 'shadow') throw invalid(`query parameter mode must be shadow, got ${JSON.stringify(raw)}`);
    return raw;
  },
});

/** PUT /api/v1/policies/{name}?mode=shadow: compiled like a PUT, stored in the shadow set. */
export async function shadowPut(
  policies: PolicyService,
  ctx: Ctx,
  rego: string,
  dryRun: boolean,
): Promise<void> {
  if (ctx.get('if-match') !== '') throw invalid('If-Match cannot be used with mode=shadow');
  if (ctx.get('if-none-match') !== '') throw invalid('If-None-Match cannot be used with mode=shadow');
  const r = await policies.putShadow(param(ctx, 'name'), rego, dryRun, change(ctx));
  ctx.status = r.dryRun ? 200 : r.created ? 201 : 200;
  ctx.body = {
    ...(r.dryRun ? { dry_run: true, compiled: true } : {}),
    mode: 'shadow',
    name: r.name,
    sha256: r.sha256,
    since: r.since,
  };
}

/** DELETE /api/v1/policies/{name}?mode=shadow: drops the module from the shadow set. */
export async function shadowDelete(policies: PolicyService, ctx: Ctx): Promise<void> {
  if (ctx.get('if-match') !== '') throw invalid('If-Match cannot be used with mode=shadow');
  await policies.dropShadow(param(ctx, 'name'), change(ctx));
  ctx.status = 204;
}
