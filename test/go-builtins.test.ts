import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { onEveryBackend } from './helpers/backends.js';
import { Arbiter, call, REPO } from './helpers/harness.js';

const run = promisify(execFile);
const OPA = path.join(REPO, '.opa-bin', 'opa');

/**
 * sprintf, regex.split, yaml.* and time.parse_* against OPA itself. Every case is one Rego
 * expression, evaluated by the running service (its evaluator, through the decision API) and by
 * `opa eval` on the very same module and input. What each side computed is compared as the text
 * json.marshal gave, so that no digit is lost on the way to the comparison.
 *
 *   same    both give a value, and the same one
 *   error   OPA's builtin errors (the rule is undefined; an error with --strict-builtin-errors):
 *           Arbiter fails closed (deny, "policy evaluation failed: …")
 *   refused OPA gives a value Arbiter cannot be sure to reproduce: Arbiter fails closed
 */
type Expect = 'same' | 'error' | 'refused';

/** a0: &a0 [x × n], then a1: &a1 [*a0 × m] … up to a<levels>, as Rego string-literal text. */
function bomb(n: number, m: number, levels: number): string {
  let s = `a0: &a0 [${Array<string>(n).fill('x').join(',')}]\\n`;
  for (let l = 1; l <= levels; l++)
    s += `a${l}: &a${l} [${Array<string>(m)
      .fill(`*a${l - 1}`)
      .join(',')}]\\n`;
  return s;
}

/** The same with a0: &a0 {? k0, …}: keys without values, an empty scalar each that go-yaml counts. */
function nullBomb(n: number, m: number, levels: number): string {
  let s = `a0: &a0 {${Array.from({ length: n }, (_, i) => `? k${i}`).join(', ')}}\\n`;
  for (let l = 1; l <= levels; l++)
    s += `a${l}: &a${l} [${Array<string>(m)
      .fill(`*a${l - 1}`)
      .join(',')}]\\n`;
  return s;
}

