import type { NewAuditEvent } from '../audit/types.js';

export interface TokenRecord {
  /** = the JWT's jti */
  id: string;
  request_id: string | null;
  subject: string;
  scopes: string[];
  audience: string;
  tenant_id: string | null;
  issued_at: string;
  expires_at: string;
  revoked_at: string | null;
  /** Name of the API key that minted it. */
  minted_by: string;
  trace_id: string | null;
  /** The approved call's digest and deciding revision (SPEC §13), for exchanged decisions. */
  request_digest?: string | null;
  policy_revision?: number | null;
}

export interface SigningKeyRecord {
  kid: string;
  private_jwk: string;
  public_jwk: string;
  created_at: string;
}

export interface TokenStore {
  /** The signing key, creating it from `create()` if none exists yet (first start wins). */
  signingKey(create: () => Promise<SigningKeyRecord>): Promise<SigningKeyRecord>;
  /**
   * Exchanges a decision for a token once: marks the decision exchanged, stores the token and its
   * audit event atomically. 'already' when the decision was exchanged before.
   */
  exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | 'key_revoked'>;
  /**
   * Stores a free-form token with its event. Both this and `exchange` write nothing and answer
   * 'key_revoked' when the key named by `token.minted_by` has been revoked meanwhile.
   */
  insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | 'key_revoked'>;
  get(id: string): Promise<TokenRecord | undefined>;
  /** Revokes (idempotently: keeps the first revoked_at); undefined if unknown. */
  revoke(id: string, at: string, event: (t: TokenRecord) => NewAuditEvent): Promise<TokenRecord | undefined>;
  /** When the token was revoked (null: live), or undefined if unknown; read per introspection. */
  revokedAt(id: string): Promise<string | null | undefined>;
}
