import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import fc from 'fast-check';
import { onceOnly } from './helpers/backends.js';
import { REPO } from './helpers/harness.js';
import { type Module, RegoCompiler } from '../src/policy/compiler.js';
import { Evaluator } from '../src/policy/evaluator.js';
import { checkPairedData, planPaired, planRules } from '../src/policy/paired.js';
import { Unsupported } from '../src/policy/paired-rules.js';
import { PlanThread } from '../src/policy/plan-thread.js';
import { shadowModules } from '../src/policy/shadow-set.js';

const opaBin = process.env.ARBITER_OPA_BIN || path.join(REPO, '.opa-bin', 'opa');
const example = (name: string): Module => ({
  name,
  rego: readFileSync(path.join(REPO, 'policies', `${name}.rego`), 'utf8'),
});
const EXAMPLE = ['agent', 'budgets', 'delegation', 'human'].map(example);
const DATA = JSON.parse(readFileSync(path.join(REPO, 'policies', 'data.json'), 'utf8')) as Record<
  string,
  unknown
>;
const AGENT = EXAMPLE[0]!.rego;
const HUMAN = EXAMPLE[3]!.rego;
const DELEGATION = EXAMPLE[2]!.rego;
expect(DELEGATION).to.include('"max": data.delegation.calls_per_user_per_hour,');

/** A module whose deny reads `flagged` (defined by `when`) with another action than the input's. */
const probe = (when: string) =>
  'package authz.agent\n\ndefault flagged := false\n\n' +
  `flagged if ${when}\n\n` +
  'deny contains "a grant would be flagged" if {\n\tinput.action == "read"\n\tflagged with input.action as "grant"\n}\n';

/** What `p` rejects with; undefined when it resolves. */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
    return undefined;
  } catch (e) {
    return e;
  }
}

/** agent.rego with `from` replaced by `to` (which must be there, once). */
function editAgent(from: string, to: string): Module {
  expect(AGENT.split(from).length, from).to.equal(2);
  return { name: 'agent', rego: AGENT.replace(from, to) };
}

// Inputs shaped as the decision service builds them (src/decisions/policy-input.ts), over the names
// the example policies and data know, and some they do not.
const ACTIONS = [
  'read', 'list', 'deploy', 'rollback', 'delete', 'logs.tail', 'invoices.pay', 'payments.transfer',
  'query', 'export', 'drop', 'grant', 'pay', 'create', 'update', 'never-sent',
]; // prettier-ignore
const RESOURCES = [
  'repo/arbiter', 'prod/api', 'prod/db', 'prod/secrets/k', 'staging/web', 'repo//x', '/lead', 'trail/',
  'pii/users', 'analytics/q1', 'accounts/treasury/x', 'accounts/operating', 'invoices/i-1',
  'vendors/sanctioned-co', 'ledger/2024', 'repo/legacy-billing', 'x',
]; // prettier-ignore
const PRINCIPAL = { name: 'test', tenant: null, agent: null };
const agentInput = fc.record(
  {
    kind: fc.constant('agent'),
    agent_id: fc.constantFrom('deploy-bot', 'finance-bot', 'data-bot', 'unknown-agent'),
    action: fc.constantFrom(...ACTIONS),
    resource: fc.constantFrom(...RESOURCES),
    confidence: fc.oneof(
      fc.constantFrom(0, 0.3, 0.5, 0.65, 0.85, 0.9, 0.95, 1),
      fc.double({ min: 0, max: 1, noNaN: true }),
    ),
    context: fc.constantFrom(
      {},
      { amount: 500, payee: 'vendors/paper-co' },
      { amount: 20000 },
      { amount: 300000 },
      { amount: 'lots' },
      { emergency: true },
      { payee: 'vendors/sanctioned-co', amount: 10 },
      { override: 'requested' },
      { override: 'granted' },
      { k: 'deny' },
      { k: 'allow' },
    ),
    principal: fc.constant(PRINCIPAL),
  },
  { requiredKeys: ['kind', 'agent_id', 'action', 'resource', 'context', 'principal'] },
);
// As many agent requests on behalf of a user as on their own: an optional key of fc.record is
// there most of the time, which left requests on their own too rare to find a wrong answer.
const delegatedInput = fc
  .tuple(
    agentInput,
    fc.constantFrom(
      { tenant_id: 'acme', user_id: 'alice' },
      { tenant_id: 'acme', user_id: 'bob' },
      { tenant_id: 'acme', user_id: 'mallory' },
      { tenant_id: 'globex', user_id: 'dave' },
    ),
  )
  .map(([input, on_behalf_of]) => ({ ...input, on_behalf_of }));
