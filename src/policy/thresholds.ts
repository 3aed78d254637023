import type { Module } from './compiler.js';

/**
 * Where a threshold error comes from, for the 400 that refuses the change: the rows of the
 * `thresholds` rules in `package authz.agent` modules, narrowed to those that name the action the
 * error is about when any do. The error itself comes from evaluating the built-in module; this
 * only points the author at the source.
 */
export function locateThresholdError(modules: Module[], error: string): string {
  const key = /^thresholds\[("(?:[^"\\]|\\.)*")\]/.exec(error)?.[1];
  const hits: { at: string; named: boolean }[] = [];
  for (const m of modules) {
    if (!/^\s*package\s+authz\.agent\s*$/m.test(m.rego)) continue;
    m.rego.split('\n').forEach((line, i) => {
      if (/^\s*thresholds\b/.test(line)) {
        hits.push({ at: `policy ${m.name}:${i + 1}`, named: key !== undefined && line.includes(key) });
      }
    });
  }
  const named = hits.filter((h) => h.named);
  const chosen = named.length > 0 ? named : hits;
  return chosen.length > 0 ? chosen.map((h) => h.at).join(', ') : 'data';
}

/** The threshold errors of a set whose thresholds could not be checked, saying why: refused. */
export const uncheckedThresholds = (why: string): string[] => [`thresholds could not be checked: ${why}`];

/** The message of a change refused for its thresholds: each error with its location. */
export function thresholdErrorMessage(modules: Module[], errors: string[]): string {
  return `invalid confidence thresholds: ${errors
    .slice(0, 10)
    .map((e) => `${locateThresholdError(modules, e)}: ${e}`)
    .join('; ')}`;
}
