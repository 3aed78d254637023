import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { isTokenSafe } from '../common/validation.js';
import { tokenRevokeEvent } from '../tokens/events.js';
import { conflict, invalid, notFound } from '../errors.js';
import { newId } from '../ids.js';
import { SCOPES, type ApiKeyRecord, type KeyStore, type Principal, type Scope } from './types.js';

/**
 * API keys look like `arb_<16 hex id>_<43 base64url secret>`. Only sha256(key) is stored: keys
 * carry 256 random bits, so a slow password hash would add latency and no security. The id part
 * finds the row; the hashes are compared in constant time.
 */
const KEY_FORMAT = /^arb_([0-9a-f]{16})_[A-Za-z0-9_-]{43}$/;
const NAME_FORMAT = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

const sha256 = (s: string): Buffer => createHash('sha256').update(s).digest();

export const ADMIN_PRINCIPAL: Principal = Object.freeze({
  keyId: 'admin',
  name: 'admin',
  scopes: new Set<Scope>(['admin']),
  tenant: null,
  agent: null,
});

/** Actor names that are not keys' (in any case), and whose they are. */
const RESERVED_NAMES: Readonly<Record<string, string>> = {
  [ADMIN_PRINCIPAL.name]: "ARBITER_ADMIN_KEY's principal",
  system: "Arbiter's own events (start-up, expiry)",
};

export interface NewKey {
  name: string;
  scopes: string[];
  tenant?: string | undefined;
  agent?: string | undefined;
}

export class KeyService {
  private readonly adminHash: Buffer | undefined;

  constructor(
    private readonly store: KeyStore,
    adminKey: string | undefined,
  ) {
    this.adminHash = adminKey === undefined ? undefined : sha256(adminKey);
  }

  /** Creates a key; the returned `key` is the only time the secret exists outside the caller. */
  async create(req: NewKey, actor: string): Promise<{ key: string; record: ApiKeyRecord }> {
    if (!NAME_FORMAT.test(req.name)) throw invalid('key name must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}');
    // Decisions, approvals and audit events name the key that acted: a key called "admin" would
    // read as ARBITER_ADMIN_KEY's own principal, one called "system" as Arbiter itself.
    const reserved = RESERVED_NAMES[req.name.toLowerCase()];
    if (reserved) throw invalid(`key name ${req.name} is reserved for ${reserved}`);
    if (req.scopes.length === 0) throw invalid(`at least one scope is required (${SCOPES.join(', ')})`);
    for (const s of req.scopes) {
      if (!(SCOPES as readonly string[]).includes(s)) {
        throw invalid(`unknown scope ${s}: must be one of ${SCOPES.join(', ')}`);
      }
    }
    for (const [field, v] of [
      ['tenant', req.tenant],
      ['agent', req.agent],
    ] as const) {
      // A binding names a tenant or agent id, so it follows their rule (no binding could match otherwise).
      if (v !== undefined && (v.length < 1 || v.length > 256 || !isTokenSafe(v)))
        throw invalid(
          `${field} must be 1-256 characters without whitespace, control or invisible characters`,
        );
    }
    // `admin` manages what spans every tenant (webhooks, signing keys) and implies every scope: a
    // binding could not hold it, so a key gets one or the other (docs/decisions.md).
    if (req.scopes.includes('admin') && (req.tenant !== undefined || req.agent !== undefined))
      throw invalid(
        'the admin scope cannot be bound to a tenant or an agent: give the key the scopes it needs',
      );
    if (await this.store.findByName(req.name)) throw conflict(`a key named ${req.name} already exists`);
    const id = randomBytes(8).toString('hex');
    const key = `arb_${id}_${randomBytes(32).toString('base64url')}`;
    const record: ApiKeyRecord = {
      id,
      name: req.name,
      hash: sha256(key).toString('hex'),
      scopes: [...new Set(req.scopes)] as Scope[],
      tenant: req.tenant ?? null,
      agent: req.agent ?? null,
      created_at: new Date().toISOString(),
      revoked_at: null,
    };
    const created = await this.store.create(record, {
      kind: 'key.create',
      actor,
      outcome: 'success',
      resource: req.name,
      tenant_id: record.tenant,
      agent_id: record.agent,
      details: { key_id: id, scopes: record.scopes },
      trace_id: null,
      request_id: newId(),
    });
    if (created === 'exists') throw conflict(`a key named ${req.name} already exists`);
    return { key, record };
  }

  list(): Promise<ApiKeyRecord[]> {
    return this.store.list();
  }

  /**
   * Revokes the key and the unexpired tokens it minted: a key revoked because it leaked must not
   * leave the tokens it obtained usable until they expire (as RFC 7009 §2.1 asks of a revoked
   * grant's tokens). Offline verifiers of a JWT see this only through introspection.
   */
  async revoke(name: string, actor: string): Promise<{ key: ApiKeyRecord; tokensRevoked: number }> {
    const requestId = newId();
    const r = await this.store.revoke(name, new Date().toISOString(), {
      // The same key, tenant and agent as its key.create, so the filters that find one find both.
      key: (tokensRevoked, rec) => ({
        kind: 'key.revoke',
        actor,
        outcome: 'success',
        resource: name,
        tenant_id: rec.tenant,
        agent_id: rec.agent,
        request_id: requestId,
        details: { key_id: rec.id, tokens_revoked: tokensRevoked },
      }),
      token: (t) => tokenRevokeEvent(t, actor, null, { key: name }),
    });
    if (!r) throw notFound(`no key named ${name}`);
    return r;
  }

  /** The principal for a bearer key, or undefined for an unknown, malformed or revoked key. */
  async authenticate(presented: string): Promise<Principal | undefined> {
    const hash = sha256(presented);
    if (this.adminHash && timingSafeEqual(hash, this.adminHash)) return ADMIN_PRINCIPAL;
    const id = KEY_FORMAT.exec(presented)?.[1];
    if (!id) return undefined;
    const rec = await this.store.findById(id);
    if (!rec || rec.revoked_at !== null) return undefined;
    const known = this.derived.get(rec) ?? this.derive(rec);
    if (!timingSafeEqual(hash, known.hash)) return undefined;
    return known.principal;
  }

  /**
   * Whether the key `p` authenticated with is still live: ARBITER_ADMIN_KEY's principal always
   * is (it is configuration, not a record); another key until it is revoked or deleted.
   */
  async isLive(p: Principal): Promise<boolean> {
    if (p === ADMIN_PRINCIPAL) return true;
    const rec = await this.store.findById(p.keyId);
    return rec !== undefined && rec.revoked_at === null;
  }

  /**
   * What authentication derives from a key record, kept while the store hands out that same
   * (frozen, cached) record: a store that reads the row again gets it derived again.
   */
  private readonly derived = new WeakMap<ApiKeyRecord, { hash: Buffer; principal: Principal }>();

  private derive(rec: ApiKeyRecord): { hash: Buffer; principal: Principal } {
    const d = {
      hash: Buffer.from(rec.hash, 'hex'),
      principal: Object.freeze<Principal>({
        keyId: rec.id,
        name: rec.name,
        scopes: new Set(rec.scopes),
        tenant: rec.tenant,
        agent: rec.agent,
      }),
    };
    this.derived.set(rec, d);
    return d;
  }
}

export function hasScope(p: Principal, scope: Scope): boolean {
  return p.scopes.has(scope) || p.scopes.has('admin');
}