const humanInput = fc.record({
  kind: fc.constant('human'),
  tenant_id: fc.constantFrom('acme', 'globex', 'initech'),
  user_id: fc.constantFrom('alice', 'bob', 'carol', 'erin', 'mallory', 'dave', 'zed'),
  action: fc.constantFrom(...ACTIONS),
  resource: fc.record({
    type: fc.constantFrom('project', 'document', 'invoice', 'repo', ''),
    id: fc.constantFrom('p1', 'd1', 'i-9', ''),
  }),
  context: fc.constantFrom({}, { resource_tenant: 'globex' }, { resource_tenant: 'acme' }, { agent: 'x' }),
  principal: fc.constant(PRINCIPAL),
});
const anyInput = fc.oneof(agentInput, delegatedInput, humanInput);

interface PairCase {
  title: string;
  /** The live set (the example policies unless given). */
  live?: Module[];
  /** The shadow modules, each replacing or adding its name. */
  shadow: Module[];
  /** Rules the shadow side must evaluate again (a subset), and rules it must share. */
  copies?: string[];
  shares?: string[];
  extends?: string[];
  /**
   * The changed rules whose values the pass holds against the live ones before it evaluates the
   * copy (PairedPlan.compared); [] when it always evaluates the copy.
   */
  compares?: string[];
  /**
   * Of those, the multi-value rules compared by the members of only the rules that differ
   * between the two sides (PairedPlan.comparedByChanges).
   */
  comparesByChanges?: string[];
  /** Some inputs meet an evaluation error: no clean pair then. */
  errors?: boolean;
}

