import type { ChangeContext } from '../../policy/service.js';
import { actorOf, type Ctx } from '../context.js';

/** Which listeners serve a route. */
export const BOTH = ['engine', 'platform'] as const;
export const ENGINE = ['engine'] as const;
export const PLATFORM = ['platform'] as const;

/** Who makes a change, in which flow: for the audit event. */
export function change(ctx: Ctx): ChangeContext {
  return { actor: actorOf(ctx), traceId: ctx.state.traceId, requestId: ctx.state.requestId };
}

/** A path parameter of the route. */
export function param(ctx: Ctx, name: string): string {
  return (ctx.params[name] as string | undefined) ?? '';
}
