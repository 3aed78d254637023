import type { TokenRecord } from '../tokens/types.js';
import type { NewAuditEvent } from '../audit/types.js';

/** Every scope a key can hold (SPEC §2). `admin` implies all others. */
export const SCOPES = [
  'authorize',
  'queue:read',
  'queue:review',
  'tokens:mint',
  'tokens:read',
  'tokens:revoke',
  'policies:read',
  'policies:write',
  'audit:read',
  'audit:write',
  'metrics:read',
  'admin',
] as const;
export type Scope = (typeof SCOPES)[number];

export interface ApiKeyRecord {
  id: string;
  name: string;
  /** sha256 of the whole key, hex. The key itself is never stored. */
  hash: string;
  scopes: Scope[];
  tenant: string | null;
  agent: string | null;
  created_at: string;
  revoked_at: string | null;
}

/** The authenticated caller, as services and policies see it. */
export interface Principal {
  readonly keyId: string;
  readonly name: string;
  readonly scopes: ReadonlySet<Scope>;
  readonly tenant: string | null;
  readonly agent: string | null;
}

export interface KeyStore {
  /** Stores a new key with its audit event; 'exists' (and nothing written) if the name is taken. */
  create(rec: ApiKeyRecord, event: NewAuditEvent): Promise<'ok' | 'exists'>;
  findById(id: string): Promise<ApiKeyRecord | undefined>;
  findByName(name: string): Promise<ApiKeyRecord | undefined>;
  list(): Promise<ApiKeyRecord[]>;
  /**
   * Marks the key revoked and, in the same transaction, every token it minted that is unrevoked
   * and unexpired at `at`, each with its own `token` event; the `key` event is told how many
   * tokens that was, and the key's record. Returns the key and that count (0 when the key was already revoked: nothing
   * is written), or undefined if no such key.
   */
  revoke(
    name: string,
    at: string,
    events: KeyRevokeEvents,
  ): Promise<{ key: ApiKeyRecord; tokensRevoked: number } | undefined>;
}

/** The events of a key's revocation: the key's own (told the count and the key), and each token's. */
export interface KeyRevokeEvents {
  key: (tokensRevoked: number, key: ApiKeyRecord) => NewAuditEvent;
  token: (t: TokenRecord) => NewAuditEvent;
}
