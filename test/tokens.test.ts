import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import {
  base64url,
  createLocalJWKSet,
  createRemoteJWKSet,
  decodeJwt,
  decodeProtectedHeader,
  jwtVerify,
  SignJWT,
  type JSONWebKeySet,
} from 'jose';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call, HUMAN } from './helpers/harness.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface AuditRow {
  kind: string;
  trace_id: string;
  request_id: string | null;
  resource: string;
  actor: string;
}

/** The audit events of one trace, oldest first, as the API shows them. */
async function auditForTrace(a: Arbiter, traceId: string): Promise<AuditRow[]> {
  return (await call('GET', `${a.platform}/api/v1/audit/trace/${traceId}`)).json.events as AuditRow[];
}

/** What a downstream service does: verify offline against the published JWKS, nothing else. */
function verifyOffline(a: Arbiter, token: string) {
  const jwks = createRemoteJWKSet(new URL(`${a.engine}/.well-known/jwks.json`));
  return jwtVerify(token, jwks, {
    issuer: 'arbiter',
    algorithms: ['EdDSA'],
    typ: 'at+jwt',
  });
}

async function fetchJwks(a: Arbiter): Promise<JSONWebKeySet> {
  const r = await call('GET', `${a.engine}/.well-known/jwks.json`, { key: null });
  expect(r.status).to.equal(200);
  return r.json as JSONWebKeySet;
}

async function decide(a: Arbiter, body: Record<string, unknown>, key?: string) {
  const path = 'user_id' in body ? '/v1/authorize' : '/v1/agent/authorize';
  return call('POST', a.engine + path, { body, key });
}

