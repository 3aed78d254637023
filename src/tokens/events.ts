import type { NewAuditEvent } from '../audit/types.js';
import type { TokenRecord } from './types.js';

/**
 * What revoked a token along with others: the API key that minted it (`details.with_key`), or the
 * leaked signing key that signed it (`details.with_signing_key`, its kid).
 */
export type RevocationCause = { key: string } | { signing_key: string };

/** The audit event of one token's revocation (SPEC §8), whether revoked alone or with a cause. */
export function tokenRevokeEvent(
  tok: TokenRecord,
  actor: string,
  traceId: string | null,
  cause?: RevocationCause,
): NewAuditEvent {
  return {
    kind: 'token.revoke',
    trace_id: tok.trace_id ?? traceId,
    request_id: tok.request_id,
    actor,
    agent_id: tok.agent_id,
    user_id: tok.user_id ?? null,
    tenant_id: tok.tenant_id,
    resource: tok.id,
    outcome: 'revoked',
    details: {
      token_id: tok.id,
      subject: tok.subject,
      ...(cause && 'key' in cause ? { with_key: cause.key } : {}),
      ...(cause && 'signing_key' in cause ? { with_signing_key: cause.signing_key } : {}),
    },
  };
}
