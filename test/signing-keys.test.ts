import { expect } from 'chai';
import {
  createLocalJWKSet,
  decodeProtectedHeader,
  generateKeyPair,
  importJWK,
  jwtVerify,
  SignJWT,
  type JSONWebKeySet,
  type JWK,
} from 'jose';
import { onEveryBackend, onPostgresOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { Arbiter, auditEvents, call } from './helpers/harness.js';
import { createTestDatabase, type TestDatabase } from './helpers/postgres.js';
import { sleep } from './helpers/process.js';

/**
 * Signing-key rotation over HTTP: POST /api/v1/signing-keys/rotate makes a new key the signer at
 * once; the previous one verifies until its last live token expires, or (revoke_previous, a leaked
 * key) stops at once with its tokens revoked. Checked through the JWKS, introspection, offline
 * verification with jose, the key list and the audit trail.
 */

const mint = (a: Arbiter, ttl = 600) =>
  call('POST', `${a.engine}/v1/tokens/mint`, {
    body: { subject: 'rotation-bot', scopes: ['read:repo/arbiter'], ttl_seconds: ttl },
  });

async function minted(
  a: Arbiter,
  ttl = 600,
): Promise<{ id: string; token: string; kid: string; exp: string }> {
  const r = await mint(a, ttl);
  expect(r.status, r.text).to.equal(201);
  const token = r.json.token as string;
  return {
    id: r.json.token_id,
    token,
    kid: decodeProtectedHeader(token).kid as string,
    exp: r.json.expires_at,
  };
}

const introspect = async (a: Arbiter, token: string) =>
  (await call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token } })).json.active as boolean;

const rotate = (a: Arbiter, body?: unknown, key?: string | null) =>
  call('POST', `${a.platform}/api/v1/signing-keys/rotate`, body === undefined ? { key } : { body, key });

async function jwks(a: Arbiter): Promise<JSONWebKeySet> {
  const r = await call('GET', `${a.engine}/.well-known/jwks.json`, {
    key: null,
    headers: { connection: 'close' },
  });
  expect(r.status).to.equal(200);
  return r.json as JSONWebKeySet;
}

const kids = async (a: Arbiter) => (await jwks(a)).keys.map((k) => k.kid);

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the key list is read as plain JSON
async function listed(a: Arbiter): Promise<any[]> {
  const r = await call('GET', `${a.platform}/api/v1/signing-keys`);
  expect(r.status, r.text).to.equal(200);
  return r.json.keys;
}

/** What a resource server does: verify against the JWKS it fetched, offline. */
async function verifiesOffline(a: Arbiter, token: string): Promise<boolean> {
  const set = createLocalJWKSet(await jwks(a));
  try {
    await jwtVerify(token, set, { issuer: 'arbiter', algorithms: ['EdDSA'], typ: 'at+jwt' });
    return true;
  } catch {
    return false;
  }
}

/**
 * What someone holding a stored signing key could sign: a token naming `kid`, carrying `jti`, with
 * wide scopes and an exp five minutes ahead.
 */
async function forgeWithStoredKey(a: Arbiter, kid: string, jti: string): Promise<string> {
  const [row] = await a.stored<{ private_jwk: string }>(
    'SELECT private_jwk FROM signing_keys WHERE kid = $1',
    [kid],
  );
  const key = await importJWK(JSON.parse(row!.private_jwk) as JWK, 'EdDSA');
  return new SignJWT({ scope: 'delete:prod/db' })
    .setProtectedHeader({ alg: 'EdDSA', kid, typ: 'at+jwt' })
    .setIssuer('arbiter')
    .setSubject('rotation-bot')
    .setAudience('arbiter')
    .setJti(jti)
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(key);
}

/** Polls `probe` until it is true, for at most `ms`; returns how long it took. */
async function within(ms: number, probe: () => Promise<boolean>): Promise<number> {
  const started = Date.now();
  while (Date.now() - started < ms) {
    if (await probe()) return Date.now() - started;
    await sleep(25);
  }
  throw new Error(`not within ${ms} ms`);
}

