/**
 * How many times longer JSON.stringify can write a value than the JSON text it was parsed from:
 * only numbers grow (`1e20`, 4 bytes, is written `100000000000000000000`, 21 bytes); names,
 * strings and whitespace come out at most as long as they went in (escapes are decoded, never
 * added: a text that parsed has its control characters escaped already).
 */
const MAX_REWRITE_GROWTH = 6;

/**
 * True when `copies` values parsed from a JSON text of `receivedBytes` bytes (each a part of it,
 * or parts of it put together) cannot be more than `max` bytes as JSON together: then they need
 * not be measured (every small request). False when the size of the text is not known.
 */
export function tooSmallToExceed(receivedBytes: number | undefined, max: number, copies = 1): boolean {
  return receivedBytes !== undefined && receivedBytes * MAX_REWRITE_GROWTH * copies <= max;
}

/** The UTF-8 length of `value` as JSON (0 for undefined). */
export function jsonBytes(value: unknown): number {
  return Buffer.byteLength(JSON.stringify(value) ?? '');
}

/**
 * The UTF-8 length of `value` as JSON when that is more than `max` bytes, else undefined.
 * `receivedBytes` is the size of the whole JSON text `value` was parsed from, when known: a text
 * too small to hold more than `max` bytes of `value` spares serializing it (every small request).
 */
export function jsonBytesOver(value: unknown, max: number, receivedBytes?: number): number | undefined {
  if (tooSmallToExceed(receivedBytes, max)) return undefined;
  const bytes = jsonBytes(value);
  return bytes > max ? bytes : undefined;
}
