import { expect } from 'chai';
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { loadConfig } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { rawRequest } from './helpers/raw-http.js';
import { ADMIN_KEY, AGENT, Arbiter, call } from './helpers/harness.js';

/**
 * A raw TCP connection that records everything the server sends and when it closed: for what a
 * client library hides (a second response, a connection kept open, a request dripped in pieces).
 */
class Conn {
  readonly socket: net.Socket;
  private chunks: Buffer[] = [];
  closed = false;
  closedAt = 0;
  private waiters: (() => void)[] = [];

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on('data', (d: Buffer) => {
      this.chunks.push(d);
      this.wake();
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      this.closed = true;
      this.closedAt = Date.now();
      this.wake();
    });
  }

  /**
   * `halfOpen`: the client keeps its side open when the server closes its own (a client that
   * keeps sending), so `closed` then means the server dropped the whole connection.
   */
  static open(base: string, halfOpen = false): Promise<Conn> {
    const url = new URL(base);
    return new Promise((resolve, reject) => {
      const socket = net.connect({ port: Number(url.port), host: url.hostname, allowHalfOpen: halfOpen });
      socket.once('connect', () => resolve(new Conn(socket)));
      socket.once('error', reject);
    });
  }

  get text(): string {
    return Buffer.concat(this.chunks).toString('latin1');
  }

  /** The status lines received so far. */
  get statuses(): number[] {
    return [...this.text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
  }

  write(data: string | Buffer): void {
    if (!this.socket.destroyed && this.socket.writable) this.socket.write(data, () => undefined);
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Waits until `cond` holds (true) or `ms` pass (false). */
  async until(cond: () => boolean, ms: number): Promise<boolean> {
    const end = Date.now() + ms;
    while (!cond()) {
      const left = end - Date.now();
      if (left <= 0) return false;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.min(left, 200));
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    return true;
  }

  /** Whether a whole response (head and Content-Length body) number `n` has arrived. */
  hasResponses(n: number): boolean {
    let at = 0;
    const buf = this.text;
    for (let i = 0; i < n; i++) {
      const end = buf.indexOf('\r\n\r\n', at);
      if (end < 0) return false;
      const len = /\r\ncontent-length: *(\d+)/i.exec(buf.slice(at, end))?.[1];
      at = end + 4 + Number(len ?? 0);
      if (buf.length < at) return false;
    }
    return true;
  }

  destroy(): void {
    this.socket.destroy();
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const head = (lines: string[]) => lines.join('\r\n') + '\r\n\r\n';

// Connection handling, headers and configuration: no stored state is involved, so once.
onceOnly('HTTP hardening: one answer per request, bounded connections, strict headers', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({
      ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS: '1',
      ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS: '2',
    });
  });
  after(async () => {
    await a.close();
  });

  const unauthenticatedChunkedPost = (host: string) =>
    head([
      'POST /v1/agent/authorize HTTP/1.1',
      `Host: ${host}`,
      'Content-Type: application/json',
      'Transfer-Encoding: chunked',
    ]) + '5\r\n{"a":\r\n';

  describe('an answer given before the body was read', () => {
    it('is the only answer: a bad chunk after a 401 closes the connection, no second 400', async () => {
      const c = await Conn.open(a.engine);
      try {
        c.write(unauthenticatedChunkedPost(new URL(a.engine).host));
        expect(await c.until(() => c.hasResponses(1), 20_000)).to.equal(true);
        expect(c.statuses).to.deep.equal([401]);
        c.write('zz\r\nnot a chunk\r\n');
        expect(await c.until(() => c.closed, 20_000), 'connection closed').to.equal(true);
        expect(c.statuses).to.deep.equal([401]);
      } finally {
        c.destroy();
      }
    });

    it('is the only answer: a body dripped past the request timeout gets no 408 after the 401', async () => {
      const c = await Conn.open(a.engine);
      try {
        c.write(unauthenticatedChunkedPost(new URL(a.engine).host));
        expect(await c.until(() => c.hasResponses(1), 20_000)).to.equal(true);
        // One small chunk every 300 ms for up to 6 s: three times the (shortened) request timeout.
        for (let i = 0; i < 20 && !c.closed; i++) {
          c.write('1\r\nx\r\n');
          await sleep(300);
        }
        expect(await c.until(() => c.closed, 10_000), 'connection closed').to.equal(true);
        expect(c.statuses).to.deep.equal([401]);
      } finally {
        c.destroy();
      }
    });

    it('says Connection: close and closes the connection while the client is still sending', async () => {
      const c = await Conn.open(a.engine);
      try {
        c.write(
          head([
            'POST /v1/agent/authorize HTTP/1.1',
            `Host: ${new URL(a.engine).host}`,
            'Content-Type: application/json',
            `Content-Length: ${1024 * 1024 * 1024}`,
          ]) + '{"pad":"',
        );
        expect(await c.until(() => c.hasResponses(1), 20_000)).to.equal(true);
        expect(c.statuses).to.deep.equal([401]);
        expect(c.text).to.match(/\r\nConnection: close\r\n/i);
        // Keep streaming 64 KiB every 20 ms: the server must stop taking it within seconds (the
        // linger is 1.5 s), not read the announced gigabyte to keep the connection.
        const pad = Buffer.alloc(64 * 1024, 0x61);
        const started = Date.now();
        while (!c.closed && Date.now() - started < 30_000) {
          c.write(pad);
          await sleep(20);
        }
        expect(c.closed, 'closed while the body was still coming').to.equal(true);
        expect(c.closedAt - started).to.be.below(20_000);
        expect(c.statuses).to.deep.equal([401]);
      } finally {
        c.destroy();
      }
    });

    it('answers 413 for an announced body over the limit with Connection: close', async () => {
      const c = await Conn.open(a.engine);
      try {
        c.write(
          head([
            'POST /v1/agent/authorize HTTP/1.1',
            `Host: ${new URL(a.engine).host}`,
            `Authorization: Bearer ${ADMIN_KEY}`,
            'Content-Type: application/json',
            `Content-Length: ${64 * 1024 * 1024}`,
          ]) + '{"pad":"',
        );
        expect(await c.until(() => c.hasResponses(1), 20_000)).to.equal(true);
        expect(c.statuses).to.deep.equal([413]);
        expect(c.text).to.match(/\r\nConnection: close\r\n/i);
        expect(await c.until(() => c.closed, 20_000), 'connection closed').to.equal(true);
      } finally {
        c.destroy();
      }
    });

    it('still keeps the connection of a request whose body was read', async () => {
      const r = await rawRequest(a.engine, {
        method: 'POST',
        target: '/v1/agent/authorize',
        headers: [
          ['Authorization', `Bearer ${ADMIN_KEY}`],
          ['Content-Type', 'application/json'],
        ],
        body: Buffer.from(JSON.stringify(AGENT.allow)),
      });
      expect(r.status).to.equal(200);
      expect(r.headers.connection).to.equal('keep-alive');
    });
  });

  describe('time limits', () => {
    it('closes a connection that sends nothing after the headers timeout', async () => {
      const c = await Conn.open(a.engine);
      const opened = Date.now();
      try {
        // The limit is 1 s here (Node's default: 60 s); checked every second.
        expect(await c.until(() => c.closed, 20_000), 'idle connection closed').to.equal(true);
        expect(c.closedAt - opened).to.be.below(20_000);
        expect(c.statuses.filter((s) => s !== 408)).to.deep.equal([]);
      } finally {
        c.destroy();
      }
    });

    it('keeps an idle keep-alive connection past the headers timeout (that is the keep-alive timeout)', async () => {
      const c = await Conn.open(a.engine);
      try {
        const healthz = head(['GET /healthz HTTP/1.1', `Host: ${new URL(a.engine).host}`]);
        c.write(healthz);
        expect(await c.until(() => c.hasResponses(1), 20_000)).to.equal(true);
        // Three times the headers timeout, and past Node's check interval.
        await sleep(3000);
        expect(c.closed, 'still open').to.equal(false);
        c.write(healthz);
        expect(await c.until(() => c.hasResponses(2), 20_000)).to.equal(true);
        expect(c.statuses).to.deep.equal([200, 200]);
      } finally {
        c.destroy();
      }
    });

    it('closes a connection that drips its headers with one 408', async () => {
      const c = await Conn.open(a.platform);
      const opened = Date.now();
      try {
        c.write('GET /healthz HTTP/1.1\r\n');
        for (let i = 0; i < 40 && !c.closed; i++) {
          c.write(`X-Drip-${i}: 1\r\n`);
          await sleep(250);
        }
        expect(await c.until(() => c.closed, 20_000), 'dripping connection closed').to.equal(true);
        expect(c.closedAt - opened).to.be.below(20_000);
        expect(c.statuses).to.deep.equal([408]);
      } finally {
        c.destroy();
      }
    });
  });

  describe('the Host header', () => {
    const metadata = (host: string | string[], target = '/.well-known/authzen-configuration') =>
      rawRequest(a.engine, {
        method: 'GET',
        target,
        noHost: true,
        headers: (Array.isArray(host) ? host : [host]).map((h): [string, string] => ['Host', h]),
      });

    for (const bad of ['evil.example/phish?', 'x"><script>', 'a b', 'host:port', '[::1', 'user@host']) {
      it(`refuses an invalid Host ${JSON.stringify(bad)} with 400`, async () => {
        const r = await metadata(bad);
        expect(r.status).to.equal(400);
        expect(JSON.parse(r.body.toString()).error).to.match(/Host/);
        expect(r.body.toString()).not.to.include('<script>');
      });
    }

    it('refuses two Host lines with 400', async () => {
      const r = await metadata(['good.example', 'evil.example']);
      expect(r.status).to.equal(400);
      expect(JSON.parse(r.body.toString()).error).to.match(/one Host/);
    });

    for (const good of ['arbiter.example.com', 'arbiter.example.com:8443', '127.0.0.1:8080', '[::1]:8080']) {
      it(`builds the metadata URLs on a valid Host ${good}`, async () => {
        const r = await metadata(good);
        expect(r.status).to.equal(200);
        const doc = JSON.parse(r.body.toString()) as Record<string, string>;
        expect(doc.policy_decision_point).to.equal(`http://${good}`);
      });
    }

    it('takes the authority of an absolute-form target over Host (RFC 9112 §3.2.2)', async () => {
      const r = await metadata('ignored.example', 'http://abs.example:9/.well-known/authzen-configuration');
      expect(r.status).to.equal(200);
      const doc = JSON.parse(r.body.toString()) as Record<string, string>;
      expect(doc.policy_decision_point).to.equal('http://abs.example:9');
    });

    for (const target of [
      'http://u:p@abs.example/healthz',
      'http://x"y/healthz',
      'ftp://abs.example/healthz',
    ]) {
      it(`refuses the absolute-form target ${target} with 400`, async () => {
        const r = await metadata('ok.example', target);
        expect(r.status).to.equal(400);
      });
    }
  });

  describe('request headers', () => {
    it('refuses two Authorization headers with 401 naming the problem', async () => {
      const r = await rawRequest(a.engine, {
        method: 'GET',
        target: '/v1/whoami',
        headers: [
          ['Authorization', `Bearer ${ADMIN_KEY}`],
          ['Authorization', 'Bearer someone-else-entirely'],
        ],
      });
      expect(r.status).to.equal(401);
      expect(JSON.parse(r.body.toString()).error).to.match(/one Authorization header/);
    });

    const padded = (pads: number): [string, string][] => [
      ...Array.from({ length: pads }, (_, i): [string, string] => [`X-P${i}`, '1']),
      ['Authorization', `Bearer ${ADMIN_KEY}`],
    ];

    it('serves a request of 999 header lines', async () => {
      // Host + 997 pads + Authorization.
      const r = await rawRequest(a.engine, { method: 'GET', target: '/v1/whoami', headers: padded(997) });
      expect(r.status).to.equal(200);
    });

    for (const pads of [998, 1200]) {
      it(`answers 431 for ${pads + 2} header lines instead of dropping the last ones`, async () => {
        const r = await rawRequest(a.engine, { method: 'GET', target: '/v1/whoami', headers: padded(pads) });
        expect(r.status).to.equal(431);
        expect(JSON.parse(r.body.toString()).error).to.match(/header lines/);
      });
    }
  });

  describe('media types and content codings (RFC 9110 §8.3.1, §8.4.1)', () => {
    const post = (headers: Record<string, string>, body: string | Buffer = JSON.stringify(AGENT.allow)) =>
      call('POST', a.engine + '/v1/agent/authorize', { headers, raw: body });

    for (const type of [
      'Application/JSON',
      'application/json ; charset=utf-8',
      'application/json;charset="UTF-8"',
      'APPLICATION/json; Charset=Utf-8',
    ]) {
      it(`accepts Content-Type ${type}`, async () => {
        const r = await post({ 'content-type': type });
        expect(r.status, r.text).to.equal(200);
      });
    }

    for (const type of ['application/json; charset=utf-16', 'application/json; charset=iso-8859-1']) {
      it(`refuses Content-Type ${type} with 415`, async () => {
        const r = await post({ 'content-type': type });
        expectError(r, 415);
        expect(r.json.error).to.match(/charset/);
      });
    }

    for (const coding of ['GZIP', 'x-gzip', 'X-GZip']) {
      it(`accepts Content-Encoding ${coding}`, async () => {
        const r = await post(
          { 'content-type': 'application/json', 'content-encoding': coding },
          gzipSync(JSON.stringify(AGENT.allow)),
        );
        expect(r.status, r.text).to.equal(200);
      });
    }
  });

  describe('the request log line', () => {
    it('names the client address, and never the key', async () => {
      const before = a.logs.length;
      const r = await call('GET', a.platform + '/v1/agent/authorize-nothing', { key: 'arb_not-a-real-key' });
      expect(r.status).to.equal(404);
      await call('GET', a.engine + '/v1/whoami', { key: 'arb_not-a-real-key-either' });
      let lines: Record<string, unknown>[] = [];
      for (let i = 0; i < 50; i++) {
        lines = a.logs
          .slice(before)
          .map((l) => {
            try {
              return JSON.parse(l) as Record<string, unknown>;
            } catch {
              return {};
            }
          })
          .filter((l) => l.msg === 'request');
        if (lines.length >= 2) break;
        await sleep(100);
      }
      expect(lines.length).to.be.at.least(2);
      for (const l of lines) expect(l.remoteAddress).to.match(/^(::ffff:)?127\.0\.0\.1$/);
      expect(a.logs.slice(before).join('\n')).not.to.include('not-a-real-key');
    });
  });
});

