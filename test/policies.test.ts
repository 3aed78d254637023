import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { onEveryBackend } from './helpers/backends.js';
import { bigJsonBody, expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call, type RequestOptions, type Response } from './helpers/harness.js';
import { SPIN, SPIN_ITEMS } from './helpers/policies.js';

const MiB = 1024 * 1024;

/** A rule in package authz.agent that denies the AGENT.allow example (action read). */
const DENY_READ = 'package authz.agent\n\ndeny contains "reads are switched off" if input.action == "read"\n';
const DENY_READ_V2 =
  'package authz.agent\n\ndeny contains "reads are switched off (v2)" if input.action == "read"\n';

// Policies, data and their history are stored: every backend.
onEveryBackend('Platform API: policies and data (real compiler, real storage)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const policy = (name: string) => `${a.platform}/api/v1/policies/${name}`;
  const data = (path: string) => `${a.platform}/api/v1/data/${path}`;
  const put = (name: string, body: unknown, opts: RequestOptions = {}) =>
    call('PUT', policy(name), { body, ...opts });
  const authorize = (body: unknown = AGENT.allow) => call('POST', a.engine + '/v1/agent/authorize', { body });

  const revision = async (): Promise<number> => {
    const r = await call('GET', a.platform + '/api/v1/policies');
    expect(r.status).to.equal(200);
    return r.json.revision as number;
  };

  /** What must not move when a change is refused: revision, policy list, data list, decisions. */
  const observable = async () => {
    const list = await call('GET', a.platform + '/api/v1/policies');
    const docs = await call('GET', a.platform + '/api/v1/data');
    const allow = await authorize(AGENT.allow);
    const approval = await authorize(AGENT.approval);
    return {
      revision: list.json.revision,
      policies: list.json.policies,
      data: docs.json.documents,
      decisions: [
        [allow.status, allow.json.status, allow.json.message],
        [approval.status, approval.json.status, approval.json.message],
      ],
    };
  };

  /** Runs `fn` and asserts that nothing observable changed. */
  const expectUnchanged = async (fn: () => Promise<void>) => {
    const before = await observable();
    await fn();
    expect(await observable()).to.deep.equal(before);
  };

  const remove = async (name: string) => {
    const r = await call('DELETE', policy(name));
    expect(r.status, `cleanup of ${name}: ${r.text}`).to.be.oneOf([204, 404]);
  };

  describe('GET /api/v1/policies and /api/v1/policies/{name}', () => {
    it('lists the seeded policies with their metadata and the global revision', async () => {
      const r = await call('GET', a.platform + '/api/v1/policies');
      expect(r.status).to.equal(200);
      expect(r.json).to.have.keys('policies', 'revision', 'next_cursor');
      expect(r.json.revision).to.be.a('number').and.at.least(1);
      const names = (r.json.policies as { name: string }[]).map((p) => p.name);
      expect(names).to.include.members(['agent', 'human']);
      for (const p of r.json.policies) {
        expect(p).to.have.keys('name', 'description', 'sha256', 'version', 'updated_at');
        expect(p.sha256).to.match(/^[0-9a-f]{64}$/);
        expect(p.version).to.be.a('number').and.at.least(1);
        expect(Number.isNaN(Date.parse(p.updated_at))).to.equal(false);
        expect(p.description).to.be.a('string');
      }
    });

    it('returns one policy with its Rego source and an ETag', async () => {
      const r = await call('GET', policy('agent'));
      expect(r.status).to.equal(200);
      expect(r.json).to.have.keys('name', 'description', 'sha256', 'version', 'updated_at', 'rego');
      expect(r.json.name).to.equal('agent');
      expect(r.json.rego).to.match(/^package authz\.agent$/m);
      const etag = r.headers.get('etag');
      expect(etag).to.equal(`"${r.json.version}-${(r.json.sha256 as string).slice(0, 16)}"`);
    });

    it('answers 404 for a policy that does not exist', async () => {
      expectError(await call('GET', policy('no-such-policy')), 404, /no-such-policy/);
    });

    it('answers 404 when deleting a policy that does not exist', async () => {
      await expectUnchanged(async () => {
        expectError(await call('DELETE', policy('no-such-policy')), 404, /no-such-policy/);
      });
    });
  });

  describe('PUT /api/v1/policies/{name}', () => {
    afterEach(async () => {
      await remove('read-off');
    });

    it('creates with 201, updates with 200, bumps the revision by one each time, and is live before the response', async () => {
      expect((await authorize()).status).to.equal(200);
      const rev0 = await revision();

      const created = await put('read-off', { rego: DENY_READ, description: 'switch reads off' });
      expect(created.status).to.equal(201);
      expect(created.json).to.include({ name: 'read-off', description: 'switch reads off', version: 1 });
      expect(created.json.revision).to.equal(rev0 + 1);
      expect(created.headers.get('etag')).to.match(/^"1-[0-9a-f]{16}"$/);
      const denied = await authorize();
      expect(denied.status).to.equal(403);
      expect(denied.json.message).to.include('reads are switched off');
      expect(await revision()).to.equal(rev0 + 1);

      const updated = await put('read-off', { rego: DENY_READ_V2 });
      expect(updated.status).to.equal(200);
      expect(updated.json).to.include({ name: 'read-off', version: 2, description: 'switch reads off' });
      expect(updated.json.revision).to.equal(rev0 + 2);
      expect((await authorize()).json.message).to.include('(v2)');

      const got = await call('GET', policy('read-off'));
      expect(got.json.rego).to.equal(DENY_READ_V2);
      expect(got.headers.get('etag')).to.equal(updated.headers.get('etag'));

      const list = await call('GET', a.platform + '/api/v1/policies');
      expect(list.json.revision).to.equal(rev0 + 2);
      expect(list.json.policies.find((p: { name: string }) => p.name === 'read-off')).to.include({
        version: 2,
      });
    });

    it('accepts the Rego itself as text/plain', async () => {
      const rev0 = await revision();
      const r = await call('PUT', policy('read-off'), {
        raw: DENY_READ,
        headers: { 'content-type': 'text/plain; charset=utf-8' },
      });
      expect(r.status).to.equal(201);
      // Versions count on across a delete (history keeps every one): this name was created and
      // deleted by the tests above, so this creation is not its version 1.
      expect(r.json).to.include({ name: 'read-off', revision: rev0 + 1 });
      expect(r.json.version).to.be.greaterThan(1);
      expect((await call('GET', policy('read-off'))).json.rego).to.equal(DENY_READ);
      expect((await authorize()).status).to.equal(403);
    });

    it('accepts a name of exactly 128 characters', async () => {
      const name = 'n' + 'a'.repeat(127);
      try {
        const r = await put(name, { rego: 'package lib.long\n\nx := 1\n' });
        expect(r.status).to.equal(201);
        expect(r.json.name).to.equal(name);
      } finally {
        await remove(name);
      }
    });

    it('records each change in the audit trail', async () => {
      const r = await put('read-off', { rego: DENY_READ });
      expect(r.status).to.equal(201);
      const [latest] = await auditEvents(a.platform, { kind: 'policy.put' });
      const ev = { kind: latest.kind, outcome: latest.outcome, policy_revision: latest.policy_revision };
      expect(ev).to.deep.equal({ kind: 'policy.put', outcome: 'success', policy_revision: r.json.revision });
    });
  });

  describe('?dry_run=true', () => {
    it('answers 200 without storing the policy, bumping the revision or changing decisions', async () => {
      await expectUnchanged(async () => {
        const r = await call('PUT', policy('read-off') + '?dry_run=true', { body: { rego: DENY_READ } });
        expect(r.status).to.equal(200);
        expect(r.json).to.include({ dry_run: true, compiled: true, name: 'read-off' });
        expectError(await call('GET', policy('read-off')), 404);
      });
    });

    it('answers 400 for a dry run that does not compile, and changes nothing', async () => {
      await expectUnchanged(async () => {
        const r = await call('PUT', policy('broken') + '?dry_run=true', {
          body: { rego: 'package authz.agent\n\nallow if {\n' },
        });
        expectError(r, 400, /policy broken:\d+:\d+/);
        expectError(await call('GET', policy('broken')), 404);
      });
    });

    it('does not change an existing policy on a dry run', async () => {
      try {
        expect((await put('read-off', { rego: DENY_READ })).status).to.equal(201);
        await expectUnchanged(async () => {
          const r = await call('PUT', policy('read-off') + '?dry_run=true', {
            body: { rego: 'package authz.agent\n\nx := 1\n' },
          });
          expect(r.status).to.equal(200);
          expect((await call('GET', policy('read-off'))).json.rego).to.equal(DENY_READ);
        });
      } finally {
        await remove('read-off');
      }
    });

    it('answers 400 naming dry_run when it is not a boolean', async () => {
      await expectUnchanged(async () => {
        const r = await call('PUT', policy('read-off') + '?dry_run=maybe', { body: { rego: DENY_READ } });
        expectError(r, 400, /dry_run/);
      });
    });
  });

  describe('If-Match', () => {
    afterEach(async () => {
      await remove('guarded');
    });

    it('answers 200 when If-Match carries the current ETag', async () => {
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 1\n' })).status).to.equal(201);
      const etag = (await call('GET', policy('guarded'))).headers.get('etag') as string;
      const r = await put(
        'guarded',
        { rego: 'package lib.guarded\n\nx := 2\n' },
        { headers: { 'if-match': etag } },
      );
      expect(r.status).to.equal(200);
      expect(r.json.version).to.equal(2);
    });

    it('answers 412 when If-Match is stale, and changes nothing', async () => {
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 1\n' })).status).to.equal(201);
      const stale = (await call('GET', policy('guarded'))).headers.get('etag') as string;
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 2\n' })).status).to.equal(200);
      await expectUnchanged(async () => {
        const r = await put('guarded', { rego: DENY_READ }, { headers: { 'if-match': stale } });
        expectError(r, 412);
        expect((await call('GET', policy('guarded'))).json.rego).to.equal('package lib.guarded\n\nx := 2\n');
      });
    });

    it('answers 412 for If-Match: * when the policy does not exist, and creates nothing', async () => {
      await expectUnchanged(async () => {
        const r = await put('guarded', { rego: DENY_READ }, { headers: { 'if-match': '*' } });
        expectError(r, 412);
        expectError(await call('GET', policy('guarded')), 404);
      });
    });

    // Found by a race probe (2026-11-29): If-None-Match was ignored, so of two "create only"
    // PUTs both succeeded (201, then 200) and the second silently replaced the first.
    it('creates once under If-None-Match: * (of concurrent creators one wins, the others 412)', async () => {
      const rego = (n: number) => `package lib.guarded\n\nx := ${n}\n`;
      const rs = await Promise.all(
        [1, 2, 3, 4].map((n) => put('guarded', { rego: rego(n) }, { headers: { 'if-none-match': '*' } })),
      );
      expect(rs.map((r) => r.status).sort()).to.deep.equal([201, 412, 412, 412]);
      for (const r of rs.filter((x) => x.status === 412))
        expectError(r, 412, /If-None-Match: \* but the policy exists/);
      const won = rs.findIndex((r) => r.status === 201) + 1;
      const now = await call('GET', policy('guarded'));
      expect(now.json.rego).to.equal(rego(won));
      await expectUnchanged(async () => {
        expectError(await put('guarded', { rego: DENY_READ }, { headers: { 'if-none-match': '*' } }), 412);
      });
    });

    it('answers 412 when If-None-Match names the current ETag, 200 when it names another', async () => {
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 1\n' })).status).to.equal(201);
      const etag = (await call('GET', policy('guarded'))).headers.get('etag') as string;
      await expectUnchanged(async () => {
        const r = await put(
          'guarded',
          { rego: DENY_READ },
          { headers: { 'if-none-match': `"0-x", ${etag}` } },
        );
        expectError(r, 412, /If-None-Match names the current ETag/);
      });
      const ok = await put(
        'guarded',
        { rego: 'package lib.guarded\n\nx := 2\n' },
        { headers: { 'if-none-match': '"0-x"' } },
      );
      expect(ok.status).to.equal(200);
      expectError(
        await call('PUT', `${policy('guarded')}?mode=shadow`, {
          body: { rego: DENY_READ },
          headers: { 'if-none-match': '*' },
        }),
        400,
        /If-None-Match cannot be used with mode=shadow/,
      );
    });

    it('answers 412 when a DELETE carries a stale If-Match, and keeps the policy', async () => {
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 1\n' })).status).to.equal(201);
      const stale = (await call('GET', policy('guarded'))).headers.get('etag') as string;
      expect((await put('guarded', { rego: 'package lib.guarded\n\nx := 2\n' })).status).to.equal(200);
      await expectUnchanged(async () => {
        expectError(await call('DELETE', policy('guarded'), { headers: { 'if-match': stale } }), 412);
      });
    });
  });

  describe('concurrent changes', () => {
    const names = Array.from({ length: 5 }, (_, i) => `serial-${i}`);
    after(async () => {
      for (const n of names) await remove(n);
    });

    it('serializes concurrent PUTs: one revision each, and the live set holds every module', async () => {
      const rev = await revision();
      const answers = await Promise.all(
        names.map((n) =>
          put(n, {
            rego: `package authz.agent\n\ndeny contains "${n} says no" if input.resource == "repo/${n}"\n`,
          }),
        ),
      );
      expect(answers.map((r) => r.status)).to.deep.equal(names.map(() => 201));
      // Each change compiled with every other current module: no change lost another.
      expect(answers.map((r) => r.json.revision as number).sort((x, y) => x - y)).to.deep.equal(
        names.map((_, i) => rev + 1 + i),
      );
      expect(await revision()).to.equal(rev + names.length);
      for (const n of names) {
        const r = await authorize({ ...AGENT.allow, resource: `repo/${n}` });
        expect(r.status, r.text).to.equal(403);
        expect(r.json.message).to.equal(`${n} says no`);
      }
    });
  });

  describe('DELETE /api/v1/policies/{name}', () => {
    afterEach(async () => {
      await remove('read-off');
      await remove('user');
      await remove('lib');
    });

    it('answers 204, takes the rule out of the live set, bumps the revision, then answers 404', async () => {
      expect((await put('read-off', { rego: DENY_READ })).status).to.equal(201);
      expect((await authorize()).status).to.equal(403);
      const rev = await revision();
      const r = await call('DELETE', policy('read-off'));
      expect(r.status).to.equal(204);
      expect(r.text).to.equal('');
      expect(await revision()).to.equal(rev + 1);
      expect((await authorize()).status).to.equal(200);
      expectError(await call('GET', policy('read-off')), 404);
      expectError(await call('DELETE', policy('read-off')), 404);
    });

    it('answers 400 when deleting a policy that another imports, and changes nothing', async () => {
      const lib = 'package lib\n\nis_blocked(r) if startswith(r, "nowhere/")\n';
      const user =
        'package authz.agent\n\nimport data.lib\n\ndeny contains "lib says no" if lib.is_blocked(input.resource)\n';
      expect((await put('lib', { rego: lib })).status).to.equal(201);
      expect((await put('user', { rego: user })).status).to.equal(201);
      const blocked = await authorize({ ...AGENT.allow, resource: 'nowhere/x' });
      expect(blocked.status).to.equal(403);
      expect(blocked.json.message).to.include('lib says no');
      await expectUnchanged(async () => {
        expectError(await call('DELETE', policy('lib')), 400, /lib/);
        expect((await call('GET', policy('lib'))).status).to.equal(200);
      });
      expect((await authorize({ ...AGENT.allow, resource: 'nowhere/x' })).status).to.equal(403);
    });
  });

  describe('refused policy changes leave everything as it was', () => {
    const refuse = (
      title: string,
      send: () => Promise<Response>,
      status: number,
      message?: RegExp,
      absent?: string,
    ) =>
      it(title, async () => {
        await expectUnchanged(async () => {
          expectError(await send(), status, message);
          if (absent) expectError(await call('GET', policy(absent)), 404);
        });
      });

    refuse(
      'answers 400 naming the policy, row and column for Rego that does not parse',
      () => put('broken', { rego: 'package authz.agent\n\nallow if {\n  input.action ==\n' }),
      400,
      /policy broken:\d+:\d+/,
      'broken',
    );
    refuse(
      'answers 400 for unsafe Rego (a head variable never bound)',
      () => put('unsafe', { rego: 'package authz.agent\n\ndeny contains x if {\n  y := 1\n}\n' }),
      400,
      /policy unsafe:\d+:\d+.*unsafe/,
      'unsafe',
    );
    refuse(
      'answers 400 for unsafe Rego (a body variable never bound)',
      () => put('unsafe', { rego: 'package authz.agent\n\ndeny contains "x" if {\n  z > 1\n}\n' }),
      400,
      /unsafe/,
      'unsafe',
    );
    refuse(
      'answers 400 naming http.send for a policy that calls it',
      () =>
        put('fetcher', {
          rego:
            'package authz.agent\n\ndeny contains "remote says no" if {\n' +
            '  r := http.send({"method": "GET", "url": "http://127.0.0.1:1/"})\n  r.status_code != 200\n}\n',
        }),
      400,
      /http\.send/,
      'fetcher',
    );
    refuse(
      'answers 400 saying package authz is reserved',
      () => put('hijack', { rego: 'package authz\n\nextra := 1\n' }),
      400,
      /reserved/,
      'hijack',
    );
    refuse(
      'answers 400 when an update would break the set, and keeps the old version live',
      () => put('agent', { rego: 'package authz.agent\n\nallow if {\n' }),
      400,
      /policy agent:\d+:\d+/,
    );

    const badNames: [string, string][] = [
      ['uppercase letters', 'BadName'],
      ['a leading dot', '.hidden'],
      ['a leading dash', '-dash'],
      ['129 characters', 'a'.repeat(129)],
      ['a percent-encoded slash', 'a%2Fb'],
      ['a space', 'a%20b'],
    ];
    for (const [what, name] of badNames) {
      refuse(`answers 400 for a policy name with ${what}`, () => put(name, { rego: DENY_READ }), 400, /name/);
    }
    for (const [what, name] of badNames) {
      refuse(
        `answers 400 on GET for a policy name with ${what}`,
        () => call('GET', policy(name)),
        400,
        /name/,
      );
    }

    refuse('answers 400 when the rego field is missing', () => put('x1', { description: 'd' }), 400, /rego/);
    refuse('answers 400 when rego is not a string', () => put('x1', { rego: 42 }), 400, /rego/);
    refuse('answers 400 when rego is empty', () => put('x1', { rego: '' }), 400, /rego/);
    refuse('answers 400 when rego is only whitespace', () => put('x1', { rego: ' \n\t' }), 400, /rego/);
    refuse(
      'answers 400 for an empty text/plain body',
      () => call('PUT', policy('x1'), { raw: '', headers: { 'content-type': 'text/plain' } }),
      400,
    );
    refuse(
      'answers 400 when description is not a string',
      () => put('x1', { rego: DENY_READ, description: 7 }),
      400,
      /description/,
    );
    refuse(
      'answers 400 naming an unknown field',
      () => put('x1', { rego: DENY_READ, descripton: 'typo' }),
      400,
      /descripton/,
    );
    refuse('answers 400 for a JSON array body', () => put('x1', [DENY_READ]), 400);
    refuse(
      'answers 400 for a JSON null body',
      () => call('PUT', policy('x1'), { raw: 'null', headers: { 'content-type': 'application/json' } }),
      400,
    );
    refuse(
      'answers 400 for a JSON string body',
      () =>
        call('PUT', policy('x1'), {
          raw: JSON.stringify(DENY_READ),
          headers: { 'content-type': 'application/json' },
        }),
      400,
    );
    refuse(
      'answers 415 for an application/xml body',
      () =>
        call('PUT', policy('x1'), {
          raw: '<rego>package authz.agent</rego>',
          headers: { 'content-type': 'application/xml' },
        }),
      415,
    );
    refuse(
      'answers 400 for malformed JSON',
      () =>
        call('PUT', policy('x1'), {
          raw: '{"rego": "package',
          headers: { 'content-type': 'application/json' },
        }),
      400,
      /JSON/,
    );
    refuse(
      'answers 413 for a 2 MiB body',
      () =>
        call('PUT', policy('x1'), {
          raw: bigJsonBody(2 * MiB),
          headers: { 'content-type': 'application/json' },
        }),
      413,
    );
    refuse(
      'answers 413 for a 2 MiB text/plain body',
      () =>
        call('PUT', policy('x1'), {
          raw: DENY_READ + '#'.repeat(2 * MiB),
          headers: { 'content-type': 'text/plain' },
        }),
      413,
    );
  });

  describe('data documents', () => {
    const EXTRA =
      'package authz.agent\n\ndeny contains "resource is on the extra block list" if input.resource in data.blocked_extra\n';

    afterEach(async () => {
      await remove('extra');
      for (const p of [
        'blocked_extra',
        'ovl/b',
        'ovl',
        'ovl2/c',
        'scalar-num',
        'scalar-str',
        'scalar-null',
      ]) {
        const r = await call('DELETE', data(p));
        expect(r.status, `cleanup of ${p}: ${r.text}`).to.be.oneOf([204, 404, 400]);
      }
    });

    it('refuses (400) data that outgrows the evaluation memory, naming the limit, and changes nothing', async function () {
      this.timeout(120_000);
      // About 1 MB of JSON each, far more as the policy's wasm holds it: two fit, a third does not.
      const big = Array.from({ length: 500_000 }, () => 1);
      try {
        for (const p of ['big-1', 'big-2']) {
          const r = await call('PUT', data(p), { body: big });
          expect(r.status, r.text).to.equal(201);
        }
        await expectUnchanged(async () => {
          expectError(
            await call('PUT', data('big-3'), { body: big }),
            400,
            /^the policy set's data does not fit in the evaluation memory \(at most 256 MiB\): opa_malloc/,
          );
        });
      } finally {
        for (const p of ['big-1', 'big-2']) await call('DELETE', data(p));
      }
    });

    it('creates with 201, replaces with 200, bumps the revision, serves and lists the document, deletes with 204', async () => {
      const rev0 = await revision();
      const created = await call('PUT', data('blocked_extra'), { body: ['repo/nothing'] });
      expect(created.status).to.equal(201);
      expect(created.json).to.have.keys('path', 'revision', 'updated_at');
      expect(created.json).to.include({ path: 'blocked_extra', revision: rev0 + 1 });
      expect(await revision()).to.equal(rev0 + 1);

      const replaced = await call('PUT', data('blocked_extra'), { body: ['repo/other'] });
      expect(replaced.status).to.equal(200);
      expect(replaced.json.revision).to.equal(rev0 + 2);

      const got = await call('GET', data('blocked_extra'));
      expect(got.status).to.equal(200);
      expect(got.json).to.have.keys('path', 'value', 'updated_at');
      expect(got.json).to.deep.include({ path: 'blocked_extra', value: ['repo/other'] });

      const list = await call('GET', a.platform + '/api/v1/data');
      expect(list.status).to.equal(200);
      expect(list.json.revision).to.equal(rev0 + 2);
      const paths = (list.json.documents as { path: string }[]).map((d) => d.path);
      expect(paths).to.include.members(['blocked_extra', 'agents', 'rbac']);

      const del = await call('DELETE', data('blocked_extra'));
      expect(del.status).to.equal(204);
      expect(await revision()).to.equal(rev0 + 3);
      expectError(await call('GET', data('blocked_extra')), 404);
      expectError(await call('DELETE', data('blocked_extra')), 404);
      expect(await revision()).to.equal(rev0 + 3);
    });

    it('changes decisions live when a document a policy reads is put, replaced and deleted', async () => {
      expect((await put('extra', { rego: EXTRA })).status).to.equal(201);
      expect((await authorize()).status).to.equal(200);

      expect((await call('PUT', data('blocked_extra'), { body: ['repo/arbiter'] })).status).to.equal(201);
      const denied = await authorize();
      expect(denied.status).to.equal(403);
      expect(denied.json.message).to.include('extra block list');

      expect((await call('PUT', data('blocked_extra'), { body: ['repo/elsewhere'] })).status).to.equal(200);
      expect((await authorize()).status).to.equal(200);

      expect((await call('PUT', data('blocked_extra'), { body: ['repo/arbiter'] })).status).to.equal(200);
      expect((await authorize()).status).to.equal(403);
      expect((await call('DELETE', data('blocked_extra'))).status).to.equal(204);
      expect((await authorize()).status).to.equal(200);
    });

    it('audits data changes', async () => {
      const r = await call('PUT', data('blocked_extra'), { body: [] });
      expect(r.status).to.equal(201);
      const [latest] = await auditEvents(a.platform, { kind: 'data.put' });
      const ev = { kind: latest.kind, policy_revision: latest.policy_revision };
      expect(ev).to.deep.equal({ kind: 'data.put', policy_revision: r.json.revision });
    });

    it('accepts a number as a document value', async () => {
      expect(
        (
          await call('PUT', data('scalar-num'), {
            raw: '42',
            headers: { 'content-type': 'application/json' },
          })
        ).status,
      ).to.equal(201);
      expect((await call('GET', data('scalar-num'))).json.value).to.equal(42);
    });

    it('accepts a string as a document value', async () => {
      expect(
        (
          await call('PUT', data('scalar-str'), {
            raw: '"x"',
            headers: { 'content-type': 'application/json' },
          })
        ).status,
      ).to.equal(201);
      expect((await call('GET', data('scalar-str'))).json.value).to.equal('x');
    });

    it('accepts a literal JSON null as a document value', async () => {
      const r = await call('PUT', data('scalar-null'), {
        raw: 'null',
        headers: { 'content-type': 'application/json' },
      });
      expect(r.status).to.equal(201);
      const got = await call('GET', data('scalar-null'));
      expect(got.status).to.equal(200);
      expect(got.json).to.have.property('value', null);
    });

    const refuse = (title: string, send: () => Promise<Response>, status: number, message?: RegExp) =>
      it(title, async () => {
        await expectUnchanged(async () => {
          expectError(await send(), status, message);
        });
      });

    refuse(
      'answers 400 for an empty body (no JSON value at all)',
      () => call('PUT', data('scalar-null'), { raw: '', headers: { 'content-type': 'application/json' } }),
      400,
    );

    it('answers 409 for a document below an existing one, and changes nothing', async () => {
      expect((await call('PUT', data('ovl'), { body: { b: 1 } })).status).to.equal(201);
      await expectUnchanged(async () => {
        expectError(await call('PUT', data('ovl/b'), { body: 2 }), 409, /ovl/);
        expectError(await call('GET', data('ovl/b')), 404);
      });
    });

    it('answers 409 for a document above an existing one, and changes nothing', async () => {
      expect((await call('PUT', data('ovl2/c'), { body: 1 })).status).to.equal(201);
      await expectUnchanged(async () => {
        expectError(await call('PUT', data('ovl2'), { body: { c: 2 } }), 409, /ovl2\/c/);
      });
      expect((await call('DELETE', data('ovl2/c'))).status).to.equal(204);
    });

    refuse('answers 400 for a path under authz', () => call('PUT', data('authz'), { body: 1 }), 400, /authz/);
    refuse(
      'answers 400 for a nested path under authz',
      () => call('PUT', data('authz/agent/x'), { body: 1 }),
      400,
      /authz/,
    );
    for (const [what, p] of [
      ['a dot', 'a.b'],
      ['a space', 'a%20b'],
      ['a dollar sign', 'a$b'],
      ['an empty segment', 'a//b'],
      ['17 segments', Array.from({ length: 17 }, (_, i) => `s${i}`).join('/')],
    ]) {
      refuse(
        `answers 400 for a data path with ${what}`,
        () => call('PUT', data(p as string), { body: 1 }),
        400,
        /path/,
      );
    }
    refuse(
      'answers 400 for malformed JSON',
      () =>
        call('PUT', data('blocked_extra'), { raw: '["a",', headers: { 'content-type': 'application/json' } }),
      400,
      /JSON/,
    );
    refuse(
      'answers 415 for a text/plain data document',
      () => call('PUT', data('blocked_extra'), { raw: '["a"]', headers: { 'content-type': 'text/plain' } }),
      415,
    );
    refuse(
      'answers 413 for a 2 MiB data document',
      () =>
        call('PUT', data('blocked_extra'), {
          raw: bigJsonBody(2 * MiB),
          headers: { 'content-type': 'application/json' },
        }),
      413,
    );
    it('answers 405 with Allow for POST on a data path', async () => {
      const r = await call('POST', data('blocked_extra'), { body: 1 });
      expectError(r, 405);
      expect((r.headers.get('allow') ?? '').split(/,\s*/)).to.include.members(['GET', 'PUT', 'DELETE']);
    });
    refuse('answers 404 for a document that does not exist', () => call('GET', data('nope')), 404);
    refuse(
      'answers 404 when deleting a document that does not exist',
      () => call('DELETE', data('nope')),
      404,
    );
  });

  // `opa eval -d policy.rego -d data.json` refuses such a set: "conflicting rule for data path
  // x/flag found". Arbiter compiles without the data, and the wasm then read the rule through
  // `data.x.flag` and the document through `data.x`: two values for one path.
  describe('a data document where a policy defines a rule', () => {
    const RULE = 'package shadowed\n\nflag := false\n';
    const READS =
      'package authz.agent\n\ndeny contains "shadowed flag is set" if data.shadowed.flag == true\n\ndeny contains "shadowed document says the flag is set" if data.shadowed == {"flag": true}\n';
    const refused = (path: string, policy: string, held: string) =>
      new RegExp(
        `^conflicting rule for data path ${path}: policy ${policy} defines a rule there \\(row 3\\) and the data hold a value at ${held}; OPA refuses such a set: move the document or the rule; nothing changed$`,
      );

    afterEach(async () => {
      for (const name of ['shadowed', 'shadowed-reader']) await remove(name);
      for (const p of ['shadowed', 'shadowed/flag/x', 'shadowed-other']) {
        const r = await call('DELETE', data(p));
        expect(r.status, `cleanup of ${p}: ${r.text}`).to.be.oneOf([204, 404]);
      }
    });

    it('refuses (400) the data document, and changes nothing', async () => {
      expect((await put('shadowed', { rego: RULE })).status).to.equal(201);
      expect((await put('shadowed-reader', { rego: READS })).status).to.equal(201);
      for (const [p, body, held] of [
        ['shadowed', { flag: true }, 'shadowed/flag'],
        ['shadowed', { flag: null }, 'shadowed/flag'],
        ['shadowed', 5, 'shadowed'],
        ['shadowed', ['flag'], 'shadowed'],
        ['shadowed/flag/x', 1, 'shadowed/flag'],
      ] as const) {
        await expectUnchanged(async () => {
          expectError(await call('PUT', data(p), { body }), 400, refused('shadowed/flag', 'shadowed', held));
        });
      }
      // Beside the rule, not on it: OPA merges the two, and so does the compiled policy.
      expect((await call('PUT', data('shadowed'), { body: { other: 1 } })).status).to.equal(201);
      expect((await authorize()).status).to.equal(200);
    });

    it('refuses (400) the policy whose rule lands on a data document, and changes nothing', async () => {
      expect((await call('PUT', data('shadowed'), { body: { flag: true } })).status).to.equal(201);
      await expectUnchanged(async () => {
        expectError(
          await put('shadowed', { rego: RULE }),
          400,
          refused('shadowed/flag', 'shadowed', 'shadowed/flag'),
        );
        expectError(
          await call('POST', a.platform + '/api/v1/bundle', { body: { policies: { shadowed: RULE } } }),
          400,
          refused('shadowed/flag', 'shadowed', 'shadowed/flag'),
        );
      });
    });

    it('refuses (400) a data change that lands on a rule only the shadow set defines, and changes nothing', async () => {
      const shadow = policy('shadowed') + '?mode=shadow';
      expect((await call('PUT', shadow, { body: { rego: RULE } })).status).to.equal(201);
      try {
        await expectUnchanged(async () => {
          const shadowed = refused('shadowed/flag', 'shadowed', 'shadowed/flag');
          const asShadow = new RegExp(shadowed.source.replace('policy shadowed', 'shadow policy shadowed'));
          expectError(await call('PUT', data('shadowed'), { body: { flag: true } }), 400, asShadow);
          expectError(
            await call('POST', a.platform + '/api/v1/bundle', {
              body: { policies: {}, data: { shadowed: { flag: true } } },
            }),
            400,
            asShadow,
          );
        });
        const report = await call('GET', a.platform + '/api/v1/shadow');
        expect(report.json.policies.map((p: { name: string }) => p.name)).to.deep.equal(['shadowed']);
      } finally {
        const dropped = await call('DELETE', shadow);
        expect(dropped.status, dropped.text).to.equal(204);
      }
    });
  });

  // OPA reads every JSON number exactly (9007199254740993 is not 9007199254740992, 1e-400 is not
  // 0) and the compiled policy compares its literals exactly too; JSON.parse rounds to a double.
  describe('numbers that would reach the policy as another number', () => {
    const json = (raw: string) => ({ raw, headers: { 'content-type': 'application/json' } });
    const BLOCKED =
      'package authz.agent\n\ndeny contains "account 9007199254740993 is blocked" if input.context.account == 9007199254740993\n';
    const withAccount = (account: string) =>
      JSON.stringify({ ...AGENT.allow, context: { account: 0 } }).replace(
        '"account":0',
        `"account":${account}`,
      );

    afterEach(async () => {
      await remove('blocked-account');
      for (const p of ['exact-nums', 'inexact-nums']) {
        const r = await call('DELETE', data(p));
        expect(r.status, `cleanup of ${p}: ${r.text}`).to.be.oneOf([204, 404]);
      }
    });

    it('refuses (400) an authorize request carrying one, instead of deciding on a rounded number (it was allowed past a deny rule on it)', async () => {
      expect((await put('blocked-account', { rego: BLOCKED })).status).to.equal(201);
      const engine = a.engine + '/v1/agent/authorize';
      // opa eval: 9007199254740992 is not the blocked account (allow), 9007199254740993 is (deny).
      expect((await call('POST', engine, json(withAccount('9007199254740992')))).status).to.equal(200);
      expectError(
        await call('POST', engine, json(withAccount('9007199254740993'))),
        400,
        'context.account holds the number 9007199254740993, which would reach the policy as ' +
          '9007199254740992 (numbers are read as doubles): send it as a string',
      );
      // A confidence above 1.0 that rounds to 1 is out of range, not a confidence of 1.
      expectError(
        await call('POST', engine, json(withAccount('1').replace('0.95', '1.0000000000000000001'))),
        400,
        'confidence out of range: must be between 0.0 and 1.0, got 1.0000000000000000001',
      );
    });

    it('refuses (400) a data document holding one, and changes nothing', async () => {
      for (const [raw, at] of [
        ['{"users":[1,9007199254740993]}', 'users.1'],
        ['{"a":{"b":12345678901234567890123}}', 'a.b'],
        ['{"floor":1e-400}', 'floor'],
        ['[0.1000000000000000000001]', '0'],
        ['18446744073709551615', 'request body'],
        // An exact double (2^60), but passed on as 1152921504606847000: another number to OPA.
        ['{"id":1152921504606846976}', 'id'],
      ] as const) {
        await expectUnchanged(async () => {
          expectError(
            await call('PUT', data('inexact-nums'), json(raw)),
            400,
            new RegExp(`^${at.replace('.', '\\.')} holds the number .*, which would reach the policy as `),
          );
        });
      }
      expectError(await call('GET', data('inexact-nums')), 404);
    });

    it('accepts the numbers that come back as written, however they are written', async () => {
      const raw =
        '{"n":[0.1,1.0,1E5,-2.50,9007199254740992,1e300,0.30000000000000004,5e-324,123456789012345.6,' +
        '1.7976931348623157e308,100000000000000000000000,"9007199254740993 in a string",-1.5e-7]}';
      expect((await call('PUT', data('exact-nums'), json(raw))).status).to.equal(201);
      expect((await call('GET', data('exact-nums'))).json.value).to.deep.equal(JSON.parse(raw));
    });
  });
  it('refuses a change after which the set meets a conflict on recent decisions that the live set decides', async () => {
    // Every read now gives `x` two values: an evaluation error, so a deny, on every read.
    const conflicting =
      'package authz.agent\n\nx := 1 if input.action == "read"\n\nx := 2 if input.confidence > 0.1\n\ndeny contains "never" if x == 3\n';
    expect((await authorize(AGENT.allow)).status).to.equal(200);
    const refused =
      /^the new policy set meets a conflict on recorded decision [0-9a-f-]{36}, which the live set decides: policy evaluation failed: .*conflict.*; every decision like it would be a deny with an evaluation error; nothing changed$/;
    await expectUnchanged(async () => {
      expectError(await put('conflicting', { rego: conflicting }), 400, refused);
      const bundle = await call('POST', a.platform + '/api/v1/bundle', {
        body: { policies: { conflicting } },
      });
      expectError(bundle, 400, refused);
    });
    // The same module on deploys only never meets a recorded read: it goes live.
    const onDeploys = conflicting.replace('input.action == "read"', 'input.action == "deploy-nothing"');
    expect((await put('conflicting', { rego: onDeploys })).status).to.equal(201);
    await remove('conflicting');
  });

  it('refuses a change after which the set would not finish evaluating recent decisions (it would stall the engine)', async () => {
    const refused =
      /^the new policy set did not finish evaluating recorded decision [0-9a-f-]{36} \(evaluation timed out: no answer within \d+ ms\): decisions like it would stall the engine; nothing changed$/;
    // A read decision is among the recent ones (SPIN never finishes on a read with 3 000 items).
    expect((await authorize(AGENT.allow)).status).to.equal(200);
    expect((await call('PUT', data('spin'), { body: { items: SPIN_ITEMS } })).status).to.equal(201);
    try {
      await expectUnchanged(async () => {
        expectError(await put('spin', { rego: SPIN }), 400, refused);
        const dry = await call('PUT', policy('spin') + '?dry_run=true', { body: { rego: SPIN } });
        expectError(dry, 400, refused);
        const bundle = await call('POST', a.platform + '/api/v1/bundle', {
          body: { policies: { spin: SPIN } },
        });
        expectError(bundle, 400, refused);
      });
      // Live with 3 items it finishes; the data change to 3 000 would not.
      expect((await call('PUT', data('spin'), { body: { items: [1, 2, 3] } })).status).to.equal(200);
      expect((await put('spin', { rego: SPIN })).status).to.equal(201);
      expect((await authorize(AGENT.allow)).status).to.equal(200);
      await expectUnchanged(async () => {
        expectError(await call('PUT', data('spin'), { body: { items: SPIN_ITEMS } }), 400, refused);
      });
    } finally {
      await call('DELETE', policy('spin'));
      await call('DELETE', data('spin'));
    }
  });
});