// Tokens, their revocations and the signing key are stored: run on every backend.
onEveryBackend('scoped tokens', () => {
  let a: Arbiter;
  let agentKey: string;
  let reviewer: string;
  let resourceServer: string;
  let security: string;

  before(async () => {
    a = await Arbiter.start();
    agentKey = a.createKey('deploy-bot-key', ['authorize', 'tokens:mint', 'queue:read'], {
      agent: 'deploy-bot',
    });
    reviewer = a.createKey('sre-reviewer', ['queue:read', 'queue:review']);
    resourceServer = a.createKey('api-gateway', ['tokens:read']);
    security = a.createKey('security', ['tokens:revoke']);
  });
  after(async () => {
    await a.close();
  });

  const mint = (body: unknown, key?: string) => call('POST', `${a.engine}/v1/tokens/mint`, { body, key });
  const introspect = (token: unknown) =>
    call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token }, key: resourceServer });

  /** A fresh allowed decision by the agent key, and its request_id. */
  async function allowed(): Promise<string> {
    const r = await decide(a, AGENT.allow, agentKey);
    expect(r.status).to.equal(200);
    return r.json.request_id as string;
  }

  it('runs the whole flow: approval, long-poll, mint, offline verify, revoke, introspect, audit', async () => {
    // 1. The agent asks and is told to wait for a human.
    const asked = await decide(a, AGENT.approval, agentKey);
    expect(asked.status).to.equal(202);
    const { request_id: requestId, trace_id: traceId } = asked.json;

    // 2. It long-polls its item while a reviewer approves it.
    const poll = call('GET', `${a.engine}/v1/queue/${requestId}?wait=30`, { key: agentKey });
    await sleep(300);
    const approved = await call('POST', `${a.engine}/v1/queue/${requestId}/approve`, {
      key: reviewer,
      body: { note: 'deploy window open' },
    });
    expect(approved.status).to.equal(200);
    const polled = await poll;
    expect(polled.status).to.equal(200);
    expect(polled.json.status).to.equal('approved');

    // 3. It exchanges the approved decision for a token.
    const minted = await mint({ request_id: requestId }, agentKey);
    expect(minted.status, minted.text).to.equal(201);
    expect(minted.json).to.have.keys('token_id', 'token', 'token_type', 'subject', 'scopes', 'expires_at');
    expect(minted.json).to.include({ token_type: 'Bearer', subject: 'deploy-bot' });
    expect(minted.json.scopes).to.deep.equal(['deploy:prod/api']);
    expect(Date.parse(minted.json.expires_at)).to.be.greaterThan(Date.now());
    const { token, token_id: tokenId } = minted.json;

    // 4. A downstream service verifies it offline with the JWKS.
    const { payload, protectedHeader } = await verifyOffline(a, token);
    expect(protectedHeader.alg).to.equal('EdDSA');
    expect(protectedHeader.typ).to.equal('at+jwt');
    expect(protectedHeader.kid).to.be.a('string').and.not.equal('');
    const jwks = await fetchJwks(a);
    expect(jwks.keys.map((k) => k.kid)).to.include(protectedHeader.kid);
    expect(payload.iss).to.equal('arbiter');
    expect(payload.sub).to.equal('deploy-bot');
    expect(payload.aud).to.satisfy((aud: unknown) => typeof aud === 'string' || Array.isArray(aud));
    expect(payload.scope).to.equal('deploy:prod/api');
    expect(payload.jti).to.equal(tokenId);
    expect(payload.request_id).to.equal(requestId);
    expect(payload.iat).to.be.a('number');
    expect(payload.exp).to.equal(Date.parse(minted.json.expires_at) / 1000);
    expect(payload.exp! - payload.iat!).to.equal(300);

    const live = await introspect(token);
    expect(live.status).to.equal(200);
    expect(live.json).to.include({
      active: true,
      sub: 'deploy-bot',
      scope: 'deploy:prod/api',
      exp: payload.exp,
    });

    // 5. Revocation, idempotent.
    const revoked = await call('DELETE', `${a.engine}/v1/tokens/${tokenId}`, { key: security });
    expect(revoked.status).to.equal(200);
    expect(revoked.json).to.have.keys('token_id', 'revoked', 'revoked_at');
    expect(revoked.json).to.include({ token_id: tokenId, revoked: true });
    expect(Number.isNaN(Date.parse(revoked.json.revoked_at))).to.equal(false);
    const again = await call('DELETE', `${a.engine}/v1/tokens/${tokenId}`, { key: security });
    expect(again.status).to.equal(200);
    expect(again.json).to.deep.equal(revoked.json);

    const dead = await introspect(token);
    expect(dead.status).to.equal(200);
    expect(dead.json).to.deep.equal({ active: false });

    // 6. One trace ties the whole flow together in the audit trail.
    const events = await auditForTrace(a, traceId);
    const kinds = events.map((e) => e.kind);
    expect(kinds).to.include.members(['decision', 'queue.approve', 'token.mint', 'token.revoke']);
    expect(kinds.filter((k) => k === 'token.revoke')).to.have.length(1);
    for (const k of ['decision', 'queue.approve', 'token.mint', 'token.revoke']) {
      const e = events.find((x) => x.kind === k)!;
      expect(e.trace_id, k).to.equal(traceId);
      expect(e.request_id, k).to.equal(requestId);
    }
  });

  describe('POST /v1/tokens/mint', () => {
    it('exchanges an allowed decision once; the second exchange is 409', async () => {
      const id = await allowed();
      const first = await mint({ request_id: id }, agentKey);
      expect(first.status, first.text).to.equal(201);
      expect(first.json).to.include({ subject: 'deploy-bot', token_type: 'Bearer' });
      expect(first.json.scopes).to.deep.equal(['read:repo/arbiter']);
      expectError(await mint({ request_id: id }, agentKey), 409);
      expect(await auditEvents(a.platform, { kind: 'token.mint', request_id: id })).to.have.length(1);
    });

    it('answers 409 while the request is pending approval', async () => {
      const r = await decide(a, AGENT.approval, agentKey);
      expectError(await mint({ request_id: r.json.request_id }, agentKey), 409, /pending/);
    });

    it('answers 403 for a denied request and for a request a reviewer denied', async () => {
      const denied = await decide(a, AGENT.deny, agentKey);
      expect(denied.status).to.equal(403);
      expectError(await mint({ request_id: denied.json.request_id }, agentKey), 403);

      const asked = await decide(a, AGENT.approval, agentKey);
      await call('POST', `${a.engine}/v1/queue/${asked.json.request_id}/deny`, { key: reviewer });
      expectError(await mint({ request_id: asked.json.request_id }, agentKey), 403, /denied/);
    });

    it('answers 404 for an unknown request_id', async () => {
      expectError(await mint({ request_id: randomUUID() }, agentKey), 404);
    });

    it('answers 403 to a tenant-bound key for another tenant’s request (SPEC §2)', async () => {
      const r = await decide(a, HUMAN.allow);
      expect(r.status).to.equal(200);
      const globex = a.createKey('globex-minter', ['tokens:mint'], { tenant: 'globex' });
      expectError(await mint({ request_id: r.json.request_id }, globex), 403);
      // Still unexchanged: the admin key can mint it.
      expect((await mint({ request_id: r.json.request_id })).status).to.equal(201);
    });

    it('answers 403 when a different non-admin key tries to exchange someone else’s request', async () => {
      const id = await allowed();
      const other = a.createKey('other-minter', ['authorize', 'tokens:mint']);
      expectError(await mint({ request_id: id }, other), 403);
      expect((await mint({ request_id: id }, agentKey)).status).to.equal(201);
    });

    /** The scope minted for a decision (decided by `key`, approved by the reviewer if need be). */
    async function scopeOf(body: Record<string, unknown>, key?: string): Promise<string> {
      const r = await decide(a, body, key);
      if (r.status === 202) {
        const ok = await call('POST', `${a.engine}/v1/queue/${r.json.request_id}/approve`, { key: reviewer });
        expect(ok.status, ok.text).to.equal(200);
      } else {
        expect(r.status, r.text).to.equal(200);
      }
      const minted = await mint({ request_id: r.json.request_id }, key);
      expect(minted.status, minted.text).to.equal(201);
      const [scope] = minted.json.scopes as string[];
      expect(decodeJwt(minted.json.token as string).scope).to.equal(scope);
      return scope as string;
    }

    it('mints a scope that reads one way only, and the usual scope where nothing needs encoding', async () => {
      const agent = (action: string, resource: string) =>
        scopeOf({ ...AGENT.allow, action, resource }, agentKey);
      const human = (action: string, type: string, id: string) =>
        scopeOf({ ...HUMAN.allow, action, resource: { type, id } });
      // Each pair gave one scope: `s3:Get:x`, `read:a/b/c`, `s3:Get:x/y`.
      expect(await agent('s3:Get', 'x')).to.equal('s3%3AGet:x');
      expect(await agent('s3', 'Get:x')).to.equal('s3:Get:x');
      expect(await human('read', 'a/b', 'c')).to.equal('read:a%2Fb/c');
      expect(await human('read', 'a', 'b/c')).to.equal('read:a/b/c');
      expect(await human('s3:Get', 'x', 'y')).to.equal('s3%3AGet:x/y');
      expect(await human('s3', 'Get:x', 'y')).to.equal('s3:Get%3Ax/y');
      // `%` is encoded where the others are, so an encoded form cannot be sent as a plain one.
      expect(await human('read', 'a%2Fb', 'c')).to.equal('read:a%252Fb/c');
      expect(await human('100%', 'x', 'y')).to.equal('100%25:x/y');
      // Everything else is as it was: ids and agent resources as sent, `:` and `%` included.
      expect(await agent('read', 'repo/arbiter')).to.equal('read:repo/arbiter');
      expect(await agent('logs.read', 'repo/arn:aws:s3:::bucket/100%')).to.equal(
        'logs.read:repo/arn:aws:s3:::bucket/100%',
      );
      expect(await human('delete', 'project', 'p1')).to.equal('delete:project/p1');
      expect(await human('read', 'doc', 'urn:x:a/b')).to.equal('read:doc/urn:x:a/b');
    });

    it('allows free-form {subject, scopes} minting only with admin', async () => {
      expectError(await mint({ subject: 'ops-bot', scopes: ['read:repo/x'] }, agentKey), 403, /admin/);
      const r = await mint({ subject: 'ops-bot', scopes: ['read:repo/x', 'list:repo/y'] });
      expect(r.status, r.text).to.equal(201);
      expect(r.json).to.include({ subject: 'ops-bot', token_type: 'Bearer' });
      expect(r.json.scopes).to.deep.equal(['read:repo/x', 'list:repo/y']);
      const { payload } = await verifyOffline(a, r.json.token);
      expect(payload.sub).to.equal('ops-bot');
      expect(payload.scope).to.equal('read:repo/x list:repo/y');
    });

    it('rejects a ttl_seconds that is not an integer in 1…3600 with a 400 naming it', async () => {
      const id = await allowed();
      for (const ttl of [0, -5, 1.5, 3601, '60']) {
        expectError(await mint({ request_id: id, ttl_seconds: ttl }, agentKey), 400, /ttl_seconds/);
      }
      const ok = await mint({ request_id: id, ttl_seconds: 60 }, agentKey);
      expect(ok.status, ok.text).to.equal(201);
      const { payload } = await verifyOffline(a, ok.json.token);
      expect(payload.exp! - payload.iat!).to.equal(60);
    });

    it('accepts ttl_seconds at the maximum of 3600', async () => {
      const id = await allowed();
      const r = await mint({ request_id: id, ttl_seconds: 3600 }, agentKey);
      expect(r.status, r.text).to.equal(201);
      const claims = decodeJwt(r.json.token);
      expect(claims.exp! - claims.iat!).to.equal(3600);
    });

    it('rejects non-object bodies, a missing request_id and unknown fields with 400', async () => {
      expectError(await mint([{ request_id: randomUUID() }], agentKey), 400);
      expectError(
        await call('POST', `${a.engine}/v1/tokens/mint`, {
          key: agentKey,
          raw: 'null',
          headers: { 'content-type': 'application/json' },
        }),
        400,
      );
      expectError(await mint({}, agentKey), 400, /request_id/);
      expectError(await mint({ ttl_seconds: 60 }, agentKey), 400, /request_id/);
      expectError(await mint({ request_id: await allowed(), scope: 'x' }, agentKey), 400, /scope/);
    });
  });

  describe('GET /.well-known/jwks.json', () => {
    it('is public and publishes only the public Ed25519 key fields', async () => {
      const jwks = await fetchJwks(a);
      expect(Object.keys(jwks)).to.deep.equal(['keys']);
      expect(jwks.keys).to.have.length(1);
      const k = jwks.keys[0]!;
      expect(k).to.have.keys('kty', 'crv', 'x', 'kid', 'alg', 'use');
      expect(k).to.not.have.property('d');
      expect(k).to.include({ kty: 'OKP', crv: 'Ed25519', alg: 'EdDSA', use: 'sig' });
      expect(base64url.decode(k.x!)).to.have.length(32);
    });
  });

  describe('POST /v1/tokens/introspect', () => {
    let token: string;
    before(async () => {
      const r = await mint({ subject: 'probe', scopes: ['read:x'] });
      token = r.json.token;
    });

    it('reports a live token as active with its claims', async () => {
      const r = await introspect(token);
      expect(r.status).to.equal(200);
      expect(r.json).to.include({ active: true, sub: 'probe', scope: 'read:x', iss: 'arbiter' });
      expect(r.json.exp).to.be.a('number');
    });

    const inactive = async (t: string) => {
      const r = await introspect(t);
      expect(r.status, r.text).to.equal(200);
      expect(r.json).to.deep.equal({ active: false });
    };

    it('reports a garbage string as inactive', async () => {
      await inactive('not-a-token');
      await inactive('a.b.c');
    });

    it('reports a truncated token as inactive', async () => {
      await inactive(token.slice(0, -10));
    });

    it('reports a token with a flipped signature character as inactive', async () => {
      const dot = token.lastIndexOf('.');
      const i = dot + 10; // well inside the signature, not in the padding bits of the last character
      const flipped = token.slice(0, i) + (token[i] === 'A' ? 'B' : 'A') + token.slice(i + 1);
      expect(flipped).to.not.equal(token);
      await inactive(flipped);
    });

    it('reports a second spelling of the signature (its unused low bits set) as inactive', async () => {
      // 64 signature bytes are 86 base64url characters: the last carries 2 bits and 4 unused ones,
      // which decoders ignore. The token must have one spelling, or whatever keys on the string
      // (a cache, a denylist) can be sidestepped.
      const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
      const last = alphabet.indexOf(token.at(-1)!);
      expect(last % 16, 'the canonical spelling has the unused bits clear').to.equal(0);
      const respelled = token.slice(0, -1) + alphabet[last | 1];
      expect(Buffer.from(respelled.split('.')[2]!, 'base64url')).to.deep.equal(
        Buffer.from(token.split('.')[2]!, 'base64url'),
      );
      await inactive(respelled);
      expect((await introspect(token)).json.active).to.equal(true);
    });

    it('reports an alg:none token with the same claims as inactive', async () => {
      const header = { ...decodeProtectedHeader(token), alg: 'none' };
      const enc = (v: unknown) => base64url.encode(JSON.stringify(v));
      await inactive(`${enc(header)}.${enc(decodeJwt(token))}.`);
    });

    it('reports an HS256 token keyed with the public key bytes as inactive', async () => {
      const jwk = (await fetchJwks(a)).keys[0]!;
      const forged = await new SignJWT(decodeJwt(token))
        .setProtectedHeader({ alg: 'HS256', kid: jwk.kid!, typ: 'at+jwt' })
        .sign(base64url.decode(jwk.x!));
      await inactive(forged);
      const forgedFromJson = await new SignJWT(decodeJwt(token))
        .setProtectedHeader({ alg: 'HS256', kid: jwk.kid!, typ: 'at+jwt' })
        .sign(new TextEncoder().encode(JSON.stringify(jwk)));
      await inactive(forgedFromJson);
    });

    it('reports an expired token as inactive', async () => {
      // Expiry is whole seconds from the second of issue, so a token of ttl N lives more than
      // N - 1 s: 3 leaves 2 s for the first introspection on a loaded machine. Then wait until
      // just past the expiry the mint reported, not a fixed time.
      const r = await mint({ subject: 'short-lived', scopes: ['read:x'], ttl_seconds: 3 });
      expect(r.status).to.equal(201);
      expect((await introspect(r.json.token)).json.active).to.equal(true);
      await sleep(Math.max(0, Date.parse(r.json.expires_at as string) - Date.now()) + 300);
      await inactive(r.json.token);
    });

    it('rejects a missing token field or a non-string token with 400', async () => {
      expectError(
        await call('POST', `${a.engine}/v1/tokens/introspect`, { body: {}, key: resourceServer }),
        400,
        /token/,
      );
      expectError(await introspect(42), 400, /token/);
      expectError(await introspect({ jwt: token }), 400, /token/);
    });
  });

  describe('DELETE /v1/tokens/{tokenID}', () => {
    it('answers 404 for an unknown token id', async () => {
      expectError(await call('DELETE', `${a.engine}/v1/tokens/${randomUUID()}`, { key: security }), 404);
    });
  });

  describe('revoking the API key that minted them', () => {
    it('revokes its unexpired tokens with it, in its audit event, and no other key’s', async () => {
      const leaked = a.createKey('leaked-bot-key', ['authorize', 'tokens:mint'], { agent: 'deploy-bot' });
      const minted: string[] = [];
      for (let i = 0; i < 2; i++) {
        const r = await decide(a, AGENT.allow, leaked);
        const m = await mint({ request_id: r.json.request_id }, leaked);
        expect(m.status, m.text).to.equal(201);
        minted.push(m.json.token as string);
      }
      const bystander = await mint({ request_id: await allowed() }, agentKey);
      expect(bystander.status, bystander.text).to.equal(201);
      for (const t of minted) expect((await introspect(t)).json.active).to.equal(true);

      const r = a.cli(['keys', 'revoke', 'leaked-bot-key']);
      expect(r.code, r.stderr).to.equal(0);
      expect(JSON.parse(r.stdout)).to.include({ name: 'leaked-bot-key', tokens_revoked: 2 });
      for (const t of minted) expect((await introspect(t)).json).to.deep.equal({ active: false });
      expect((await introspect(bystander.json.token)).json.active).to.equal(true);
      const [event] = (await auditEvents(a.platform, { kind: 'key.revoke' })).filter(
        (e) => e.resource === 'leaked-bot-key',
      );
      expect(event.details).to.have.keys(['key_id', 'tokens_revoked']);
      expect(event.details.tokens_revoked).to.equal(2);
      // Each token's own revocation is in the trail too, naming the key it went with.
      const revokes = (await auditEvents(a.platform, { kind: 'token.revoke' })).filter(
        (e) => (e.details as { with_key?: string }).with_key === 'leaked-bot-key',
      );
      expect(revokes).to.have.length(2);
      // The revoked key cannot mint any more (refused at authentication, and at the store).
      expect((await mint({ request_id: await allowed() }, leaked)).status).to.equal(401);
      // Again: nothing more to revoke, nothing written.
      const again = a.cli(['keys', 'revoke', 'leaked-bot-key']);
      expect(again.code, again.stderr).to.equal(0);
      expect(JSON.parse(again.stdout)).to.include({ tokens_revoked: 0 });
    });
  });
});

