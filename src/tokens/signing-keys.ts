import { calculateJwkThumbprint, exportJWK, generateKeyPair, importJWK, type JWK } from 'jose';
import { compileSchema } from '../common/validation.js';
import { internal, unavailable } from '../errors.js';
import type { ChangeContext } from '../policy/service.js';
import { tokenRevokeEvent } from './events.js';
import type { SigningKeyRecord, TokenStore } from './types.js';

/** What jose hands back for an imported key (a WebCrypto CryptoKey on Node). */
export type CryptoKeyLike = Exclude<Awaited<ReturnType<typeof importJWK>>, Uint8Array>;

export const ALG = 'EdDSA';

/**
 * active: signs new tokens (exactly one). verifying: retired, but tokens it signed may still be
 * live, so it stays in the JWKS and introspection accepts it. retired: verifies nothing.
 */
export type SigningKeyStatus = 'active' | 'verifying' | 'retired';

/** A signing key as the API shows it: never a private part. */
export interface SigningKeyView {
  kid: string;
  alg: typeof ALG;
  created_at: string;
  status: SigningKeyStatus;
  retired_at: string | null;
  verify_until: string | null;
}

export interface RotationResult {
  kid: string;
  created_at: string;
  previous: { kid: string; status: SigningKeyStatus; verify_until: string | null };
  /** With revoke_previous: the earlier keys that were still verifying, revoked too. */
  also_revoked: string[];
}

export const rotateRequestSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    revoke_previous: {
      type: 'boolean',
      description:
        'true when a key leaked: the previous key and every earlier key still verifying leave the JWKS at once, and every unexpired token they signed is revoked',
    },
  },
};

/** One key as this process holds it: its public JWK, its verifier and (active key only) its signer. */
interface HeldKey {
  record: Omit<SigningKeyRecord, 'private_jwk'>;
  jwk: JWK;
  verifier: CryptoKeyLike;
  signer?: CryptoKeyLike;
}

export function statusOf(k: Pick<SigningKeyRecord, 'retired_at' | 'verify_until'>, now: number) {
  if (k.retired_at === null) return 'active' as const;
  return k.verify_until !== null && Date.parse(k.verify_until) > now
    ? ('verifying' as const)
    : ('retired' as const);
}

export interface SigningKeyObserver {
  /** Called after this process rotated (the cluster relay: the other workers reload). */
  rotated(): Promise<void>;
  /** The tokens a rotation with revoke_previous revoked (arbiter_tokens_revoked_total). */
  tokensRevoked?(n: number): void;
}

/** The public members of an Ed25519 JWK, in a fixed order (the JWKS every process serves). */
const publicPart = ({ kty, crv, x, kid, alg, use }: JWK): JWK => ({ kty, crv, x, kid, alg, use }) as JWK;

/**
 * The Ed25519 keys that sign and verify tokens, shared by every process through the store: one
 * active key signs; a rotation retires it, and it keeps verifying until the last token it signed has
 * expired (or not at all when it leaked). Each process holds the keys in memory and reloads them
 * on a change notice, on its periodic re-check, and whenever a token names a kid it does not know.
 */
export class SigningKeyService {
  private held: HeldKey[] = [];
  private fingerprint = '';
  private loading: Promise<void> = Promise.resolve();
  private readonly validateRotate = compileSchema<{ revoke_previous?: boolean }>(rotateRequestSchema);

  constructor(
    private readonly store: TokenStore,
    private readonly observer: SigningKeyObserver = { rotated: () => Promise.resolve() },
  ) {}

  /** Loads the keys, generating and storing the first on first start. */
  async init(): Promise<void> {
    await this.store.ensureSigningKey(generate);
    await this.reload();
  }

  /**
   * Reads the keys again (one small query; keys are imported only when something changed). Calls
   * run one after another, so a caller that reloads after a refusal reads after that refusal.
   */
  reload(): Promise<void> {
    const next = this.loading.then(() => this.load());
    this.loading = next.catch(() => undefined);
    return next;
  }

  /** The active key: the one a new token is signed with. */
  signer(): { kid: string; key: CryptoKeyLike } {
    const k = this.held.find((h) => h.record.retired_at === null);
    if (!k?.signer) throw unavailable('no active signing key is loaded');
    return { kid: k.record.kid, key: k.signer };
  }

  /**
   * The key that verifies a token naming `kid`, if that key is active or still verifying. A kid
   * this process does not know yet (rotated on another) is looked up in the store once.
   */
  async verifier(kid: string): Promise<CryptoKeyLike | undefined> {
    let k = this.held.find((h) => h.record.kid === kid);
    if (!k) {
      await this.reload();
      k = this.held.find((h) => h.record.kid === kid);
    }
    return k && statusOf(k.record, Date.now()) !== 'retired' ? k.verifier : undefined;
  }

