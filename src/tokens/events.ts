import type { NewAuditEvent } from '../audit/types.js';
import type { TokenRecord } from './types.js';

/**
 * The audit event of one token's revocation (SPEC §8), whether revoked alone or with the API key
 * that minted it (`details.with_key` names the key then).
 */
export function tokenRevokeEvent(
  tok: TokenRecord,
  actor: string,
  traceId: string | null,
  withKey?: string,
): NewAuditEvent {
  return {
    kind: 'token.revoke',
    trace_id: tok.trace_id ?? traceId,
    request_id: tok.request_id,
    actor,
    tenant_id: tok.tenant_id,
    resource: tok.id,
    outcome: 'revoked',
    details: { token_id: tok.id, subject: tok.subject, ...(withKey ? { with_key: withKey } : {}) },
  };
}
