import { introspectRequestSchema, mintRequestSchema } from '../../tokens/service.js';
import { principalOf, type RouteDef } from '../context.js';
import type { RouteDeps } from './index.js';
import { DATE_TIME, exact, NULLABLE_STRING } from '../schemas.js';
import { ENGINE, param } from './shared.js';

/** RFC 7662 introspection: an active token's claims, or only `active: false`. */
const introspectionSchema = {
  oneOf: [
    exact({ active: { const: false } }),
    exact({
      active: { const: true },
      token_type: { const: 'Bearer' },
      scope: { type: 'string', description: 'space-separated scopes' },
      sub: { type: 'string' },
      aud: { type: ['string', 'array'], items: { type: 'string' } },
      iss: { type: 'string' },
      exp: { type: 'integer' },
      iat: { type: 'integer' },
      jti: { type: 'string' },
      request_id: NULLABLE_STRING,
      request_digest: NULLABLE_STRING,
      policy_revision: { type: ['integer', 'null'] },
      on_behalf_of: {
        description: 'the user an agent acted on behalf of (SPEC §13); null otherwise',
        oneOf: [{ type: 'null' }, exact({ tenant_id: { type: 'string' }, user_id: { type: 'string' } })],
      },
    }),
  ],
};

/** SPEC §7: scoped tokens on the Engine API (the JWKS is a system route). */
export function tokenRoutes(d: RouteDeps): RouteDef[] {
  return [
    {
      method: 'POST',
      path: '/v1/tokens/mint',
      template: '/v1/tokens/mint',
      ok: {
        status: 201,
        description: '{token_id, token, token_type, subject, scopes, expires_at}',
        schema: exact({
          token_id: { type: 'string' },
          token: { type: 'string', description: 'compact JWS (EdDSA)' },
          token_type: { const: 'Bearer' },
          subject: { type: 'string' },
          scopes: { type: 'array', items: { type: 'string' } },
          expires_at: DATE_TIME,
        }),
      },
      also: [
        { status: 404, description: 'no decision with this request_id (visible to the key)' },
        { status: 409, description: 'the request is still pending approval, or was already exchanged' },
      ],
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
      ok: {
        status: 200,
        description: 'RFC 7662: {"active": true, …} or {"active": false}',
        schema: introspectionSchema,
      },
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
        schema: exact({ token_id: { type: 'string' }, revoked: { const: true }, revoked_at: DATE_TIME }),
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
