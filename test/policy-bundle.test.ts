import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call, REPO } from './helpers/harness.js';

/**
 * `policies/` is what a security team copies into its own git repository: it must test, evaluate
 * and build there with stock opa, with nothing from the rest of this repository.
 */
/** The OPA CLI the tests use: the one the service compiles with. */
const opaPath = () => process.env.ARBITER_OPA_BIN || path.join(REPO, '.opa-bin', 'opa');

// `opa` on a copy of the directory touches no storage: once (on the SQLite run).
onceOnly('policies/ is a complete OPA bundle on its own', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-bundle-'));
    cpSync(path.join(REPO, 'policies'), path.join(dir, 'policies'), { recursive: true });
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  const opa = (...args: string[]) => spawnSync(opaPath(), args, { cwd: dir, encoding: 'utf8' });

  it('holds an exact copy of the built-in decision module (comments aside)', () => {
    const builtin = readFileSync(path.join(REPO, 'src', 'policy', 'rego', 'authz.rego'), 'utf8');
    const bundled = readFileSync(path.join(REPO, 'policies', 'authz.rego'), 'utf8');
    expect(bundled.endsWith(builtin), 'policies/authz.rego differs from src/policy/rego/authz.rego').to.equal(
      true,
    );
    for (const line of bundled
      .slice(0, bundled.length - builtin.length)
      .split('\n')
      .filter(Boolean)) {
      expect(line).to.match(/^#/);
    }
  });

  it('passes `opa test policies/` in a copy of the directory alone', () => {
    const r = opa('test', 'policies/');
    expect(r.status, r.stdout + r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^PASS: \d+\/\d+/m);
  });

  it('answers data.authz.decision with `opa eval -b policies/`', () => {
    const input = spawnSync(
      opaPath(),
      ['eval', '-b', 'policies/', '--stdin-input', '--format', 'json', 'data.authz.decision'],
      {
        cwd: dir,
        encoding: 'utf8',
        input: JSON.stringify({ kind: 'agent', context: {}, ...AGENT.allow }),
      },
    );
    expect(input.status, input.stderr).to.equal(0);
    const out = JSON.parse(input.stdout) as { result: { expressions: { value: { status: string } }[] }[] };
    expect(out.result[0]?.expressions[0]?.value.status).to.equal('allow');
  });

  it('builds with `opa build -b policies/`', () => {
    const r = opa('build', '-b', 'policies/', '-o', path.join(dir, 'bundle.tar.gz'));
    expect(r.status, r.stderr).to.equal(0);
  });
});

// Seeding stores the policies: every backend.
onEveryBackend('policies/ seeded into the service', () => {
  it('is seeded into the service without the copy of the built-in module', async () => {
    const a = await Arbiter.start();
    try {
      const names = (
        (await call('GET', `${a.platform}/api/v1/policies`)).json.policies as { name: string }[]
      ).map((p) => p.name);
      expect(names).to.not.include('authz');
      expect(names).to.include.members(['agent', 'human']);
    } finally {
      await a.close();
    }
  });
});
