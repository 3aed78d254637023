import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { loadPolicy, type LoadedPolicy } from '@open-policy-agent/opa-wasm';
import { expect } from 'chai';
import fc from 'fast-check';
import { extractFromTarGz } from '../src/policy/compiler.js';
import { REPO } from './helpers/harness.js';

const opaBin = process.env.ARBITER_OPA_BIN || path.join(REPO, '.opa-bin', 'opa');

/**
 * Asks, for each case [pattern, value, delimiter], what the example policy's matches() answers and
 * what glob.match answers ("error" when it refuses the pattern).
 */
const CHECK = `package globcheck

import data.authz.agent

results := [r |
	some c in input.cases
	r := {"ours": ours(c), "glob": globbed(c)}
]

ours(c) := true if agent.matches(c[0], c[1], c[2])
else := false

globbed(c) := x if x := glob.match(c[0], [c[2]], c[1])
else := "error"
`;

// Patterns and values built from the pieces where a shortcut could go wrong: separators,
// wildcards at the ends and in the middle, escapes, classes and alternatives.
const PATTERN_PIECES = ['a', 'b', 'ab', '/', '.', '*', '**', '?', '[ab]', '{a,b}', '\\*', '-', '/**', '.*'];
// Values hold the patterns' own metacharacters too: a shortcut that compares a pattern's prefix as
// text must not take "[ab]/x" for a match of "[ab]/**".
const VALUE_PIECES = ['a', 'b', 'ab', '/', '.', '*', '-', 'a/b', 'a.b', '?', '[ab]', '{a,b}', '\\*', '\\'];
const joined = (pieces: string[]) =>
  fc.array(fc.constantFrom(...pieces), { maxLength: 5 }).map((p) => p.join(''));
/** A value: unrelated to the pattern, the pattern's own text, or a prefix of it with a tail. */
const kase = fc
  .tuple(
    joined(PATTERN_PIECES),
    joined(VALUE_PIECES),
    fc.nat(),
    fc.constantFrom(0, 1, 2),
    fc.constantFrom('/', '.'),
  )
  .map(([pattern, other, cut, how, delimiter]): [string, string, string] => [
    pattern,
    how === 0 ? other : how === 1 ? pattern : pattern.slice(0, cut % (pattern.length + 1)) + other,
    delimiter,
  ]);

describe('example policies (policies/agent.rego)', function () {
  this.timeout(120_000);
  let policy: LoadedPolicy;

  before(async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'arbiter-globcheck-'));
    try {
      await writeFile(path.join(dir, 'check.rego'), CHECK);
      const out = path.join(dir, 'bundle.tar.gz');
      await promisify(execFile)(opaBin, [
        'build',
        '-t',
        'wasm',
        '-e',
        'globcheck/results',
        '-o',
        out,
        path.join(REPO, 'policies', 'agent.rego'),
        path.join(dir, 'check.rego'),
      ]);
      const wasm = extractFromTarGz(await readFile(out), '/policy.wasm');
      if (!wasm) throw new Error('opa build produced no policy.wasm');
      policy = await loadPolicy(wasm);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  const answers = (cases: [string, string, string][]) =>
    (policy.evaluate({ cases }) as { result: { ours: boolean; glob: boolean | 'error' }[] }[])[0]?.result ??
    [];

  it('matches() answers exactly what glob.match answers, in WebAssembly, for generated patterns', () => {
    fc.assert(
      fc.property(fc.array(kase, { minLength: 1, maxLength: 50 }), (cases) => {
        const got = answers(cases);
        expect(got).to.have.length(cases.length);
        got.forEach((a, i) => {
          // A pattern glob.match refuses (an unclosed class) matches nothing: it grants no scope.
          const want = a.glob === 'error' ? false : a.glob;
          expect(a.ours, JSON.stringify(cases[i])).to.equal(want);
        });
      }),
      { numRuns: 500 },
    );
  });

  it('the generated patterns reach every clause: literals, "/**", ".*", other globs and refused ones', () => {
    const cases: [string, string, string][] = [
      ['ab', 'ab', '/'],
      ['a/**', 'a/b', '/'],
      ['a.*', 'a.b', '.'],
      ['a/*/b', 'a/x/b', '/'],
      ['[ab', '[ab', '/'],
    ];
    expect(answers(cases)).to.deep.equal([
      { ours: true, glob: true },
      { ours: true, glob: true },
      { ours: true, glob: true },
      { ours: true, glob: true },
      { ours: false, glob: 'error' },
    ]);
  });
});

// SPEC §4: scripts/build-rego.ts compiles a policy directory exactly as the service does.
describe('scripts/build-rego.ts', function () {
  this.timeout(120_000);
  const script = path.join(REPO, 'dist', 'scripts', 'build-rego.js');
  const run = (dir: string, out: string) =>
    promisify(execFile)(process.execPath, [script, '--dir', dir, '--out', out], { cwd: REPO }).then(
      (r) => ({ code: 0, ...r }),
      (e: { code: number; stdout: string; stderr: string }) => e,
    );

  it("compiles the repository's policies/ to WebAssembly, with the built-in decision module", async () => {
    const tmp = await mkdtemp(path.join(os.tmpdir(), 'arbiter-build-rego-'));
    try {
      const r = await run(path.join(REPO, 'policies'), path.join(tmp, 'policy.wasm'));
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout).to.match(/^compiled \d+ policies \(agent, /);
      const wasm = await readFile(path.join(tmp, 'policy.wasm'));
      const loaded = await loadPolicy(wasm);
      expect(Object.keys(loaded.entrypoints)).to.include('authz/decision');
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  });

  it('refuses, as a PUT would, a policy calling a builtin the evaluator lacks (exit 1, naming it)', async () => {
    const tmp = await mkdtemp(path.join(os.tmpdir(), 'arbiter-build-rego-'));
    try {
      await writeFile(
        path.join(tmp, 'fetch.rego'),
        'package authz.agent\n\nallow if http.send({"method": "GET", "url": "http://x"}).status_code == 200\n',
      );
      const r = await run(tmp, path.join(tmp, 'policy.wasm'));
      expect(r.code).to.equal(1);
      expect(r.stderr).to.match(/policy set does not compile: .*builtin http\.send is not allowed/);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  });
});
