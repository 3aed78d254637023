import net from 'node:net';

/**
 * One HTTP/1.1 request written byte for byte on a fresh TCP connection: no client library in the
 * way, so headers fetch refuses (Expect, Upgrade, Host, invalid bytes), odd methods and versions,
 * raw request targets and bodies that do not match their declared encoding all reach the server.
 */
export interface RawRequest {
  method: string;
  /** The request-target exactly as sent (path and query, already encoded or deliberately not). */
  target: string;
  /** Header lines in order; duplicates allowed. Strings are written as latin1 (one byte a char). */
  headers: [string, string][];
  body?: Buffer | undefined;
  /** Send the body with Transfer-Encoding: chunked instead of Content-Length. */
  chunked?: boolean;
  /** Defaults to HTTP/1.1. */
  version?: string;
  /** Leave out the Host header (HTTP/1.1 requires it). */
  noHost?: boolean;
}

export interface RawResponse {
  status: number;
  /** Lower-cased names; repeated headers joined with ", ". */
  headers: Record<string, string>;
  body: Buffer;
  /** Interim (1xx) statuses that preceded the final response. */
  interim: number[];
}

export class NoResponse extends Error {
  constructor(
    message: string,
    readonly received: Buffer,
    /** The socket error code (EPIPE, ECONNRESET…), when a socket error ended it. */
    readonly code?: string,
  ) {
    super(message);
    this.name = 'NoResponse';
  }
}

/** The bytes of a request (also used to print reproductions). */
export function encodeRequest(host: string, r: RawRequest): Buffer {
  const lines: string[] = [`${r.method} ${r.target} ${r.version ?? 'HTTP/1.1'}`];
  if (!r.noHost) lines.push(`Host: ${host}`);
  for (const [k, v] of r.headers) lines.push(`${k}: ${v}`);
  const body = r.body;
  let payload: Buffer = Buffer.alloc(0);
  if (r.chunked) {
    lines.push('Transfer-Encoding: chunked');
    const parts: Buffer[] = [];
    if (body && body.length > 0)
      parts.push(Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n'));
    parts.push(Buffer.from('0\r\n\r\n'));
    payload = Buffer.concat(parts);
  } else if (body !== undefined) {
    lines.push(`Content-Length: ${body.length}`);
    payload = body;
  }
  return Buffer.concat([Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1'), payload]);
}

interface Parsed {
  response: RawResponse;
  complete: boolean;
}

/** Parses what has arrived so far; `complete` once the final response's body is whole. */
function parse(buf: Buffer, eof: boolean): Parsed | undefined {
  const interim: number[] = [];
  let at = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', at);
    if (end < 0) return undefined;
    const head = buf.subarray(at, end).toString('latin1').split('\r\n');
    const m = /^HTTP\/\d(?:\.\d)? (\d{3})/.exec(head[0] ?? '');
    if (!m) return undefined;
    const status = Number(m[1]);
    const headers: Record<string, string> = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(':');
      if (i <= 0) continue;
      const k = line.slice(0, i).trim().toLowerCase();
      const v = line.slice(i + 1).trim();
      headers[k] = headers[k] === undefined ? v : `${headers[k]}, ${v}`;
    }
    at = end + 4;
    if (status >= 100 && status < 200 && status !== 101) {
      interim.push(status);
      continue;
    }
    const rest = buf.subarray(at);
    if (status === 204 || status === 304 || status === 101) {
      return { response: { status, headers, body: Buffer.alloc(0), interim }, complete: true };
    }
    if (/\bchunked\b/i.test(headers['transfer-encoding'] ?? '')) {
      const chunks: Buffer[] = [];
      let p = 0;
      for (;;) {
        const eol = rest.indexOf('\r\n', p);
        if (eol < 0) break;
        const size = parseInt(rest.subarray(p, eol).toString('latin1'), 16);
        if (Number.isNaN(size)) break;
        if (size === 0) {
          return { response: { status, headers, body: Buffer.concat(chunks), interim }, complete: true };
        }
        if (rest.length < eol + 2 + size + 2) break;
        chunks.push(rest.subarray(eol + 2, eol + 2 + size));
        p = eol + 2 + size + 2;
      }
      return { response: { status, headers, body: Buffer.concat(chunks), interim }, complete: eof };
    }
    const length = headers['content-length'];
    if (length !== undefined && /^\d+$/.test(length)) {
      const n = Number(length);
      return {
        response: { status, headers, body: rest.subarray(0, n), interim },
        complete: rest.length >= n,
      };
    }
    return { response: { status, headers, body: rest, interim }, complete: eof };
  }
}

/**
 * Sends `r` to `base` (http://host:port) and resolves with the final response as soon as it is
 * complete. Rejects with NoResponse when the connection ends, fails or times out without one.
 */
export function rawRequest(base: string, r: RawRequest, timeoutMs = 20_000): Promise<RawResponse> {
  const url = new URL(base);
  const bytes = encodeRequest(url.host, r);
  return new Promise((resolve, reject) => {
    const received: Buffer[] = [];
    let done = false;
    const socket = net.connect(Number(url.port), url.hostname);
    const finish = (eof: boolean, why: string, code?: string) => {
      if (done) return;
      const buf = Buffer.concat(received);
      const p = parse(buf, eof);
      if (p && (p.complete || eof)) {
        done = true;
        socket.destroy();
        resolve(p.response);
      } else if (eof) {
        done = true;
        socket.destroy();
        reject(new NoResponse(why, buf, code));
      }
    };
    socket.setTimeout(timeoutMs, () => finish(true, `no complete response within ${timeoutMs} ms`));
    socket.on('connect', () => {
      // A server that answers early (413, 415, 400) may close while the body is still being written.
      socket.write(bytes, () => undefined);
    });
    socket.on('data', (d: Buffer) => {
      received.push(d);
      finish(false, '');
    });
    socket.on('error', (err: NodeJS.ErrnoException) =>
      finish(true, `connection error ${err.code ?? err.message} before a response`, err.code),
    );
    socket.on('end', () => finish(true, 'connection closed without a response'));
    socket.on('close', () => finish(true, 'connection closed without a response'));
  });
}