onEveryBackend('scoped tokens across a restart', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('keeps revocations, live tokens, the signing key, queue items and decisions', async () => {
    const mintFree = async (subject: string) => {
      const r = await call('POST', `${a.engine}/v1/tokens/mint`, { body: { subject, scopes: ['read:x'] } });
      expect(r.status).to.equal(201);
      return r.json as { token: string; token_id: string };
    };
    const introspect = async (token: string) =>
      (await call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token } })).json;

    const allowedDecision = await decide(a, AGENT.allow);
    const exchanged = await call('POST', `${a.engine}/v1/tokens/mint`, {
      body: { request_id: allowedDecision.json.request_id },
    });
    expect(exchanged.status).to.equal(201);
    const revoked = await mintFree('revoked-one');
    expect((await call('DELETE', `${a.engine}/v1/tokens/${revoked.token_id}`)).status).to.equal(200);
    const queued = await decide(a, AGENT.approval);
    expect(queued.status).to.equal(202);
    const denied = await decide(a, HUMAN.deny);
    expect(denied.status).to.equal(403);
    const kidBefore = (await fetchJwks(a)).keys[0]!.kid;

    await a.restart();

    expect(await introspect(revoked.token)).to.deep.equal({ active: false });
    expect(await introspect(exchanged.json.token)).to.include({ active: true, sub: 'deploy-bot' });

    const jwks = await fetchJwks(a);
    expect(jwks.keys.map((k) => k.kid)).to.deep.equal([kidBefore]);
    const { protectedHeader } = await jwtVerify(exchanged.json.token, createLocalJWKSet(jwks), {
      issuer: 'arbiter',
      algorithms: ['EdDSA'],
    });
    expect(protectedHeader.kid).to.equal(kidBefore);
    await verifyOffline(a, exchanged.json.token);

    // Exchanged before the restart: still exchanged after it.
    expectError(
      await call('POST', `${a.engine}/v1/tokens/mint`, {
        body: { request_id: allowedDecision.json.request_id },
      }),
      409,
    );

    const item = await call('GET', `${a.engine}/v1/queue/${queued.json.request_id}`);
    expect(item.status).to.equal(200);
    expect(item.json).to.include({ id: queued.json.request_id, status: 'pending' });

    const decisions = (await auditEvents(a.platform, { kind: 'decision' })).map((e) => ({
      request_id: e.request_id as string,
      outcome: e.outcome as string,
    }));
    expect(decisions).to.deep.include({ request_id: allowedDecision.json.request_id, outcome: 'allow' });
    expect(decisions).to.deep.include({ request_id: queued.json.request_id, outcome: 'requires_approval' });
    expect(decisions).to.deep.include({ request_id: denied.json.request_id, outcome: 'deny' });
  });
});

