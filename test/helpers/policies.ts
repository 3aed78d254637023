// Rego fixtures more than one test file needs.

/**
 * Never finishes on a read (3000³ comparisons, allocating nothing: no memory limit ends it), and is
 * fast on anything else. `data.spin.items` is 0..2999; no a > b > c > a exists.
 */
export const SPIN = [
  'package authz.agent',
  '',
  'deny contains "never" if {',
  '\tinput.action == "read"',
  '\tsome a in data.spin.items',
  '\tsome b in data.spin.items',
  '\ta > b',
  '\tsome c in data.spin.items',
  '\tb > c',
  '\tc > a',
  '}',
  '',
].join('\n');

/**
 * A `thresholds` rule that never finishes (the same 3000³ comparisons as SPIN): the built-in
 * module's threshold check, and every agent decision, evaluate it.
 */
export const SPIN_THRESHOLDS = [
  'package authz.agent',
  '',
  'thresholds["read"] := {"deny_below": 0.1, "approval_below": 0.2} if {',
  '\tsome a in data.spin.items',
  '\tsome b in data.spin.items',
  '\ta > b',
  '\tsome c in data.spin.items',
  '\tb > c',
  '\tc > a',
  '}',
  '',
].join('\n');
