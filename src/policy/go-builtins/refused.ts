/** A builtin's deliberate refusal: it fails the evaluation closed rather than answer differently from OPA. */
export class Refused extends Error {}

export function refuse(fn: string, why: string): never {
  throw new Refused(`${fn}: ${why} (Arbiter refuses rather than answer differently from OPA)`);
}