const CASES: PairCase[] = [
  {
    title: 'adds a deny rule: only the new rule and the decision module rules reading deny run again',
    shadow: [
      {
        name: 'candidate',
        rego: 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n',
      },
    ],
    extends: ['authz.agent.deny'],
    compares: ['authz.agent.deny'],
    comparesByChanges: ['authz.agent.deny'],
    copies: ['authz.deny_reasons', 'authz.base_decision', 'authz.decision'],
    shares: ['authz.agent.allow', 'authz.agent.require_approval', 'authz.approval_reasons', 'authz.allowed'],
  },
  {
    title: 'edits one require_approval rule of agent.rego',
    shadow: [
      editAgent(
        'require_approval contains "deploy to production requires approval"',
        'require_approval contains "deploy to prod needs approval"',
      ),
    ],
    copies: ['authz.agent.require_approval', 'authz.approval_reasons'],
    compares: ['authz.agent.require_approval'],
    // The edited rule's members against the live rule's, not the whole of require_approval.
    comparesByChanges: ['authz.agent.require_approval'],
    shares: ['authz.agent.deny', 'authz.agent.allow', 'authz.deny_reasons'],
  },
  {
    title: 'widens a rule that deny, allow and require_approval read (production)',
    shadow: [
      editAgent(
        'production if matches("prod/**", input.resource, "/")',
        'production if matches("prod/**", input.resource, "/")\n\nproduction if matches("staging/**", input.resource, "/")',
      ),
    ],
    copies: ['authz.agent.production', 'authz.agent.deny', 'authz.agent.require_approval'],
  },
  {
    title: 'changes a confidence threshold (a partial object with reference heads)',
    shadow: [
      editAgent(
        'thresholds["deploy"] := {"deny_below": 0.6, "approval_below": 0.9}',
        'thresholds["deploy"] := {"deny_below": 0.7, "approval_below": 0.95}',
      ),
    ],
    copies: ['authz.agent.thresholds'],
    shares: ['authz.agent.deny', 'authz.agent.allow'],
    compares: [],
  },
  {
    title: 'removes a deny rule (empty path segments are no longer refused)',
    shadow: [
      {
        name: 'agent',
        rego: AGENT.replace(
          'deny contains concat("", ["resource ", str(input.resource), " has an empty path segment"]) if empty_segment\n',
          '',
        ),
      },
    ],
    copies: ['authz.agent.deny'],
    // The removed rule's members against none.
    compares: ['authz.agent.deny'],
    comparesByChanges: ['authz.agent.deny'],
  },
  {
    title:
      'edits a deny rule and adds a require_approval rule reading deny: each compared by its changed rules',
    shadow: [
      {
        name: 'agent',
        rego: AGENT.replace(
          'deny contains "production deploys are frozen" if {',
          'deny contains "production is frozen" if {',
        ).replace(
          'require_approval contains "access to PII requires approval" if {',
          'require_approval contains "a denied read" if {\n\tinput.action == "read"\n\tcount(deny) > 0\n}\n\n' +
            'require_approval contains "access to PII requires approval" if {',
        ),
      },
    ],
    copies: ['authz.agent.deny'],
    extends: ['authz.agent.require_approval'],
    // The added rule reads deny by name: in its own package, the copy's deny, not its changed rules.
    compares: ['authz.agent.deny', 'authz.agent.require_approval'],
    comparesByChanges: ['authz.agent.deny', 'authz.agent.require_approval'],
  },
  {
    title: 'widens production and edits a deny rule: unchanged deny rules read the changed production',
    shadow: [
      {
        name: 'agent',
        rego: AGENT.replace(
          'production if matches("prod/**", input.resource, "/")',
          'production if matches("prod/**", input.resource, "/")\n\nproduction if matches("staging/**", input.resource, "/")',
        ).replace(
          'deny contains "production deploys are frozen" if {',
          'deny contains "production is frozen" if {',
        ),
      },
    ],
    compares: ['authz.agent.deny', 'authz.agent.production'],
    comparesByChanges: ['authz.agent.deny'],
  },
  {
    title: 'adds a helper package and a deny rule that imports it',
    shadow: [
      { name: 'lib-extra', rego: 'package lib.extra\n\nblocked(r) if startswith(r, "repo/")\n' },
      {
        name: 'candidate',
        rego: 'package authz.agent\n\nimport data.lib.extra\n\ndeny contains "repos are frozen" if extra.blocked(input.resource)\n',
      },
    ],
    extends: ['authz.agent.deny'],
  },
  {
    title: 'changes a helper that a live module reads through an import',
    live: [
      ...EXAMPLE,
      { name: 'risk', rego: 'package lib.risk\n\nrisky(a) if a == "drop"\n' },
      {
        name: 'risky',
        rego: 'package authz.agent\n\nimport data.lib.risk as r\n\ndeny contains "risky action" if r.risky(input.action)\n',
      },
    ],
    shadow: [{ name: 'risk', rego: 'package lib.risk\n\nrisky(a) if a in {"drop", "read", "query"}\n' }],
    copies: ['lib.risk.risky', 'authz.agent.deny'],
    shares: ['authz.agent.allow'],
    compares: [],
  },
  {
    title: 'changes the human rules, which delegated agent requests are also decided by',
    shadow: [{ name: 'human', rego: HUMAN.replace('is suspended in tenant', 'is on leave in tenant') }],
    copies: ['authz.human.deny'],
    shares: ['authz.agent.deny', 'authz.human.allow'],
    // Compared with the request's input and with the delegating user's (delegated_input).
    compares: ['authz.human.deny'],
    comparesByChanges: ['authz.human.deny'],
  },
  {
    title: 'changes a delegated budget, which the decision reads with the delegating user’s input',
    shadow: [
      {
        name: 'delegation',
        rego: DELEGATION.replace('"max": data.delegation.calls_per_user_per_hour,', '"max": 10,'),
      },
    ],
    copies: ['authz.human.limits', 'authz.decision_limits'],
    // Equal for every request's own input (no tenant_id in an agent's), unequal as the user's.
    compares: ['authz.human.limits'],
    comparesByChanges: ['authz.human.limits'],
  },
  {
    title: 'changes a rule that another reads with another input (with input.action): never compared',
    live: [...EXAMPLE, { name: 'probe', rego: probe('input.action == "drop"') }],
    shadow: [{ name: 'probe', rego: probe('input.action in {"drop", "grant"}') }],
    copies: ['authz.agent.flagged', 'authz.agent.deny'],
    // `flagged` is false for a read on both sides, yet the deny reads it as for a grant.
    compares: [],
  },
  {
    title: 'adds a rule that evaluates the live rules with another input (with input)',
    shadow: [
      {
        name: 'candidate',
        rego:
          'package authz.agent\n\nrequire_approval contains "data-bot could not" if {\n' +
          '\tinput.action == "read"\n\tnot data.authz.agent.allow with input.agent_id as "data-bot"\n}\n',
      },
    ],
    extends: ['authz.agent.require_approval'],
  },
  {
    title: 'changes a default rule (its text runs from `default` to the end of its head)',
    live: [
      ...EXAMPLE,
      {
        name: 'override',
        rego:
          'package authz.agent\n\ndefault override_allowed := false\n\n' +
          'override_allowed if input.context.override == "granted"\n\n' +
          'require_approval contains "override requested" if {\n\tinput.context.override == "requested"\n' +
          '\tnot override_allowed\n}\n',
      },
    ],
    shadow: [
      {
        name: 'override',
        rego:
          'package authz.agent\n\ndefault override_allowed := true\n\n' +
          'override_allowed if input.context.override == "granted"\n\n' +
          'require_approval contains "override requested" if {\n\tinput.context.override == "requested"\n' +
          '\tnot override_allowed\n}\n',
      },
    ],
    copies: ['authz.agent.override_allowed', 'authz.agent.require_approval'],
    shares: ['authz.agent.deny'],
  },
  // Found by an adversarial probe (2026-11-28), each once answered wrongly by the shadow side.
  {
    title: 'changes what an input import names (rules of the same text then mean another thing)',
    live: [
      ...EXAMPLE,
      {
        name: 'imp',
        rego: 'package authz.agent\n\nimport input.action as act\n\ndeny contains "act" if act == "deploy-bot"\n',
      },
    ],
    shadow: [
      {
        name: 'imp',
        rego: 'package authz.agent\n\nimport input.agent_id as act\n\ndeny contains "act" if act == "deploy-bot"\n',
      },
    ],
    copies: ['authz.agent.deny'],
  },
  {
    title: 'adds a rule reading an unchanged package under a changed one',
    live: [...EXAMPLE, { name: 'sub', rego: 'package authz.agent.sub\n\ny := 1\n' }],
    shadow: [
      {
        name: 'candidate',
        rego: 'package authz.agent\n\ndeny contains "sub" if {\n\tinput.action == "read"\n\tcount(data.authz.agent.sub) > 0\n}\n',
      },
    ],
    extends: ['authz.agent.deny'],
  },
  {
    title: 'adds a rule reading an unchanged package by a dynamic key, under the changed decision module',
    shadow: [
      {
        name: 'candidate',
        rego: 'package authz.agent\n\ndeny contains "h" if {\n\tx := data.authz.human[input.context.k]\n\tis_set(x)\n}\n',
      },
    ],
    extends: ['authz.agent.deny'],
  },
  {
    title: 'changes a helper that reads a package nested in its own',
    live: [
      ...EXAMPLE,
      { name: 'x', rego: 'package lib.x\n\nok := true\n' },
      { name: 'y', rego: 'package lib.x.y\n\nz := 1\n' },
      {
        name: 'uses-x',
        rego: 'package authz.agent\n\nimport data.lib.x\n\ndeny contains "x is ok" if {\n\tx.ok\n\tinput.action == "read"\n}\n',
      },
    ],
    shadow: [{ name: 'x', rego: 'package lib.x\n\nok if data.lib.x.y == {"z": 2}\n' }],
    copies: ['lib.x.ok', 'authz.agent.deny'],
  },
  {
    title: 'adds a partial object whose key is a data reference',
    shadow: [
      {
        name: 'candidate',
        rego:
          'package authz.agent\n\nprimary := "drop"\n\nlabel[data.authz.agent.primary] := "bad"\n\n' +
          'deny contains "labelled" if label[input.action] == "bad"\n',
      },
    ],
    extends: ['authz.agent.deny'],
  },
  {
    title: 'changes a rule that another reads into by a longer path (data.lib.cfg.limit.max)',
    live: [
      ...EXAMPLE,
      { name: 'cfg', rego: 'package lib.cfg\n\nlimit := {"max": 3}\n' },
      {
        name: 'over',
        rego: 'package authz.agent\n\ndeny contains "over" if input.context.amount > data.lib.cfg.limit.max\n',
      },
    ],
    shadow: [{ name: 'cfg', rego: 'package lib.cfg\n\nlimit := {"max": 1000}\n' }],
    copies: ['lib.cfg.limit', 'authz.agent.deny'],
  },
  // Found by a second probe (2026-11-28): reads inside a reference that starts with a literal.
  {
    title: 'changes a helper read inside an array literal ([data.lib.x.v][0])',
    live: [
      ...EXAMPLE,
      { name: 'x', rego: 'package lib.x\n\nv := "read"\n' },
      {
        name: 'u',
        rego: 'package authz.agent\n\ndeny contains "arr" if [data.lib.x.v][0] == input.action\n',
      },
    ],
    shadow: [{ name: 'x', rego: 'package lib.x\n\nv := "list"\n' }],
    copies: ['lib.x.v', 'authz.agent.deny'],
  },
  {
    title:
      'changes a rule its own package reads inside a literal and a call ([watched][0], object.keys({…}))',
    live: [
      ...EXAMPLE,
      {
        name: 'w',
        rego:
          'package authz.agent\n\nwatched := "read"\n\n' +
          'require_approval contains "w" if [watched][0] == input.action\n\n' +
          'require_approval contains "k" if object.keys({watched: 1})[input.action]\n',
      },
    ],
    shadow: [
      {
        name: 'w',
        rego:
          'package authz.agent\n\nwatched := "list"\n\n' +
          'require_approval contains "w" if [watched][0] == input.action\n\n' +
          'require_approval contains "k" if object.keys({watched: 1})[input.action]\n',
      },
    ],
    copies: ['authz.agent.watched', 'authz.agent.require_approval'],
  },
  {
    title:
      'adds a rule reading a changed helper both inside a literal and plainly, after an emoji on its line',
    live: [...EXAMPLE, { name: 'x', rego: 'package lib.x\n\nv := "read"\n\nw := "query"\n' }],
    shadow: [
      { name: 'x', rego: 'package lib.x\n\nv := "list"\n\nw := "export"\n' },
      {
        name: 'c',
        rego:
          'package authz.agent\n\ndeny contains "both" if { "🛑" != ""; [data.lib.x.v][0] == input.action }\n\n' +
          'deny contains "w" if { x := "🛑🛑"; count(x) == 2; data.lib.x.w == input.action }\n',
      },
    ],
    copies: ['lib.x.v', 'lib.x.w'],
    extends: ['authz.agent.deny'],
  },
  {
    title: 'adds a rule in a module that imports input',
    shadow: [
      {
        name: 'candidate',
        rego: 'package authz.agent\n\nimport input\n\ndeny contains "dropped" if input.action == "drop"\n',
      },
    ],
    extends: ['authz.agent.deny'],
  },
  { title: 'is the live set itself', shadow: [example('agent')], copies: [], extends: [] },
  {
    title: 'adds a package nothing reads: the shadow decision is the live one',
    shadow: [{ name: 'unused', rego: 'package lib.unused\n\nx := 1\n' }],
    copies: ['lib.unused.x'],
    shares: ['authz.decision', 'authz.deny_reasons'],
  },
  // Found by differential probing (2026-11-29): `==` holds 1 equal to 1.0 (and 1e3 to 1000, 0.5
  // to 0.50), so the changed rule was taken as unchanged and the shadow side answered the live
  // decision, while the shadow set on its own writes the number as it is written.
  {
    title:
      'writes a number of a changed rule as another, equal by == (1 to 1.0): json.marshal tells them apart',
    live: [
      ...EXAMPLE,
      {
        name: 'scale',
        rego:
          'package authz.agent\n\nscale := 1\n\n' +
          'deny contains concat("", ["scale ", json.marshal(scale)]) if input.action == "drop"\n',
      },
    ],
    shadow: [
      {
        name: 'scale',
        rego:
          'package authz.agent\n\nscale := 1.0\n\n' +
          'deny contains concat("", ["scale ", json.marshal(scale)]) if input.action == "drop"\n',
      },
    ],
    copies: ['authz.agent.scale', 'authz.agent.deny'],
    compares: ['authz.agent.scale'],
  },
  {
    title: 'writes a member of a changed multi-value rule as another, equal by == (1e3 to 1000)',
    live: [
      ...EXAMPLE,
      {
        name: 'fees',
        rego:
          'package authz.agent\n\nfees contains 1000\n\n' +
          'deny contains concat("", ["fees ", json.marshal(fees)]) if input.action == "drop"\n',
      },
    ],
    shadow: [
      {
        name: 'fees',
        rego:
          'package authz.agent\n\nfees contains 1e3\n\n' +
          'deny contains concat("", ["fees ", json.marshal(fees)]) if input.action == "drop"\n',
      },
    ],
    compares: ['authz.agent.fees'],
    comparesByChanges: ['authz.agent.fees'],
  },
  // Of two rules giving values equal by == but written differently, a complete rule keeps the
  // first one's: the copies are evaluated in the order of the set's own files, not of the list.
  {
    title:
      'adds a rule giving a value equal by == (1.0) to a live rule’s (1), in a module whose name sorts first',
    live: [
      ...EXAMPLE,
      {
        name: 'zscale',
        rego:
          'package authz.agent\n\nscale := 1 if input.action == "drop"\n\n' +
          'deny contains concat("", ["scale ", json.marshal(scale)]) if input.action == "drop"\n',
      },
    ],
    shadow: [{ name: 'ascale', rego: 'package authz.agent\n\nscale := 1.0 if input.confidence > 0.5\n' }],
    compares: ['authz.agent.scale'],
  },
  {
    title: 'adds a function that meets a conflict on some inputs (no clean pair there)',
    shadow: [
      {
        name: 'candidate',
        rego:
          'package authz.agent\n\npick(x) := 1 if x == "read"\n\npick(x) := 2 if startswith(x, "re")\n\n' +
          'deny contains "picked" if pick(input.action) == 3\n',
      },
    ],
    extends: ['authz.agent.deny'],
    errors: true,
  },
];

