import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { ADMIN_KEY, AGENT, Arbiter, call, REPO } from './helpers/harness.js';
import { baseEnv, MAIN, runSync } from './helpers/process.js';
import { SPIN_ITEMS, SPIN_THRESHOLDS } from './helpers/policies.js';

const POLICIES = path.join(REPO, 'policies');
const DENY_READ = 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n';
const HARMLESS = 'package authz.agent\n\ncli_marker := true\n';

const dirs: string[] = [];
/** A temporary directory holding `files` (relative path → content). */
function tempDir(files: Record<string, string> = {}): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-cli-'));
  dirs.push(dir);
  for (const [rel, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    writeFileSync(path.join(dir, rel), text);
  }
  return dir;
}
/** A copy of the repository's policies/ directory, to edit. */
function copyOfPolicies(): string {
  const dir = tempDir();
  cpSync(POLICIES, dir, { recursive: true });
  return dir;
}
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** Runs `arbiter policy …` as a real process (no ARBITER_URL/KEY unless given). */
function policy(args: string[], env: Record<string, string | undefined> = {}) {
  return runSync(
    ['policy', ...args],
    baseEnv({ ARBITER_OPA_BIN: process.env.ARBITER_OPA_BIN, ...env }),
    120_000,
  );
}

/** `policy` without blocking the event loop (for a test whose own server must answer meanwhile). */
function policyAsync(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, 'policy', ...args], {
      env: baseEnv({ ARBITER_OPA_BIN: process.env.ARBITER_OPA_BIN, ...env }),
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

// check and test compile and run Rego locally: no server, no storage.
onceOnly('arbiter policy check and test (no server)', () => {
  it('check: the repository policies compile (exit 0)', () => {
    const r = policy(['check', POLICIES]);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^ok: 4 policies and \d+ data documents compile/);
  });

  it('check: a file that is not Rego is exit 1 with file:row:col: msg', () => {
    const dir = tempDir({ 'notes.rego': 'this is not rego at all\n' });
    const r = policy(['check', dir]);
    expect(r.code).to.equal(1);
    expect(r.stdout).to.contain(`${path.join(dir, 'notes.rego')}:1:1: rego_parse_error: package expected`);
    const j = policy(['check', '--json', dir]);
    expect(j.code).to.equal(1);
    const out = JSON.parse(j.stdout);
    expect(out.ok).to.equal(false);
    expect(out.errors[0]).to.deep.include({ file: path.join(dir, 'notes.rego'), row: 1, col: 1 });
  });

  it('check: refuses what the service refuses (a disallowed builtin, the reserved package, bad thresholds)', () => {
    const http = tempDir({
      'fetch.rego':
        'package authz.agent\n\ndeny contains "x" if {\n  http.send({"method": "get", "url": "http://x"})\n}\n',
    });
    const r1 = policy(['check', http]);
    expect(r1.code).to.equal(1);
    expect(r1.stdout).to.match(
      new RegExp(`${path.join(http, 'fetch.rego')}:4:\\d+: .*http.send is not allowed`),
    );
    const reserved = tempDir({ 'mine.rego': 'package authz\n\nx := 1\n' });
    const r2 = policy(['check', reserved]);
    expect(r2.code).to.equal(1);
    expect(r2.stdout).to.contain(`${path.join(reserved, 'mine.rego')}:1:1: package authz is reserved`);
    const thresholds = tempDir({
      't.rego': 'package authz.agent\n\nthresholds["read"] := {"deny_below": 2, "approval_below": 0.9}\n',
    });
    const r3 = policy(['check', thresholds]);
    expect(r3.code).to.equal(1);
    expect(r3.stdout).to.contain(`${path.join(thresholds, 't.rego')}:3:1`);
  });

  it('check: a thresholds rule that never finishes is reported with exit 1, not a hung CI job', () => {
    const dir = tempDir({
      'slow.rego': SPIN_THRESHOLDS,
      'spin/data.json': JSON.stringify({ items: SPIN_ITEMS }),
    });
    const r = policy(['check', dir], { ARBITER_EVAL_BUDGET_MS: '100' });
    expect(r.code).to.equal(1);
    expect(r.stdout).to.match(
      /invalid confidence thresholds: .*thresholds could not be checked: evaluation timed out: no answer within 1100 ms/,
    );
    // The same directory without the data: the rule finishes (no items), and the check passes.
    const fast = tempDir({ 'slow.rego': SPIN_THRESHOLDS });
    const ok = policy(['check', fast]);
    expect(ok.code).to.equal(0);
    expect(ok.stdout).to.contain('ok: 1 policies and 0 data documents compile');
  });

  it('check: a missing directory is exit 2; bad usage is exit 2', () => {
    const missing = path.join(os.tmpdir(), 'arbiter-no-such-dir-for-cli');
    const r = policy(['check', missing]);
    expect(r.code).to.equal(2);
    expect(r.stderr).to.contain('is not a directory');
    expect(policy(['check']).code).to.equal(2);
    expect(policy(['check', POLICIES, POLICIES]).code).to.equal(2);
    expect(policy(['frobnicate', POLICIES]).code).to.equal(2);
    expect(policy(['check', '--prune', POLICIES]).code).to.equal(2);
    expect(policy(['check', '--nope', POLICIES]).code).to.equal(2);
  });

  it('check: a data.json that is not JSON is exit 1 naming the file', () => {
    const dir = tempDir({ 'a.rego': HARMLESS, 'data.json': '{"agents": ' });
    const r = policy(['check', dir]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain(path.join(dir, 'data.json'));
  });

  it('check: a .rego or data file that is not UTF-8 is exit 1 naming the file (not "ok")', () => {
    for (const [file, head] of [
      ['latin1.rego', 'package authz.agent\n\n# caf'],
      ['data.json', '{"note": "caf'],
      ['team/data.yaml', 'note: caf'],
    ] as const) {
      const dir = tempDir({ 'a.rego': HARMLESS });
      mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
      // "café" in Latin-1: 0xe9 alone is not UTF-8.
      writeFileSync(
        path.join(dir, file),
        Buffer.concat([Buffer.from(head), Buffer.from([0xe9, 0x22, 0x7d, 0x0a])]),
      );
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${path.join(dir, file)}: not valid UTF-8`);
      expect(r.stdout).to.not.match(/\bok\b/);
    }
  });

  it('check: a root authz.rego of another package is exit 1 (its rules would never be pushed); the copy of the built-in is ignored', () => {
    // The repository's own policies/ holds the copy of the built-in module (package authz): ok.
    expect(policy(['check', POLICIES]).code).to.equal(0);
    for (const text of [DENY_READ, '# only a comment\n', '']) {
      const dir = tempDir({ 'a.rego': HARMLESS, 'authz.rego': text });
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${path.join(dir, 'authz.rego')}: the root authz.rego is kept for a copy`);
      expect(r.stdout).to.not.match(/\bok\b/);
    }
    // With a comment before it and one after the package name, as a hand-edited copy may have.
    const copy = tempDir({ 'a.rego': HARMLESS, 'authz.rego': '# copy\npackage authz # built-in\n' });
    expect(policy(['check', copy]).code).to.equal(0);
  });

  it('test: runs the Rego tests with the built-in module (exit 0), a failing test is exit 1', () => {
    const ok = policy(['test', POLICIES]);
    expect(ok.code, ok.stdout + ok.stderr).to.equal(0);
    expect(ok.stdout).to.match(/PASS: \d+\/\d+/);
    const dir = copyOfPolicies();
    writeFileSync(
      path.join(dir, 'broken_test.rego'),
      'package authz.agent_test\n\ntest_always_fails if {\n  data.authz.decision.status == "nonsense" with input as {"kind": "agent"}\n}\n',
    );
    const bad = policy(['test', dir]);
    expect(bad.code).to.equal(1);
    expect(bad.stdout).to.contain('test_always_fails');
    expect(bad.stdout).to.match(/FAIL/);
  });
});

