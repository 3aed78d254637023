import { introspectRequestSchema, mintRequestSchema } from '../../tokens/service.js';
import { principalOf, type RouteDef } from '../context.js';
import type { RouteDeps } from './index.js';
import { ENGINE, param } from './shared.js';

/** SPEC §7: scoped tokens on the Engine API (the JWKS is a system route). */
export function tokenRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'POST',
      path: '/v1/tokens/mint',
      template: '/v1/tokens/mint',
      ok: {
        status: 201,
        description:
          '{token_id, token, token_type, subject, scopes, expires_at}; 409 pending or already exchanged',
      },
      requestSchema: mintRequestSchema(d.config.tokenMaxTtlSeconds),
      apis: ENGINE,
      scope: 'tokens:mint',
      body: 'object',
      summary: 'Exchange an allowed or approved request for a scoped token (once)',
      handler: async (ctx) => {
        ctx.status = 201;
        ctx.body = await d.tokens.mint(ctx.request.body, principalOf(ctx), ctx.state.traceId);
      },
    },
    {
      method: 'POST',
      path: '/v1/tokens/introspect',
      template: '/v1/tokens/introspect',
      ok: { status: 200, description: 'RFC 7662: {"active": true, …} or {"active": false}' },
      requestSchema: introspectRequestSchema,
      apis: ENGINE,
      scope: 'tokens:read',
      body: 'object',
      summary: 'RFC 7662 token introspection',
      handler: async (ctx) => {
        ctx.body = await d.tokens.introspect(ctx.request.body, principalOf(ctx));
      },
    },
    {
      method: 'DELETE',
      path: '/v1/tokens/:tokenID',
      template: '/v1/tokens/{tokenID}',
      ok: {
        status: 200,
        description: '{token_id, revoked: true, revoked_at}; repeating it answers the same',
      },
      apis: ENGINE,
      scope: 'tokens:revoke',
      body: 'none',
      summary: 'Revoke a token (idempotent)',
      handler: async (ctx) => {
        ctx.body = await d.tokens.revoke(param(ctx, 'tokenID'), principalOf(ctx), ctx.state.traceId);
      },
    },
  ];
}
