/**
 * Replaces configured fields (dotted paths such as `context.ssn`) before anything is stored, so
 * secrets an agent sends never reach the audit trail or the review queue.
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
  const child = node[head];
  if (typeof child !== 'object' || child === null || Array.isArray(child)) return node;
  return { ...node, [head]: maskPath(child as Record<string, unknown>, rest) };
}
