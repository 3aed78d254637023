/**
 * JSON with object keys sorted (by UTF-16 code units, as Array.prototype.sort does) at every
 * depth and no insignificant whitespace: the same content always gives the same text. Strings and
 * numbers are written exactly as JSON.stringify writes them, so lone surrogates and control
 * characters come out as ASCII `\uXXXX` escapes: the text is always well-formed and NUL-free.
 * Members whose value is `undefined` are left out, as JSON.stringify leaves them out.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value ?? null);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(',')}}`;
}