const CASES: [string, Expect][] = [
  // sprintf: the probe's finding, and Go's fmt for each kind of value.
  ['sprintf("%v", [{"env": "prod"}])', 'refused'],
  ['sprintf("%v", [["a", 1]])', 'refused'],
  ['sprintf("%v", [{1, 2}])', 'refused'],
  ['sprintf("%s-%d", ["a", 7])', 'same'],
  ['sprintf("%d", [1.5])', 'same'],
  ['sprintf("%s", [12])', 'same'],
  ['sprintf("%v", [null])', 'same'],
  ['sprintf("%d", [null])', 'same'],
  ['sprintf("%v %t", [true, false])', 'same'],
  ['sprintf("%v %v", [1])', 'same'],
  ['sprintf("%v", [1, "a", 2.5, null])', 'same'],
  ['sprintf("abc%", [])', 'same'],
  ['sprintf("%z", [1])', 'same'],
  ['sprintf("%v%%", [1])', 'same'],
  ['sprintf("%v", [9007199254740993])', 'refused'],
  ['sprintf("%d", [12345678901234567890])', 'refused'],
  ['sprintf("%d", [-9007199254740991])', 'same'],
  ['sprintf("%v|%g|%G|%v", [1500000.5, 1e-7, 1e-7, 1000000])', 'same'],
  ['sprintf("%v|%v|%v|%v", [123456.5, 1234567.5, 0.0001, 0.00001])', 'same'],
  ['sprintf("%v|%v|%v", [0.1, -2.5e-10, 5e-324])', 'same'],
  ['sprintf("%v", [1.5e20])', 'refused'],
  ['sprintf("%v", [1.7976931348623157e308])', 'refused'],
  ['sprintf("%v", [2.5 * 2])', 'same'],
  ['sprintf("%v", [10 / 4])', 'same'],
  ['sprintf("%e|%E|%f|%F", [1.5, 123.25, 0.0078125, 2.5])', 'same'],
  ['sprintf("%f|%f|%e", [0.1, 123456.789, 0.000123456789])', 'same'],
  ['sprintf("%e|%f|%g", [1, 2, 3])', 'same'],
  ['sprintf("%q", ["a\\"\\n\\u00e9\\u0001\\u00a0x\\u00ad\\u007f\\u0085\\t"])', 'same'],
  ['sprintf("%q", ["\\u200b"])', 'refused'],
  ['sprintf("%q", ["日本"])', 'refused'],
  ['sprintf("%x|%X|%x|%X", ["hé", "hé", -255, 3054])', 'same'],
  ['sprintf("%q|%t|%x", [true, 1, null])', 'same'],
  // %T: the Go type OPA converted to; an integral number may have been 1.0 (float64) to OPA.
  ['sprintf("%T|%T|%T|%T|%T|%T", ["a", 1.5, true, null, [1], {"a": {1}}])', 'same'],
  ['sprintf("%T", [])', 'same'],
  ['sprintf("%T", [1])', 'refused'],
  ['sprintf("%T", [1.0])', 'refused'],
  ['sprintf("%T", [12345678901234567890])', 'refused'],
  ['sprintf("%T %v", ["a", [1]])', 'refused'],
  ['sprintf("%5d", [3])', 'refused'],
  ['sprintf("%.2f", [3.14159])', 'refused'],
  ['sprintf("%x", [1.5])', 'refused'],
  // yaml.unmarshal / yaml.is_valid: go-yaml v3 under sigs.k8s.io/yaml.
  ['yaml.unmarshal("a: 1\\na: 2")', 'same'],
  ['yaml.unmarshal("privileged: true\\nprivileged: false")', 'same'],
  ['yaml.unmarshal("{a: 1, a: 2}")', 'same'],
  ['yaml.unmarshal("c: 012\\nf: 1_000\\nh: 0x1F\\no: 0o12\\nb: 0b101\\ne: 08\\ng: 1.5e3\\nz: 1.0")', 'same'],
  ['yaml.unmarshal("b: [yes, no, on, off, y, n, Yes, TRUE, True, False, ~, null, Null]")', 'same'],
  ['yaml.unmarshal("t: 2024-01-01\\nu: 2024-01-01T00:00:00Z\\ns: 1:20")', 'same'],
  ['yaml.unmarshal("a: &x {k: 1}\\nb: *x")', 'same'],
  ['yaml.unmarshal("a: 1\\n---\\nb: 2")', 'same'],
  ['yaml.unmarshal("a: 1\\n---\\n[")', 'error'],
  ['yaml.unmarshal("a: [1")', 'error'],
  ['yaml.unmarshal("x: .inf")', 'error'],
  ['yaml.unmarshal("null: a")', 'error'],
  ['yaml.unmarshal("a: 1__0\\nb: -0b1_1\\nc: .5\\nd: +12\\ne: 1_0.5\\nf: -.inf")', 'error'],
  ['yaml.unmarshal("a: 1__0\\nb: -0b1_1\\nc: .5\\nd: +12\\ne: 1_0.5")', 'same'],
  ['yaml.unmarshal("1: a\\ntrue: b")', 'same'],
  ['yaml.unmarshal("")', 'same'],
  ['yaml.unmarshal("- a\\n- \'b\'\\n- \\"c\\"\\n- !!str 1")', 'same'],
  ['yaml.unmarshal("x: 123456789012345678901\\ny: 1e400")', 'same'],
  ['yaml.unmarshal("x: 9007199254740993")', 'refused'],
  ['yaml.unmarshal("a:\\n  <<: {b: 1}\\n  c: 2")', 'refused'],
  [
    'yaml.unmarshal("x: \\"a\\\\tb\\\\u00e9\\"\\ny: \'it\'\'s\'\\nz: |\\n  l1\\n  l2\\nw: >-\\n  f1\\n  f2\\n")',
    'same',
  ],
  ['yaml.unmarshal("# only a comment")', 'same'],
  ['yaml.unmarshal("---\\n")', 'same'],
  ['yaml.unmarshal("~")', 'same'],
  ['yaml.unmarshal("a: !!int 3")', 'refused'],
  ['yaml.unmarshal("a: ! 3")', 'refused'],
  ['yaml.unmarshal("b: !!str true\\nc: !!null ~\\nd: !!bool false")', 'same'],
  ['yaml.unmarshal("a:\\n  - {b: [1, 2], c: null}\\n  - -3\\n  - +.5e1\\n  - 1e3")', 'same'],
  ['yaml.unmarshal("a: b: c")', 'error'],
  ['yaml.unmarshal("\\ta: 1")', 'error'],
  // An alias bomb (330 bytes, 10^7 nodes expanded): go-yaml stops it ("excessive aliasing"),
  // Arbiter counts as go-yaml does and stops at the same node; just below the bound it is valid.
  [`yaml.unmarshal("${bomb(10, 10, 6)}")`, 'error'],
  [`yaml.is_valid("${bomb(10, 10, 6)}")`, 'same'],
  [`yaml.is_valid("${bomb(2, 2, 9)}")`, 'same'],
  [`yaml.unmarshal("${bomb(2, 2, 8)}")`, 'same'],
  [`yaml.is_valid("${bomb(5, 3, 6)}")`, 'same'],
  [`yaml.unmarshal("${bomb(5, 3, 5)}")`, 'same'],
  [`yaml.is_valid("${nullBomb(2, 2, 8)}")`, 'same'],
  [`yaml.is_valid("${nullBomb(1, 60, 2)}")`, 'same'],
  [`yaml.unmarshal("${nullBomb(1, 40, 2)}")`, 'same'],
  // What go-yaml refuses before the grammar: characters outside YAML's set (anywhere), directives
  // other than %YAML 1.1 and %TAG (each once a document), content after "..." without "---".
  ['yaml.is_valid("a: \\u0001")', 'same'],
  ['yaml.is_valid("a: \\u007f")', 'same'],
  ['yaml.is_valid("a: \\u0080")', 'same'],
  ['yaml.is_valid("a: \\ufffe")', 'same'],
  ['yaml.is_valid("a: 1\\n---\\nb: 1 # \\u0001")', 'same'],
  ['yaml.unmarshal("a: \\u0001")', 'error'],
  ['yaml.unmarshal("\\ufeffa: \\ufeff\\u00a0")', 'same'],
  ['yaml.is_valid("%FOO bar\\n---\\na: 1")', 'same'],
  ['yaml.is_valid("%YAML 1.3\\n---\\na: 1")', 'same'],
  ['yaml.is_valid("%YAML 2.0\\n---\\na: 1")', 'same'],
  ['yaml.is_valid("%YAML 1.2\\n---\\na: 1")', 'same'],
  ['yaml.is_valid("%YAML 1.1\\n%YAML 1.1\\n---\\na: 1")', 'same'],
  ['yaml.is_valid("%TAG !a! tag:x,2000:\\n%TAG !a! tag:x,2000:\\n---\\na: 1")', 'same'],
  [
    'yaml.unmarshal("%YAML 01.01 # c\\n%TAG !a! tag:x,2000:\\n---\\na: 1\\n...\\n%YAML 1.1\\n%TAG !a! tag:y,2000:\\n---\\nb: 1")',
    'same',
  ],
  ['yaml.unmarshal("a: 1\\n...\\nb: 2")', 'error'],
  ['yaml.is_valid("a: 1\\n...\\nb: 2")', 'same'],
  ['yaml.is_valid("...\\na: 1")', 'same'],
  ['yaml.unmarshal("a: 1\\n...\\n# c\\n---\\nb: 2\\n...\\n")', 'same'],
  // go-yaml breaks lines at CR, NEL, LS and PS too: Arbiter refuses those.
  ['yaml.is_valid("a: 1\\u2028b: 2")', 'refused'],
  ['yaml.is_valid("a: 1\\u0085b: 2")', 'refused'],
  ['yaml.is_valid("a: 1\\rb: 2")', 'refused'],
  ['yaml.unmarshal("a: \\"x\\u2029y\\"")', 'refused'],
  ['yaml.unmarshal("a: 1\\r\\nb: 2")', 'same'],
  ['yaml.is_valid("a: 1\\na: 2")', 'same'],
  ['yaml.is_valid("a: [1")', 'same'],
  ['yaml.is_valid("")', 'same'],
  // regex.split: RE2 syntax JS cannot take (or takes differently) is refused.
  ['regex.split("[,;]", "a,b;c")', 'same'],
  ['regex.split(",", "a,,b,")', 'same'],
  ['regex.split("", "abc")', 'same'],
  ['regex.split("x*", "axbxxc")', 'same'],
  ['regex.split("(,)", "a,b")', 'same'],
  ['regex.split("\\\\s+", "a b\\tc\\u000bd")', 'same'],
  ['regex.split(".", "a\\rb")', 'same'],
  ['regex.split("a{2}", "baab")', 'same'],
  ['regex.split(",", "")', 'same'],
  // Backtracking JS, linear RE2: a repeated group that repeats or alternates inside is refused.
  ['regex.split("(?:\\\\s*,\\\\s*)+", "a , b,,c")', 'refused'],
  ['regex.split("(a+)+", "aab")', 'refused'],
  ['regex.split("(a|a)*", "aab")', 'refused'],
  ['regex.split("(a+){2}", "aaaa")', 'refused'],
  // An escaped *, + or ? before a ? is a literal, so that ? repeats: not a lazy marker.
  ['regex.split("(?:\\\\*?\\\\*?)+x", "**x")', 'refused'],
  ['regex.split("(?:\\\\+?\\\\+?)+x", "++x")', 'refused'],
  ['regex.split("(?:a*?b)", "aab")', 'same'],
  ['regex.split("(a|b)?c|(ab)+|(a+){1}|(x)*?y", "xacbabyd")', 'same'],
  ['regex.split("(?i)x", "aXb")', 'refused'],
  ['regex.split("\\\\pL", "a1b")', 'refused'],
  ['regex.split("[", "a")', 'error'],
  // time.parse_rfc3339_ns: Go's time.Parse(time.RFC3339, …), then OPA's int64 range.
  ['time.parse_rfc3339_ns("2024-06-31T00:00:00Z")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01T24:00:00Z")', 'error'],
  ['time.parse_rfc3339_ns("2023-02-29T00:00:00Z")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:60Z")', 'error'],
  ['time.parse_rfc3339_ns("2024-02-29t13:14:15z")', 'error'],
  ['time.parse_rfc3339_ns("2024-02-29T13:14:15Z")', 'same'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00.5+05:30")', 'same'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00,25Z")', 'same'],
  ['time.parse_rfc3339_ns("2024-01-01T5:00:00Z")', 'same'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00+24:60")', 'same'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00+25:00")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00+05:61")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00.Z")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01T00:00:00")', 'error'],
  ['time.parse_rfc3339_ns("2024-01-01 00:00:00Z")', 'error'],
  ['time.parse_rfc3339_ns("0000-01-01T00:00:00Z")', 'error'],
  ['time.parse_rfc3339_ns("1677-09-21T00:12:43.145224191Z")', 'error'],
  ['time.parse_rfc3339_ns("2262-04-11T23:47:16.854775808Z")', 'error'],
  ['time.parse_rfc3339_ns("1970-01-01T00:00:00.123456789123Z")', 'same'],
  // time.parse_duration_ns: Go's time.ParseDuration (with OPA's d, w, y).
  ['time.parse_duration_ns("5.s")', 'same'],
  ['time.parse_duration_ns(".5s")', 'same'],
  ['time.parse_duration_ns("1h30m")', 'same'],
  ['time.parse_duration_ns("-1.5s")', 'same'],
  ['time.parse_duration_ns("1d")', 'same'],
  ['time.parse_duration_ns("1.5w")', 'refused'],
  ['time.parse_duration_ns("1µs1μs1us")', 'same'],
  ['time.parse_duration_ns("0")', 'same'],
  ['time.parse_duration_ns("-0")', 'same'],
  ['time.parse_duration_ns("1.0000000001s")', 'same'],
  // A fraction of d, w or y: OPA's own arithmetic, not reproduced.
  ['time.parse_duration_ns("2.3d")', 'refused'],
  ['time.parse_duration_ns("0.1y")', 'refused'],
  ['time.parse_duration_ns("2.0d1.d2.3h")', 'same'],
  ['time.parse_duration_ns("3000000h")', 'error'],
  ['time.parse_duration_ns("9223372036854775808ns")', 'error'],
  ['time.parse_duration_ns("1")', 'error'],
  ['time.parse_duration_ns("")', 'error'],
  ['time.parse_duration_ns("1h-1m")', 'error'],
  ['time.parse_duration_ns(".s")', 'error'],
  ['time.parse_duration_ns("1D")', 'error'],
];

