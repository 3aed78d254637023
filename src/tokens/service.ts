import { decodeProtectedHeader, jwtVerify, SignJWT, type JWK, type JWTPayload } from 'jose';
import { decisionAgent, type DecisionStore } from '../decisions/store.js';
import { AppError, conflict, forbidden, internal, invalid, notFound, unavailable } from '../errors.js';
import { compileSchema, TOKEN_SAFE } from '../common/validation.js';
import { newId } from '../ids.js';
import { admitsSubject, checkBinding } from '../keys/binding.js';
import { hasScope } from '../keys/service.js';
import type { Principal } from '../keys/types.js';
import type { QueueService } from '../queue/service.js';
import { tokenRevokeEvent } from './events.js';
import { ALG, type SigningKeyService } from './signing-keys.js';
import type { TokenRecord, TokenStore } from './types.js';

const TYP = 'at+jwt';

export interface TokenConfig {
  issuer: string;
  defaultTtlSeconds: number;
  maxTtlSeconds: number;
  /** An allow (or approval) can be exchanged this long after it was given, not later. */
  exchangeWindowSeconds: number;
}

export interface TokenObserver {
  minted(): void;
  revoked(): void;
}

export interface MintedToken {
  token_id: string;
  token: string;
  token_type: 'Bearer';
  subject: string;
  scopes: string[];
  expires_at: string;
}

interface MintRequest {
  request_id?: string;
  subject?: string;
  scopes?: string[];
  ttl_seconds?: number;
  audience?: string;
}

export const mintRequestSchema = (maxTtl: number) => ({
  type: 'object',
  additionalProperties: false,
  properties: {
    request_id: { type: 'string', minLength: 1, maxLength: 64 },
    subject: { type: 'string', minLength: 1, maxLength: 256 },
    scopes: {
      type: 'array',
      minItems: 1,
      maxItems: 64,
      items: {
        type: 'string',
        minLength: 1,
        maxLength: 1024,
        // A scope is signed into a space-delimited claim and logged: the identifiers' rule.
        pattern: TOKEN_SAFE,
      },
    },
    ttl_seconds: { type: 'integer', minimum: 1, maximum: maxTtl },
    audience: { type: 'string', minLength: 1, maxLength: 256 },
  },
});

export const introspectRequestSchema = {
  type: 'object',
  required: ['token'],
  additionalProperties: false,
  properties: { token: { type: 'string', maxLength: 16384 } },
};

/**
 * Whether `token` is a compact JWS whose three parts are each base64url in its one canonical
 * spelling (no padding, no unused bits set). Decoders, Node's and so jose's, ignore the unused low
 * bits of a part's last character: `…Q` and `…R` end the same signature, so two strings would pass
 * for one token, and whatever keys on the string (a resource server's cache or denylist) could be
 * sidestepped. Re-encoding the decoded bytes gives the canonical spelling back.
 */
const canonicalJws = (token: string): boolean => {
  const parts = token.split('.');
  return (
    parts.length === 3 &&
    parts.every((p) => /^[A-Za-z0-9_-]*$/.test(p) && Buffer.from(p, 'base64url').toString('base64url') === p)
  );
};

