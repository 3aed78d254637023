import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { onEveryBackend } from './helpers/backends.js';
import { bigJsonBody, expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, auditEvents, call, type RequestOptions } from './helpers/harness.js';

const MiB = 1024 * 1024;

const DENY_READ = 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n';
const DENY_READ_V2 = 'package authz.agent\n\ndeny contains "reads are off (v2)" if input.action == "read"\n';
const HARMLESS = 'package authz.agent\n\nunused_marker := true\n';
const BROKEN = 'package authz.agent\n\ndeny contains "x" if {\n  input.action ==\n}\n';

// Bundles, history and restore are stored changes: every backend.
onEveryBackend('Platform API: bundles, history and restore (real compiler, real storage)', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const bundle = (body: unknown, opts: RequestOptions = {}, query = '') =>
    call('POST', `${a.platform}/api/v1/bundle${query}`, { body, ...opts });
  const authorize = (body: unknown = AGENT.allow) => call('POST', a.engine + '/v1/agent/authorize', { body });

  /** Everything a refused change must leave as it was: revision, policies (with text), data, decisions. */
  const observable = async () => {
    const list = await call('GET', a.platform + '/api/v1/policies');
    const texts: Record<string, string> = {};
    for (const p of list.json.policies as { name: string }[]) {
      texts[p.name] = (await call('GET', `${a.platform}/api/v1/policies/${p.name}`)).json.rego as string;
    }
    const docs = await call('GET', a.platform + '/api/v1/data');
    const allow = await authorize(AGENT.allow);
    const revisions = await call('GET', a.platform + '/api/v1/revisions?limit=1');
    return {
      revision: list.json.revision as number,
      policies: list.json.policies,
      texts,
      data: docs.json.documents,
      decision: [allow.status, allow.json.status, allow.json.message],
      newest: revisions.json.revisions[0],
    };
  };
  const expectUnchanged = async (fn: () => Promise<void>) => {
    const before = await observable();
    await fn();
    expect(await observable()).to.deep.equal(before);
  };
  const revision = async () => (await observable()).revision;

  describe('POST /api/v1/bundle', () => {
    it('applies creates, updates, data and deletions as ONE revision, live before the answer', async () => {
      const r0 = await revision();
      const first = await bundle({ policies: { 'b-one': HARMLESS, 'b-two': HARMLESS }, message: 'first' });
      expect(first.status, first.text).to.equal(200);
      expect(first.json).to.deep.equal({
        revision: r0 + 1,
        created: ['b-one', 'b-two'],
        updated: [],
        deleted: [],
        unchanged: [],
        data: { created: [], updated: [], deleted: [], unchanged: [] },
        dry_run: false,
      });
      expect(first.headers.get('etag')).to.equal(`"rev-${r0 + 1}"`);
      expect((await authorize()).json.status).to.equal('allow');

      const second = await bundle({
        policies: { 'b-one': DENY_READ, 'b-two': HARMLESS, 'b-three': HARMLESS },
        data: { b_flags: { on: true } },
        delete: [],
        message: 'second',
      });
      expect(second.status, second.text).to.equal(200);
      expect(second.json).to.deep.include({
        revision: r0 + 2,
        created: ['b-three'],
        updated: ['b-one'],
        deleted: [],
        unchanged: ['b-two'],
        data: { created: ['b_flags'], updated: [], deleted: [], unchanged: [] },
      });
      const denied = await authorize();
      expect(denied.json.status).to.equal('deny');
      expect(denied.json.message).to.contain('reads are off');
      expect((await call('GET', `${a.platform}/api/v1/data/b_flags`)).json.value).to.deep.equal({ on: true });

      const third = await bundle({
        policies: {},
        data: { b_flags: null },
        delete: ['b-one', 'b-two', 'b-three'],
        message: 'third',
      });
      expect(third.status, third.text).to.equal(200);
      expect(third.json).to.deep.include({
        revision: r0 + 3,
        deleted: ['b-one', 'b-three', 'b-two'],
        data: { created: [], updated: [], deleted: ['b_flags'], unchanged: [] },
      });
      expect((await authorize()).json.status).to.equal('allow');
      expectError(await call('GET', `${a.platform}/api/v1/data/b_flags`), 404);

      const revs = await call('GET', `${a.platform}/api/v1/revisions?limit=3`);
      expect(revs.status).to.equal(200);
      expect(revs.json.revisions.map((r: { message: string }) => r.message)).to.deep.equal([
        'third',
        'second',
        'first',
      ]);
      expect(revs.json.revisions[1].changes).to.have.deep.members([
        { kind: 'policy', name: 'b-one', op: 'put' },
        { kind: 'policy', name: 'b-three', op: 'put' },
        { kind: 'data', name: 'b_flags', op: 'put' },
      ]);
      const events = await auditEvents(a.platform, { kind: 'policy.bundle' });
      expect(events.map((e) => e.policy_revision)).to.include.members([r0 + 1, r0 + 2, r0 + 3]);
    });

    it('changes nothing and makes no revision when everything is unchanged', async () => {
      await bundle({ policies: { 'b-same': HARMLESS } });
      await expectUnchanged(async () => {
        const r = await bundle({ policies: { 'b-same': HARMLESS } });
        expect(r.status).to.equal(200);
        expect(r.json).to.deep.include({ created: [], updated: [], unchanged: ['b-same'] });
      });
      await bundle({ policies: {}, delete: ['b-same'] });
    });

    it('reports the data documents it names under data (created, updated, deleted, unchanged), dry runs too', async () => {
      const r0 = await revision();
      const made = await bundle({ policies: {}, data: { 'bd/one': 1, 'bd/two': 2, 'bd/three': 3 } });
      expect(made.status, made.text).to.equal(200);
      expect(made.json).to.deep.equal({
        revision: r0 + 1,
        created: [],
        updated: [],
        deleted: [],
        unchanged: [],
        data: { created: ['bd/one', 'bd/three', 'bd/two'], updated: [], deleted: [], unchanged: [] },
        dry_run: false,
      });

      const change = { policies: {}, data: { 'bd/one': null, 'bd/two': 22, 'bd/three': 3, 'bd/four': 4 } };
      const data = {
        created: ['bd/four'],
        updated: ['bd/two'],
        deleted: ['bd/one'],
        unchanged: ['bd/three'],
      };
      await expectUnchanged(async () => {
        const dry = await bundle(change, {}, '?dry_run=true');
        expect(dry.status, dry.text).to.equal(200);
        expect(dry.json).to.deep.include({ revision: r0 + 1, unchanged: [], data, dry_run: true });
      });
      const applied = await bundle(change);
      expect(applied.status, applied.text).to.equal(200);
      expect(applied.json).to.deep.include({ revision: r0 + 2, unchanged: [], data, dry_run: false });
      // The answer names what the revision records.
      const [newest] = (await call('GET', `${a.platform}/api/v1/revisions?limit=1`)).json.revisions;
      expect(newest).to.deep.include({ revision: r0 + 2 });
      expect(newest.changes).to.have.deep.members([
        { kind: 'data', name: 'bd/four', op: 'put' },
        { kind: 'data', name: 'bd/two', op: 'put' },
        { kind: 'data', name: 'bd/one', op: 'delete' },
      ]);

      // Nothing to change: no revision, and each document named is listed as unchanged.
      await expectUnchanged(async () => {
        const same = await bundle({ policies: {}, data: { 'bd/two': 22, 'bd/three': 3 } });
        expect(same.status, same.text).to.equal(200);
        expect(same.json).to.deep.include({
          revision: r0 + 2,
          data: { created: [], updated: [], deleted: [], unchanged: ['bd/three', 'bd/two'] },
        });
      });
      await bundle({ policies: {}, data: { 'bd/two': null, 'bd/three': null, 'bd/four': null } });
    });

    it('prune: true deletes every live policy the bundle does not name', async () => {
      const live = (await call('GET', a.platform + '/api/v1/policies')).json.policies as { name: string }[];
      const keep = Object.fromEntries(
        await Promise.all(
          live.map(async (p) => [
            p.name,
            (await call('GET', `${a.platform}/api/v1/policies/${p.name}`)).json.rego as string,
          ]),
        ),
      );
      await bundle({ policies: { 'b-extra1': HARMLESS, 'b-extra2': HARMLESS } });
      const r = await bundle({ policies: keep, prune: true });
      expect(r.status, r.text).to.equal(200);
      expect(r.json.deleted).to.deep.equal(['b-extra1', 'b-extra2']);
      expect(r.json.unchanged).to.have.members(Object.keys(keep));
      const names = (await call('GET', a.platform + '/api/v1/policies')).json.policies.map(
        (p: { name: string }) => p.name,
      );
      expect(names).to.have.members(Object.keys(keep));
    });

    it('prunes and deletes a policy named like an Object.prototype member (constructor)', async () => {
      expect((await bundle({ policies: { constructor: HARMLESS } })).status).to.equal(200);
      const del = await bundle({ policies: {}, delete: ['constructor'] });
      expect(del.status, del.text).to.equal(200);
      expect(del.json.deleted).to.deep.equal(['constructor']);
      expect((await bundle({ policies: { constructor: HARMLESS } })).status).to.equal(200);
      const live = (await call('GET', a.platform + '/api/v1/policies')).json.policies as { name: string }[];
      const keep = Object.fromEntries(
        await Promise.all(
          live
            .filter((p) => p.name !== 'constructor')
            .map(async (p) => [
              p.name,
              (await call('GET', `${a.platform}/api/v1/policies/${p.name}`)).json.rego as string,
            ]),
        ),
      );
      const pruned = await bundle({ policies: keep, prune: true });
      expect(pruned.status, pruned.text).to.equal(200);
      expect(pruned.json.deleted).to.deep.equal(['constructor']);
    });

    it('refuses data documents that overlap however their paths sort ("roles", "roles-x", "roles/admins")', async () => {
      expect(
        (await call('PUT', `${a.platform}/api/v1/data/ovl`, { body: { admins: ['alice'] } })).status,
      ).to.be.oneOf([200, 201]);
      await expectUnchanged(async () => {
        const r = await bundle({ policies: {}, data: { 'ovl-x': 1, 'ovl/admins': ['mallory'] } });
        expectError(r, 409, /ovl\/admins overlaps data document ovl\b/);
      });
      await call('DELETE', `${a.platform}/api/v1/data/ovl`);
    });

    it('records what went live by content: sha256 of each put policy and data document in the audit event', async () => {
      const r = await bundle({ policies: { 'b-hashed': HARMLESS }, data: { 'hashed/doc': { v: 1 } } });
      expect(r.status, r.text).to.equal(200);
      const events = (await auditEvents(a.platform, { kind: 'policy.bundle' })) as {
        details: Record<string, Record<string, string>>;
      }[];
      const ev = events.find((e) => e.details.sha256?.['b-hashed'] !== undefined);
      if (!ev) throw new Error('no policy.bundle event names b-hashed');
      const sha = createHash('sha256').update(HARMLESS).digest('hex');
      expect(ev.details.sha256).to.deep.equal({ 'b-hashed': sha });
      expect(Object.keys(ev.details.data_sha256 ?? {})).to.deep.equal(['hashed/doc']);
      await bundle({ policies: {}, delete: ['b-hashed'], data: { 'hashed/doc': null } });
    });

    it('?dry_run=true compiles and reports, and stores nothing', async () => {
      await expectUnchanged(async () => {
        const r = await bundle({ policies: { 'b-dry': DENY_READ } }, {}, '?dry_run=true');
        expect(r.status, r.text).to.equal(200);
        expect(r.json).to.deep.include({ created: ['b-dry'], dry_run: true });
        expect(r.headers.get('etag')).to.equal(null);
      });
      await expectUnchanged(async () => {
        expectError(
          await bundle({ policies: { 'b-dry': BROKEN } }, {}, '?dry_run=true'),
          400,
          /policy b-dry:5:1: rego_parse_error/,
        );
      });
    });

    it('If-Match "rev-N" applies only on revision N: 412 otherwise, 400 when malformed', async () => {
      const n = await revision();
      await expectUnchanged(async () => {
        const stale = await bundle(
          { policies: { 'b-cond': HARMLESS } },
          { headers: { 'if-match': `"rev-${n - 1}"` } },
        );
        expectError(stale, 412, new RegExp(`revision ${n - 1}.*live revision is ${n}`));
        expectError(
          await bundle({ policies: { 'b-cond': HARMLESS } }, { headers: { 'if-match': 'rev-x' } }),
          400,
          /If-Match/,
        );
      });
      const ok = await bundle(
        { policies: { 'b-cond': HARMLESS } },
        { headers: { 'if-match': `"rev-${n}"` } },
      );
      expect(ok.status, ok.text).to.equal(200);
      expect(ok.json.revision).to.equal(n + 1);
      await bundle({ policies: {}, delete: ['b-cond'] });
    });

    it('refuses a bundle with a module that does not compile: 400 naming policy, row and column; nothing changes', async () => {
      await expectUnchanged(async () => {
        const r = await bundle({ policies: { 'b-good': DENY_READ, 'b-broken': BROKEN }, data: { b_x: 1 } });
        expectError(r, 400, /policy b-broken:5:1: rego_parse_error: unexpected } token/);
      });
    });

    it('refuses a rule of the wrong shape for the decision module with 400 naming its policy and row, not the built-in module; nothing changes', async () => {
      await expectUnchanged(async () => {
        const r = await bundle({
          policies: {
            agent: 'package authz.agent\n\nthresholds := 5\n',
            delegation: 'package authz.human\n\nlimits := "none"\n',
          },
        });
        expectError(r, 400, /^policy set does not compile: /);
        const text = r.json.error as string;
        expect(text).to.contain(
          'policy agent:3:1: rego_type_error: thresholds must be an object of action -> {"deny_below": x, "approval_below": y}',
        );
        expect(text).to.contain('policy delegation:3:1: rego_type_error: limits must be a set of limits');
        // Where OPA met it stays in the message, but no problem is located in the built-in module.
        expect(text).not.to.match(/(^|; )builtin\/authz\.rego:\d+:\d+:/);
      });
    });

    it('refuses a bundle whose whole set breaks (a deletion another module needs)', async () => {
      const uses = 'package authz.agent\n\ndeny contains "h" if helper_fn(1) == 2\n';
      const helper = 'package authz.agent\n\nhelper_fn(x) := x\n';
      const made = await bundle({ policies: { 'b-helper': helper, 'b-user': uses } });
      expect(made.status, made.text).to.equal(200);
      await expectUnchanged(async () => {
        const r = await bundle({ policies: {}, delete: ['b-helper'] });
        expectError(r, 400, /b-user/);
      });
      await bundle({ policies: {}, delete: ['b-helper', 'b-user'] });
    });

    it('answers 404 for an unknown policy or data document to delete; nothing changes', async () => {
      await expectUnchanged(async () => {
        expectError(
          await bundle({ policies: { 'b-new': HARMLESS }, delete: ['no-such-policy'] }),
          404,
          /no-such-policy/,
        );
        expectError(
          await bundle({ policies: { 'b-new': HARMLESS }, data: { no_such_doc: null } }),
          404,
          /no_such_doc/,
        );
      });
    });

    it('refuses reserved and invalid names as a PUT does; nothing changes', async () => {
      await expectUnchanged(async () => {
        expectError(await bundle({ policies: { authz: HARMLESS } }), 400, /authz is reserved/);
        expectError(await bundle({ policies: {}, delete: ['authz'] }), 400, /authz is reserved/);
        expectError(await bundle({ policies: { 'Bad Name': HARMLESS } }), 400, /invalid policy name/);
        expectError(await bundle({ policies: { 'b-ok': HARMLESS }, data: { authz: 1 } }), 400, /reserved/);
        expectError(await bundle({ policies: { 'b-ok': 'package authz\n\nx := 1\n' } }), 400, /reserved/);
        expectError(
          await bundle({ policies: { 'b-ok': HARMLESS }, delete: ['b-ok'] }),
          400,
          /both put and deleted/,
        );
        expectError(await bundle({ policies: { 'b-ok': '   ' } }), 400, /empty/);
      });
    });

    it('answers 400 for malformed JSON, wrong types, missing and unknown fields; nothing changes', async () => {
      await expectUnchanged(async () => {
        expectError(
          await bundle(undefined, { raw: '{"policies": ', headers: { 'content-type': 'application/json' } }),
          400,
          /malformed JSON/,
        );
        expectError(await bundle({}), 400, /policies/);
        expectError(await bundle({ policies: { 'b-t': 42 } }), 400, /b-t/);
        expectError(await bundle({ policies: [] }), 400, /policies/);
        expectError(await bundle({ policies: {}, delete: 'b-t' }), 400, /delete/);
        expectError(await bundle({ policies: {}, prune: 'yes' }), 400, /prune/);
        expectError(await bundle({ policies: {}, extra: 1 }), 400, /extra/);
        expectError(await bundle({ policies: {} }, {}, '?dry_run=maybe'), 400, /dry_run/);
        expectError(await bundle([1]), 400);
        expectError(
          await bundle(undefined, { raw: 'package x', headers: { 'content-type': 'text/plain' } }),
          415,
        );
        expectError(await bundle({ policies: {} }, { headers: { 'if-match': '*' } }), 400, /If-Match/);
      });
    });

    it('answers 413 for a body over the limit; nothing changes', async () => {
      await expectUnchanged(async () => {
        const r = await bundle(undefined, {
          raw: bigJsonBody(2 * MiB),
          headers: { 'content-type': 'application/json' },
        });
        expectError(r, 413);
      });
    });

    it('needs policies:write', async () => {
      const reader = a.createKey('bundle-reader', ['policies:read']);
      await expectUnchanged(async () => {
        expectError(await bundle({ policies: { 'b-k': HARMLESS } }, { key: reader }), 403, /policies:write/);
        expectError(await bundle({ policies: { 'b-k': HARMLESS } }, { key: null }), 401);
      });
    });
  });

  describe('history: revisions and policy versions', () => {
    it("shows a revision's whole set: policies by sha256, data by path", async () => {
      const r = await bundle({ policies: { 'h-one': HARMLESS }, data: { h_doc: [1, 2] }, message: 'hist' });
      const n = r.json.revision as number;
      const got = await call('GET', `${a.platform}/api/v1/revisions/${n}`);
      expect(got.status, got.text).to.equal(200);
      expect(got.json).to.have.keys('revision', 'time', 'actor', 'message', 'policies', 'data');
      expect(got.json).to.deep.include({ revision: n, message: 'hist', actor: 'admin' });
      const live = (await call('GET', a.platform + '/api/v1/policies')).json.policies;
      expect(got.json.policies).to.deep.equal(
        live.map((p: { name: string; sha256: string }) => ({ name: p.name, sha256: p.sha256 })),
      );
      expect(got.json.data.h_doc).to.deep.equal([1, 2]);
      expect(got.json.data.agents).to.be.an('object');
      await bundle({ policies: {}, delete: ['h-one'], data: { h_doc: null } });
    });

    it('pages revisions newest first with next_cursor', async () => {
      const first = await call('GET', `${a.platform}/api/v1/revisions?limit=2`);
      expect(first.json.revisions).to.have.length(2);
      expect(first.json.next_cursor).to.be.a('string');
      const second = await call(
        'GET',
        `${a.platform}/api/v1/revisions?limit=2&cursor=${first.json.next_cursor}`,
      );
      expect(second.json.revisions[0].revision).to.equal(first.json.revisions[1].revision - 1);
      expectError(await call('GET', `${a.platform}/api/v1/revisions?cursor=garbage!`), 400, /cursor/);
      expectError(await call('GET', `${a.platform}/api/v1/revisions?limit=0`), 400, /limit/);
    });

    it('lists revisions from their summaries, never reading the manifests of their sets', async () => {
      // Each revision stores the name → sha256 manifest of its whole set (a few hundred KB for a
      // few thousand policies): a list that read and parsed them held the serving thread for
      // seconds. Made unreadable here, they must not matter to the list, only to the one revision.
      const r = await bundle({ policies: { 'm-one': HARMLESS }, data: { m_doc: 1 }, message: 'manifests' });
      const n = r.json.revision as number;
      const [saved] = await a.stored<{ policies: string; data: string }>(
        'SELECT policies, data FROM revisions WHERE revision = $1',
        [n],
      );
      await a.alter('UPDATE revisions SET policies = $1, data = $2 WHERE revision = $3', [
        '{not json',
        '{not json',
        n,
      ]);
      try {
        const list = await call('GET', `${a.platform}/api/v1/revisions?limit=2`);
        expect(list.status, list.text).to.equal(200);
        expect(list.json.revisions[0]).to.deep.include({ revision: n, message: 'manifests', actor: 'admin' });
        expect(list.json.revisions[0]).to.have.keys('revision', 'time', 'actor', 'message', 'changes');
        expect(list.json.revisions[0].changes).to.have.deep.members([
          { kind: 'policy', name: 'm-one', op: 'put' },
          { kind: 'data', name: 'm_doc', op: 'put' },
        ]);
        // The one revision does read them (which is what shows the list did not): SPEC §3's 500,
        // {"error"} with no internals (no parser message, no stack, no SQL).
        expectError(await call('GET', `${a.platform}/api/v1/revisions/${n}`), 500, 'internal error');
      } finally {
        await a.alter('UPDATE revisions SET policies = $1, data = $2 WHERE revision = $3', [
          saved!.policies,
          saved!.data,
          n,
        ]);
      }
      expect((await call('GET', `${a.platform}/api/v1/revisions/${n}`)).status).to.equal(200);
      await bundle({ policies: {}, delete: ['m-one'], data: { m_doc: null } });
    });

    it('lists the versions of a policy, with deletions, and each version with its text', async () => {
      await bundle({ policies: { 'v-pol': DENY_READ } });
      await bundle({ policies: { 'v-pol': DENY_READ_V2 } });
      await bundle({ policies: {}, delete: ['v-pol'] });
      const r = await call('GET', `${a.platform}/api/v1/policies/v-pol/versions`);
      expect(r.status, r.text).to.equal(200);
      expect(r.json.next_cursor).to.equal(null);
      const vs = r.json.versions as { version: number; deleted: boolean; sha256: string }[];
      expect(vs.map((v) => [v.version, v.deleted])).to.deep.equal([
        [3, true],
        [2, false],
        [1, false],
      ]);
      for (const v of vs) expect(v).to.have.keys('version', 'revision', 'sha256', 'time', 'actor', 'deleted');
      const v1 = await call('GET', `${a.platform}/api/v1/policies/v-pol/versions/1`);
      expect(v1.status).to.equal(200);
      expect(v1.json.rego).to.equal(DENY_READ);
      expect((await call('GET', `${a.platform}/api/v1/policies/v-pol/versions/2`)).json.rego).to.equal(
        DENY_READ_V2,
      );
      const paged = await call('GET', `${a.platform}/api/v1/policies/v-pol/versions?limit=1`);
      expect(paged.json.versions[0].version).to.equal(3);
      const next = await call(
        'GET',
        `${a.platform}/api/v1/policies/v-pol/versions?limit=1&cursor=${paged.json.next_cursor}`,
      );
      expect(next.json.versions[0].version).to.equal(2);
    });

    it('stores an unchanged module once (content-addressed)', async () => {
      const text = 'package authz.agent\n\ncontent_marker := "stored-once"\n';
      const other = 'package authz.agent\n\ncontent_marker_2 := "stored-once"\n';
      const before = await a.count('policy_blobs');
      await bundle({ policies: { 'c-one': text } });
      expect(await a.count('policy_blobs')).to.equal(before + 1);
      await bundle({ policies: { 'c-two': text, 'c-three': text } });
      await call('PUT', `${a.platform}/api/v1/policies/c-one`, { body: { rego: other } });
      await call('PUT', `${a.platform}/api/v1/policies/c-one`, { body: { rego: text } });
      expect(await a.count('policy_blobs')).to.equal(before + 2);
      expect(await a.count('policy_versions', 'name = $1', ['c-one'])).to.equal(3);
      await bundle({ policies: {}, delete: ['c-one', 'c-two', 'c-three'] });
    });

    it('answers 404 for unknown revisions, policies and versions, 400 for malformed numbers', async () => {
      expectError(await call('GET', `${a.platform}/api/v1/revisions/999999`), 404, /revision 999999/);
      expectError(
        await call('GET', `${a.platform}/api/v1/policies/never-existed/versions`),
        404,
        /never-existed/,
      );
      expectError(await call('GET', `${a.platform}/api/v1/policies/v-pol/versions/99`), 404, /version 99/);
      expectError(await call('GET', `${a.platform}/api/v1/revisions/abc`), 400, /path parameter n/);
      expectError(await call('GET', `${a.platform}/api/v1/revisions/0`), 400, /path parameter n/);
      expectError(await call('GET', `${a.platform}/api/v1/policies/v-pol/versions/-1`), 400, /version/);
      expectError(await call('GET', `${a.platform}/api/v1/policies/authz/versions`), 400, /reserved/);
    });
  });

  describe('POST /api/v1/revisions/{n}/restore', () => {
    it('makes an earlier set live again as a new, audited revision', async () => {
      const base = await bundle({ policies: { 'r-pol': HARMLESS }, data: { r_doc: 'old' } });
      const n = base.json.revision as number;
      await bundle({
        policies: { 'r-pol': DENY_READ, 'r-extra': HARMLESS },
        data: { r_doc: 'new', r_more: 1 },
      });
      expect((await authorize()).json.status).to.equal('deny');

      const r = await call('POST', `${a.platform}/api/v1/revisions/${n}/restore`);
      expect(r.status, r.text).to.equal(200);
      expect(r.json).to.deep.equal({ revision: n + 2 });
      expect((await authorize()).json.status).to.equal('allow');
      const restored = await call('GET', `${a.platform}/api/v1/revisions/${n + 2}`);
      const original = await call('GET', `${a.platform}/api/v1/revisions/${n}`);
      expect(restored.json.policies).to.deep.equal(original.json.policies);
      expect(restored.json.data).to.deep.equal(original.json.data);
      expect(restored.json.message).to.equal(`restore of revision ${n}`);
      expect((await call('GET', `${a.platform}/api/v1/policies/r-pol`)).json.rego).to.equal(HARMLESS);
      const events = await auditEvents(a.platform, { kind: 'policy.restore' });
      expect(events[0]).to.deep.include({ policy_revision: n + 2, actor: 'admin', outcome: 'success' });
      expect(events[0].details.restored_revision).to.equal(n);
      await bundle({ policies: {}, delete: ['r-pol'], data: { r_doc: null } });
    });

    it("brings back each policy's description as it was at that revision; 409 only when that too is live", async () => {
      const put = (description: string) =>
        call('PUT', `${a.platform}/api/v1/policies/r-desc`, { body: { rego: HARMLESS, description } });
      const description = async () =>
        (await call('GET', `${a.platform}/api/v1/policies/r-desc`)).json.description as string;
      const first = await put('first desc');
      expect(first.status, first.text).to.equal(201);
      const n = first.json.revision as number;
      expect((await put('second desc')).json.revision).to.equal(n + 1);

      // The same module and data, another description: not the set of revision n.
      const back = await call('POST', `${a.platform}/api/v1/revisions/${n}/restore`);
      expect(back.status, back.text).to.equal(200);
      expect(back.json).to.deep.equal({ revision: n + 2 });
      expect(await description()).to.equal('first desc');
      const [newest] = (await call('GET', `${a.platform}/api/v1/revisions?limit=1`)).json.revisions;
      expect(newest.changes).to.deep.equal([{ kind: 'policy', name: 'r-desc', op: 'put' }]);
      await expectUnchanged(async () => {
        expectError(await call('POST', `${a.platform}/api/v1/revisions/${n}/restore`), 409, /already live/);
      });

      // After an unrelated change too: the description comes back with the rest of the set.
      expect((await call('PUT', `${a.platform}/api/v1/data/r_unrelated`, { body: 1 })).status).to.equal(201);
      const again = await call('POST', `${a.platform}/api/v1/revisions/${n + 1}/restore`);
      expect(again.status, again.text).to.equal(200);
      expect(await description()).to.equal('second desc');
      expectError(await call('GET', `${a.platform}/api/v1/data/r_unrelated`), 404);
      await bundle({ policies: {}, delete: ['r-desc'] });
    });

    it("answers 409 when the revision's set is already live, 404 when unknown; nothing changes", async () => {
      const n = await revision();
      await expectUnchanged(async () => {
        expectError(await call('POST', `${a.platform}/api/v1/revisions/${n}/restore`), 409, /already live/);
        expectError(await call('POST', `${a.platform}/api/v1/revisions/999999/restore`), 404, /999999/);
        expectError(await call('POST', `${a.platform}/api/v1/revisions/x/restore`), 400, /path parameter n/);
      });
    });

    it('needs policies:write', async () => {
      const reader = a.createKey('restore-reader', ['policies:read']);
      await expectUnchanged(async () => {
        expectError(
          await call('POST', `${a.platform}/api/v1/revisions/1/restore`, { key: reader }),
          403,
          /policies:write/,
        );
      });
    });
  });
});