// The keys, the tokens that name them and their revocations are stored: run on every backend.
onEveryBackend('signing-key rotation (/api/v1/signing-keys)', function () {
  this.timeout(120_000);
  let a: Arbiter;
  let reader: string;
  before(async () => {
    a = await Arbiter.start();
    reader = a.createKey('token-reader', ['tokens:mint', 'tokens:read', 'audit:read']);
  });
  after(async () => {
    await a?.close();
  });

  it('lists the one key of a first start as active, with no private part, and the JWKS holds it', async () => {
    const keys = await listed(a);
    expect(keys).to.have.length(1);
    expect(keys[0]).to.have.all.keys('kid', 'alg', 'created_at', 'status', 'retired_at', 'verify_until');
    expect(keys[0]).to.include({ alg: 'EdDSA', status: 'active', retired_at: null, verify_until: null });
    expect(await kids(a)).to.deep.equal([keys[0].kid]);
    const t = await minted(a);
    expect(t.kid).to.equal(keys[0].kid);
    const text = (await call('GET', `${a.platform}/api/v1/signing-keys`)).text;
    expect(text).not.to.match(/"d"|private/);
  });

  it('rotates: the new key signs at once, an old token stays active until its expiry, the JWKS holds both', async () => {
    const [before] = await listed(a);
    const old = await minted(a, 900);
    const r = await rotate(a);
    expect(r.status, r.text).to.equal(201);
    expect(r.json.kid).to.be.a('string').and.not.equal(before.kid);
    // Verifying until the last live token the previous key signed can have expired.
    expect(r.json.previous).to.deep.equal({ kid: before.kid, status: 'verifying', verify_until: old.exp });
    const fresh = await minted(a);
    expect(fresh.kid).to.equal(r.json.kid);
    expect(await introspect(a, old.token)).to.equal(true);
    expect(await introspect(a, fresh.token)).to.equal(true);
    expect(await kids(a)).to.deep.equal([r.json.kid, before.kid]);
    expect(await verifiesOffline(a, old.token)).to.equal(true);
    expect(await verifiesOffline(a, fresh.token)).to.equal(true);
    const keys = await listed(a);
    expect(keys.map((k) => [k.kid, k.status])).to.deep.equal([
      [r.json.kid, 'active'],
      [before.kid, 'verifying'],
    ]);
    expect(keys[1]).to.include({ retired_at: r.json.created_at, verify_until: old.exp });
    const [event] = await auditEvents(a.platform, { kind: 'signing_key.rotate' });
    expect(event).to.include({ actor: 'admin', resource: r.json.kid, outcome: 'rotated' });
    expect(event.details).to.deep.equal({
      kid: r.json.kid,
      previous_kid: before.kid,
      revoke_previous: false,
      tokens_revoked: 0,
      previous_verify_until: old.exp,
      also_revoked: [],
    });
    expect(r.json.also_revoked).to.deep.equal([]);
  });

  /** arbiter_tokens_revoked_total on the serving process's /metrics. */
  const revokedCount = async (arb: Arbiter): Promise<number> => {
    const text = (await call('GET', `${arb.engine}/metrics`)).text;
    return Number(/^arbiter_tokens_revoked_total (\d+)$/m.exec(text)?.[1] ?? 0);
  };

  it('revoke_previous: the previous key and every earlier key still verifying leave the JWKS at once, and every live token they signed is revoked, each audited', async () => {
    const [current, older] = await listed(a);
    const t1 = await minted(a);
    const t2 = await minted(a);
    const revokedBefore = await revokedCount(a);
    const r = await rotate(a, { revoke_previous: true });
    expect(r.status, r.text).to.equal(201);
    expect(r.json.previous).to.deep.equal({
      kid: current.kid,
      status: 'retired',
      verify_until: r.json.created_at,
    });
    expect(await introspect(a, t1.token)).to.equal(false);
    expect(await introspect(a, t2.token)).to.equal(false);
    expect(await verifiesOffline(a, t1.token)).to.equal(false);
    // The key before it was still verifying (a leak may be older than the last rotation): revoked
    // too, with the token the previous test minted under it.
    expect(older.status).to.equal('verifying');
    expect(r.json.also_revoked).to.deep.equal([older.kid]);
    expect(await kids(a)).to.deep.equal([r.json.kid]);
    const revokeEvents = await auditEvents(a.platform, { kind: 'token.revoke' });
    const revokes = revokeEvents.filter((e) => e.details.with_signing_key === current.kid);
    // t1, t2 and the token the previous test minted under this key.
    expect(revokes).to.have.length(3);
    expect(revokes.map((e) => e.resource)).to.include.members([t1.id, t2.id]);
    const olderRevokes = revokeEvents.filter((e) => e.details.with_signing_key === older.kid);
    expect(olderRevokes).to.have.length.at.least(1);
    const [event] = await auditEvents(a.platform, { kind: 'signing_key.rotate' });
    expect(event.details).to.deep.include({
      kid: r.json.kid,
      previous_kid: current.kid,
      revoke_previous: true,
      tokens_revoked: 3 + olderRevokes.length,
      also_revoked: [older.kid],
    });
    // The revocations count in the metric as a DELETE of each token would.
    expect((await revokedCount(a)) - revokedBefore).to.equal(3 + olderRevokes.length);
    const keys = await listed(a);
    expect(keys[1]).to.include({ kid: current.kid, status: 'retired', retired_at: r.json.created_at });
    expect(keys[2]).to.include({ kid: older.kid, status: 'retired', verify_until: r.json.created_at });
    // A token of the retired key that were somehow unrevoked still introspects inactive: its kid is retired.
    await a.alter('UPDATE tokens SET revoked_at = NULL WHERE id = $1', [t1.id]);
    expect(await introspect(a, t1.token)).to.equal(false);
  });

  it('drops a retired key from the JWKS once its last token has expired; with no live token, at once', async () => {
    const [current] = await listed(a);
    // Long enough to outlive the rotation on a loaded machine (exp is floored to the second).
    const short = await minted(a, 5);
    const r = await rotate(a, {});
    expect(r.status, r.text).to.equal(201);
    expect(r.json.previous).to.deep.equal({ kid: current.kid, status: 'verifying', verify_until: short.exp });
    expect(await kids(a)).to.include(current.kid);
    await within(10_000, async () => !(await kids(a)).includes(current.kid));
    expect(Date.now()).to.be.at.least(Date.parse(short.exp));
    expect((await listed(a)).find((k) => k.kid === current.kid)).to.include({ status: 'retired' });
    expect(await introspect(a, short.token)).to.equal(false);
    // The key just made has signed nothing: rotating again retires it at once.
    const again = await rotate(a);
    expect(again.json.previous).to.deep.equal({
      kid: r.json.kid,
      status: 'retired',
      verify_until: again.json.created_at,
    });
    expect(await kids(a)).not.to.include(r.json.kid);
    expect((await kids(a))[0]).to.equal(again.json.kid);
  });

  it('introspects as inactive a token whose jti another key signed: a key cannot vouch for a token it never signed', async () => {
    const real = await minted(a);
    const r = await rotate(a, {});
    expect(r.status, r.text).to.equal(201);
    // Whoever holds the new key (leaked, say) signs a token carrying the real token's jti.
    const forged = await forgeWithStoredKey(a, r.json.kid, real.id);
    expect(await introspect(a, forged)).to.equal(false);
    expect(await introspect(a, real.token)).to.equal(true);
  });

  it('introspects as inactive a token carrying an expired token’s jti, whatever exp it presents', async () => {
    const real = await minted(a, 1);
    // Expired as stored (its exp is floored to the second): introspection says so.
    await within(10_000, async () => !(await introspect(a, real.token)));
    // Whoever holds the key that signed it signs the same jti again, with a later exp.
    const forged = await forgeWithStoredKey(a, real.kid, real.id);
    expect(await introspect(a, forged)).to.equal(false);
  });

  it('introspects a token naming an unknown kid as inactive', async () => {
    const { privateKey } = await generateKeyPair('EdDSA', { crv: 'Ed25519' });
    const forged = await new SignJWT({ scope: 'read:repo/arbiter' })
      .setProtectedHeader({ alg: 'EdDSA', kid: 'no-such-kid', typ: 'at+jwt' })
      .setIssuer('arbiter')
      .setSubject('rotation-bot')
      .setAudience('arbiter')
      .setJti('forged')
      .setIssuedAt()
      .setExpirationTime('5m')
      .sign(privateKey);
    expect(await introspect(a, forged)).to.equal(false);
    const noKid = await new SignJWT({})
      .setProtectedHeader({ alg: 'EdDSA', typ: 'at+jwt' })
      .setIssuer('arbiter')
      .setExpirationTime('5m')
      .sign(privateKey);
    expect(await introspect(a, noKid)).to.equal(false);
  });

  it('refuses bad input with its status and {"error"}, and changes nothing', async () => {
    const keysBefore = await listed(a);
    const rotationsBefore = (await auditEvents(a.platform, { kind: 'signing_key.rotate' })).length;
    const url = `${a.platform}/api/v1/signing-keys/rotate`;
    const json = { 'content-type': 'application/json' };
    expectError(await call('POST', url, { raw: '{"revoke_previous": tru', headers: json }), 400);
    expectError(await rotate(a, { revoke_previous: 'yes' }), 400, /revoke_previous/);
    expectError(await rotate(a, { revoke_previous: 1 }), 400, /revoke_previous/);
    expectError(await rotate(a, { revoke_previous: null }), 400, /revoke_previous/);
    expectError(await rotate(a, { revoke: true }), 400);
    expectError(await rotate(a, [true]), 400);
    expectError(await call('POST', url, { raw: 'true', headers: { 'content-type': 'text/plain' } }), 415);
    expectError(await rotate(a, {}, reader), 403);
    expectError(await rotate(a, {}, null), 401);
    expectError(await call('GET', `${a.platform}/api/v1/signing-keys`, { key: reader }), 403);
    expectError(await call('GET', `${a.platform}/api/v1/signing-keys`, { key: null }), 401);
    expect(await listed(a)).to.deep.equal(keysBefore);
    expect(await auditEvents(a.platform, { kind: 'signing_key.rotate' })).to.have.length(rotationsBefore);
  });

  it('revokes with revoke_previous the tokens minted before signing_kid was recorded, as the oldest key’s', async () => {
    const b = await Arbiter.start();
    try {
      const legacy = await minted(b);
      const current = await minted(b);
      // A row as an earlier version stored it: no signing_kid.
      await b.alter('UPDATE tokens SET signing_kid = NULL WHERE id = $1', [legacy.id]);
      expect(await introspect(b, legacy.token)).to.equal(true);
      const r = await rotate(b, { revoke_previous: true });
      expect(r.status, r.text).to.equal(201);
      expect(await introspect(b, legacy.token)).to.equal(false);
      expect(await introspect(b, current.token)).to.equal(false);
      const [event] = await auditEvents(b.platform, { kind: 'signing_key.rotate' });
      expect(event.details.tokens_revoked).to.equal(2);
    } finally {
      await b.close();
    }
  });

  it('never hands out a token under a key revoked by a rotation another process made (it signs again)', async () => {
    // A second process on the same store. On SQLite without --workers nothing tells it of the
    // rotation: only the mint's own transaction finds its key retired, and it signs again.
    const b = await Arbiter.start({}, a.dataDir);
    try {
      const before = await minted(b);
      const r = await rotate(a, { revoke_previous: true });
      expect(r.status, r.text).to.equal(201);
      const after = await minted(b);
      expect(after.kid).to.equal(r.json.kid);
      expect(after.kid).not.to.equal(before.kid);
      expect(await introspect(b, after.token)).to.equal(true);
      expect(await introspect(b, before.token)).to.equal(false);
      expect(
        await a.count('tokens', 'signing_kid = $1 AND revoked_at IS NULL AND expires_at > $2', [
          before.kid,
          new Date().toISOString(),
        ]),
      ).to.equal(0);
    } finally {
      await b.stop();
    }
  });

  it('with --workers, every worker signs with the new key and serves the same JWKS once the rotation is answered', async () => {
    const w = await Arbiter.start({ ARBITER_WORKERS: '2' });
    try {
      await minted(w);
      const r = await rotate(w);
      expect(r.status, r.text).to.equal(201);
      // New connections each time: the kernel spreads them over both workers.
      for (let i = 0; i < 12; i++) {
        expect((await kids(w))[0]).to.equal(r.json.kid);
        const res = await call('POST', `${w.engine}/v1/tokens/mint`, {
          body: { subject: 'rotation-bot', scopes: ['read:repo/arbiter'] },
          headers: { connection: 'close' },
        });
        expect(decodeProtectedHeader(res.json.token as string).kid).to.equal(r.json.kid);
      }
    } finally {
      await w.close();
    }
  });
});

