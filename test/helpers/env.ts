/** A test's tuning knob from the environment (runs, seed, …): `def` when unset, else a non-negative integer or a thrown error naming it. */
export function intEnv(name: string, def: number): number {
  const v = process.env[name];
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${v}`);
  return n;
}