onceOnly('Paired evaluation: the live and a shadow set in one pass (ADR 0012)', () => {
  const compiler = new RegoCompiler(opaBin);
  before(async () => {
    await compiler.init();
  });
  after(async () => {
    await compiler.close();
  });

  const plan = async (live: Module[], shadow: Module[], data = DATA) => {
    const [l, s] = await Promise.all([compiler.parse(live), compiler.parse(shadowModules(live, shadow))]);
    return planPaired(l.modules, s.modules, l.builtin, data);
  };

  for (const c of CASES) {
    it(`answers exactly as the two sets on their own when the shadow set ${c.title}`, async function () {
      this.timeout(120_000);
      const live = c.live ?? EXAMPLE;
      const shadowSet = shadowModules(live, c.shadow);
      const p = await plan(live, c.shadow);
      for (const rule of c.copies ?? []) expect(p.copied, `${rule} is copied`).to.include(rule);
      for (const rule of c.shares ?? []) expect(p.copied, `${rule} is shared`).to.not.include(rule);
      if (c.copies?.length === 0) expect(p.copied).to.deep.equal([]);
      if (c.extends) expect(p.extended).to.deep.equal(c.extends);
      if (c.compares) expect(p.compared).to.deep.equal(c.compares);
      if (c.comparesByChanges) expect(p.comparedByChanges).to.deep.equal(c.comparesByChanges);
      const [pairedWasm, liveWasm, shadowWasm] = await Promise.all([
        compiler.compilePaired(live, p.modules),
        compiler.compile(live),
        compiler.compile(shadowSet),
      ]);
      const [paired, liveSet, shadow] = await Promise.all(
        [pairedWasm, liveWasm, shadowWasm].map((w) => Evaluator.create(w, DATA, 1, 10_000)),
      );
      let unpaired = 0;
      fc.assert(
        fc.property(anyInput, (input) => {
          const both = paired!.evaluatePair(input);
          const own = { live: liveSet!.evaluate(input), shadow: shadow!.evaluate(input, 'shadow') };
          if (both === undefined) {
            // No clean pair only where one of the two fails on its own: the caller then uses them.
            unpaired++;
            expect(own.live.error ?? own.shadow.error, JSON.stringify(input)).to.be.a('string');
            return;
          }
          expect(both, JSON.stringify(input)).to.deep.equal(own);
        }),
        { numRuns: 400, seed: 20261128 },
      );
      if (c.errors) expect(unpaired, 'some inputs meet the error').to.be.greaterThan(0);
      else expect(unpaired).to.equal(0);
    });
  }

  it('copies none of the example policies for a candidate that adds a deny rule: each is an alias of the live rule', async function () {
    this.timeout(60_000);
    const p = await plan(EXAMPLE, CASES[0]!.shadow);
    const rules = p.modules.map((m) => m.rego).join('\n');
    // Every rule of the example policies is an alias or shared, not copied.
    expect(rules).to.include('allow := data.authz.agent.allow');
    expect(rules).to.include(
      'deny contains arbiter_shadow_v if some arbiter_shadow_v in data.authz.agent.deny',
    );
    expect(rules).to.not.include('known_agent if');
  });

  describe('refuses to pair what the copy could read differently from the shadow set', () => {
    const refused: {
      title: string;
      shadow: Module[];
      live?: Module[];
      data?: Record<string, unknown>;
      why: RegExp;
    }[] = [
      {
        title: 'a rule reading the whole of data',
        shadow: [{ name: 'c', rego: 'package authz.agent\n\ndeny contains "x" if data[input.action]\n' }],
        why: /reads the whole of data/,
      },
      {
        title: 'a live rule reading the whole of data (it would see the copy)',
        live: [...EXAMPLE, { name: 'walker', rego: 'package lib.walk\n\nn := count([x | walk(data, x)])\n' }],
        shadow: [{ name: 'c', rego: 'package authz.agent\n\ndeny contains "x" if input.action == "read"\n' }],
        why: /reads the whole of data/,
      },
      {
        title: 'a copied rule reading a whole package the shadow set changes',
        shadow: [
          {
            name: 'c',
            rego: 'package authz.agent\n\nrequire_approval contains "many" if count(data.authz.agent) > 100\n',
          },
        ],
        why: /reads the whole of data\.authz\.agent, which holds a changed package/,
      },
      {
        title: 'a copied rule replacing data with `with`',
        shadow: [
          {
            name: 'c',
            rego: 'package authz.agent\n\ndeny contains "w" if {\n\tnot data.authz.agent.allow with data.agents as {}\n}\n',
          },
        ],
        why: /uses with on data/,
      },
      {
        title: 'data documents under a package the shadow set changes',
        shadow: [{ name: 'c', rego: 'package lib.x\n\ny := 1\n' }],
        live: [...EXAMPLE, { name: 'x', rego: 'package lib.x\n\ny := 2\n' }],
        data: { ...DATA, lib: { x: { z: 1 } } },
        why: /data documents lie under package lib\.x/,
      },
      {
        title: 'a rule of several bodies (each a rule whose text lacks the head)',
        shadow: [
          {
            name: 'c',
            rego:
              'package authz.agent\n\nflagged if { input.action == "x" } { input.action == "y" }\n\n' +
              'deny contains "flagged" if flagged\n',
          },
        ],
        why: /has a body apart from its head/,
      },
      {
        // Its name once ran into lib.a.b's in the planner's keys: nothing was copied.
        title: 'a changed package whose quoted name is not made of names (a NUL in it)',
        live: [
          ...EXAMPLE,
          { name: 'p1', rego: 'package lib.a.b\n\nx := 1\n' },
          { name: 'reads', rego: 'package authz.agent\n\ndeny contains "x is set" if data.lib.a.b.x == 1\n' },
        ],
        shadow: [{ name: 'p1', rego: 'package lib["a\\u0000b"]\n\nx := 1\n' }],
        why: /has a segment that is not a name/,
      },
      {
        // Were deny taken as only extended, its live members would be the old limit's.
        title: 'a rule the shadow set adds to, whose live rules read a whole package it changes',
        live: [
          ...EXAMPLE,
          { name: 'cfg', rego: 'package lib.cfg\n\nlimit := {"max": 3}\n' },
          {
            name: 'over',
            rego:
              'package authz.agent\n\ndeny contains "over" if {\n\tcfg := data.lib.cfg\n' +
              '\tinput.context.amount > cfg.limit.max\n}\n',
          },
        ],
        shadow: [
          { name: 'cfg', rego: 'package lib.cfg\n\nlimit := {"max": 1000}\n' },
          {
            name: 'c',
            rego: 'package authz.agent\n\ndeny contains "reads are off" if input.action == "read"\n',
          },
        ],
        why: /reads the whole of data\.lib\.cfg, which holds a changed package/,
      },
      {
        title: 'a package in the copy’s own namespace',
        shadow: [{ name: 'c', rego: 'package __arbiter_shadow.authz\n\ny := 1\n' }],
        why: /is reserved/,
      },
      {
        title: 'a data document named like the copy’s namespace',
        shadow: [{ name: 'c', rego: 'package authz.agent\n\ndeny contains "x" if input.action == "read"\n' }],
        data: { ...DATA, __arbiter_shadow: {} },
        why: /data document is named __arbiter_shadow/,
      },
    ];
    for (const r of refused) {
      it(`refuses ${r.title}`, async () => {
        const error = await rejection(plan(r.live ?? EXAMPLE, r.shadow, r.data));
        expect(error).to.be.instanceOf(Unsupported);
        expect((error as Error).message).to.match(r.why);
      });
    }

    it('refuses each of them just the same when planned on a thread of its own, the data checked here', async function () {
      this.timeout(120_000);
      const planner = new PlanThread(opaBin);
      try {
        for (const r of refused) {
          const live = r.live ?? EXAMPLE;
          let error: unknown;
          try {
            const { changedPackages } = await planner.plan(live, shadowModules(live, r.shadow));
            checkPairedData(r.data ?? DATA, changedPackages);
          } catch (e) {
            error = e;
          }
          expect(error, r.title).to.be.instanceOf(Unsupported);
          expect((error as Error).message, r.title).to.match(r.why);
        }
      } finally {
        await planner.close();
      }
    });
  });

  describe('planned on a thread of its own (plan-thread.ts)', () => {
    it('plans exactly what planRules plans on this thread, for every case above, one thread for all', async function () {
      this.timeout(120_000);
      const planner = new PlanThread(opaBin);
      try {
        for (const c of CASES) {
          const live = c.live ?? EXAMPLE;
          const shadow = shadowModules(live, c.shadow);
          const [l, s] = await Promise.all([compiler.parse(live), compiler.parse(shadow)]);
          const here = planRules(l.modules, s.modules, l.builtin);
          const there = await planner.plan(live, shadow);
          expect(there, c.title).to.deep.equal(here);
          expect(there.plan.modules.length, c.title).to.be.greaterThan(0);
        }
      } finally {
        await planner.close();
      }
    });

    it('rejects a module that does not parse, and is not Unsupported; the thread goes on planning', async function () {
      this.timeout(60_000);
      const planner = new PlanThread(opaBin);
      try {
        const error = await rejection(
          planner.plan(EXAMPLE, [
            ...EXAMPLE,
            { name: 'broken', rego: 'package authz.agent\n\ndeny contains {\n' },
          ]),
        );
        expect(error).to.be.instanceOf(Error).and.not.instanceOf(Unsupported);
        expect((error as Error).message).to.match(/^planning the paired module failed: opa parse failed/);
        const ok = await planner.plan(EXAMPLE, shadowModules(EXAMPLE, CASES[0]!.shadow));
        expect(ok.plan.copied).to.include('authz.deny_reasons');
      } finally {
        await planner.close();
      }
    });

    it('stops a plan that takes longer than its time, says so, and closes without waiting for it', async function () {
      this.timeout(60_000);
      // Starting a thread and its compiler takes far longer than a millisecond.
      const planner = new PlanThread(opaBin, 1);
      const error = await rejection(planner.plan(EXAMPLE, EXAMPLE));
      expect((error as Error).message).to.equal('planning the paired module took longer than 1 ms');
      await planner.close();
      // Closed while a plan waits: the plan fails at once, the close ends.
      const slow = new PlanThread(opaBin);
      const waiting = slow.plan(EXAMPLE, EXAMPLE).then(
        () => 'planned',
        (e: Error) => e.message,
      );
      await slow.close();
      expect(await waiting).to.equal('the planning thread was closed');
    });

    describe('with an `opa` that can be made slow, hang or fail to start', () => {
      // A wrapper around the real compiler: `opa parse` of a module that says `hang-here` records
      // its pid and directory and never ends; one that says `slow-here` takes 2 s more; and
      // `opa capabilities` (the first thing a compiler runs) fails while `fail-start` exists.
      let dir = '';
      let wrapper = '';
      before(() => {
        dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-plan-test-'));
        wrapper = path.join(dir, 'opa');
        writeFileSync(
          wrapper,
          '#!/bin/sh\n' +
            `if [ "$1" = capabilities ] && [ -e '${dir}/fail-start' ]; then echo 'cannot start' >&2; exit 3; fi\n` +
            `if [ "$1" = parse ] && grep -q hang-here m.rego; then echo "$PWD" > '${dir}/cwd'; echo $$ > '${dir}/pid.tmp'; mv '${dir}/pid.tmp' '${dir}/pid'; exec sleep 300; fi\n` +
            `if [ "$1" = parse ] && grep -q slow-here m.rego; then sleep 2; fi\n` +
            `exec '${opaBin}' "$@"\n`,
        );
        chmodSync(wrapper, 0o755);
      });
      after(() => rmSync(dir, { recursive: true, force: true }));
      afterEach(() => {
        for (const f of ['fail-start', 'pid', 'cwd']) rmSync(path.join(dir, f), { force: true });
      });

      const extra = (name: string, marker: string): Module => ({
        name,
        rego: `package authz.agent\n\n# ${marker}\ndeny contains "${name}" if input.action == "never-sent"\n`,
      });
      const SHADOW = shadowModules(EXAMPLE, CASES[0]!.shadow);
      const until = async (what: string, ok: () => boolean, ms: number) => {
        for (const end = Date.now() + ms; !ok();) {
          if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      /** The hanging `opa parse`: its pid and the compiler's work directory (the parse ran in a subdirectory). */
      const hanging = async () => {
        await until('the hanging opa parse started', () => existsSync(path.join(dir, 'pid')), 60_000);
        const pid = Number(readFileSync(path.join(dir, 'pid'), 'utf8'));
        const workDir = path.dirname(readFileSync(path.join(dir, 'cwd'), 'utf8').trim());
        expect(workDir).to.match(/arbiter-opa-/);
        return { pid, workDir };
      };
      /** Ended and reaped: no longer in /proc (a zombie still is). */
      const ended = (pid: number) => !existsSync(`/proc/${pid}`);

      it('times a plan from when the thread began it, not while it waited behind another', async function () {
        this.timeout(60_000);
        const planner = new PlanThread(wrapper, 3_500);
        try {
          await planner.plan(EXAMPLE, SHADOW); // the thread started, the example modules parsed
          // Each takes 2 s and a little; the second waits 2 s more behind the first. Timed from
          // when they were asked, the second would be over its 3.5 s.
          const [a, b] = await Promise.all([
            planner.plan(EXAMPLE, [...EXAMPLE, extra('slow1', 'slow-here 1')]),
            planner.plan(EXAMPLE, [...EXAMPLE, extra('slow2', 'slow-here 2')]),
          ]);
          expect(a.plan.modules.length).to.be.greaterThan(0);
          expect(b.plan.modules.length).to.be.greaterThan(0);
        } finally {
          await planner.close();
        }
      });

      it('ends the `opa` processes of a plan it stops for its time and removes its files; the next plan starts a new thread', async function () {
        this.timeout(120_000);
        const planner = new PlanThread(wrapper, 3_000);
        try {
          await planner.plan(EXAMPLE, SHADOW);
          const error = await rejection(planner.plan(EXAMPLE, [...EXAMPLE, extra('stuck', 'hang-here')]));
          expect((error as Error).message).to.equal('planning the paired module took longer than 3000 ms');
          const { pid, workDir } = await hanging();
          await until('the hanging opa parse ended', () => ended(pid), 10_000);
          await until('the work directory removed', () => !existsSync(workDir), 10_000);
          const again = await planner.plan(EXAMPLE, SHADOW);
          expect(again.plan.copied).to.include('authz.deny_reasons');
        } finally {
          await planner.close();
        }
      });

      it('ends the `opa` processes and files of a plan in progress when closed, and plans nothing after', async function () {
        this.timeout(120_000);
        const planner = new PlanThread(wrapper);
        const waiting = planner.plan(EXAMPLE, [...EXAMPLE, extra('stuck', 'hang-here')]).then(
          () => 'planned',
          (e: Error) => e.message,
        );
        const { pid, workDir } = await hanging();
        await planner.close();
        expect(await waiting).to.equal('the planning thread was closed');
        await until('the hanging opa parse ended', () => ended(pid), 10_000);
        expect(existsSync(workDir), 'the work directory').to.equal(false);
        const error = await rejection(planner.plan(EXAMPLE, SHADOW));
        expect((error as Error).message).to.equal('the planning thread was closed');
      });

      it('fails a plan whose thread could not start its compiler, and starts a new thread for the next', async function () {
        this.timeout(120_000);
        const planner = new PlanThread(wrapper);
        try {
          writeFileSync(path.join(dir, 'fail-start'), '');
          const error = await rejection(planner.plan(EXAMPLE, SHADOW));
          expect(error).to.be.instanceOf(Error).and.not.instanceOf(Unsupported);
          expect((error as Error).message).to.match(
            /^planning the paired module failed: its compiler did not start: cannot run the OPA compiler at .* \(cannot start\)/,
          );
          rmSync(path.join(dir, 'fail-start'));
          const ok = await planner.plan(EXAMPLE, SHADOW);
          expect(ok.plan.copied).to.include('authz.deny_reasons');
        } finally {
          await planner.close();
        }
      });
    });
  });
});
