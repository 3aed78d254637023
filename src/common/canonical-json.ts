/**
 * JSON with object keys sorted (by UTF-16 code units, as Array.prototype.sort does) at every
 * depth and no insignificant whitespace: the same content always gives the same text. Strings and
 * numbers are written exactly as JSON.stringify writes them, so lone surrogates and control
 * characters come out as ASCII `\uXXXX` escapes: the text is always well-formed and NUL-free.
 * Members whose value is `undefined` are left out, as JSON.stringify leaves them out.
 *
 * Every audit event and request digest goes through this, so it is built for speed: a copy with
 * its keys inserted in sorted order is written by the native JSON.stringify (about twice as fast
 * as writing the text in JavaScript). V8 lists integer-like keys ("7", "10") first in numeric
 * order whatever the insertion order, and `__proto__` cannot be inserted as a plain key, so an
 * object holding such a key is written by the JavaScript writer instead; both give the same text
 * (test/canonical-json.test.ts holds them to the reference definition).
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value ?? null);
  const copy = sortedCopy(value);
  return copy === UNSORTABLE ? written(value) : JSON.stringify(copy);
}

const UNSORTABLE = Symbol('unsortable');

/** Whether V8 would not keep `key` in insertion order, or could not insert it as data. */
function unsortableKey(key: string): boolean {
  const c = key.charCodeAt(0);
  return (c >= 48 && c <= 57) || key === '__proto__';
}

function sortedCopy(v: unknown): unknown {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    const a: unknown[] = new Array<unknown>(v.length);
    for (let i = 0; i < v.length; i++) {
      const x = sortedCopy(v[i]);
      if (x === UNSORTABLE) return UNSORTABLE;
      a[i] = x;
    }
    return a;
  }
  const obj = v as Record<string, unknown>;
  const keys = Object.keys(obj).sort();
  const out: Record<string, unknown> = {};
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i] as string;
    if (unsortableKey(k)) return UNSORTABLE;
    const x = sortedCopy(obj[k]);
    if (x === UNSORTABLE) return UNSORTABLE;
    out[k] = x;
  }
  return out;
}

/** The same text, written key by key (for objects the sorted copy cannot represent). */
function written(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value ?? null);
  if (Array.isArray(value)) {
    let s = '[';
    for (let i = 0; i < value.length; i++) s += (i > 0 ? ',' : '') + written(value[i]);
    return s + ']';
  }
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).sort();
  let s = '{';
  let first = true;
  for (const k of keys) {
    const x = obj[k];
    if (x === undefined) continue;
    s += (first ? '' : ',') + JSON.stringify(k) + ':' + written(x);
    first = false;
  }
  return s + '}';
}
