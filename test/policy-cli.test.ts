import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { execFileSync } from 'node:child_process';
import {
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { ADMIN_KEY, AGENT, Arbiter, call, REPO } from './helpers/harness.js';
import { baseEnv, MAIN, runSync, sleep } from './helpers/process.js';
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
  spawned?: (pid: number) => void,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, 'policy', ...args], {
      env: baseEnv({ ARBITER_OPA_BIN: process.env.ARBITER_OPA_BIN, ...env }),
    });
    if (child.pid !== undefined) spawned?.(child.pid);
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/**
 * What a pass-through proxy in front of `target` does with one request: reads it, runs `before`
 * (what a test lets happen first), sends it on with the headers the CLI sets, and reads the whole
 * answer.
 */
function forward(
  target: string,
  req: IncomingMessage,
  before: () => Promise<void> = async () => {},
): Promise<{ status: number; type: string; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      void (async () => {
        await before();
        const headers: Record<string, string> = {};
        for (const h of ['authorization', 'content-type', 'if-match']) {
          const v = req.headers[h];
          if (typeof v === 'string') headers[h] = v;
        }
        const r = await fetch(target + (req.url ?? '/'), {
          method: req.method,
          headers,
          body: chunks.length > 0 ? Buffer.concat(chunks) : undefined,
        });
        resolve({
          status: r.status,
          type: r.headers.get('content-type') ?? 'application/json',
          body: Buffer.from(await r.arrayBuffer()),
        });
      })().catch(reject);
    });
  });
}

/** With --json: stdout is exactly one JSON object (an error one carries ok false and the exit). */
function jsonOf(r: { code: number | null; stdout: string; stderr: string }): Record<string, unknown> {
  let out: unknown;
  try {
    out = JSON.parse(r.stdout);
  } catch {
    throw new Error(`stdout is not one JSON value:\n${r.stdout}\nstderr:\n${r.stderr}`);
  }
  expect(out, r.stdout).to.be.an('object').and.not.be.an('array');
  const o = out as Record<string, unknown>;
  if (r.code !== 0) expect(o, r.stdout).to.deep.include({ ok: false, exit: r.code });
  return o;
}

/**
 * A stand-in HTTP server for one test: `answer` decides each request (undefined: pass it on to
 * `upstream`, the real server, when given). Runs `fn` with its URL, then closes.
 */
