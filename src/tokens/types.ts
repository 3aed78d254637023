import type { NewAuditEvent } from '../audit/types.js';

export interface TokenRecord {
  /** = the JWT's jti */
  id: string;
  request_id: string | null;
  subject: string;
  scopes: string[];
  audience: string;
  tenant_id: string | null;
  /**
   * The agent it acts for: its decision's agent (null for a human decision), or for a free-form
   * token the minting key's agent binding. Keys bound to another agent cannot introspect or revoke it.
   */
  agent_id: string | null;
  /**
   * The user it acts for, as audit events name one: its decision's user (a human decision's, or
   * the user an agent acted on behalf of, SPEC §13). Null for free-form tokens and agents acting
   * for themselves.
   */
  user_id?: string | null;
  issued_at: string;
  expires_at: string;
  revoked_at: string | null;
  /** Name of the API key that minted it. */
  minted_by: string;
  trace_id: string | null;
  /** The approved call's digest and deciding revision (SPEC §13), for exchanged decisions. */
  request_digest?: string | null;
  policy_revision?: number | null;
  /** The kid of the key that signed it; null for tokens minted before rotation existed (the oldest key's). */
  signing_kid?: string | null;
}

export interface SigningKeyRecord {
  kid: string;
  private_jwk: string;
  public_jwk: string;
  created_at: string;
  /** When it stopped signing; null for the active key (exactly one). */
  retired_at: string | null;
  /** Until when it still verifies: null while active; its retired_at when it was revoked. */
  verify_until: string | null;
}

/** What a rotation asks of the store, besides the new key. */
export interface RotationPlan {
  /**
   * A leak: the previous key, and every earlier key still verifying, stop verifying at once, and
   * every unexpired token any of them signed is revoked.
   */
  revokePrevious: boolean;
  /** The previous key's verify_until, given the latest expiry of its live tokens (null: none). */
  verifyUntil: (latestExpiry: string | null) => string;
  /** The audit event of each token revoked with the previous key. */
  token: (t: TokenRecord, previousKid: string) => NewAuditEvent;
  /**
   * The rotation's own audit event, told the retired key, how many tokens were revoked, and the
   * earlier keys that were still verifying and were revoked with it.
   */
  rotate: (previous: SigningKeyRecord, tokensRevoked: number, alsoRevoked: string[]) => NewAuditEvent;
}

/** What a rotation did: the key it retired, the tokens it revoked, the earlier keys it revoked. */
export interface RotationOutcome {
  previous: SigningKeyRecord;
  tokensRevoked: number;
  alsoRevoked: string[];
}

/** Why a mint wrote nothing: its API key was revoked, or its signing key retired, meanwhile. */
export type MintRefusal = 'key_revoked' | 'signing_key_retired';

export interface TokenStore {
  /** Stores the first signing key from `create()` if there is none yet (first start wins). */
  ensureSigningKey(create: () => Promise<SigningKeyRecord>): Promise<void>;
  /** Every signing key, newest first (private parts included: for the token service only). */
  signingKeys(): Promise<SigningKeyRecord[]>;
  /**
   * Makes `fresh` the active key and retires the active one, in one transaction with the rotation's
   * audit event. With `revokePrevious`, the previous key and every earlier key still verifying stop
   * verifying, and every unrevoked, unexpired token they signed (tokens without a signing_kid count
   * as the oldest key's) is revoked too, each with its event. Undefined (nothing written) when
   * there is no active key.
   */
  rotateSigningKey(fresh: SigningKeyRecord, plan: RotationPlan): Promise<RotationOutcome | undefined>;
  /**
   * Exchanges a decision for a token once: marks the decision exchanged, stores the token and its
   * audit event atomically. 'already' when the decision was exchanged before.
   */
  exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | MintRefusal>;
  /**
   * Stores a free-form token with its event. Both this and `exchange` write nothing and answer
   * 'key_revoked' when the key named by `token.minted_by` has been revoked meanwhile, and
   * 'signing_key_retired' when `token.signing_kid` is no longer the active signing key (a rotation
   * this process has not seen yet): no token is ever stored under a retired key.
   */
  insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | MintRefusal>;
  get(id: string): Promise<TokenRecord | undefined>;
  /** Revokes (idempotently: keeps the first revoked_at); undefined if unknown. */
  revoke(id: string, at: string, event: (t: TokenRecord) => NewAuditEvent): Promise<TokenRecord | undefined>;
  /** What introspection needs of a stored token (see TokenState); undefined if unknown. Read per introspection. */
  tokenState(id: string): Promise<TokenState | undefined>;
}

/**
 * A stored token as introspection reads it: when it was revoked (null: live), the kid of the key
 * that signed it (null: minted before kids were recorded, so the oldest key's), when it expires,
 * and the tenant and agent it belongs to (for the caller's binding).
 */
export type TokenState = Pick<TokenRecord, 'revoked_at' | 'expires_at' | 'tenant_id' | 'agent_id'> & {
  signing_kid: string | null;
};