onceOnly('HTTP hardening: connection limit', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_CONNECTIONS: '3' });
  });
  after(async () => {
    await a.close();
  });

  it('closes connections beyond ARBITER_MAX_CONNECTIONS unanswered; open ones still answer /healthz', async () => {
    const host = new URL(a.platform).host;
    const healthz = head(['GET /healthz HTTP/1.1', `Host: ${host}`]);
    const conns: Conn[] = [];
    try {
      // The harness's own client may hold a connection for a few seconds: open until one is
      // refused, and at most one more than the limit.
      let refused: Conn | undefined;
      for (let i = 0; i < 4 && !refused; i++) {
        const c = await Conn.open(a.platform);
        conns.push(c);
        c.write(healthz);
        await c.until(() => c.hasResponses(1) || c.closed, 10_000);
        if (c.closed && c.statuses.length === 0) refused = c;
      }
      expect(refused, 'a connection beyond the limit is closed').not.to.equal(undefined);
      const served = conns.filter((c) => c !== refused);
      expect(served.length).to.be.within(1, 3);
      for (const c of served) expect(c.statuses).to.deep.equal([200]);
      // The first connection still answers on the same socket.
      const first = served[0] as Conn;
      first.write(healthz);
      expect(await first.until(() => first.hasResponses(2), 10_000)).to.equal(true);
      expect(first.statuses).to.deep.equal([200, 200]);
    } finally {
      for (const c of conns) c.destroy();
    }
  });
});