async function withServer(
  answer: (
    req: { method: string; url: string; body: string },
    seen: number,
  ) => { status: number; body: unknown; headers?: Record<string, string> } | undefined,
  fn: (url: string) => Promise<void>,
  upstream?: string,
): Promise<void> {
  let seen = 0;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      void (async () => {
        const body = Buffer.concat(chunks);
        const mine = answer(
          { method: req.method ?? 'GET', url: req.url ?? '/', body: body.toString() },
          seen++,
        );
        if (mine !== undefined || upstream === undefined) {
          const a = mine ?? { status: 404, body: { error: 'nothing here' } };
          res.writeHead(a.status, { 'content-type': 'application/json', ...a.headers });
          res.end(typeof a.body === 'string' ? a.body : JSON.stringify(a.body));
          return;
        }
        const headers: Record<string, string> = {};
        for (const h of ['authorization', 'content-type', 'if-match']) {
          const v = req.headers[h];
          if (typeof v === 'string') headers[h] = v;
        }
        const r = await fetch(upstream + (req.url ?? '/'), {
          method: req.method,
          headers,
          body: chunks.length > 0 ? body : undefined,
        });
        res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
        res.end(Buffer.from(await r.arrayBuffer()));
      })();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    await fn(`http://127.0.0.1:${(server.address() as { port: number }).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
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
    // Like every --json failure, an error member: the first problem.
    expect(jsonOf(j).error).to.match(
      new RegExp(
        `^${path.join(dir, 'notes.rego').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:1:1: rego_parse_error`,
      ),
    );
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
    // A data document where a rule is: OPA and the server refuse the set, though it compiles.
    const clash = tempDir({ 'x.rego': 'package x\n\nflag := false\n', 'data.json': '{"x": {"flag": true}}' });
    const r4 = policy(['check', clash]);
    expect(r4.code, r4.stdout + r4.stderr).to.equal(1);
    expect(r4.stdout).to.contain(`${path.join(clash, 'x.rego')}:3:1: conflicting rule for data path x/flag`);
  });

  it('check: a rule of the wrong shape for the decision module is blamed on its own file and row, not on builtin/authz.rego', () => {
    const dir = tempDir({
      'shape.rego': 'package authz.agent\n\n# a number where an object of actions belongs\nthresholds := 5\n',
      'human.rego': 'package authz.human\n\nallow := "yes"\n\ndeny(x) := true if x\n',
    });
    const r = policy(['check', dir]);
    expect(r.code, r.stderr).to.equal(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines).to.have.length(3);
    expect(lines).to.include.members([
      `${path.join(dir, 'shape.rego')}:4:1: rego_type_error: thresholds must be an object of action -> {"deny_below": x, "approval_below": y}: \`thresholds[action] := {…}\`; Arbiter's decision module reads data.authz.agent.thresholds (OPA: undefined ref: data.authz.agent.thresholds[action], at builtin/authz.rego:110)`,
    ]);
    expect(
      lines.some((l) =>
        l.startsWith(`${path.join(dir, 'human.rego')}:3:1: rego_type_error: allow must be true or undefined`),
      ),
    ).to.equal(true);
    expect(
      lines.some((l) =>
        l.startsWith(`${path.join(dir, 'human.rego')}:5:1: rego_type_error: deny must be a set of reasons`),
      ),
    ).to.equal(true);
    for (const l of lines) expect(l).not.to.match(/^builtin\//);
    // Each file is parsed once however many of OPA's errors (up to 100) point at its rules: six
    // more files that mention `thresholds` add six parses, not six per error.
    const calls = path.join(tempDir(), 'opa-calls');
    const wrapper = path.join(tempDir(), 'opa');
    const real = process.env.ARBITER_OPA_BIN ?? path.join(REPO, '.opa-bin', 'opa');
    writeFileSync(wrapper, `#!/bin/sh\necho "$1" >> '${calls}'\nexec '${real}' "$@"\n`, { mode: 0o755 });
    for (let i = 0; i < 6; i++) {
      writeFileSync(path.join(dir, `mention${i}.rego`), `package lib.m${i}\n\n# thresholds\nx := ${i}\n`);
    }
    const counted = policy(['check', dir], { ARBITER_OPA_BIN: wrapper });
    expect(counted.code, counted.stderr).to.equal(1);
    const parses = readFileSync(calls, 'utf8')
      .split('\n')
      .filter((l) => l === 'parse').length;
    expect(parses).to.be.within(1, 8);
    for (let i = 0; i < 6; i++) rmSync(path.join(dir, `mention${i}.rego`));
    const j = JSON.parse(policy(['check', '--json', dir]).stdout);
    expect(
      j.errors.map((e: { file: string; row: number }) => [path.basename(e.file), e.row]),
    ).to.have.deep.members([
      ['shape.rego', 4],
      ['human.rego', 3],
      ['human.rego', 5],
    ]);
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
    const j = jsonOf(policy(['check', dir, '--json'], { ARBITER_EVAL_BUDGET_MS: '100' }));
    expect(j.error).to.match(/invalid confidence thresholds: .*evaluation timed out/);
    // The same directory without the data: the rule finishes (no items), and the check passes.
    const fast = tempDir({ 'slow.rego': SPIN_THRESHOLDS });
    const ok = policy(['check', fast]);
    expect(ok.code).to.equal(0);
    expect(ok.stdout).to.contain('ok: 1 policies and 0 data documents compile');
  });

  it('check and test: an invalid ARBITER_* setting is exit 2 (the environment, not the policies), as for every command', () => {
    for (const args of [
      ['check', POLICIES],
      ['test', POLICIES],
      ['check', POLICIES, '--json'],
    ]) {
      const r = policy(args, { ARBITER_EVAL_BUDGET_MS: 'abc' });
      expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(2);
      expect(r.stderr).to.contain('invalid configuration: ARBITER_EVAL_BUDGET_MS must be a positive integer');
      if (args.includes('--json')) jsonOf(r);
    }
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
    // An option given twice is refused, not read as its last value (push --url a --url b).
    const twice = policy(['diff', '--url', 'http://127.0.0.1:1', '--url', 'http://127.0.0.1:2', POLICIES]);
    expect(twice.code).to.equal(2);
    expect(twice.stderr).to.contain('option --url is given more than once');
    const none = policy([]);
    expect(none.code).to.equal(2);
    expect(none.stderr).to.contain(
      'arbiter policy: policy needs a command (check, test, diff, push or pull) and exactly one DIR',
    );
  });

  it('check: a reserved data document (authz, __proto__) is exit 1 naming the file; a BOM before data.json is ignored', () => {
    const cases: [Record<string, string>, string, string][] = [
      [{ 'data.json': '{"authz": {"x": 1}}' }, 'data.json', 'data path authz is reserved'],
      [{ 'data.yaml': '__proto__: {x: 1}\n' }, 'data.yaml', 'data path segment __proto__ is not allowed'],
      [{ '__proto__/data.json': '{}' }, '__proto__/data.json', 'data path segment __proto__'],
    ];
    for (const [files, file, why] of cases) {
      const dir = tempDir({ 'a.rego': HARMLESS, ...files });
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${path.join(dir, file)}: ${why}`);
    }
    const bom = tempDir({ 'a.rego': HARMLESS, 'data.json': '\uFEFF{"rbac": {"a": 1}}' });
    const ok = policy(['check', bom]);
    expect(ok.code, ok.stderr).to.equal(0);
    expect(ok.stdout).to.contain('ok: 1 policies and 1 data documents compile');
  });

  it('check: a data.json that is not JSON is exit 1 naming the file', () => {
    const dir = tempDir({ 'a.rego': HARMLESS, 'data.json': '{"agents": ' });
    const r = policy(['check', dir]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain(path.join(dir, 'data.json'));
  });

  it('check: a syntax error in a data file is one line, file:row:col: msg, as for Rego', () => {
    const cases: [string, string, string][] = [
      ['data.json', '{\n  "agents": {},\n}\n', 'data.json:3:1: Expected double-quoted property name'],
      ['data.json', '{"agents": {}} x', 'data.json:1:16: Unexpected non-whitespace character after JSON'],
      ['data.yaml', 'agents:\n\t- 1\n', 'data.yaml:2:1: Tabs are not allowed as indentation'],
      ['data.yaml', 'a: 1\na: 2\n', 'data.yaml:2:1: Map keys must be unique'],
    ];
    for (const [file, text, message] of cases) {
      const dir = tempDir({ 'a.rego': HARMLESS, [file]: text });
      for (const args of [
        ['check', dir],
        ['check', dir, '--json'],
      ]) {
        const r = policy(args);
        expect(r.code, r.stderr).to.equal(1);
        const line = `${path.join(dir, message.split(':')[0] as string)}${message.slice(message.indexOf(':'))}`;
        if (args.includes('--json')) expect(jsonOf(r).error).to.equal(line);
        else expect(r.stderr.trim()).to.equal(`arbiter policy: ${line}`);
      }
    }
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

  it("test: tests exactly the data push sends (data.yaml as YAML 1.2, no other .json/.yaml), reporting DIR's paths", () => {
    const dir = tempDir({
      // YAML 1.1 (OPA's loader) reads 0755 as 493; push sends 755.
      'data.yaml': 'agents: {deploy-bot: {role: deployer}}\nmode: 0755\n',
      // Never pushed: not a data file of the layout.
      'ci-fixture.json': '{"agents": {"ci-bot": {"role": "admin"}}}',
      'fixtures/extra.yaml': 'mode: 1\n',
      'sub/pushed_test.rego': [
        'package authz.agent_test',
        '',
        'test_agents_as_pushed if { object.keys(data.agents) == {"deploy-bot"} }',
        '',
        'test_mode_as_pushed if { data.mode == 755 }',
        '',
        'test_fails if { false }',
        '',
      ].join('\n'),
    });
    const r = policy(['test', dir]);
    expect(r.code, r.stdout + r.stderr).to.equal(1);
    expect(r.stdout).to.match(/test_agents_as_pushed: PASS/);
    expect(r.stdout).to.match(/test_mode_as_pushed: PASS/);
    expect(r.stdout).to.match(/test_fails: FAIL/);
    // The runner's file paths are DIR's, not those of its temporary copy.
    expect(r.stdout).to.contain(`${path.join(dir, 'sub', 'pushed_test.rego')}:7`);
    expect(r.stdout).not.to.match(/(^|\s)policies\//m);
    const j = jsonOf(policy(['test', dir, '--json']));
    const results = j.results as { name: string; fail?: boolean; location: { file: string } }[];
    expect(results.map((x) => [x.name, x.fail === true]).sort()).to.deep.equal([
      ['test_agents_as_pushed', false],
      ['test_fails', true],
      ['test_mode_as_pushed', false],
    ]);
    for (const x of results) expect(x.location.file).to.equal(path.join(dir, 'sub', 'pushed_test.rego'));
  });

  it('check and test: a symbolic link inside DIR (to a .rego file or to a directory) is exit 1 naming it; DIR itself may be a link', () => {
    const outside = tempDir({ 'linked.rego': HARMLESS, 'sub/inner.rego': HARMLESS });
    const cases: [string, string][] = [
      ['cli-linked.rego', path.join(outside, 'linked.rego')],
      ['team', path.join(outside, 'sub')],
      ['notes.txt', path.join(outside, 'nowhere')], // dangling, and not even a .rego file
    ];
    for (const [name, target] of cases) {
      const dir = copyOfPolicies();
      symlinkSync(target, path.join(dir, name));
      for (const cmd of ['check', 'test']) {
        const r = policy([cmd, dir]);
        expect(r.code, `${cmd} ${name}: ${r.stdout}${r.stderr}`).to.equal(1);
        expect(r.stderr).to.contain(`${path.join(dir, name)}: a symbolic link`);
        const j = policy([cmd, dir, '--json']);
        expect(j.code).to.equal(1);
        expect(jsonOf(j).error).to.contain(`${path.join(dir, name)}: a symbolic link`);
      }
    }
    // A FIFO named like a policy: refused, not read (which would hang).
    const fifo = copyOfPolicies();
    execFileSync('mkfifo', [path.join(fifo, 'cli-fifo.rego')]);
    const f = policy(['check', fifo]);
    expect(f.code).to.equal(1);
    expect(f.stderr).to.contain(`${path.join(fifo, 'cli-fifo.rego')}: not a regular file`);
    // DIR given as a link to a directory is the user's choice.
    const via = path.join(tempDir(), 'policies-link');
    symlinkSync(copyOfPolicies(), via);
    expect(policy(['check', via]).code).to.equal(0);
    expect(policy(['test', via]).code).to.equal(0);
  });

  it('check: two files that are one policy, or data documents defined twice or one inside another, are exit 1 naming both files', () => {
    const cases: [Record<string, string>, string, string][] = [
      [
        { 'lib/helpers.rego': HARMLESS, 'lib.helpers.rego': HARMLESS },
        'lib.helpers.rego',
        'lib/helpers.rego',
      ],
      [
        { 'a.rego': HARMLESS, 'data.json': '{"rbac": {"a": 1}}', 'data.yaml': 'rbac:\n  a: 2\n' },
        'data.json',
        'data.yaml',
      ],
      [
        { 'a.rego': HARMLESS, 'data.json': '{"rbac": {"a": 1}}', 'rbac/data.json': '{"a": 2}' },
        'data.json',
        'rbac/data.json',
      ],
      [
        { 'a.rego': HARMLESS, 'data.json': '{"rbac": {"a": 1}}', 'rbac/extra/data.json': '{"b": 2}' },
        'data.json',
        'rbac/extra/data.json',
      ],
      [
        { 'a.rego': HARMLESS, 'rbac/data.json': '{"a": 1}', 'rbac/data.yaml': 'a: 2\n' },
        'rbac/data.json',
        'rbac/data.yaml',
      ],
      [
        { 'a.rego': HARMLESS, 'rbac/data.json': '{"a": 1}', 'rbac/x/data.yaml': 'a: 2\n' },
        'rbac/data.json',
        'rbac/x/data.yaml',
      ],
    ];
    for (const [files, one, other] of cases) {
      const dir = tempDir(files);
      const r = policy(['check', dir]);
      expect(r.code, `${one} ${other}: ${r.stdout}${r.stderr}`).to.equal(1);
      expect(r.stderr).to.contain(path.join(dir, one)).and.to.contain(path.join(dir, other));
      expect(r.stdout).to.not.match(/\bok\b/);
    }
  });

  it('check: a null data document and a number JSON cannot hold (1e400, .inf, .nan) are exit 1 naming file and path', () => {
    const nulls: [Record<string, string>, string, string][] = [
      [{ 'data.json': '{"killswitch": null, "other": 1}' }, 'data.json', 'killswitch'],
      [{ 'team/data.json': 'null' }, 'team/data.json', 'team'],
      [{ 'team/data.yaml': '# nothing yet\n' }, 'team/data.yaml', 'team'],
    ];
    for (const [files, file, doc] of nulls) {
      const dir = tempDir({ 'a.rego': HARMLESS, ...files });
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(
        `${path.join(dir, file)}: data document ${doc} is null: a bundle's null deletes a document, so a null document cannot be pushed in a bundle`,
      );
      expect(r.stderr).to.contain(`PUT /api/v1/data/${doc}`);
    }
    const numbers: [Record<string, string>, string, string][] = [
      [
        { 'data.json': '{"limits": {"max": 1e400}}' },
        'data.json',
        'data document limits at .max holds Infinity',
      ],
      [
        { 'rbac/data.yaml': 'weights: [1, .nan]\n' },
        'rbac/data.yaml',
        'data document rbac at .weights[1] holds NaN',
      ],
      [{ 'data.yaml': 'floor: -.inf\n' }, 'data.yaml', 'data document floor holds -Infinity'],
    ];
    for (const [files, file, what] of numbers) {
      const dir = tempDir({ 'a.rego': HARMLESS, ...files });
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${path.join(dir, file)}: ${what}, which JSON cannot hold`);
    }
  });

  it('check: a number that would reach the policy as another number is exit 1 naming file and where', () => {
    const cases: [Record<string, string>, string][] = [
      [
        { 'data.json': '{"blocked": {"ids": [1, 9007199254740993]}}' },
        'data.json: blocked.ids.1 holds the number 9007199254740993, which would reach the policy as 9007199254740992 (numbers are read as doubles): write it as a string',
      ],
      [
        { 'rbac/data.yaml': 'floor: 0.1\nids:\n  - 0x20000000000001\n' },
        'rbac/data.yaml:3: the line holds the number 0x20000000000001, which would reach the policy as 9007199254740992 (numbers are read as doubles): quote it to make it a string',
      ],
      [
        { 'data.yaml': 'limits:\n  min: 1.0000000000000000001\n' },
        'data.yaml:2: the line holds the number 1.0000000000000000001, which would reach the policy as 1 (numbers are read as doubles): quote it to make it a string',
      ],
      [
        // 2^60 in hex: an exact double, but pushed as 1152921504606847000.
        { 'data.yaml': 'n: 0x1000000000000000\n' },
        'data.yaml:1: the line holds the number 0x1000000000000000, which would reach the policy as 1152921504606847000 (numbers are read as doubles): quote it to make it a string',
      ],
    ];
    for (const [files, message] of cases) {
      const dir = tempDir({ 'a.rego': HARMLESS, ...files });
      const r = policy(['check', dir]);
      expect(r.code, r.stdout + r.stderr).to.equal(1);
      expect(r.stderr).to.contain(`${dir}/${message}`);
    }
    // Numbers a double holds, however they are written, are fine.
    const dir = tempDir({
      'a.rego': HARMLESS,
      'data.json': '{"n": [0.1, 1.0, 1E5, 9007199254740992, 1e300]}',
      'x/data.yaml': 'n: [0x1F, 0o17, +.5, 1., 1e3, -2.50, 9007199254740992]\n',
    });
    const ok = policy(['check', dir]);
    expect(ok.code, ok.stdout + ok.stderr).to.equal(0);
  });

  it('check and test: data.yaml beyond YAML 1.2 core (merge keys, other tags) is exit 1 naming file and line', () => {
    const LOCKDOWN = [
      'lockdown_defaults: &lock {blocked_prefixes: ["staging/db"]}',
      'lockdown: {deploy-bot: {<<: *lock, reason: audit}}',
    ].join('\n');
    const cases: [string, string, RegExp][] = [
      [LOCKDOWN, 'data.yaml:2', /a merge key \(<<\) is not accepted/],
      ['a: 1\nb: !!set {x, y}\n', 'data.yaml:2', /the tag !!set is not accepted/],
      ['a: !!omap [{x: 1}]\n', 'data.yaml:1', /the tag !!omap is not accepted/],
      ['a:\n  b: !!binary aGVsbG8=\n', 'data.yaml:2', /the tag !!binary is not accepted/],
      ['a: !custom bar\n', 'data.yaml:1', /the tag !custom is not accepted/],
    ];
    for (const [yaml, where, message] of cases) {
      const dir = tempDir({ 'a.rego': HARMLESS, 'data.yaml': yaml });
      for (const cmd of ['check', 'test']) {
        const r = policy([cmd, dir]);
        expect(r.code, `${cmd} ${yaml}: ${r.stdout + r.stderr}`).to.equal(1);
        expect(r.stderr).to.contain(`${path.join(dir, where)}: `);
        expect(r.stderr).to.match(message);
      }
    }
    // The same keys written out, or a quoted "<<" (a plain key in every reader), are accepted.
    const plain = tempDir({ 'a.rego': HARMLESS, 'data.yaml': 'a: {"<<": 1}\nb: !!str 3\n' });
    expect(policy(['check', plain]).code).to.equal(0);
  });

  it('--json: every outcome prints exactly one JSON object, with the exit code it has without --json', () => {
    const missing = path.join(os.tmpdir(), 'arbiter-no-such-dir-for-cli');
    const runs: [string[], number, RegExp][] = [
      [['check', missing, '--json'], 2, /is not a directory/],
      [['check', POLICIES, '--json', '--nope'], 2, /--nope/],
      [['check', '--json'], 2, /exactly one DIR/],
      [['frobnicate', POLICIES, '--json'], 2, /unknown policy command/],
      [['check', '--prune', POLICIES, '--json'], 2, /takes no --prune/],
      [['diff', POLICIES, '--json', '--url', 'http://127.0.0.1:9', '--key', 'k'], 2, /cannot reach/],
      [['pull', tempDir(), '--json', '--key', 'k'], 2, /the server is unknown/],
    ];
    for (const [args, exit, error] of runs) {
      const plain = policy(args.filter((a) => a !== '--json'));
      const r = policy(args);
      expect(r.code, args.join(' ')).to.equal(exit);
      expect(plain.code, args.join(' ')).to.equal(exit);
      expect(jsonOf(r).error).to.match(error);
    }
    // OPA's own loading error in `policy test --json`: its text, in the JSON object.
    const broken = copyOfPolicies();
    writeFileSync(path.join(broken, 'broken_test.rego'), 'package x_test\n\ntest_b if {\n');
    const t = policy(['test', broken, '--json']);
    expect(t.code, t.stdout + t.stderr).to.equal(1);
    expect(policy(['test', broken]).code).to.equal(1);
    expect(jsonOf(t).error).to.match(/broken_test\.rego:\d+: rego_parse_error/);
    // Passing and failing tests: the results, inside the object.
    const ok = policy(['test', POLICIES, '--json']);
    expect(ok.code, ok.stderr).to.equal(0);
    const passed = jsonOf(ok);
    expect(passed.ok).to.equal(true);
    expect(passed.results).to.be.an('array').with.length.greaterThan(0);
    const failing = copyOfPolicies();
    writeFileSync(
      path.join(failing, 'broken_test.rego'),
      'package authz.agent_test\n\ntest_always_fails if {\n  false\n}\n',
    );
    const bad = policy(['test', failing, '--json']);
    expect(bad.code).to.equal(1);
    const failed = jsonOf(bad);
    expect(
      (failed.results as { name: string; fail?: boolean }[]).find((x) => x.name === 'test_always_fails'),
    ).to.have.property('fail', true);
    expect(failed.error).to.equal('1 test failed');
  });

  it('a --url with a password is never printed with it (refused: the key goes in --key)', () => {
    for (const [url, args] of [
      ['http://user:s3cret@127.0.0.1:9', ['diff', POLICIES]],
      ['http://user:s3cret@127.0.0.1:9/', ['push', POLICIES]],
      ['https://user:s3cret@arbiter.example', ['pull', tempDir()]],
      ['ftp://user:s3cret@arbiter.example', ['diff', POLICIES]],
      ['http://user:s3cret@host:99999', ['diff', POLICIES]],
    ] as const) {
      for (const how of ['flag', 'env', 'json'] as const) {
        const r =
          how === 'env'
            ? policy([...args], { ARBITER_URL: url, ARBITER_KEY: 'k' })
            : policy([...args, '--url', url, '--key', 'k', ...(how === 'json' ? ['--json'] : [])]);
        expect(r.code, `${url} ${how}: ${r.stderr}`).to.equal(2);
        expect(r.stdout + r.stderr).to.not.contain('s3cret');
        if (!url.includes('99999')) expect(r.stderr).to.contain('user:***@');
        if (how === 'json') jsonOf(r);
      }
    }
  });

  it('a server that is not Arbiter (another JSON shape, null lists, endless or repeating cursors) is exit 2, never a loop', async () => {
    const sha = 'a'.repeat(64);
    const list = (req: { url: string }, field: string, items: unknown, next: unknown) =>
      req.url.startsWith(`/api/v1/${field === 'policies' ? 'policies' : 'data'}?`)
        ? { status: 200, body: { [field]: items, revision: 1, next_cursor: next } }
        : undefined;
    const fakes: [string, Parameters<typeof withServer>[0], RegExp][] = [
      ['hello world', () => ({ status: 200, body: { hello: 'world' } }), /policies is not a list/],
      ['null lists', (req) => list(req, 'policies', null, null), /policies is not a list/],
      ['an array', () => ({ status: 200, body: [] }), /JSON that is not an object/],
      [
        'a repeated cursor',
        (req) => list(req, 'policies', [{ name: 'p', sha256: sha }], 'same'),
        /next_cursor repeats/,
      ],
      ['an empty page with a next one', (req) => list(req, 'policies', [], 'next'), /an empty page/],
      [
        'endless pages',
        (req, n) => list(req, 'policies', [{ name: `p${n}`, sha256: sha }], `c${n}`),
        /more than 1000 pages/,
      ],
      [
        'a data path that climbs out',
        (req) =>
          list(req, 'policies', [], null) ??
          list(req, 'documents', [{ path: '../../escape' }], null) ?? { status: 200, body: { value: 1 } },
        /escape/,
      ],
      ['a 500', () => ({ status: 500, body: { error: 'boom' } }), /500 boom/],
      [
        'the Engine API (404 on the Platform routes)',
        (req) => ({ status: 404, body: { error: `no route for GET ${req.url.split('?')[0]}` } }),
        /GET \/api\/v1\/policies: answered 404 no route .*is --url the Platform API\?/,
      ],
    ];
    for (const [what, answer, why] of fakes) {
      await withServer(answer, async (url) => {
        const pulled = path.join(tempDir(), 'pulled');
        for (const args of [
          ['diff', POLICIES],
          ['pull', pulled],
        ]) {
          const started = Date.now();
          const r = await policyAsync([...args, '--json'], { ARBITER_URL: url, ARBITER_KEY: 'k' });
          expect(r.code, `${what} ${args[0]}: ${r.stdout}${r.stderr}`).to.equal(2);
          expect(jsonOf(r).error).to.match(why);
          expect(Date.now() - started).to.be.below(60_000);
        }
        expect(existsSync(pulled), what).to.equal(false);
      });
    }
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

  it('--json before the command, or alone, still prints exactly one JSON object (exit 2)', () => {
    for (const args of [['--json'], ['--json', 'diff', POLICIES]]) {
      const r = policy(args, env);
      expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(2);
      expect(jsonOf(r).error).to.match(/^policy needs a command \(check, test, diff, push or pull\)/);
    }
    expect(policy([], env).code).to.equal(2);
    // With the command first, the same diff runs against the server.
    const ok = policy(['diff', POLICIES, '--json'], env);
    expect(ok.code, ok.stdout + ok.stderr).to.equal(0);
    expect(jsonOf(ok).ok).to.equal(true);
  });

  it('--url: a trailing slash works; a query or fragment is exit 2 saying so', () => {
    expect(policy(['diff', POLICIES, '--url', `${a.platform}/`], env).code).to.equal(0);
    for (const url of [`${a.platform}?tenant=x`, `${a.platform}/#top`, `${a.platform}/?`]) {
      const r = policy(['diff', POLICIES, '--json'], { ...env, ARBITER_URL: url });
      expect(r.code, `${url}: ${r.stdout}${r.stderr}`).to.equal(2);
      expect(jsonOf(r).error).to.contain('holds a query or fragment');
    }
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
    expect(r.stdout).to.not.contain('evaluation error');
    // A candidate that fails on recorded reads (two values for one rule): the count is printed.
    expect((await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    writeFileSync(
      path.join(dir, 'cli-new.rego'),
      'package authz.agent\n\nx := 1 if input.action == "read"\n\nx := 2 if input.confidence > 0.1\n\ndeny contains "never" if x == 3\n',
    );
    const failing = policy(['diff', dir], env);
    expect(failing.code, failing.stderr).to.equal(0);
    expect(failing.stdout, failing.stdout).to.match(
      /impact: [1-9]\d* of the \d+ would be a deny with an evaluation error/,
    );
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
    let races = 0;
    const proxy: Server = createServer((req, res) => {
      void forward(a.platform, req, async () => {
        if (req.method === 'POST' && req.url === '/api/v1/bundle') {
          raced = (
            await call('PUT', `${a.platform}/api/v1/policies/cli-racer`, {
              body: { rego: `${HARMLESS}# race ${++races}\n` },
            })
          ).json.revision as number;
        }
      }).then((r) => res.writeHead(r.status, { 'content-type': r.type }).end(r.body));
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
      // With --json: one JSON object saying so, the same exit.
      const j = await policyAsync(['push', dir, '--json'], {
        ARBITER_URL: `http://127.0.0.1:${port}`,
        ARBITER_KEY: ADMIN_KEY,
      });
      expect(j.code, j.stdout + j.stderr).to.equal(1);
      expect(jsonOf(j).error).to.contain('changed since the plan was made');
      expect(races).to.equal(2);
      expect(await names()).to.not.include('cli-late');
    } finally {
      await new Promise<void>((resolve) => proxy.close(() => resolve()));
      await call('DELETE', `${a.platform}/api/v1/policies/cli-racer`);
    }
  });

  it('push: a connection that breaks after the bundle was sent is exit 2 saying the outcome is unknown, not "cannot reach"', async () => {
    // A pass-through proxy that hands the bundle to the real server (which applies it) and then
    // drops the connection without an answer: a server killed or a proxy reset mid-push.
    let forwarded = 0;
    const proxy: Server = createServer((req, res) => {
      void forward(a.platform, req).then((r) => {
        if (req.method === 'POST' && req.url === '/api/v1/bundle') {
          forwarded = r.status;
          req.socket.destroy();
          return;
        }
        res.writeHead(r.status, { 'content-type': r.type }).end(r.body);
      });
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(proxy.address() as { port: number }).port}`;
      const dir = copyOfPolicies();
      writeFileSync(path.join(dir, 'cli-dropped.rego'), HARMLESS);
      const before = await revision();
      const r = await policyAsync(['push', dir, '--json'], { ARBITER_URL: url, ARBITER_KEY: ADMIN_KEY });
      expect(r.code, r.stdout + r.stderr).to.equal(2);
      const error = jsonOf(r).error as string;
      expect(error).to.not.contain('cannot reach');
      expect(error).to.match(
        /^POST \/api\/v1\/bundle: .* did not answer .*whether it took effect is unknown/,
      );
      // And here it did take effect: "cannot reach" would have said nothing was pushed.
      expect(forwarded).to.equal(200);
      expect(await revision()).to.equal(before + 1);
      expect(await names()).to.include('cli-dropped');
    } finally {
      proxy.closeAllConnections();
      await new Promise<void>((resolve) => proxy.close(() => resolve()));
      await call('DELETE', `${a.platform}/api/v1/policies/cli-dropped`);
    }
  });

  it('an https server whose certificate Node does not trust is exit 2 naming NODE_EXTRA_CA_CERTS, which then works', async () => {
    // A TLS front for the real server, with a self-signed certificate (an internal CA's, say).
    const cert = path.join(REPO, 'test', 'fixtures', 'tls-self-signed.crt');
    const front = createHttpsServer(
      {
        cert: readFileSync(cert),
        key: readFileSync(path.join(REPO, 'test', 'fixtures', 'tls-self-signed.key')),
      },
      (req, res) => {
        void forward(a.platform, req).then((r) =>
          res.writeHead(r.status, { 'content-type': r.type }).end(r.body),
        );
      },
    );
    await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve));
    try {
      const url = `https://127.0.0.1:${(front.address() as { port: number }).port}`;
      const untrusted = await policyAsync(['diff', POLICIES, '--json'], {
        ARBITER_URL: url,
        ARBITER_KEY: ADMIN_KEY,
      });
      expect(untrusted.code, untrusted.stdout + untrusted.stderr).to.equal(2);
      expect(jsonOf(untrusted).error).to.match(
        /^cannot reach https:\/\/127\.0\.0\.1:\d+: DEPTH_ZERO_SELF_SIGNED_CERT \(.*NODE_EXTRA_CA_CERTS/,
      );
      const trusted = await policyAsync(['diff', POLICIES], {
        ARBITER_URL: url,
        ARBITER_KEY: ADMIN_KEY,
        NODE_EXTRA_CA_CERTS: cert,
      });
      expect(trusted.code, trusted.stdout + trusted.stderr).to.equal(0);
      expect(trusted.stdout).to.contain('no changes');
      // And https:// to a port that speaks plain HTTP says so.
      const plain = await policyAsync(['diff', POLICIES], {
        ARBITER_URL: a.platform.replace(/^http:/, 'https:'),
        ARBITER_KEY: ADMIN_KEY,
      });
      expect(plain.code).to.equal(2);
      expect(plain.stderr).to.contain('does not speak TLS there');
    } finally {
      front.closeAllConnections();
      await new Promise<void>((resolve) => front.close(() => resolve()));
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
  it("pull --force: keeps the repository's layout and leaves a file already live byte for byte", async () => {
    // A repository as people keep one: nested policies, a CRLF file from a Windows editor, a
    // data document in a directory of its own, data.json indented its own way.
    const rbac = (await call('GET', `${a.platform}/api/v1/data/rbac`)).json.value;
    const root = JSON.parse(readFileSync(path.join(POLICIES, 'data.json'), 'utf8')) as Record<
      string,
      unknown
    >;
    delete root.rbac;
    const dir = tempDir({
      'team/cli/layout.rego': 'package authz.agent\r\n\r\ncli_layout := true\r\n',
      'team/cli/other.rego': 'package authz.agent\n\ncli_other := 1\n',
      'rbac/data.json': JSON.stringify(rbac),
      'data.json': JSON.stringify(root, null, 4),
    });
    for (const f of ['agent', 'budgets', 'delegation', 'human'])
      cpSync(path.join(POLICIES, `${f}.rego`), path.join(dir, `${f}.rego`));
    const pushed = policy(['push', dir, '--prune'], env);
    expect(pushed.code, pushed.stdout + pushed.stderr).to.equal(0);
    const snapshot = () => {
      const files: Record<string, string> = {};
      for (const e of readdirSync(dir, { recursive: true, withFileTypes: true }))
        if (e.isFile())
          files[path.relative(dir, path.join(e.parentPath, e.name))] = readFileSync(
            path.join(e.parentPath, e.name),
            'latin1',
          );
      return files;
    };
    const before = snapshot();
    // At the live revision: nothing in the directory changes.
    const same = policy(['pull', dir, '--force', '--json'], env);
    expect(same.code, same.stdout + same.stderr).to.equal(0);
    expect(snapshot()).to.deep.equal(before);
    expect(jsonOf(same).unchanged).to.have.length(Object.keys(before).length);
    // A live change is written to the file that holds it, and only that file changes.
    const changed = 'package authz.agent\n\ncli_other := 2\n';
    expect(
      (await call('PUT', `${a.platform}/api/v1/policies/team.cli.other`, { body: { rego: changed } })).status,
    ).to.equal(200);
    const after = policy(['pull', dir, '--force'], env);
    expect(after.code, after.stdout + after.stderr).to.equal(0);
    expect(snapshot()).to.deep.equal({ ...before, [path.join('team', 'cli', 'other.rego')]: changed });
    const back = policy(['push', dir, '--prune'], env);
    expect(back.stdout).to.contain('nothing to push');
    // Leave the set as the other tests expect it.
    for (const n of ['team.cli.layout', 'team.cli.other'])
      expect((await call('DELETE', `${a.platform}/api/v1/policies/${n}`)).status).to.equal(204);
  });

  it('diff and push: a symlinked policy or directory is exit 1, and push --prune does not delete the live policy it holds', async () => {
    expect(
      (await call('PUT', `${a.platform}/api/v1/policies/cli-linked`, { body: { rego: HARMLESS } })).status,
    ).to.equal(201);
    const before = await revision();
    const outside = tempDir({ 'cli-linked.rego': HARMLESS, 'team/x.rego': HARMLESS });
    for (const [name, target] of [
      ['cli-linked.rego', path.join(outside, 'cli-linked.rego')],
      ['team', path.join(outside, 'team')],
    ]) {
      const dir = copyOfPolicies();
      symlinkSync(target as string, path.join(dir, name as string));
      for (const args of [
        ['diff', dir],
        ['push', dir, '--prune'],
        ['push', dir, '--prune', '--json'],
      ]) {
        const r = policy(args, env);
        expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(1);
        expect(r.stderr).to.contain(`${path.join(dir, name as string)}: a symbolic link`);
        if (args.includes('--json')) jsonOf(r);
      }
    }
    expect(await revision()).to.equal(before);
    expect(await names()).to.include('cli-linked');
    expect((await call('DELETE', `${a.platform}/api/v1/policies/cli-linked`)).status).to.equal(204);
  });

  it('diff and push: a null data document or a non-finite number is exit 1 and the live document stays', async () => {
    expect((await call('PUT', `${a.platform}/api/v1/data/cli-kill`, { body: { on: true } })).status).to.equal(
      201,
    );
    const before = await revision();
    for (const [file, text, message] of [
      ['data.json', null, "data document cli-kill is null: a bundle's null deletes a document"],
      ['data.json', '1e400', 'data document cli-kill holds Infinity'],
    ] as const) {
      const dir = copyOfPolicies();
      const raw = readFileSync(path.join(dir, file), 'utf8').trimEnd();
      // The document spliced in as text: JSON.stringify would already have turned 1e400 into null.
      writeFileSync(path.join(dir, file), raw.replace(/\}$/, `, "cli-kill": ${String(text)}}`));
      for (const args of [
        ['diff', dir],
        ['push', dir],
        ['push', dir, '--json'],
      ]) {
        const r = policy(args, env);
        expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(1);
        expect(r.stderr).to.contain(`${path.join(dir, file)}: ${message}`);
        expect(r.stdout).to.not.match(/update +data +cli-kill/);
        if (args.includes('--json')) jsonOf(r);
      }
    }
    expect(await revision()).to.equal(before);
    const live = await call('GET', `${a.platform}/api/v1/data/cli-kill`);
    expect(live.status).to.equal(200);
    expect(live.json.value).to.deep.equal({ on: true });
    expect((await call('DELETE', `${a.platform}/api/v1/data/cli-kill`)).status).to.equal(204);
  });

  it('a Windows checkout (CRLF line endings, a BOM) of the repository policies is read as it is: check, test, diff, seeding', async () => {
    // git's core.autocrlf on Windows writes every text file with CRLF; some editors add a BOM.
    const dir = tempDir();
    for (const f of readdirSync(POLICIES)) {
      const text = readFileSync(path.join(POLICIES, f), 'utf8').replace(/\n/g, '\r\n');
      writeFileSync(path.join(dir, f), f === 'authz.rego' ? `\uFEFF${text}` : text);
    }
    for (const args of [
      ['check', dir],
      ['test', dir],
      ['diff', dir, '--json'],
    ]) {
      const r = policy(args, env);
      expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(0);
      expect(r.stderr).to.not.contain('authz.rego');
    }
    // The policies' bytes differ from the live ones (CRLF): an update each, and nothing else.
    const plan = jsonOf(policy(['diff', dir, '--json'], env)).plan as { policies: { update: string[] } };
    expect(plan.policies.update).to.deep.equal(['agent', 'budgets', 'delegation', 'human']);
    const b = await Arbiter.start({ ARBITER_POLICY_DIR: dir });
    try {
      const names = (await call('GET', `${b.platform}/api/v1/policies`)).json.policies as { name: string }[];
      expect(names.map((p) => p.name)).to.deep.equal(['agent', 'budgets', 'delegation', 'human']);
    } finally {
      await b.close();
    }
  });

  it('diff and push: a policy or data file named in another case (agent.Rego, Data.json) is exit 1, not skipped and pruned', async () => {
    expect(
      (await call('PUT', `${a.platform}/api/v1/policies/cli-case`, { body: { rego: HARMLESS } })).status,
    ).to.equal(201);
    expect((await call('PUT', `${a.platform}/api/v1/data/cli-case`, { body: { on: true } })).status).to.equal(
      201,
    );
    const before = await revision();
    for (const [file, text] of [
      ['cli-case.Rego', HARMLESS],
      ['cli-case/Data.json', '{"on": true}'],
      ['cli-case/DATA.YAML', 'on: true\n'],
    ] as const) {
      const dir = copyOfPolicies();
      // The other one of the pair, correctly named, so that only the odd file is in question.
      if (file.endsWith('.Rego')) {
        mkdirSync(path.join(dir, 'cli-case'));
        writeFileSync(path.join(dir, 'cli-case', 'data.json'), '{"on": true}');
      } else writeFileSync(path.join(dir, 'cli-case.rego'), HARMLESS);
      mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
      writeFileSync(path.join(dir, file), text);
      for (const args of [
        ['check', dir],
        ['diff', dir, '--prune'],
        ['push', dir, '--prune'],
      ]) {
        const r = policy(args, env);
        expect(r.code, `${file} ${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(1);
        expect(r.stderr).to.contain(`${path.join(dir, file)}: named like a`);
      }
    }
    expect(await revision()).to.equal(before);
    expect(await names()).to.include('cli-case');
    expect((await call('DELETE', `${a.platform}/api/v1/policies/cli-case`)).status).to.equal(204);
    expect((await call('DELETE', `${a.platform}/api/v1/data/cli-case`)).status).to.equal(204);
  });

  it('diff and push: a key repeated in one object of a data.json is exit 1 naming file and line; nothing is pushed', async () => {
    expect(
      (await call('PUT', `${a.platform}/api/v1/data/cli-dup`, { body: { admins: ['alice'] } })).status,
    ).to.equal(201);
    const before = await revision();
    const dir = copyOfPolicies();
    // What a reviewer reads first is alice and mallory; JSON.parse keeps the last: mallory alone.
    mkdirSync(path.join(dir, 'cli-dup'));
    writeFileSync(
      path.join(dir, 'cli-dup', 'data.json'),
      '{\n  "admins": ["alice", "mallory"],\n  "admins": ["mallory"]\n}\n',
    );
    for (const args of [
      ['check', dir],
      ['diff', dir],
      ['push', dir],
      ['push', dir, '--json'],
    ]) {
      const r = policy(args, env);
      expect(r.code, `${args.join(' ')}: ${r.stdout}${r.stderr}`).to.equal(1);
      expect(r.stderr).to.contain(
        `${path.join(dir, 'cli-dup', 'data.json')}:3: the key "admins" is repeated in one object`,
      );
      expect(r.stdout).to.not.match(/update +data +cli-dup/);
      if (args.includes('--json')) jsonOf(r);
    }
    expect(await revision()).to.equal(before);
    expect((await call('GET', `${a.platform}/api/v1/data/cli-dup`)).json.value).to.deep.equal({
      admins: ['alice'],
    });
    expect((await call('DELETE', `${a.platform}/api/v1/data/cli-dup`)).status).to.equal(204);
  });

  it('pull: a live null document is written with a warning that push refuses it; push then refuses and keeps it', async () => {
    expect(
      (
        await call('PUT', `${a.platform}/api/v1/data/cli-null`, {
          raw: 'null',
          headers: { 'content-type': 'application/json' },
        })
      ).status,
    ).to.equal(201);
    try {
      const dir = path.join(tempDir(), 'pulled');
      const r = policy(['pull', dir], env);
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stderr).to.contain('warning: data document cli-null is null');
      expect(r.stderr).to.contain('push refuse a null document');
      expect(JSON.parse(readFileSync(path.join(dir, 'data.json'), 'utf8'))).to.have.property(
        'cli-null',
        null,
      );
      const j = policy(['pull', path.join(tempDir(), 'pulled'), '--json'], env);
      expect(j.code).to.equal(0);
      expect(jsonOf(j).warnings).to.be.an('array').with.lengthOf(1);
      const before = await revision();
      const back = policy(['push', dir, '--prune'], env);
      expect(back.code, back.stdout + back.stderr).to.equal(1);
      expect(back.stderr).to.contain('data document cli-null is null');
      expect(await revision()).to.equal(before);
      expect((await call('GET', `${a.platform}/api/v1/data/cli-null`)).status).to.equal(200);
    } finally {
      await call('DELETE', `${a.platform}/api/v1/data/cli-null`);
    }
  });

  it('pull: never writes through a link (a file, a directory on the way, a FIFO), --force or not; links count as content', async () => {
    await call('PUT', `${a.platform}/api/v1/data/cli/nested`, { body: { deep: true } });
    try {
      const victim = path.join(tempDir(), 'victim');
      writeFileSync(victim, 'precious\n');
      const elsewhere = tempDir();
      const cases: [string, (dir: string) => void, string][] = [
        ['a linked policy file', (dir) => symlinkSync(victim, path.join(dir, 'agent.rego')), 'agent.rego'],
        [
          'a dangling link',
          (dir) => symlinkSync(path.join(elsewhere, 'new'), path.join(dir, 'budgets.rego')),
          'budgets.rego',
        ],
        ['a linked directory on the way', (dir) => symlinkSync(elsewhere, path.join(dir, 'cli')), 'cli'],
        ['a FIFO', (dir) => execFileSync('mkfifo', [path.join(dir, 'human.rego')]), 'human.rego'],
        ['a file where a directory goes', (dir) => writeFileSync(path.join(dir, 'cli'), 'x'), 'cli'],
      ];
      for (const [what, make, name] of cases) {
        for (const force of [false, true]) {
          const dir = tempDir();
          make(dir);
          const r = policy(['pull', dir, ...(force ? ['--force'] : [])], env);
          expect(r.code, `${what} ${force}: ${r.stdout}${r.stderr}`).to.equal(1);
          expect(r.stderr, what).to.contain(path.join(dir, name));
          expect(readdirSync(dir), what).to.deep.equal([name]);
        }
      }
      expect(readFileSync(victim, 'utf8')).to.equal('precious\n');
      expect(readdirSync(elsewhere)).to.deep.equal([]);
      // A link pull would not write through still means DIR is not empty; --force leaves it be.
      const dir = tempDir();
      symlinkSync(victim, path.join(dir, 'notes'));
      const r = policy(['pull', dir], env);
      expect(r.code).to.equal(1);
      expect(r.stderr).to.contain('already holds policies or data, or links (notes…); pass --force');
      const forced = policy(['pull', dir, '--force'], env);
      expect(forced.code, forced.stderr).to.equal(0);
      expect(lstatSync(path.join(dir, 'notes')).isSymbolicLink()).to.equal(true);
      expect(lstatSync(path.join(dir, 'agent.rego')).isFile()).to.equal(true);
      expect(readdirSync(dir).filter((f) => f.startsWith('.'))).to.deep.equal([]);
      expect(readFileSync(victim, 'utf8')).to.equal('precious\n');
    } finally {
      await call('DELETE', `${a.platform}/api/v1/data/cli/nested`);
    }
  });

  it('diff: 413 and other 4xx from the impact replay are exit 1; 429 is retried as Retry-After asks, then exit 2; 5xx is exit 2', async () => {
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-new.rego'), HARMLESS);
    // Real: a candidate larger than the server takes (1 MiB) is refused with 413, as push would be.
    const big = copyOfPolicies();
    mkdirSync(path.join(big, 'cli-big'));
    writeFileSync(path.join(big, 'cli-big', 'data.json'), JSON.stringify({ blob: 'x'.repeat(1_200_000) }));
    const before = await revision();
    const r413 = policy(['diff', big], env);
    expect(r413.code, r413.stdout + r413.stderr).to.equal(1);
    expect(r413.stdout).to.match(/the plan would be refused: the impact replay answered 413/);
    const j413 = policy(['diff', big, '--json'], env);
    expect(j413.code).to.equal(1);
    expect(jsonOf(j413).refused).to.match(/413/);
    expect(await revision()).to.equal(before);

    const impacts = (status: number, headers: Record<string, string> = {}, times = Infinity) => {
      let n = 0;
      return (req: { method: string; url: string }) =>
        req.method === 'POST' && req.url === '/api/v1/impact' && n++ < times
          ? { status, headers, body: { error: `canned ${status}` } }
          : undefined;
    };
    // Busy twice, then the real replay.
    let seen = 0;
    const twice = impacts(429, { 'retry-after': '1' }, 2);
    await withServer(
      (req) => {
        if (req.url === '/api/v1/impact') seen++;
        return twice(req);
      },
      async (url) => {
        const started = Date.now();
        const r = await policyAsync(['diff', dir], { ARBITER_URL: url, ARBITER_KEY: ADMIN_KEY });
        expect(r.code, r.stdout + r.stderr).to.equal(0);
        expect(r.stdout).to.match(/impact: \d+ of \d+ recent decisions would change/);
        expect(seen).to.equal(3);
        expect(Date.now() - started).to.be.at.least(2000);
      },
      a.platform,
    );
    for (const [answer, exit, message] of [
      [impacts(429, { 'retry-after': '3600' }), 2, /server is busy \(429 canned 429\)/],
      [impacts(503), 2, /the impact replay failed: 503 canned 503/],
      [impacts(500), 2, /the impact replay failed: 500/],
      [impacts(403), 1, /the plan would be refused: the impact replay answered 403 canned 403/],
      [impacts(422), 1, /answered 422/],
    ] as const) {
      await withServer(
        answer,
        async (url) => {
          for (const json of [false, true]) {
            const r = await policyAsync(['diff', dir, ...(json ? ['--json'] : [])], {
              ARBITER_URL: url,
              ARBITER_KEY: ADMIN_KEY,
            });
            expect(r.code, `${String(message)}: ${r.stdout}${r.stderr}`).to.equal(exit);
            expect(json ? String(jsonOf(r).error) : r.stdout + r.stderr).to.match(message);
            if (!json) expect(r.stdout).to.match(/create +policy cli-new/);
          }
        },
        a.platform,
      );
    }
    expect(await revision()).to.equal(before);
  });

  // Found by a race probe (2026-11-29): the 30 s were measured on the wall clock, so a clock
  // stepped back while diff waited (NTP) made it wait for the step as well.
  it('diff: waits for a busy replay 30 s in all, however far the wall clock steps back meanwhile', async function () {
    this.timeout(180_000);
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-new.rego'), HARMLESS);
    let pid: number | undefined;
    let stepped = false;
    await withServer(
      (req) => {
        if (req.method !== 'POST' || req.url !== '/api/v1/impact') return undefined;
        // At the first 429 the CLI's wall clock goes back an hour (test/fixtures/skew-clock.mjs).
        if (!stepped && pid !== undefined) {
          stepped = true;
          process.kill(pid, 'SIGUSR2');
        }
        return { status: 429, headers: { 'retry-after': '1' }, body: { error: 'canned 429' } };
      },
      async (url) => {
        const run = policyAsync(
          ['diff', dir],
          {
            ARBITER_URL: url,
            ARBITER_KEY: ADMIN_KEY,
            NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'skew-clock.mjs')}`,
            TEST_CLOCK_JUMP_MS: String(-3600_000),
          },
          (p) => (pid = p),
        );
        // Not a timing check: 30 s is the budget, 120 s four times that; it waited an hour before.
        const r = await Promise.race([run, sleep(120_000).then(() => undefined)]);
        if (r === undefined) {
          if (pid !== undefined) process.kill(pid, 'SIGKILL');
          expect.fail('diff was still waiting after 120 s');
        }
        expect(stepped).to.equal(true);
        expect(r.stderr).to.contain('wall clock stepped');
        expect(r.code, r.stdout + r.stderr).to.equal(2);
        expect(r.stdout + r.stderr).to.match(/server is busy \(429 canned 429\)/);
      },
      a.platform,
    );
  });

  it('push: needs policies:read and policies:write (write alone is a 403 naming both); --json on a 403', async () => {
    const writer = a.createKey('cli-writer', ['policies:write']);
    const both = a.createKey('cli-pusher', ['policies:read', 'policies:write']);
    const dir = copyOfPolicies();
    writeFileSync(path.join(dir, 'cli-scoped.rego'), HARMLESS);
    const before = await revision();
    const r = policy(['push', dir], { ARBITER_URL: a.platform, ARBITER_KEY: writer });
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain('403');
    expect(r.stderr).to.contain(
      'push needs a key with policies:read (to read the live set) and policies:write',
    );
    const j = policy(['push', dir, '--json'], { ARBITER_URL: a.platform, ARBITER_KEY: writer });
    expect(j.code).to.equal(1);
    expect(jsonOf(j).error).to.contain('403');
    expect(await revision()).to.equal(before);
    const ok = policy(['push', dir], { ARBITER_URL: a.platform, ARBITER_KEY: both });
    expect(ok.code, ok.stderr).to.equal(0);
    expect(await names()).to.include('cli-scoped');
    expect((await call('DELETE', `${a.platform}/api/v1/policies/cli-scoped`)).status).to.equal(204);
  });
});
