// Rego fixtures more than one test file needs.

/** `data.spin.items` for the fixtures below: 0..2999, so no a > b > c > a exists. */
export const SPIN_ITEMS = Array.from({ length: 3000 }, (_, i) => i);

/** 3000³ comparisons that allocate nothing (no memory limit ends them): never finishes in practice. */
const SPINNING = [
  '\tsome a in data.spin.items',
  '\tsome b in data.spin.items',
  '\ta > b',
  '\tsome c in data.spin.items',
  '\tb > c',
  '\tc > a',
];

/** Never finishes on a read with SPIN_ITEMS as `data.spin.items`, and is fast on anything else. */
export const SPIN = [
  'package authz.agent',
  '',
  'deny contains "never" if {',
  '\tinput.action == "read"',
  ...SPINNING,
  '}',
  '',
].join('\n');

/** A deny rule that never finishes (SPIN_ITEMS as `data.spin.items`) on inputs where `condition` holds. */
export function spinsWhen(condition: string): string {
  return [
    'package authz.agent',
    '',
    'deny contains "never" if {',
    `\t${condition}`,
    ...SPINNING,
    '}',
    '',
  ].join('\n');
}

/**
 * A `thresholds` rule that never finishes (the same comparisons as SPIN): the built-in module's
 * threshold check, and every agent decision, evaluate it.
 */
export const SPIN_THRESHOLDS = [
  'package authz.agent',
  '',
  'thresholds["read"] := {"deny_below": 0.1, "approval_below": 0.2} if {',
  ...SPINNING,
  '}',
  '',
].join('\n');

/** `data.slow.items` for denyReadsSlowOn: 0..699. */
export const SLOW_ITEMS = Array.from({ length: 700 }, (_, i) => i);

/** A deny that never holds, n² comparisons over `data.slow.items`, on a request for `resource`. */
const slowRule = (resource: string): string[] => [
  'deny contains "never" if {',
  `\tinput.resource == "${resource}"`,
  '\tsome a in data.slow.items',
  '\tsome b in data.slow.items',
  '\ta > b',
  '\tb > a',
  '}',
  '',
];

/** A package that is slow (slowRule) on a request for `resource`, and changes no answer. */
export const slowOn = (resource: string): string =>
  ['package authz.agent', '', ...slowRule(resource)].join('\n');

/**
 * A package that denies reads at once (with `reason`), and takes ~25 ms more (700² comparisons
 * over SLOW_ITEMS, a deny that never holds) on a request for `resource`: slower than the shadow
 * set may be on the serving thread (5 ms), well within the eval budget.
 */
export const denyReadsSlowOn = (reason: string, resource: string): string =>
  [
    'package authz.agent',
    '',
    `deny contains "${reason}" if input.action == "read"`,
    '',
    ...slowRule(resource),
  ].join('\n');