/** One module holds every case; input.context.case picks the one that runs. */
function module(): string {
  const rules = CASES.map(
    ([expr], i) =>
      `deny contains json.marshal([${i}, v]) if {\n\tinput.context.case == ${i}\n\tv := ${expr}\n}\n`,
  );
  return `package authz.agent\n\n${rules.join('\n')}`;
}

/**
 * json.marshal's text with the keys sorted: OPA sorts an object's keys, the wasm build's
 * json.marshal keeps the order of its own object layout, which is not what is compared here.
 */
function canonical(text: string): string {
  const sort = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(sort)
      : v !== null && typeof v === 'object'
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sort((v as Record<string, unknown>)[k])]),
          )
        : v;
  return JSON.stringify(sort(JSON.parse(text)));
}

/** OPA's answer for case i: the json.marshal text, or undefined when the rule is undefined. */
async function opaEval(dir: string, i: number): Promise<string | undefined> {
  const input = path.join(dir, `input-${i}.json`);
  writeFileSync(input, JSON.stringify({ context: { case: i } }));
  const { stdout } = await run(OPA, [
    'eval',
    '-f',
    'json',
    '-d',
    path.join(dir, 'probe.rego'),
    '-i',
    input,
    'data.authz.agent.deny',
  ]);
  const out = JSON.parse(stdout) as { result: { expressions: { value: string[] }[] }[] };
  const reasons = out.result[0]?.expressions[0]?.value ?? [];
  expect(reasons.length).to.be.at.most(1);
  return reasons[0];
}