/** `s` with each character `reserved` matches percent-encoded (`%` → `%25`, `:` → `%3A`, `/` → `%2F`). */
const percentEncode = (s: string, reserved: RegExp): string =>
  s.replace(reserved, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`);

/**
 * The scope a token carries for an exchanged decision: exactly that action on that resource,
 * `<action>:<resource>` (humans: `<action>:<type>/<id>`), read one way only. Actions (`s3:GetObject`)
 * and resources (ARNs) may hold `:`, and a human type may hold `/`, so the action has `%` and `:`
 * percent-encoded and a human type `%`, `:` and `/`: the first `:` ends the action and the first
 * `/` after it ends the type; the resource (or id) is the rest, as sent. Values without those
 * characters read as they always did.
 */
export function decisionScope(action: string, resource: unknown): string {
  const r =
    typeof resource === 'string'
      ? resource
      : `${percentEncode((resource as { type: string }).type, /[%:/]/g)}/${(resource as { id: string }).id}`;
  return `${percentEncode(action, /[%:]/g)}:${r}`;
}

/**
 * The key was revoked after this request was authenticated (by another process, which may take up
 * to a second to be seen): the mint is refused in its own transaction, so no token outlives the
 * cascade of the key's revocation.
 */
const revokedKey = () => new AppError('unauthenticated', 'invalid or revoked API key');

/**
 * How many times a mint signs again after finding its signing key retired by a rotation it had not
 * seen (each time with the keys read again): more than one rotation in that instant is unlikely.
 */
const SIGN_ATTEMPTS = 3;

/**
 * Short-lived Ed25519-signed JWTs (RFC 9068 access-token shape) minted from allowed or approved
 * decisions, once each; offline verification through the JWKS, revocation through introspection.
 */
export class TokenService {
  private readonly validateMint: (b: unknown) => MintRequest;
  private readonly validateIntrospect = compileSchema<{ token: string }>(introspectRequestSchema);

  constructor(
    private readonly store: TokenStore,
    private readonly decisions: DecisionStore,
    private readonly queue: QueueService,
    private readonly cfg: TokenConfig,
    private readonly observer: TokenObserver,
    private readonly keys: SigningKeyService,
  ) {
    this.validateMint = compileSchema<MintRequest>(mintRequestSchema(cfg.maxTtlSeconds));
  }

  /** Loads the signing keys, generating and storing the first on first start. */
  init(): Promise<void> {
    return this.keys.init();
  }

  /** The public verification keys (active and still verifying): never a private part. */
  jwks(): { keys: JWK[] } {
    return this.keys.jwks();
  }

  async mint(body: unknown, principal: Principal, traceId: string): Promise<MintedToken> {
    const req = this.validateMint(body);
    const ttl = req.ttl_seconds ?? this.cfg.defaultTtlSeconds;
    const audience = req.audience ?? this.cfg.issuer;
    if (req.request_id !== undefined) {
      if (req.subject !== undefined || req.scopes !== undefined) {
        throw invalid('give either request_id, or subject and scopes, not both');
      }
      return this.exchange(req.request_id, ttl, audience, principal);
    }
    if (req.subject === undefined || req.scopes === undefined) {
      throw invalid('missing required field: request_id (or subject and scopes for free-form minting)');
    }
    if (!hasScope(principal, 'admin'))
      throw forbidden('free-form minting (subject and scopes) needs the admin scope');
    const token = this.record(null, req.subject, req.scopes, audience, ttl, principal, traceId);
    const { jwt, stored: r } = await this.signAndStore(token, (t) =>
      this.store.insert(t, this.mintEvent(t, principal, { free_form: true })),
    );
    if (r === 'key_revoked') throw revokedKey();
    this.observer.minted();
    return this.render(token, jwt);
  }

  private async exchange(
    requestId: string,
    ttl: number,
    audience: string,
    principal: Principal,
  ): Promise<MintedToken> {
    const d = await this.decisions.get(requestId);
    if (!d) throw notFound(`no decision with request_id ${requestId}`);
    checkBinding(principal, { tenant_id: d.tenant_id, agent_id: decisionAgent(d) });
    if (d.key_id !== principal.keyId && !hasScope(principal, 'admin')) {
      throw forbidden('only the API key that made the request can exchange it for a token');
    }
    if (d.status === 'deny') throw forbidden(`request ${requestId} was denied`);
    // When the right to act was given: the allow itself, or the approval.
    let grantedAt = d.created_at;
    if (d.status === 'requires_approval') {
      const item = await this.queue.get(principal, requestId);
      if (item.status === 'pending') throw conflict(`request ${requestId} is still pending approval`);
      if (item.status !== 'approved') {
        throw forbidden(`request ${requestId} was ${item.status}, not approved`);
      }
      grantedAt = item.decided_at ?? d.created_at;
    }
    // A decision is not a coupon to bank until the policy changes: exchange it soon or ask again.
    if (Date.now() - Date.parse(grantedAt) > this.cfg.exchangeWindowSeconds * 1000) {
      throw forbidden(
        `request ${requestId} was granted more than ${this.cfg.exchangeWindowSeconds} s ago; authorize again`,
      );
    }
    if (d.token_id !== null) throw conflict(`request ${requestId} was already exchanged for a token`);
    const token = this.record(
      requestId,
      d.subject,
      [decisionScope(d.action, d.resource)],
      audience,
      ttl,
      principal,
      d.trace_id,
    );
    token.tenant_id = d.tenant_id;
    token.agent_id = decisionAgent(d);
    token.user_id = d.user_id ?? null;
    // Bound to the exact call that was allowed or approved, and the revision that decided it.
    token.request_digest = d.request_digest ?? null;
    token.policy_revision = d.policy_revision ?? null;
    const { jwt, stored: r } = await this.signAndStore(token, (t) =>
      this.store.exchange(requestId, t, this.mintEvent(t, principal, {})),
    );
    if (r === 'already') throw conflict(`request ${requestId} was already exchanged for a token`);
    if (r === 'key_revoked') throw revokedKey();
    this.observer.minted();
    return this.render(token, jwt);
  }

  /** RFC 7662: `{"active": false}` for anything not a live token we issued. */
  async introspect(body: unknown, principal: Principal): Promise<Record<string, unknown>> {
    const { token } = this.validateIntrospect(body);
    let payload: JWTPayload;
    let kid: unknown;
    // One token, one spelling: see canonicalJws.
    if (!canonicalJws(token)) return { active: false };
    try {
      // The key the token names, if it is active or still verifying: a retired kid is inactive.
      ({ kid } = decodeProtectedHeader(token));
      const key = typeof kid === 'string' ? await this.keys.verifier(kid) : undefined;
      if (!key) return { active: false };
      ({ payload } = await jwtVerify(token, key, {
        algorithms: [ALG],
        issuer: this.cfg.issuer,
        typ: TYP,
      }));
    } catch {
      return { active: false };
    }
    // A token we issued, unexpired and unrevoked as stored, and signed by the key it names: a
    // leaked key that a process has not yet seen retired cannot vouch for a forged token carrying
    // a real token's jti (an expired one's included: revoke_previous revokes only live tokens).
    const stored = typeof payload.jti === 'string' ? await this.store.tokenState(payload.jti) : undefined;
    // The stored expiry, not the presented `exp`: a forged token may carry any.
    if (!stored || stored.revoked_at !== null || Date.parse(stored.expires_at) <= Date.now())
      return { active: false };
    if ((stored.signing_kid ?? this.keys.oldestKid()) !== kid) return { active: false };
    // Another tenant's or agent's token is none of a bound key's business: inactive, as RFC 7662
    // §4 allows (a 403 would confirm that the token is live).
    if (!admitsSubject(principal, stored)) return { active: false };
    return {
      active: true,
      token_type: 'Bearer',
      scope: payload.scope,
      sub: payload.sub,
      aud: payload.aud,
      iss: payload.iss,
      exp: payload.exp,
      iat: payload.iat,
      jti: payload.jti,
      request_id: payload.request_id ?? null,
      request_digest: payload.request_digest ?? null,
      policy_revision: payload.policy_revision ?? null,
      on_behalf_of: payload.on_behalf_of ?? null,
    };
  }

  async revoke(
    tokenId: string,
    principal: Principal,
    traceId: string,
  ): Promise<{ token_id: string; revoked: true; revoked_at: string }> {
    const t = await this.store.get(tokenId);
    if (!t) throw notFound(`token ${tokenId} not found`);
    checkBinding(principal, t);
    const r = await this.store.revoke(tokenId, new Date().toISOString(), (tok) =>
      tokenRevokeEvent(tok, principal.name, traceId),
    );
    if (!r || r.revoked_at === null) throw internal('revocation was not recorded');
    if (t.revoked_at === null) this.observer.revoked();
    return { token_id: r.id, revoked: true, revoked_at: r.revoked_at };
  }

  private record(
    requestId: string | null,
    subject: string,
    scopes: string[],
    audience: string,
    ttl: number,
    principal: Principal,
    traceId: string,
  ): TokenRecord {
    const issued = Math.floor(Date.now() / 1000);
    return {
      id: newId(),
      request_id: requestId,
      subject,
      scopes,
      audience,
      tenant_id: principal.tenant,
      agent_id: principal.agent,
      issued_at: new Date(issued * 1000).toISOString(),
      expires_at: new Date((issued + ttl) * 1000).toISOString(),
      revoked_at: null,
      minted_by: principal.name,
      trace_id: traceId,
    };
  }

  /**
   * Signs `token` with the active key and stores it with `write`. A rotation made on another process
   * that this one has not seen yet retires the key under the mint: the store refuses it in the
   * mint's own transaction, and the token is signed again with the keys read again. No token is
   * handed out under a retired (possibly leaked) key.
   */
  private async signAndStore<R extends string>(
    token: TokenRecord,
    write: (t: TokenRecord) => Promise<R | 'signing_key_retired'>,
  ): Promise<{ jwt: string; stored: Exclude<R, 'signing_key_retired'> }> {
    for (let attempt = 1; attempt <= SIGN_ATTEMPTS; attempt++) {
      const jwt = await this.sign(token);
      const stored = await write(token);
      if (stored !== 'signing_key_retired')
        return { jwt, stored: stored as Exclude<R, 'signing_key_retired'> };
      await this.keys.reload();
    }
    throw unavailable('the signing key was rotated while this token was being minted; try again');
  }

  /** Signs with the active key, recording its kid on the token. */
  private sign(t: TokenRecord): Promise<string> {
    // Scopes are space-delimited in the claim: one that contains a space would read as several.
    if (t.scopes.some((s) => /\s/.test(s)))
      throw internal('refusing to sign a scope that contains whitespace');
    const claims: JWTPayload = {
      scope: t.scopes.join(' '),
      request_id: t.request_id,
    };
    if (t.tenant_id !== null) claims.tenant_id = t.tenant_id;
    // An agent acting for a user (SPEC §13): whose behalf, as the request named it. The subject
    // stays the agent that holds the scopes (docs/decisions.md: why not RFC 8693's `act`).
    if (t.agent_id !== null && t.tenant_id !== null && t.user_id) {
      claims.on_behalf_of = { tenant_id: t.tenant_id, user_id: t.user_id };
    }
    if (t.request_digest) claims.request_digest = t.request_digest;
    if (t.policy_revision !== null && t.policy_revision !== undefined)
      claims.policy_revision = t.policy_revision;
    const { kid, key } = this.keys.signer();
    t.signing_kid = kid;
    return new SignJWT(claims)
      .setProtectedHeader({ alg: ALG, kid, typ: TYP })
      .setIssuer(this.cfg.issuer)
      .setSubject(t.subject)
      .setAudience(t.audience)
      .setJti(t.id)
      .setIssuedAt(Date.parse(t.issued_at) / 1000)
      .setExpirationTime(Date.parse(t.expires_at) / 1000)
      .sign(key);
  }

  private mintEvent(t: TokenRecord, principal: Principal, details: Record<string, unknown>) {
    return {
      kind: 'token.mint',
      trace_id: t.trace_id,
      request_id: t.request_id,
      actor: principal.name,
      agent_id: t.agent_id,
      user_id: t.user_id ?? null,
      tenant_id: t.tenant_id,
      resource: t.id,
      outcome: 'minted',
      details: {
        token_id: t.id,
        subject: t.subject,
        scopes: t.scopes,
        expires_at: t.expires_at,
        ...(t.request_digest ? { request_digest: t.request_digest, policy_revision: t.policy_revision } : {}),
        ...details,
      },
    };
  }

  private render(t: TokenRecord, jwt: string): MintedToken {
    return {
      token_id: t.id,
      token: jwt,
      token_type: 'Bearer',
      subject: t.subject,
      scopes: t.scopes,
      expires_at: t.expires_at,
    };
  }
}