// SPEC §1 names ARBITER_ISSUER; SPEC §7 the optional audience of a mint. Tokens are stored: every backend.
onEveryBackend('scoped tokens: issuer and audience', () => {
  const ISSUER = 'https://arbiter.example.test';
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_ISSUER: ISSUER });
  });
  after(async () => {
    await a.close();
  });

  const claims = async (body: Record<string, unknown>) => {
    const r = await call('POST', `${a.engine}/v1/tokens/mint`, { body });
    expect(r.status, r.text).to.equal(201);
    const jwks = createLocalJWKSet(await fetchJwks(a));
    const { payload } = await jwtVerify(r.json.token as string, jwks, {
      issuer: ISSUER,
      algorithms: ['EdDSA'],
    });
    const seen = await call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token: r.json.token } });
    return { payload, introspected: seen.json };
  };

  it('signs iss as ARBITER_ISSUER, and makes it the audience when the mint names none', async () => {
    const allowed = await decide(a, AGENT.allow);
    const { payload, introspected } = await claims({ request_id: allowed.json.request_id });
    expect(payload).to.include({ iss: ISSUER, aud: ISSUER });
    expect(introspected).to.include({ active: true, iss: ISSUER, aud: ISSUER });
  });

  it('puts the audience a mint names in aud, for an exchange and a free-form mint alike', async () => {
    const allowed = await decide(a, AGENT.allow);
    const exchanged = await claims({ request_id: allowed.json.request_id, audience: 'repo-service' });
    expect(exchanged.payload).to.include({ iss: ISSUER, aud: 'repo-service' });
    expect(exchanged.introspected).to.include({ active: true, aud: 'repo-service' });
    const free = await claims({ subject: 'ops', scopes: ['read:x'], audience: 'billing' });
    expect(free.payload).to.include({ iss: ISSUER, aud: 'billing', sub: 'ops' });
  });
});
