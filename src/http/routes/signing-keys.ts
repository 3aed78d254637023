import { rotateRequestSchema, type SigningKeyService } from '../../tokens/signing-keys.js';
import type { RouteDef } from '../context.js';
import { DATE_TIME, exact, NULLABLE_DATE_TIME } from '../schemas.js';
import { change, PLATFORM } from './shared.js';

const STATUS = {
  type: 'string',
  enum: ['active', 'verifying', 'retired'],
  description:
    'active: signs new tokens; verifying: retired, still in the JWKS until verify_until; retired: verifies nothing',
};

const signingKeySchema = exact({
  kid: { type: 'string' },
  alg: { const: 'EdDSA' },
  created_at: DATE_TIME,
  status: STATUS,
  retired_at: { ...NULLABLE_DATE_TIME, description: 'when it stopped signing; null while active' },
  verify_until: {
    ...NULLABLE_DATE_TIME,
    description:
      'until when it verifies: the expiry of the last live token it signed; its retired_at when it was revoked',
  },
});

/** The signing key signs every tenant's tokens, and revoke_previous revokes them all. */
const SIGNING_KEYS_ARE_GLOBAL = "cannot manage the signing keys, which sign every tenant's tokens";

/**
 * Signing-key rotation (Platform API, `admin`, keys bound to no tenant or agent): listing, and
 * making a new key the signer.
 */
export function signingKeyRoutes(keys: SigningKeyService): RouteDef[] {
  return [
    {
      method: 'GET',
      path: '/api/v1/signing-keys',
      template: '/api/v1/signing-keys',
      ok: {
        status: 200,
        description: '{"keys": [signing key]} newest first (never a private part)',
        schema: exact({ keys: { type: 'array', items: signingKeySchema } }),
      },
      apis: PLATFORM,
      scope: 'admin',
      global: SIGNING_KEYS_ARE_GLOBAL,
      body: 'none',
      summary: 'List the token signing keys',
      handler: async (ctx) => {
        ctx.body = { keys: await keys.list() };
      },
    },
    {
      method: 'POST',
      path: '/api/v1/signing-keys/rotate',
      template: '/api/v1/signing-keys/rotate',
      ok: {
        status: 201,
        description: 'the new active key, and what became of the previous one',
        schema: exact({
          kid: { type: 'string' },
          created_at: DATE_TIME,
          previous: exact({
            kid: { type: 'string' },
            status: STATUS,
            verify_until: NULLABLE_DATE_TIME,
          }),
          also_revoked: {
            type: 'array',
            items: { type: 'string' },
            description: 'with revoke_previous: the earlier keys still verifying, revoked too (their kids)',
          },
        }),
      },
      requestSchema: rotateRequestSchema,
      apis: PLATFORM,
      scope: 'admin',
      global: SIGNING_KEYS_ARE_GLOBAL,
      body: 'optional-object',
      summary: 'Rotate the token signing key (optional {"revoke_previous": true} for a leaked key)',
      handler: async (ctx) => {
        ctx.status = 201;
        ctx.body = await keys.rotate(ctx.request.body, change(ctx));
      },
    },
  ];
}