// The built-in module's reading of user rules: in a set of its own, since `deny := …` cannot sit
// beside the example policies' `deny contains …` in one package.
onEveryBackend('a deny, require_approval or limits rule that is one value, not a set', () => {
  let a: Arbiter;
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'arbiter-scalar-'));
    // The type checker refuses `deny := "x"`, but cannot see that data.freeze.message is a string.
    writeFileSync(
      join(dir, 'freeze.rego'),
      [
        'package authz.agent',
        '',
        'allow if input.agent_id == "deploy-bot"',
        '',
        'deny := data.freeze.message if data.freeze.active == true',
        '',
        'require_approval := data.review.message if input.action == "deploy"',
        '',
        'limits := data.budget if input.action == "spend"',
        '',
      ].join('\n'),
    );
    writeFileSync(
      join(dir, 'data.json'),
      JSON.stringify({
        freeze: { active: true, message: 'change freeze until Monday' },
        review: { message: 'deploys need a human' },
        budget: 'ten per hour',
      }),
    );
    a = await Arbiter.start({ ARBITER_POLICY_DIR: dir });
  });
  after(async () => {
    await a?.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const authorize = (body: unknown) => call('POST', a.engine + '/v1/agent/authorize', { body });

  it('is one reason or one limit: a defined rule never vanishes (it used to answer allow)', async () => {
    const denied = await authorize(AGENT.allow);
    expect(denied.status, denied.text).to.equal(403);
    expect(denied.json).to.deep.include({ status: 'deny', message: 'change freeze until Monday' });
    const r = await call('PUT', `${a.platform}/api/v1/data/freeze`, { body: { active: false } });
    expect(r.status, r.text).to.equal(200);
    expect((await authorize(AGENT.allow)).status).to.equal(200);
    const review = await authorize(AGENT.approval);
    expect(review.status, review.text).to.equal(202);
    expect(review.json.message).to.equal('deploys need a human');
    // A budget that is not a list of limits is refused as malformed, never left unenforced.
    const spend = await authorize({ ...AGENT.allow, action: 'spend' });
    expect(spend.status, spend.text).to.equal(403);
  });
});