// Two processes on a database of their own: registered on the PostgreSQL run.
onPostgresOnly('signing-key rotation across processes', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let a: Arbiter;
  let b: Arbiter;
  before(async () => {
    db = await createTestDatabase();
    [a, b] = await Promise.all([
      Arbiter.start({ ARBITER_DATABASE_URL: db.url }),
      Arbiter.start({ ARBITER_DATABASE_URL: db.url }),
    ]);
  });
  after(async () => {
    await Promise.all([a?.close(), b?.close()]);
    await db?.drop();
  });

  it('a rotation on A: B serves the same JWKS and signs with the new kid within 1 s', async () => {
    expect(await jwks(b)).to.deep.equal(await jwks(a));
    const old = await minted(b);
    const r = await rotate(a);
    expect(r.status, r.text).to.equal(201);
    const took = await within(1_000, async () => (await kids(b))[0] === r.json.kid);
    expect(took).to.be.lessThan(1_000);
    expect(await jwks(b)).to.deep.equal(await jwks(a));
    expect((await minted(b)).kid).to.equal(r.json.kid);
    expect(await introspect(b, old.token)).to.equal(true);
    expect(await verifiesOffline(b, old.token)).to.equal(true);
  });

  it('a revoke_previous rotation on A: the old key leaves B’s JWKS within 1 s and its tokens are inactive on B at once', async () => {
    const t = await minted(b);
    const r = await rotate(a, { revoke_previous: true });
    expect(r.status, r.text).to.equal(201);
    expect(await introspect(b, t.token)).to.equal(false);
    expect((await minted(b)).kid).to.equal(r.json.kid);
    await within(1_000, async () => !(await kids(b)).includes(t.kid));
    expect(await jwks(b)).to.deep.equal(await jwks(a));
  });
});