// diff, push and pull read and change the stored set: every backend.
onEveryBackend('arbiter policy diff, push and pull (real server, real storage)', () => {
  let a: Arbiter;
  let env: Record<string, string>;
  before(async () => {
    a = await Arbiter.start();
    env = { ARBITER_URL: a.platform, ARBITER_KEY: ADMIN_KEY };
  });
  after(async () => {
    await a.close();
  });
  const revision = async () => (await call('GET', a.platform + '/api/v1/policies')).json.revision as number;
  const names = async () =>
    ((await call('GET', a.platform + '/api/v1/policies')).json.policies as { name: string }[]).map(
      (p) => p.name,
    );

  it('a server that is down is exit 2; no URL or key is exit 2', () => {
    const r = policy(['diff', POLICIES], { ARBITER_URL: 'http://127.0.0.1:9', ARBITER_KEY: 'k' });
    expect(r.code).to.equal(2);
    expect(r.stderr).to.contain('cannot reach http://127.0.0.1:9');
    expect(policy(['diff', POLICIES], { ARBITER_KEY: 'k' }).code).to.equal(2);
    expect(policy(['diff', POLICIES], { ARBITER_URL: a.platform }).code).to.equal(2);
    expect(policy(['push', POLICIES, '--url', 'not a url', '--key', 'k']).code).to.equal(2);
    expect(policy(['push', path.join(os.tmpdir(), 'arbiter-none-here')], env).code).to.equal(2);
  });

  it('diff: the unchanged repository policies plan no changes; --url/--key work as flags', () => {
    const r = policy(['diff', POLICIES, '--url', a.platform, '--key', ADMIN_KEY]);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.contain('no changes');
    expect(r.stdout).to.contain('unchanged: 4 policies');
  });

  it('diff: prints create/update/delete and data changes, says whether impact is available, changes nothing', async () => {
    const before = await revision();
    await call('PUT', `${a.platform}/api/v1/policies/cli-live-only`, { body: { rego: HARMLESS } });
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-new.rego'), HARMLESS);
    writeFileSync(
      path.join(dir, 'agent.rego'),
      readFileSync(path.join(dir, 'agent.rego'), 'utf8') + '\ncli_extra := 1\n',
    );
    const data = JSON.parse(readFileSync(path.join(dir, 'data.json'), 'utf8'));
    data.cli_doc = { x: 1 };
    writeFileSync(path.join(dir, 'data.json'), JSON.stringify(data));
    const r = policy(['diff', dir], env);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.contain(`plan against revision ${before + 1}`);
    expect(r.stdout).to.match(/create +policy cli-new/);
    expect(r.stdout).to.match(/update +policy agent/);
    expect(r.stdout).to.match(/create +data +cli_doc/);
    expect(r.stdout).to.match(/keep +policy cli-live-only \(live only; --prune deletes it\)/);
    expect(r.stdout).to.match(/impact: \d+ of \d+ recent decisions would change/);
    const pruned = policy(['diff', dir, '--prune', '--json'], env);
    expect(pruned.code).to.equal(0);
    const plan = JSON.parse(pruned.stdout).plan;
    expect(plan.policies).to.deep.include({
      create: ['cli-new'],
      update: ['agent'],
      delete: ['cli-live-only'],
    });
    expect(plan.data.create).to.deep.equal(['cli_doc']);
    expect(await revision()).to.equal(before + 1);
    await call('DELETE', `${a.platform}/api/v1/policies/cli-live-only`);
  });

  it('diff: a plan the server would refuse (data overlapping a live document) is exit 1 and changes nothing', async () => {
    expect(
      (await call('PUT', `${a.platform}/api/v1/data/cli-ovl/inner`, { body: { x: 1 } })).status,
    ).to.equal(201);
    const before = await revision();
    const dir = copyOfPolicies();
    const data = JSON.parse(readFileSync(path.join(dir, 'data.json'), 'utf8'));
    data['cli-ovl'] = { shadowing: true };
    writeFileSync(path.join(dir, 'data.json'), JSON.stringify(data));
    const r = policy(['diff', dir], env);
    expect(r.code, r.stdout + r.stderr).to.equal(1);
    expect(r.stdout).to.match(/the plan would be refused: .*overlap/);
    const json = policy(['diff', dir, '--json'], env);
    expect(json.code).to.equal(1);
    expect(JSON.parse(json.stdout).refused).to.match(/overlap/);
    expect(await revision()).to.equal(before);
    expect((await call('DELETE', `${a.platform}/api/v1/data/cli-ovl/inner`)).status).to.equal(204);
  });

  it('push: applies the plan as one revision; again it is a no-op; --prune deletes live-only policies', async () => {
    const before = await revision();
    await call('PUT', `${a.platform}/api/v1/policies/cli-stale`, { body: { rego: HARMLESS } });
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-deny.rego'), DENY_READ);
    const r = policy(['push', dir, '--message', 'from ci'], env);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.contain(`pushed: revision ${before + 2} is live`);
    expect(await revision()).to.equal(before + 2);
    const revs = await call('GET', `${a.platform}/api/v1/revisions?limit=1`);
    expect(revs.json.revisions[0]).to.deep.include({ message: 'from ci' });
    const denied = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    expect(denied.json.status).to.equal('deny');
    expect(await names()).to.include('cli-stale');

    const again = policy(['push', dir], env);
    expect(again.code).to.equal(0);
    expect(again.stdout).to.contain(`nothing to push: revision ${before + 2} is live`);

    rmSync(path.join(dir, 'cli-deny.rego'));
    const pruned = policy(['push', dir, '--prune', '--json'], env);
    expect(pruned.code, pruned.stderr).to.equal(0);
    expect(JSON.parse(pruned.stdout).result.deleted).to.deep.equal(['cli-deny', 'cli-stale']);
    expect(await names()).to.have.members(['agent', 'budgets', 'delegation', 'human']);
  });

  it('push: a module that does not compile is exit 1 and nothing changes', async () => {
    const before = await revision();
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-broken.rego'), 'package authz.agent\n\nallow if {\n');
    const r = policy(['push', dir], env);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/push refused: 400 .*policy cli-broken:\d+:\d+/);
    expect(await revision()).to.equal(before);
  });

  it('diff and push: a file that is not UTF-8 is exit 1 and nothing changes', async () => {
    const before = await revision();
    const dir = copyOfPolicies();
    writeFileSync(
      path.join(dir, 'cli-latin1.rego'),
      Buffer.concat([
        Buffer.from('package authz.agent\n\n# caf'),
        Buffer.from([0xe9]),
        Buffer.from('\nx := 1\n'),
      ]),
    );
    for (const cmd of ['diff', 'push']) {
      const r = policy([cmd, dir], env);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${path.join(dir, 'cli-latin1.rego')}: not valid UTF-8`);
    }
    expect(await revision()).to.equal(before);
    expect(await names()).to.not.include('cli-latin1');
  });

  it('seeding: a policy directory holding a file that is not UTF-8 stops the start', async () => {
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'data.json'), Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]));
    let failed: Error | undefined;
    try {
      const b = await Arbiter.start({ ARBITER_POLICY_DIR: dir });
      await b.close();
    } catch (e) {
      failed = e as Error;
    }
    expect(failed?.message).to.contain(`${path.join(dir, 'data.json')}: not valid UTF-8`);
  });

  it('push: a key without policies:write is exit 1; a bad key is exit 1; nothing changes', async () => {
    const before = await revision();
    const reader = a.createKey('cli-reader', ['policies:read']);
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-x.rego'), HARMLESS);
    const r = policy(['push', dir], { ARBITER_URL: a.platform, ARBITER_KEY: reader });
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain('403');
    const bad = policy(['diff', dir], { ARBITER_URL: a.platform, ARBITER_KEY: 'arb_wrong' });
    expect(bad.code).to.equal(1);
    expect(bad.stderr).to.contain('401');
    expect(await revision()).to.equal(before);
  });

  it('push: a change that lands between plan and push makes it exit 1 and pushes nothing (If-Match)', async () => {
    // A pass-through proxy to the real server that, just before forwarding the bundle, lets
    // another writer change the live set: the race the conditional push exists for.
    let raced = 0;
    const proxy: Server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        void (async () => {
          if (req.method === 'POST' && req.url === '/api/v1/bundle') {
            raced = (
              await call('PUT', `${a.platform}/api/v1/policies/cli-racer`, { body: { rego: HARMLESS } })
            ).json.revision as number;
          }
          const headers: Record<string, string> = {};
          for (const h of ['authorization', 'content-type', 'if-match']) {
            const v = req.headers[h];
            if (typeof v === 'string') headers[h] = v;
          }
          const body = chunks.length > 0 ? Buffer.concat(chunks) : undefined;
          const r = await fetch(a.platform + (req.url ?? '/'), {
            method: req.method,
            headers,
            body,
          });
          res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
          res.end(Buffer.from(await r.arrayBuffer()));
        })();
      });
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    try {
      const port = (proxy.address() as { port: number }).port;
      const dir = copyOfPolicies();
      writeFileSync(path.join(dir, 'cli-late.rego'), DENY_READ);
      const r = await policyAsync(['push', dir], {
        ARBITER_URL: `http://127.0.0.1:${port}`,
        ARBITER_KEY: ADMIN_KEY,
      });
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain('changed since the plan was made');
      expect(raced).to.be.greaterThan(0);
      expect(await revision()).to.equal(raced);
      expect(await names()).to.not.include('cli-late');
    } finally {
      await new Promise<void>((resolve) => proxy.close(() => resolve()));
      await call('DELETE', `${a.platform}/api/v1/policies/cli-racer`);
    }
  });

  it('pull: writes the live set in the directory layout; pushing it back changes nothing', async () => {
    await call('PUT', `${a.platform}/api/v1/data/cli/nested`, { body: { deep: true } });
    const dir = path.join(tempDir(), 'pulled');
    const r = policy(['pull', dir], env);
    expect(r.code, r.stderr).to.equal(0);
    expect(readdirSync(dir).sort()).to.deep.equal([
      'agent.rego',
      'budgets.rego',
      'cli',
      'data.json',
      'delegation.rego',
      'human.rego',
    ]);
    expect(readFileSync(path.join(dir, 'agent.rego'), 'utf8')).to.equal(
      (await call('GET', `${a.platform}/api/v1/policies/agent`)).json.rego,
    );
    expect(JSON.parse(readFileSync(path.join(dir, 'cli', 'nested', 'data.json'), 'utf8'))).to.deep.equal({
      deep: true,
    });
    expect(JSON.parse(readFileSync(path.join(dir, 'data.json'), 'utf8'))).to.have.property('agents');
    const check = policy(['check', dir]);
    expect(check.code, check.stdout).to.equal(0);
    const before = await revision();
    const back = policy(['push', dir, '--prune'], env);
    expect(back.code, back.stderr).to.equal(0);
    expect(back.stdout).to.contain('nothing to push');
    expect(await revision()).to.equal(before);

    const again = policy(['pull', dir], env);
    expect(again.code).to.equal(1);
    expect(again.stderr).to.contain('--force');
    writeFileSync(path.join(dir, 'gone.rego'), HARMLESS);
    writeFileSync(path.join(dir, 'keep_test.rego'), 'package x_test\n');
    // A refused pull (a wrong key) leaves the directory as it was, even with --force.
    const refused = policy(['pull', dir, '--force'], { ...env, ARBITER_KEY: 'arb_wrong' });
    expect(refused.code, refused.stderr).to.equal(1);
    expect(existsSync(path.join(dir, 'gone.rego'))).to.equal(true);
    expect(existsSync(path.join(dir, 'agent.rego'))).to.equal(true);
    // A live policy named NAME_test would come back as a test file: pull refuses to write it.
    expect(
      (
        await call('PUT', `${a.platform}/api/v1/policies/looks_test`, {
          body: { rego: 'package authz.agent\n\nlooks_test_marker := true\n' },
        })
      ).status,
    ).to.equal(201);
    const testName = policy(['pull', dir, '--force'], env);
    expect(testName.code, testName.stderr).to.equal(1);
    expect(testName.stderr).to.contain('looks_test');
    expect(existsSync(path.join(dir, 'gone.rego'))).to.equal(true);
    expect((await call('DELETE', `${a.platform}/api/v1/policies/looks_test`)).status).to.equal(204);
    const forced = policy(['pull', dir, '--force'], env);
    expect(forced.code, forced.stderr).to.equal(0);
    expect(existsSync(path.join(dir, 'gone.rego'))).to.equal(false);
    expect(existsSync(path.join(dir, 'keep_test.rego'))).to.equal(true);
    await call('DELETE', `${a.platform}/api/v1/data/cli/nested`);
  });
});
