import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { onEveryBackend, TEST_BACKEND } from './helpers/backends.js';
import {
  ADMIN_KEY,
  AGENT,
  Arbiter,
  auditEvents,
  call,
  HUMAN,
  storedText,
  type Response,
} from './helpers/harness.js';

const KEY_SHAPE = /^arb_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$/;

function expectUnauthorized(r: Response): void {
  expect(r.status).to.equal(401);
  expect(r.headers.get('www-authenticate')).to.match(/^Bearer/);
  expect(r.json).to.have.all.keys('error');
  expect(r.json.error).to.be.a('string').and.not.equal('');
}

function expectErrorOnly(r: Response, status: number): void {
  expect(r.status).to.equal(status);
  expect(r.json).to.have.all.keys('error');
  expect(r.json.error).to.be.a('string').and.not.equal('');
}

// Keys and their revocations are stored: run on every backend.
onEveryBackend('authentication and scopes (SPEC §2)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const auditRowsFor = async (requestId: string | null) => ({
    n: requestId === null ? 0 : (await auditEvents(a.platform, { request_id: requestId })).length,
  });
  const auditCount = async () =>
    (await call('GET', `${a.platform}/api/v1/audit/verify`)).json.checked as number;

  describe('401 for a missing, malformed, unknown or revoked key', () => {
    const authorize = (headers: Record<string, string>) =>
      call('POST', a.engine + '/v1/agent/authorize', { key: null, headers, body: AGENT.allow });

    it('answers 401 with a Bearer challenge when there is no Authorization header', async () => {
      expectUnauthorized(await authorize({}));
    });

    it('answers 401 for a Basic Authorization header', async () => {
      expectUnauthorized(await authorize({ authorization: 'Basic xyz' }));
    });

    it('answers 401 for "Bearer" with no key', async () => {
      expectUnauthorized(await authorize({ authorization: 'Bearer' }));
      expectUnauthorized(await authorize({ authorization: 'Bearer ' }));
    });

    it('answers 401 for an unknown key of the right shape', async () => {
      const unknown = `arb_0123456789abcdef_${'A'.repeat(43)}`;
      expect(unknown).to.match(KEY_SHAPE);
      expectUnauthorized(await authorize({ authorization: `Bearer ${unknown}` }));
    });

    it('answers 401 for a garbage token', async () => {
      expectUnauthorized(await authorize({ authorization: 'Bearer not-a-key' }));
      expectUnauthorized(await authorize({ authorization: 'Bearer arb_zz_zz' }));
    });

    it('answers 401 for a real key with one character changed', async () => {
      const key = a.createKey('tampered-key', ['authorize']);
      const last = key.at(-1) === 'A' ? 'B' : 'A';
      const tampered = key.slice(0, -1) + last;
      expectUnauthorized(await authorize({ authorization: `Bearer ${tampered}` }));
      expect((await authorize({ authorization: `Bearer ${key}` })).status).to.equal(200);
    });

    it('answers 401 on the very next request after another process revokes the key (the key cache never outlives a commit)', async () => {
      const key = a.createKey('revoke-me', ['authorize']);
      // Used several times first, so that the serving process has it cached.
      for (let i = 0; i < 3; i++) {
        expect((await authorize({ authorization: `Bearer ${key}` })).status).to.equal(200);
      }
      const r = a.cli(['keys', 'revoke', 'revoke-me']);
      expect(r.code, r.stderr).to.equal(0);
      expectUnauthorized(await authorize({ authorization: `Bearer ${key}` }));
    });

    it('requires a key on the Platform API too, but not for /healthz', async () => {
      expectUnauthorized(await call('GET', a.platform + '/api/v1/policies', { key: null }));
      const h = await call('GET', a.platform + '/healthz', { key: null });
      expect(h.status).to.equal(200);
    });
  });

  describe('scopes', () => {
    it('answers 403 "API key lacks scope policies:write" to a policies:read key doing a PUT', async () => {
      const key = a.createKey('reader', ['policies:read']);
      const list = await call('GET', a.platform + '/api/v1/policies', { key });
      expect(list.status).to.equal(200);
      const r = await call('PUT', a.platform + '/api/v1/policies/not-allowed', {
        key,
        body: 'package authz.agent\n\nallow if false\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(r.status).to.equal(403);
      expect(r.json).to.deep.equal({ error: 'API key lacks scope policies:write' });
      const get = await call('GET', a.platform + '/api/v1/policies/not-allowed');
      expect(get.status).to.equal(404);
    });

    it('does not let an authorize-only key read policies (403 naming policies:read)', async () => {
      const key = a.createKey('authorize-only', ['authorize']);
      const r = await call('GET', a.platform + '/api/v1/policies', { key });
      expect(r.status).to.equal(403);
      expect(r.json).to.deep.equal({ error: 'API key lacks scope policies:read' });
      const ok = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
      expect(ok.status).to.equal(200);
    });

    it('does not let a policies key authorize', async () => {
      const key = a.createKey('policy-admin', ['policies:read', 'policies:write']);
      const r = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
      expect(r.status).to.equal(403);
      expect(r.json).to.deep.equal({ error: 'API key lacks scope authorize' });
    });

    it('lets an admin-scoped key do everything', async () => {
      const key = a.createKey('super', ['admin']);
      expect(
        (await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow })).status,
      ).to.equal(200);
      expect((await call('POST', a.engine + '/v1/authorize', { key, body: HUMAN.allow })).status).to.equal(
        200,
      );
      expect((await call('GET', a.platform + '/api/v1/policies', { key })).status).to.equal(200);
      expect((await call('GET', a.platform + '/api/v1/data', { key })).status).to.equal(200);
      expect((await call('GET', a.engine + '/metrics', { key })).status).to.equal(200);
      const put = await call('PUT', a.platform + '/api/v1/policies/admin-scope-check', {
        key,
        body: 'package authz.agent\n\ndeny contains "never" if input.action == "no-such-action-x"\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(put.status, put.text).to.equal(201);
      const del = await call('DELETE', a.platform + '/api/v1/policies/admin-scope-check', { key });
      expect(del.status).to.equal(204);
    });

    it('accepts ARBITER_ADMIN_KEY as a key with every scope', async () => {
      expect((await call('GET', a.platform + '/api/v1/policies', { key: ADMIN_KEY })).status).to.equal(200);
      expect((await call('GET', a.engine + '/metrics', { key: ADMIN_KEY })).status).to.equal(200);
    });

    it('protects /metrics with metrics:read', async () => {
      expectUnauthorized(await call('GET', a.engine + '/metrics', { key: null }));
      const noScope = a.createKey('no-metrics', ['authorize']);
      const r = await call('GET', a.engine + '/metrics', { key: noScope });
      expect(r.status).to.equal(403);
      expect(r.json).to.deep.equal({ error: 'API key lacks scope metrics:read' });
      const withScope = a.createKey('metrics-reader', ['metrics:read']);
      expect((await call('GET', a.engine + '/metrics', { key: withScope })).status).to.equal(200);
    });
  });

  describe('bindings', () => {
    it('lets an agent-bound key authorize only as its agent, and writes no audit row for a refusal', async () => {
      const key = a.createKey('deploy-bot-key', ['authorize'], { agent: 'deploy-bot' });
      const ok = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
      expect(ok.status).to.equal(200);
      expect(ok.json.status).to.equal('allow');

      const before = await auditCount();
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        key,
        body: { ...AGENT.allow, agent_id: 'other-bot' },
      });
      expectErrorOnly(r, 403);
      expect(r.json.error).to.match(/deploy-bot/);
      expect((await auditRowsFor(r.headers.get('x-request-id'))).n).to.equal(0);
      expect(await auditCount()).to.equal(before);

      const viaApi = await call('POST', a.platform + '/api/v1/authorize', {
        key,
        body: { ...AGENT.allow, agent_id: 'other-bot' },
      });
      expectErrorOnly(viaApi, 403);
    });

    it('lets a tenant-bound key authorize humans only in its tenant', async () => {
      const key = a.createKey('acme-key', ['authorize'], { tenant: 'acme' });
      const ok = await call('POST', a.engine + '/v1/authorize', { key, body: HUMAN.allow });
      expect(ok.status).to.equal(200);
      expect(ok.json.status).to.equal('allow');

      const before = await auditCount();
      const r = await call('POST', a.engine + '/v1/authorize', {
        key,
        body: { ...HUMAN.allow, tenant_id: 'globex' },
      });
      expectErrorOnly(r, 403);
      expect(r.json.error).to.match(/acme/);
      expect(await auditCount()).to.equal(before);
    });

    it('passes the calling key to policies as input.principal', async () => {
      const put = await call('PUT', a.platform + '/api/v1/policies/principal-check', {
        body: 'package authz.agent\n\ndeny contains "tenant-bound" if input.principal.tenant == "acme"\n',
        headers: { 'content-type': 'text/plain' },
      });
      expect(put.status, put.text).to.equal(201);
      try {
        const key = a.createKey('acme-agent-key', ['authorize'], { tenant: 'acme' });
        const denied = await call('POST', a.engine + '/v1/agent/authorize', { key, body: AGENT.allow });
        expect(denied.status).to.equal(403);
        expect(denied.json.status).to.equal('deny');
        expect(denied.json.message).to.match(/tenant-bound/);
        const [ev] = await auditEvents(a.platform, { request_id: denied.json.request_id });
        expect({ tenant_id: ev.tenant_id, actor: ev.actor }).to.deep.equal({
          tenant_id: 'acme',
          actor: 'acme-agent-key',
        });

        const admin = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
        expect(admin.status).to.equal(200);
      } finally {
        const del = await call('DELETE', a.platform + '/api/v1/policies/principal-check');
        expect(del.status).to.equal(204);
      }
      const after = a.createKey('acme-agent-key-2', ['authorize'], { tenant: 'acme' });
      const r = await call('POST', a.engine + '/v1/agent/authorize', { key: after, body: AGENT.allow });
      expect(r.status).to.equal(200);
    });
  });

  describe('arbiter keys (CLI)', () => {
    it('prints the new key once, as one JSON line, in the documented shape', () => {
      const r = a.cli(['keys', 'create', '--name', 'cli-shape', '--scopes', 'authorize,queue:read']);
      expect(r.code, r.stderr).to.equal(0);
      const lines = r.stdout.trim().split('\n');
      expect(lines).to.have.length(1);
      const out = JSON.parse(lines[0] as string) as { key: string; name: string; scopes: string[] };
      expect(out.key).to.match(KEY_SHAPE);
      expect(out.name).to.equal('cli-shape');
      expect(out.scopes).to.have.members(['authorize', 'queue:read']);
    });

    it('stores only a 64-hex hash, never the key itself', async () => {
      const r = a.cli(['keys', 'create', '--name', 'hash-only', '--scopes', 'authorize']);
      expect(r.code, r.stderr).to.equal(0);
      const key = (JSON.parse(r.stdout) as { key: string }).key;
      const rows = await a.stored('SELECT * FROM api_keys');
      const secret = key.split('_').slice(2).join('_');
      const row = rows.find((x) => x.name === 'hash-only');
      expect(row?.hash).to.match(/^[0-9a-f]{64}$/);
      // Nowhere in the database: not in api_keys, not in an audit event, not in any other table.
      const everything = await storedText(a);
      expect(everything).to.include('hash-only');
      expect(everything).to.not.include(key);
      expect(everything).to.not.include(secret);
      // On SQLite, not in the file's bytes either (free pages, the write-ahead log).
      if (TEST_BACKEND === 'sqlite') {
        for (const file of ['arbiter.db', 'arbiter.db-wal']) {
          let bytes: Buffer;
          try {
            bytes = readFileSync(path.join(a.dataDir, file));
          } catch {
            continue;
          }
          expect(bytes.includes(Buffer.from(secret)), `${file} contains the key`).to.equal(false);
        }
      }
    });

    it('lists keys without the key or its hash', async () => {
      const created = a.cli([
        'keys',
        'create',
        '--name',
        'listed',
        '--scopes',
        'authorize',
        '--tenant',
        'acme',
      ]);
      expect(created.code, created.stderr).to.equal(0);
      const key = (JSON.parse(created.stdout) as { key: string }).key;
      const hashes = (await a.stored<{ hash: string }>('SELECT hash FROM api_keys')).map((h) => h.hash);
      expect(hashes.length).to.be.greaterThan(0);
      const r = a.cli(['keys', 'list']);
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout).to.include('listed');
      expect(r.stdout).to.not.include(key);
      expect(r.stdout).to.not.match(/arb_[0-9a-f]{16}_/);
      for (const h of hashes) expect(r.stdout).to.not.include(h);
      const listed = r.stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((k) => k.name === 'listed');
      expect(listed).to.include({ name: 'listed', tenant: 'acme' });
      expect(listed).to.not.have.property('hash');
      expect(listed).to.not.have.property('key');
    });

    it('refuses a duplicate name with a non-zero exit', () => {
      expect(a.cli(['keys', 'create', '--name', 'dup', '--scopes', 'authorize']).code).to.equal(0);
      const r = a.cli(['keys', 'create', '--name', 'dup', '--scopes', 'authorize']);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.match(/dup/);
      expect(r.stdout).to.not.match(/arb_/);
    });

    it('refuses an option given twice rather than keeping the last (found by a tenancy probe)', async () => {
      // parseArgs kept the last value: --tenant acme --tenant globex bound the key to globex.
      for (const args of [
        ['--tenant', 'acme', '--tenant', 'globex'],
        ['--tenant=acme', '--tenant', 'globex'],
        ['--scopes', 'queue:read'],
      ]) {
        const r = a.cli(['keys', 'create', '--name', 'twice', '--scopes', 'authorize', ...args]);
        expect(r.code, r.stdout).to.equal(1);
        expect(r.stderr).to.match(/option --(tenant|scopes) is given more than once/);
        expect(r.stdout).to.not.match(/arb_/);
      }
      const created = await auditEvents(a.platform, { kind: 'key.create' });
      expect(created.map((e) => e.resource)).to.not.include('twice');
    });

    it("refuses the names admin and system (any case): what they did would read as ARBITER_ADMIN_KEY's or Arbiter's", async () => {
      for (const [name, whose] of [
        ['admin', "ARBITER_ADMIN_KEY's principal"],
        ['Admin', "ARBITER_ADMIN_KEY's principal"],
        ['SYSTEM', "Arbiter's own events (start-up, expiry)"],
      ]) {
        const r = a.cli(['keys', 'create', '--name', name!, '--scopes', 'queue:read,queue:review']);
        expect(r.code, r.stdout).to.not.equal(0);
        expect(r.stderr).to.include(`key name ${name} is reserved for ${whose}`);
        expect(r.stdout).to.not.match(/arb_/);
      }
      const created = await auditEvents(a.platform, { kind: 'key.create' });
      expect(created.map((e) => String(e.resource).toLowerCase())).to.not.include.members([
        'admin',
        'system',
      ]);
      expect(a.cli(['keys', 'create', '--name', 'admin-2', '--scopes', 'authorize']).code).to.equal(0);
    });

    it('refuses an unknown scope with a non-zero exit and a message naming it', async () => {
      const r = a.cli(['keys', 'create', '--name', 'bad-scope', '--scopes', 'authorize,queue:explode']);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.include('queue:explode');
      const listed = a.cli(['keys', 'list']);
      expect(listed.code, listed.stderr).to.equal(0);
      const names = listed.stdout
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { name: string }).name);
      expect(names.length).to.be.greaterThan(0);
      expect(names).to.not.include('bad-scope');
      const created = await auditEvents(a.platform, { kind: 'key.create' });
      expect(created.map((e) => e.resource)).to.not.include('bad-scope');
    });

    it('refuses to revoke an unknown key name with a non-zero exit', () => {
      const r = a.cli(['keys', 'revoke', 'no-such-key']);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.include('no-such-key');
    });

    it('audits key creation and revocation as key.create and key.revoke', async () => {
      expect(a.cli(['keys', 'create', '--name', 'audited', '--scopes', 'authorize']).code).to.equal(0);
      expect(a.cli(['keys', 'revoke', 'audited']).code).to.equal(0);
      const found = [
        ...(await auditEvents(a.platform, { kind: 'key.create' })),
        ...(await auditEvents(a.platform, { kind: 'key.revoke' })),
      ].filter((e) => e.resource === 'audited');
      expect(found.map((r) => r.kind)).to.deep.equal(['key.create', 'key.revoke']);
      for (const r of found) expect(JSON.stringify(r)).to.not.match(/arb_[0-9a-f]{16}_/);
    });
  });
});
