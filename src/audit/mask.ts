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