onEveryBackend('builtins as OPA computes them (sprintf, regex.split, yaml.*, time.parse_*)', () => {
  let a: Arbiter;
  let dir: string;
  const opa = new Map<number, string | undefined>();

  before(async function () {
    this.timeout(120_000);
    a = await Arbiter.start();
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-go-builtins-'));
    const rego = module();
    writeFileSync(path.join(dir, 'probe.rego'), rego);
    const put = await call('PUT', a.platform + '/api/v1/policies/go-builtins', { body: { rego } });
    expect(put.status, put.text).to.be.oneOf([200, 201]);
    for (let i = 0; i < CASES.length; i += 8) {
      const batch = CASES.slice(i, i + 8).map((_, k) => i + k);
      const answers = await Promise.all(batch.map((n) => opaEval(dir, n)));
      batch.forEach((n, k) => opa.set(n, answers[k]));
    }
  });
  after(async () => {
    await a.close();
    rmSync(dir, { recursive: true, force: true });
  });

  CASES.forEach(([expr, want], i) => {
    it(`${want}: ${expr}`, async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: {
          agent_id: 'deploy-bot',
          action: 'probe',
          resource: 'x',
          confidence: 0.99,
          context: { case: i },
        },
      });
      expect(r.status, r.text).to.equal(403);
      const theirs = opa.get(i);
      if (want === 'same') {
        expect(theirs, 'opa eval gives a value').to.be.a('string');
        expect(canonical(r.json.message as string), r.text).to.equal(canonical(theirs as string));
      } else {
        expect(r.json.status).to.equal('deny');
        expect(r.json.message, r.text).to.match(/^policy evaluation failed: /);
        if (want === 'error') expect(theirs, 'opa eval: the builtin errors').to.equal(undefined);
        else expect(theirs, 'opa eval gives a value Arbiter refuses to guess').to.be.a('string');
      }
    });
  });

  it('refuses yaml.marshal when the policy is written (its output is not reproduced), naming it', async () => {
    const rego = 'package authz.agent\n\ndeny contains yaml.marshal({"a": 1}) if input.action == "x"\n';
    const put = await call('PUT', a.platform + '/api/v1/policies/go-yaml-marshal', { body: { rego } });
    expect(put.status, put.text).to.equal(400);
    expect(put.json.error).to.contain('yaml.marshal');
  });

  it('the probe: sprintf("%v") of different objects no longer makes them equal (not allow)', async () => {
    const data = await call('PUT', `${a.platform}/api/v1/data/allowed_targets`, {
      body: [{ env: 'staging', service: 'web' }],
    });
    expect(data.status, data.text).to.be.oneOf([200, 201]);
    const rego =
      'package authz.agent\n\nallow if sprintf("%v", [input.context.target]) in {sprintf("%v", [t]) | some t in data.allowed_targets}\n';
    const put = await call('PUT', a.platform + '/api/v1/policies/go-builtins', { body: { rego } });
    expect(put.status, put.text).to.be.oneOf([200, 201]);
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: {
        agent_id: 'deploy-bot',
        action: 'deploy',
        resource: 'payments-db',
        confidence: 0.99,
        context: { target: { env: 'prod', service: 'payments-db' } },
      },
    });
    expect(r.json.status, r.text).to.equal('deny');
    expect(r.status).to.equal(403);
  });
});
