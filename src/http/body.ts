import { isUtf8 } from 'node:buffer';
import type { IncomingMessage } from 'node:http';
import { pipeline, type Readable } from 'node:stream';
import zlib from 'node:zlib';
import getRawBody from 'raw-body';
import { AppError, invalid } from '../errors.js';

/**
 * The one place a request body becomes text: its bytes (after Content-Encoding, at most `limit`
 * of them), decoded as UTF-8 without repair, and how many bytes that was. A decoder that replaced invalid bytes by U+FFFD
 * would let different byte strings become the same request (one request digest, one stored
 * policy whose sha256 is not that of the bytes sent), so they are refused instead.
 *
 * Errors: 413 over the limit, 415 for an unknown Content-Encoding, 400 for a body that is not
 * what its Content-Encoding says, is cut short, or is not UTF-8.
 */
export async function readBodyText(
  req: IncomingMessage,
  limit: number,
): Promise<{ text: string; bytes: number }> {
  const encoding = contentCoding(req.headers['content-encoding']);
  const declared = req.headers['content-length'];
  let bytes: Buffer;
  try {
    bytes = await getRawBody(decoded(req, encoding), {
      limit,
      // Content-Length counts encoded bytes: only an identity body can be held to it.
      length: encoding === 'identity' && declared !== undefined ? Number(declared) : null,
    });
  } catch (e) {
    // zlib's own errors (a body that is not what Content-Encoding says) carry no status; nor does
    // the end of a compressed request its client gave up on (raw-body says "request aborted" for
    // an identity body itself).
    const code = (e as { code?: unknown }).code;
    if (code === 'ERR_STREAM_PREMATURE_CLOSE') throw invalid('request aborted');
    if ((e as { status?: unknown }).status === undefined && typeof code === 'string') {
      throw invalid(`request body is not valid ${encoding}`);
    }
    throw e;
  }
  if (!isUtf8(bytes)) throw invalid('request body is not valid UTF-8');
  const text = bytes.toString('utf8');
  // A leading byte order mark is framing, not content (the body parser before this dropped it too).
  return { text: text.charCodeAt(0) === 0xfeff ? text.slice(1) : text, bytes: bytes.length };
}

/**
 * The Content-Encoding as one of the names `decoded` knows: codings are case-insensitive (RFC 9110
 * §8.4.1) and x-gzip is gzip (§8.4.1.3). Anything else is kept (trimmed) to be refused by name.
 */
function contentCoding(header: string | undefined): string {
  if (header === undefined) return 'identity';
  const coding = header.trim().toLowerCase();
  if (coding === 'x-gzip') return 'gzip';
  return coding;
}

/**
 * The request's content with its Content-Encoding undone. Through `pipeline`, not `pipe`: a
 * request its client aborts then fails the decompressor too, so reading it ends (a `pipe` would
 * leave the decompressor waiting for the rest, and the request unanswered for ever).
 */
function decoded(req: IncomingMessage, encoding: string): Readable {
  const through = (inflate: zlib.Gunzip | zlib.Unzip | zlib.BrotliDecompress) => {
    pipeline(req, inflate, () => undefined);
    return inflate;
  };
  switch (encoding) {
    case 'identity':
      return req;
    case 'gzip':
    case 'deflate':
      return through(zlib.createUnzip());
    case 'br':
      return through(zlib.createBrotliDecompress());
    default:
      throw new AppError('unsupported_media', `Unsupported Content-Encoding: ${encoding}`);
  }
}

/** A key JSON.parse keeps as data, but that any later `target[key] = …` copy would turn into a prototype. */
const MAY_HOLD_PROTO =
  /"(?:_|\\u005[Ff])(?:_|\\u005[Ff])(?:p|\\u0070)(?:r|\\u0072)(?:o|\\u006[Ff])(?:t|\\u0074)(?:o|\\u006[Ff])(?:_|\\u005[Ff])(?:_|\\u005[Ff])"/;

/** A JSON text parsed; malformed JSON and `__proto__` keys are 400. */
export function parseJson(text: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw invalid(`malformed JSON body: ${(e as Error).message}`);
  }
  if (MAY_HOLD_PROTO.test(text) && holdsProtoKey(value)) {
    throw invalid('JSON body must not contain a "__proto__" member: it would become a prototype when copied');
  }
  return value;
}

function holdsProtoKey(value: unknown): boolean {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v !== 'object' || v === null) continue;
    if (Object.prototype.hasOwnProperty.call(v, '__proto__')) return true;
    for (const child of Object.values(v)) stack.push(child);
  }
  return false;
}