  /** The first key's kid: it signed the tokens minted before tokens recorded their kid. */
  oldestKid(): string | undefined {
    return this.held.at(-1)?.record.kid;
  }

  /** The JWK Set: the public part of every key that still verifies, newest first. */
  jwks(): { keys: JWK[] } {
    const now = Date.now();
    return { keys: this.held.filter((h) => statusOf(h.record, now) !== 'retired').map((h) => h.jwk) };
  }

  /** Every key, newest first, as read from the store now. */
  async list(): Promise<SigningKeyView[]> {
    const now = Date.now();
    return (await this.store.signingKeys()).map((r) => view(r, now));
  }

  /**
   * Makes a new key the signer at once and retires the active one: it keeps verifying until the
   * last unexpired token it signed expires, or (`revoke_previous`) stops at once, its tokens revoked.
   */
  async rotate(body: unknown, ctx: ChangeContext): Promise<RotationResult> {
    const revokePrevious = this.validateRotate(body).revoke_previous ?? false;
    const fresh = await generate();
    const r = await this.store.rotateSigningKey(fresh, {
      revokePrevious,
      // Verifying longer than the last token needs only widens what a stolen key could sign.
      verifyUntil: (latest) => (latest !== null && latest > fresh.created_at ? latest : fresh.created_at),
      token: (t, kid) => tokenRevokeEvent(t, ctx.actor, ctx.traceId, { signing_key: kid }),
      rotate: (previous, tokensRevoked, alsoRevoked) => ({
        kind: 'signing_key.rotate',
        actor: ctx.actor,
        trace_id: ctx.traceId,
        request_id: ctx.requestId,
        resource: fresh.kid,
        outcome: 'rotated',
        details: {
          kid: fresh.kid,
          previous_kid: previous.kid,
          revoke_previous: revokePrevious,
          tokens_revoked: tokensRevoked,
          previous_verify_until: previous.verify_until,
          also_revoked: alsoRevoked,
        },
      }),
    });
    if (!r) throw internal('there is no active signing key to rotate');
    if (r.tokensRevoked > 0) this.observer.tokensRevoked?.(r.tokensRevoked);
    await this.reload();
    await this.observer.rotated();
    return {
      kid: fresh.kid,
      created_at: fresh.created_at,
      previous: {
        kid: r.previous.kid,
        status: statusOf(r.previous, Date.now()),
        verify_until: r.previous.verify_until,
      },
      also_revoked: r.alsoRevoked,
    };
  }

  private async load(): Promise<void> {
    const records = await this.store.signingKeys();
    const fingerprint = records.map((r) => `${r.kid}/${r.retired_at}/${r.verify_until}`).join(' ');
    if (fingerprint === this.fingerprint) return;
    const known = new Map(this.held.map((h) => [h.record.kid, h]));
    const held: HeldKey[] = [];
    for (const { private_jwk, ...record } of records) {
      const was = known.get(record.kid);
      const jwk = was?.jwk ?? publicPart(JSON.parse(record.public_jwk) as JWK);
      const verifier = was?.verifier ?? ((await importJWK(jwk, ALG)) as CryptoKeyLike);
      // Only the active key's private part is kept in memory.
      const signer =
        record.retired_at !== null
          ? undefined
          : (was?.signer ?? ((await importJWK(JSON.parse(private_jwk) as JWK, ALG)) as CryptoKeyLike));
      held.push({ record, jwk, verifier, ...(signer ? { signer } : {}) });
    }
    this.held = held;
    this.fingerprint = fingerprint;
  }
}

function view(r: SigningKeyRecord, now: number): SigningKeyView {
  return {
    kid: r.kid,
    alg: ALG,
    created_at: r.created_at,
    status: statusOf(r, now),
    retired_at: r.retired_at,
    verify_until: r.verify_until,
  };
}

/** A fresh Ed25519 key pair, its kid the RFC 7638 thumbprint of its public part. */
async function generate(): Promise<SigningKeyRecord> {
  const { privateKey, publicKey } = await generateKeyPair(ALG, { crv: 'Ed25519', extractable: true });
  const pub = await exportJWK(publicKey);
  const kid = await calculateJwkThumbprint(pub);
  return {
    kid,
    private_jwk: JSON.stringify({ ...(await exportJWK(privateKey)), kid, alg: ALG }),
    public_jwk: JSON.stringify({ ...pub, kid, alg: ALG, use: 'sig' }),
    created_at: new Date().toISOString(),
    retired_at: null,
    verify_until: null,
  };
}
