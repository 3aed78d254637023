/**
 * Replaces configured fields (dotted paths such as `context.ssn`) before anything is stored, so
 * secrets an agent sends never reach the audit trail or the review queue. A path passes through
 * arrays: `context.cards.number` masks the number of every card when `cards` is a list of them,
 * as it does when `cards` is one object.
 */
export const MASK = '[masked]';

export function makeMasker(
  fields: readonly string[],
): (doc: Record<string, unknown>) => Record<string, unknown> {
  if (fields.length === 0) return (doc) => doc;
  const paths = fields.map((f) => f.split('.'));
  return (doc) => {
    let out = doc;
    for (const p of paths) out = maskPath(out, p);
    return out;
  };
}

function maskPath(node: Record<string, unknown>, path: string[]): Record<string, unknown> {
  const [head, ...rest] = path;
  if (head === undefined || !Object.prototype.hasOwnProperty.call(node, head)) return node;
  if (rest.length === 0) return { ...node, [head]: MASK };
  return { ...node, [head]: maskWithin(node[head], rest) };
}

/** `value` with `path` masked in it: in an object, or in each element of an array (nested or not). */
function maskWithin(value: unknown, path: string[]): unknown {
  if (Array.isArray(value)) return value.map((v) => maskWithin(v, path));
  if (typeof value !== 'object' || value === null) return value;
  return maskPath(value as Record<string, unknown>, path);
}

/**
 * The values masking took out of `original` to make `masked` (what `makeMasker` made of it): the
 * strings and numbers under every member replaced by MASK. For text that may quote them.
 */
export function maskedValues(original: unknown, masked: unknown): string[] {
  const out: string[] = [];
  const leaves = (v: unknown): void => {
    if (typeof v === 'string' || typeof v === 'number') out.push(String(v));
    else if (typeof v === 'object' && v !== null) for (const x of Object.values(v)) leaves(x);
  };
  const walk = (o: unknown, m: unknown): void => {
    if (o === m) return;
    if (m === MASK) return leaves(o);
    if (typeof o !== 'object' || o === null || typeof m !== 'object' || m === null) return;
    for (const [k, v] of Object.entries(o)) walk(v, (m as Record<string, unknown>)[k]);
  };
  walk(original, masked);
  return out.filter((s) => s !== '' && s !== MASK);
}

/** `text` with every occurrence of each of `values` replaced by MASK (the longest first). */
export function withoutValues(text: string, values: readonly string[]): string {
  let out = text;
  for (const v of [...values].sort((a, b) => b.length - a.length)) out = out.split(v).join(MASK);
  return out;
}