onceOnly('HTTP hardening: configuration', () => {
  const base = { ARBITER_DATA_DIR: '/tmp/unused' };
  const refuses = (env: Record<string, string>, pattern: RegExp, secret?: string) => {
    let message = '';
    try {
      loadConfig({ ...base, ...env });
    } catch (e) {
      message = (e as Error).message;
    }
    expect(message).to.match(pattern);
    if (secret) expect(message).not.to.include(secret);
  };

  for (const [what, key] of [
    ['a space', 'an admin key with space'],
    ['a trailing newline', 'abcdefghijklmnopqrst\n'],
    ['a non-ASCII character', 'clé-administrateur-0123456789'],
  ] as const) {
    it(`refuses an ARBITER_ADMIN_KEY with ${what}, without echoing it`, () => {
      refuses({ ARBITER_ADMIN_KEY: key }, /^ARBITER_ADMIN_KEY must be printable ASCII/, key.trim());
    });
  }

  it('refuses an ARBITER_PUBLIC_URL with user:password, without echoing the password', () => {
    refuses(
      { ARBITER_PUBLIC_URL: 'https://ops:s3cr3t-pw@arbiter.example.com' },
      /^ARBITER_PUBLIC_URL must not contain a user name or password/,
      's3cr3t-pw',
    );
    refuses({ ARBITER_PUBLIC_URL: 'https://ops@arbiter.example.com' }, /user name or password/);
  });

  for (const url of [
    'https://arbiter.example.com/?x=1',
    'https://arbiter.example.com/#top',
    'https://a.example/?',
  ]) {
    it(`refuses an ARBITER_PUBLIC_URL with a query or fragment: ${url}`, () => {
      refuses(
        { ARBITER_PUBLIC_URL: url },
        /^ARBITER_PUBLIC_URL must be a base URL without a query or fragment/,
      );
    });
  }

  it('keeps accepting a plain public URL with a path', () => {
    const c = loadConfig({ ...base, ARBITER_PUBLIC_URL: 'https://arbiter.example.com/engine/' });
    expect(c.publicUrl).to.equal('https://arbiter.example.com/engine');
  });

  it('validates the HTTP limits', () => {
    const c = loadConfig(base);
    expect(c.httpHeadersTimeoutSeconds).to.equal(10);
    expect(c.httpRequestTimeoutSeconds).to.equal(30);
    expect(c.maxConnections).to.equal(4096);
    refuses({ ARBITER_MAX_CONNECTIONS: '0' }, /^ARBITER_MAX_CONNECTIONS must be a positive integer/);
    refuses({ ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS: 'ten' }, /^ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS must be/);
    refuses(
      { ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS: '3000000' },
      /^ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS must be/,
    );
    refuses(
      { ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS: '40' },
      /^ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS must not exceed ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS/,
    );
  });

  it('warns at start when ARBITER_ADMIN_KEY is the README example key', async () => {
    const a = await Arbiter.start({ ARBITER_ADMIN_KEY: 'dev-admin-key-change-me' });
    try {
      const warning = a.logs
        .map((l) => {
          try {
            return JSON.parse(l) as Record<string, unknown>;
          } catch {
            return {};
          }
        })
        .find((l) => l.level === 'warn' && /example key/.test(String(l.msg)));
      expect(warning, a.logs.join('\n')).not.to.equal(undefined);
      expect(JSON.stringify(warning)).not.to.include('dev-admin-key-change-me');
    } finally {
      await a.close();
    }
  });
});
