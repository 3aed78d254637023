import { expect } from 'chai';
import { connect } from 'node:net';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import { onceOnly, onEveryBackend } from './helpers/backends.js';
import { bigJsonBody, expectError } from './helpers/expect-error.js';
import { rawRequest as sendRaw, type RawRequest } from './helpers/raw-http.js';
import {
  ADMIN_KEY,
  AGENT,
  Arbiter,
  auditCount,
  call,
  HUMAN,
  type RequestOptions,
  type Response,
} from './helpers/harness.js';

const MiB = 1024 * 1024;
const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

// Refused requests must store nothing, and accepted ones are stored: run on every backend.
onEveryBackend('common HTTP rules (SPEC §3) on both listeners', () => {
  let a: Arbiter;
  let metricsKey: string;
  let authorizeOnlyKey: string;
  before(async () => {
    a = await Arbiter.start();
    metricsKey = a.createKey('metrics-reader', ['metrics:read']);
    authorizeOnlyKey = a.createKey('authorize-only', ['authorize']);
  });
  after(async () => {
    await a.close();
  });

  const base = (api: 'engine' | 'platform') => (api === 'engine' ? a.engine : a.platform);

  for (const api of ['engine', 'platform'] as const) {
    describe(`${api} listener`, () => {
      it('answers 404 {"error"} for an unknown path', async () => {
        const r = await call('GET', base(api) + '/v1/no-such-thing/0190c0de-0000-7000-8000-000000000000');
        expectError(r, 404);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('answers 404 {"error"} for an unknown path without a key', async () => {
        const r = await call('GET', base(api) + '/nothing-here', { key: null });
        expectError(r, 404);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('answers 405 with Allow and {"error"} for a known path with the wrong method', async () => {
        const r = await call('DELETE', base(api) + '/healthz');
        expectError(r, 405);
        expect((r.headers.get('allow') ?? '').split(/,\s*/)).to.include('GET');
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('answers 405 with Allow: POST for GET on /api/v1/authorize', async () => {
        const r = await call('GET', base(api) + '/api/v1/authorize');
        expectError(r, 405);
        expect((r.headers.get('allow') ?? '').split(/,\s*/)).to.include('POST');
      });

      it('serves /healthz publicly as {"status":"ok","revision":N}', async () => {
        const r = await call('GET', base(api) + '/healthz', { key: null });
        expect(r.status).to.equal(200);
        expect(r.headers.get('content-type')).to.match(/^application\/json/);
        expect(r.json).to.have.keys('status', 'revision');
        expect(r.json.status).to.equal('ok');
        expect(r.json.revision).to.be.a('number').and.at.least(1);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('answers 401 {"error"} with WWW-Authenticate for /metrics without a key', async () => {
        const r = await call('GET', base(api) + '/metrics', { key: null });
        expectError(r, 401);
        expect(r.headers.get('www-authenticate')).to.match(/^Bearer/);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('answers 403 {"error"} naming metrics:read for /metrics with a key lacking it', async () => {
        const r = await call('GET', base(api) + '/metrics', { key: authorizeOnlyKey });
        expectError(r, 403, /metrics:read/);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('serves /metrics as Prometheus text to a key with metrics:read', async () => {
        const r = await call('GET', base(api) + '/metrics', { key: metricsKey });
        expect(r.status).to.equal(200);
        expect(r.headers.get('content-type')).to.match(/^text\/plain/);
        expect(r.text).to.match(/^# HELP arbiter_http_requests_total /m);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });

      it('carries X-Request-Id on a 400, a 401 and a 415, each one different', async () => {
        const bad = await call('POST', base(api) + '/api/v1/authorize', {
          raw: '{',
          headers: { 'content-type': 'application/json' },
        });
        const unauth = await call('POST', base(api) + '/api/v1/authorize', {
          key: 'arb_wrong',
          body: AGENT.allow,
        });
        const media = await call('POST', base(api) + '/api/v1/authorize', {
          raw: JSON.stringify(AGENT.allow),
          headers: { 'content-type': 'text/plain' },
        });
        expectError(bad, 400);
        expectError(unauth, 401);
        expectError(media, 415);
        const ids = [bad, unauth, media].map((r) => r.headers.get('x-request-id'));
        for (const id of ids) expect(id).to.match(UUID_V7);
        expect(new Set(ids).size).to.equal(3);
      });

      it('answers with Cache-Control: no-store and nosniff: decisions, errors, tokens; the JWKS may be cached', async () => {
        const answers = [
          await call('POST', base(api) + '/api/v1/authorize', { body: AGENT.allow }),
          await call('POST', base(api) + '/api/v1/authorize', {
            raw: '{',
            headers: { 'content-type': 'application/json' },
          }),
          await call('POST', base(api) + '/api/v1/authorize', { key: 'arb_wrong', body: AGENT.allow }),
          await call('GET', base(api) + '/no/such/path'),
          await call('GET', base(api) + '/healthz', { key: null }),
        ];
        if (api === 'engine') {
          const allowed = answers[0]!;
          expect(allowed.status, allowed.text).to.equal(200);
          const minted = await call('POST', a.engine + '/v1/tokens/mint', {
            body: { request_id: allowed.json.request_id },
          });
          expect(minted.status, minted.text).to.equal(201);
          answers.push(minted);
        }
        for (const r of answers) {
          expect(r.headers.get('cache-control'), `${r.status} ${r.text}`).to.equal('no-store');
          expect(r.headers.get('x-content-type-options')).to.equal('nosniff');
        }
        const jwks = await call('GET', base(api) + '/.well-known/jwks.json', { key: null });
        expect(jwks.status).to.equal(200);
        expect(jwks.headers.get('cache-control')).to.equal('public, max-age=300');
      });

      it('does not echo a client-supplied X-Request-Id', async () => {
        const r = await call('GET', base(api) + '/healthz', { headers: { 'x-request-id': 'forged-id' } });
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
      });
    });
  }

  it('does not serve engine-only routes on the platform listener (404)', async () => {
    expectError(await call('POST', a.platform + '/v1/authorize', { body: HUMAN.allow }), 404);
  });

  it('does not serve platform-only routes on the engine listener (404)', async () => {
    expectError(await call('GET', a.engine + '/api/v1/policies'), 404);
  });

  it('answers 405 with Allow listing GET, PUT and DELETE for PATCH on a policy', async () => {
    const r = await call('PATCH', a.platform + '/api/v1/policies/agent', { body: { rego: 'x' } });
    expectError(r, 405);
    expect((r.headers.get('allow') ?? '').split(/,\s*/)).to.include.members(['GET', 'PUT', 'DELETE']);
  });

  it('answers 405 with Allow: POST for GET on /v1/agent/authorize', async () => {
    const r = await call('GET', a.engine + '/v1/agent/authorize');
    expectError(r, 405);
    expect((r.headers.get('allow') ?? '').split(/,\s*/)).to.include('POST');
  });

  it('labels request metrics by route template, never by raw path', async () => {
    expect((await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    await call('GET', a.platform + '/api/v1/policies/agent');
    await call('GET', a.platform + '/api/v1/policies/raw-name-must-not-leak');
    await call('GET', a.engine + '/v1/raw-unknown-path-must-not-leak');
    const r = await call('GET', a.engine + '/metrics', { key: metricsKey });
    const httpLines = r.text.split('\n').filter((l) => l.startsWith('arbiter_http_requests_total{'));
    expect(
      httpLines.filter((l) => l.includes('route="/v1/agent/authorize"') && l.includes('status="200"')),
    ).to.have.length.at.least(1);
    // The platform listener's requests show up too: one registry per process, labelled by template.
    expect(httpLines.filter((l) => l.includes('route="/api/v1/policies/{name}"'))).to.have.length.at.least(1);
    expect(r.text).to.not.include('raw-name-must-not-leak');
    expect(r.text).to.not.include('raw-unknown-path-must-not-leak');
    expect(r.text).to.not.include('route="/api/v1/policies/agent"');
  });

  it('counts decisions by kind and outcome', async () => {
    expect((await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    const r = await call('GET', a.platform + '/metrics', { key: metricsKey });
    const m = /^arbiter_decisions_total\{kind="agent",outcome="allow"\} (\d+)$/m.exec(r.text);
    expect(m, r.text.slice(0, 2000)).to.not.equal(null);
    expect(Number(m?.[1])).to.be.at.least(1);
  });

  describe('authorize: bad input is a 400-class {"error"} that records nothing', () => {
    const counts = async () => ({
      audit: await auditCount(a.platform),
      decisions: await a.count('decisions'),
      queue: await a.count('queue_items'),
    });

    const refuse = (
      title: string,
      path: string,
      opts: RequestOptions,
      status: number,
      message?: RegExp | string,
      api: 'engine' | 'platform' = 'engine',
    ) =>
      it(title, async () => {
        const before = await counts();
        const r: Response = await call('POST', base(api) + path, opts);
        expectError(r, status, message);
        expect(r.headers.get('x-request-id')).to.match(UUID_V7);
        expect(await counts()).to.deep.equal(before);
      });

    const json = (raw: string): RequestOptions => ({ raw, headers: { 'content-type': 'application/json' } });
    const without = <T extends object>(o: T, k: string) =>
      Object.fromEntries(Object.entries(o).filter(([key]) => key !== k));

    for (const path of ['/v1/agent/authorize', '/api/v1/authorize']) {
      describe(`POST ${path} (agents)`, () => {
        refuse('answers 400 for malformed JSON', path, json('{"agent_id": "deploy-bot",'), 400, /JSON/);
        refuse('answers 400 for a JSON array', path, json(JSON.stringify([AGENT.allow])), 400);
        refuse(
          'answers 400 naming a "__proto__" member (valid JSON, refused as a hardening), not "malformed"',
          path,
          json(
            '{"agent_id":"deploy-bot","action":"read","resource":"repo/x","confidence":0.9,"context":{"__proto__":{"admin":true}}}',
          ),
          400,
          'JSON body must not contain a "__proto__" member: it would become a prototype when copied',
        );
        refuse('answers 400 for a JSON string', path, json('"deploy-bot"'), 400);
        refuse('answers 400 for JSON null', path, json('null'), 400);
        refuse('answers 400 for no body at all', path, {}, 400);
        refuse(
          'answers 415 for a text/plain body',
          path,
          { raw: JSON.stringify(AGENT.allow), headers: { 'content-type': 'text/plain' } },
          415,
        );
        refuse('answers 413 for a 2 MiB body', path, json(bigJsonBody(2 * MiB, AGENT.allow)), 413);

        for (const field of ['agent_id', 'action', 'resource', 'confidence']) {
          refuse(
            `answers 400 naming ${field} when it is missing`,
            path,
            { body: without(AGENT.allow, field) },
            400,
            new RegExp(field),
          );
        }
        for (const field of ['agent_id', 'action', 'resource']) {
          refuse(
            `answers 400 naming ${field} when it is empty`,
            path,
            { body: { ...AGENT.allow, [field]: '' } },
            400,
            new RegExp(field),
          );
        }
        refuse(
          'answers 400 naming agent_id when it is over 256 characters',
          path,
          { body: { ...AGENT.allow, agent_id: 'a'.repeat(257) } },
          400,
          /agent_id/,
        );
        refuse(
          'answers 400 naming action when it is over 256 characters',
          path,
          { body: { ...AGENT.allow, action: 'r'.repeat(257) } },
          400,
          /action/,
        );
        refuse(
          'answers 400 naming resource when it is over 1024 characters',
          path,
          { body: { ...AGENT.allow, resource: 'r'.repeat(1025) } },
          400,
          /resource/,
        );
        refuse(
          'answers 400 naming resource when it is an object',
          path,
          { body: { ...AGENT.allow, resource: { type: 'repo', id: 'arbiter' } } },
          400,
          /resource/,
        );
        refuse(
          'answers 400 naming confidence when it is a string',
          path,
          { body: { ...AGENT.allow, confidence: '0.95' } },
          400,
          /confidence/,
        );
        refuse(
          'answers 400 with the out-of-range message for confidence -0.01',
          path,
          { body: { ...AGENT.allow, confidence: -0.01 } },
          400,
          'confidence out of range: must be between 0.0 and 1.0, got -0.01',
        );
        refuse(
          'answers 400 with the out-of-range message for confidence 1.0000001',
          path,
          { body: { ...AGENT.allow, confidence: 1.0000001 } },
          400,
          'confidence out of range: must be between 0.0 and 1.0, got 1.0000001',
        );
        // The seed: out-of-range confidence is a 400 whose text names confidence as out of range,
        // also for a number JSON.parse cannot hand on as written (Infinity, or rounded into range).
        for (const literal of ['1e999', '-1e999', '1.00000000000000001', '-1e-400']) {
          refuse(
            `answers 400 with the out-of-range message for confidence ${literal}, as sent`,
            path,
            json(
              `{"agent_id":"deploy-bot","action":"read","resource":"repo/arbiter","confidence":${literal}}`,
            ),
            400,
            `confidence out of range: must be between 0.0 and 1.0, got ${literal}`,
          );
        }
        refuse(
          'answers 400 naming confidence for an in-range confidence a double cannot hold (0.99999999999999999)',
          path,
          json(
            '{"agent_id":"deploy-bot","action":"read","resource":"repo/arbiter","confidence":0.99999999999999999}',
          ),
          400,
          // A confidence cannot be sent as a string: the advice is one it can follow.
          /^confidence holds the number 0\.99999999999999999, which would reach the policy as 1 \(numbers are read as doubles\): send it with at most 15 significant digits$/,
        );
        refuse(
          'advises sending a string for an inexact number inside context, where a string is allowed',
          path,
          json(
            '{"agent_id":"deploy-bot","action":"read","resource":"repo/arbiter","context":{"account":9007199254740993}}',
          ),
          400,
          /^context\.account holds the number 9007199254740993, which would reach the policy as 9007199254740992 .*: send it as a string$/,
        );
        refuse(
          'answers 400 naming context when it is a string',
          path,
          { body: { ...AGENT.allow, context: 'prod' } },
          400,
          /context/,
        );
        refuse(
          'answers 400 naming context when it is an array',
          path,
          { body: { ...AGENT.allow, context: ['prod'] } },
          400,
          /context/,
        );
        // The seed's known members of context are strings.
        for (const [member, value] of [
          ['reason', 5],
          ['reason', { why: 'x' }],
          ['user_id', 42],
          ['user_id', null],
        ] as const) {
          refuse(
            `answers 400 naming context.${member} when it is ${JSON.stringify(value)}, not a string`,
            path,
            { body: { ...AGENT.allow, context: { [member]: value } } },
            400,
            `context.${member} must be a string`,
          );
        }
        refuse(
          'answers 400 naming an unknown top-level field',
          path,
          { body: { ...AGENT.allow, confidance: 0.9 } },
          400,
          /confidance/,
        );
      });
    }

    refuse(
      'answers 400 for malformed JSON on the platform listener too',
      '/api/v1/authorize',
      json('{'),
      400,
      /JSON/,
      'platform',
    );

    describe('POST /v1/authorize (humans)', () => {
      for (const field of ['tenant_id', 'user_id', 'action', 'resource']) {
        refuse(
          `answers 400 naming ${field} when it is missing`,
          '/v1/authorize',
          { body: without(HUMAN.allow, field) },
          400,
          new RegExp(field),
        );
      }
      refuse(
        'answers 400 naming resource.id when it is missing',
        '/v1/authorize',
        { body: { ...HUMAN.allow, resource: { type: 'project' } } },
        400,
        /resource\.id/,
      );
      refuse(
        'answers 400 naming resource.type when it is not a string',
        '/v1/authorize',
        { body: { ...HUMAN.allow, resource: { type: 42, id: 'p1' } } },
        400,
        /resource\.type/,
      );
      refuse(
        'answers 400 naming resource when it is a string',
        '/v1/authorize',
        { body: { ...HUMAN.allow, resource: 'project/p1' } },
        400,
        /resource/,
      );
      refuse(
        'answers 400 for an empty user_id',
        '/v1/authorize',
        { body: { ...HUMAN.allow, user_id: '' } },
        400,
        /user_id/,
      );
      refuse(
        'answers 400 naming context.reason when it is not a string',
        '/v1/authorize',
        { body: { ...HUMAN.allow, context: { reason: 5 } } },
        400,
        'context.reason must be a string',
      );
      refuse('answers 400 for malformed JSON', '/v1/authorize', json('{"tenant_id":'), 400, /JSON/);
      refuse('answers 400 for a JSON array', '/v1/authorize', json('[]'), 400);
      refuse(
        'answers 400 naming an unknown top-level field',
        '/v1/authorize',
        { body: { ...HUMAN.allow, role: 'admin' } },
        400,
        /role/,
      );
    });
  });

  describe('authorize: boundary values are accepted', () => {
    it('accepts confidence exactly 0 (and decides: deny below the threshold)', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...AGENT.allow, confidence: 0 },
      });
      expect(r.status).to.equal(403);
      expect(r.json.status).to.equal('deny');
      expect(r.json).to.not.have.property('error');
    });

    it('accepts confidence exactly 1 (and decides: allow)', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...AGENT.allow, confidence: 1 },
      });
      expect(r.status).to.equal(200);
      expect(r.json.status).to.equal('allow');
    });

    it('accepts an agent_id of exactly 256 characters (a decision, not a 400)', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...AGENT.allow, agent_id: 'a'.repeat(256) },
      });
      expect(r.status).to.equal(403);
      expect(r.json.status).to.equal('deny');
    });

    it('accepts an empty context object', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...AGENT.allow, context: {} },
      });
      expect(r.status).to.equal(200);
    });

    it('accepts application/json with a charset parameter', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        raw: JSON.stringify(AGENT.allow),
        headers: { 'content-type': 'application/json; charset=utf-8' },
      });
      expect(r.status).to.equal(200);
    });
  });
});

// Encoded ingest bodies are stored once decoded: run on every backend.
onEveryBackend('request bodies and headers Node or the body parser would mishandle', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  const ingestWith = (encoding: string, body: Buffer) =>
    call('POST', `${a.platform}/api/v1/audit/ingest`, {
      raw: body,
      headers: { 'content-type': 'application/json', 'content-encoding': encoding },
    });

  for (const encoding of ['gzip', 'br', 'deflate']) {
    it(`answers 400 when Content-Encoding: ${encoding} is claimed but the body is not so encoded`, async () => {
      expectError(
        await ingestWith(encoding, Buffer.from('{"kind":"x.y"}')),
        400,
        new RegExp(`not valid ${encoding}`),
      );
    });
  }

  it('answers (and counts) a compressed request whose client gives up halfway, never leaving it pending', async () => {
    const counted = async () => {
      const m = await call('GET', `${a.engine}/metrics`);
      const line = new RegExp(
        '^arbiter_http_requests_total\\{api="engine",route="/v1/agent/authorize",method="POST",status="400"\\} (\\d+)$',
        'm',
      ).exec(m.text);
      return line ? Number(line[1]) : 0;
    };
    const before = await counted();
    const half = gzipSync(Buffer.from(JSON.stringify(AGENT.allow))).subarray(0, 12);
    await new Promise<void>((resolve, reject) => {
      const url = new URL(a.engine);
      const socket = connect(Number(url.port), url.hostname, () => {
        socket.write(
          `POST /v1/agent/authorize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n` +
            'Content-Type: application/json\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n' +
            `${half.length.toString(16)}\r\n`,
        );
        socket.write(half);
        setTimeout(() => {
          socket.destroy();
          resolve();
        }, 200);
      });
      socket.on('error', reject);
    });
    // The request is answered (nobody reads the answer) and counted like any other.
    const until = Date.now() + 10_000;
    while ((await counted()) === before && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
    expect(await counted()).to.equal(before + 1);
  });

  it('accepts a body that really is gzip- or br-encoded', async () => {
    const text = Buffer.from('{"kind":"encoded.ok"}');
    expect((await ingestWith('gzip', gzipSync(text))).status).to.equal(202);
    expect((await ingestWith('br', brotliCompressSync(text))).status).to.equal(202);
  });

  it('answers 415 {"error"} for an unknown Content-Encoding', async () => {
    expectError(await ingestWith('x-unknown', Buffer.from('{}')), 415);
  });

  it('answers an Expect it cannot meet with 417 {"error"} and a request id (not a bare 417)', async () => {
    const raw = await rawRequest(
      new URL(a.engine),
      'GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\nConnection: close\r\n\r\n',
    );
    const [head, body] = raw.split('\r\n\r\n') as [string, string];
    expect(head).to.match(/^HTTP\/1\.1 417 /);
    expect(head).to.match(/\r\nX-Request-Id: [0-9a-f-]{36}\r\n/i);
    expect(head).to.match(/\r\nContent-Type: application\/json/i);
    expect(Object.keys(JSON.parse(body))).to.deep.equal(['error']);
  });

  it('answers an HTTP/1.1 request without Host with 400 {"error"} and a request id (not a bare 400)', async () => {
    const raw = await rawRequest(new URL(a.engine), 'GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n');
    const [head, body] = raw.split('\r\n\r\n') as [string, string];
    expect(head).to.match(/^HTTP\/1\.1 400 /);
    expect(head).to.match(/\r\nX-Request-Id: [0-9a-f-]{36}\r\n/i);
    expect(JSON.parse(body)).to.deep.equal({ error: 'missing Host header' });
  });

  it('answers CONNECT with 400 {"error"} instead of dropping the connection', async () => {
    const raw = await rawRequest(new URL(a.engine), 'CONNECT /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    const [head, body] = raw.split('\r\n\r\n') as [string, string];
    expect(head).to.match(/^HTTP\/1\.1 400 /);
    expect(head).to.match(/\r\nX-Request-Id: /i);
    expect(Object.keys(JSON.parse(body))).to.deep.equal(['error']);
  });

  it('refuses a number JSON cannot represent (1e400 would be stored as null) with 400', async () => {
    const r = await call('PUT', `${a.platform}/api/v1/data/huge`, {
      raw: '{"id":1e400}',
      headers: { 'content-type': 'application/json' },
    });
    expectError(r, 400, /^id holds a number too large to represent$/);
    expect((await call('GET', `${a.platform}/api/v1/data/huge`)).status).to.equal(404);
  });

  // Overflow is the mantissa's digits and the exponent together: a short exponent on a long
  // mantissa overflows as surely as a long exponent does (1 followed by 210 zeros, e99, is 1e309).
  for (const [what, n] of [
    ['a 211-digit mantissa with a two-digit exponent', `1${'0'.repeat(210)}e99`],
    ['a negative one, with a fraction', `-1${'0'.repeat(210)}.5E+99`],
    ['a 300-digit mantissa with a one-digit exponent', `9${'9'.repeat(299)}e9`],
  ]) {
    it(`refuses ${what} (Infinity to JSON.parse, null once stored) with 400`, async () => {
      expect(Number.isFinite(JSON.parse(n as string))).to.equal(false);
      const r = await call('PUT', `${a.platform}/api/v1/data/huge`, {
        raw: `{"id":${n}}`,
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400, /^id holds a number too large to represent$/);
      expect((await call('GET', `${a.platform}/api/v1/data/huge`)).status).to.equal(404);
    });
  }

  it('refuses ingested integers beyond 2^53 with 400 (never a 500 from the database)', async () => {
    for (const field of ['latency_us', 'policy_revision']) {
      const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
        raw: `{"kind":"x.y","${field}":1e19}`,
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400, new RegExp(`^${field} out of range`));
    }
  });

  // SPEC makes the approve body optional; whether an empty one came as Content-Length: 0 or as
  // chunks with no data is framing, and must not change the answer.
  it('refuses a change with a precondition header its route cannot honour (400), changing nothing', async () => {
    // Data documents have no ETag: If-Match was accepted and the write made unconditionally.
    const put = await call('PUT', `${a.platform}/api/v1/data/precondition_probe`, {
      body: { v: 1 },
      headers: { 'if-match': '"stale"' },
    });
    expectError(
      put,
      400,
      /PUT \/api\/v1\/data\/\{path\} does not take If-Match.*bundle with If-Match: "rev-N"/,
    );
    expect((await call('GET', `${a.platform}/api/v1/data/precondition_probe`)).status).to.equal(404);
    const created = await call('PUT', `${a.platform}/api/v1/data/precondition_probe`, { body: { v: 1 } });
    expect(created.status, created.text).to.be.oneOf([200, 201]);
    const del = await call('DELETE', `${a.platform}/api/v1/data/precondition_probe`, {
      headers: { 'if-none-match': '*' },
    });
    expectError(del, 400, /does not take If-None-Match/);
    expect((await call('GET', `${a.platform}/api/v1/data/precondition_probe`)).status).to.equal(200);
    // A queue decision: the item stays pending.
    const pending = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    expect(pending.status, pending.text).to.equal(202);
    const approve = await call('POST', `${a.engine}/v1/queue/${pending.json.request_id}/approve`, {
      body: {},
      headers: { 'if-unmodified-since': new Date().toUTCString() },
    });
    expectError(approve, 400, /does not take If-Unmodified-Since/);
    const item = await call('GET', `${a.engine}/v1/queue/${pending.json.request_id}`);
    expect(item.json.status).to.equal('pending');
    // A policy PUT honours If-Match and If-None-Match, not If-Unmodified-Since.
    const policy = await call('PUT', `${a.platform}/api/v1/policies/precondition_probe`, {
      body: { rego: 'package precondition_probe\n' },
      headers: { 'if-unmodified-since': new Date().toUTCString() },
    });
    expectError(policy, 400, /does not take If-Unmodified-Since/);
    expect((await call('GET', `${a.platform}/api/v1/policies/precondition_probe`)).status).to.equal(404);
    // Reads keep theirs.
    const list = await call('GET', `${a.platform}/api/v1/policies`, { headers: { 'if-none-match': '"x"' } });
    expect(list.status).to.equal(200);
  });

  it('treats an empty chunked body as no body: approve without Content-Type is 200, not 415', async () => {
    const pending = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    expect(pending.status, pending.text).to.equal(202);
    const reviewer = a.createKey('empty-body-reviewer', ['queue:review']);
    const r = await sendRaw(a.engine, {
      method: 'POST',
      target: `/v1/queue/${pending.json.request_id}/approve`,
      headers: [['Authorization', `Bearer ${reviewer}`]],
      chunked: true,
    });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(JSON.parse(r.body.toString())).to.include({ id: pending.json.request_id, status: 'approved' });
    // A route that needs a body names the missing body, whichever way the empty one was framed.
    for (const chunked of [true, false]) {
      const refused = await sendRaw(a.engine, {
        method: 'POST',
        target: '/v1/agent/authorize',
        headers: [['Authorization', `Bearer ${ADMIN_KEY}`]],
        body: Buffer.alloc(0),
        chunked,
      });
      expect(refused.status).to.equal(400);
      expect(JSON.parse(refused.body.toString())).to.deep.equal({
        error: 'request body must be a JSON object',
      });
    }
  });

  // A route that takes no body once ignored any body sent, whatever its type or validity, and made
  // the change. The body is now checked as any body is and refused unless it is {}: nothing changes.
  describe('a body sent to a route that takes none', () => {
    const RULE = 'package authz.agent\n\ndeny contains "bodies" if input.action == "bodies-test-action"\n';
    const asJson = (raw: string): RequestOptions => ({
      raw,
      headers: { 'content-type': 'application/json' },
    });
    const asText = (raw: string): RequestOptions => ({ raw, headers: { 'content-type': 'text/plain' } });
    const takesNone = (method: string, template: string) =>
      `${method} ${template} takes no request body: send none, or {}`;
    const TEXT_PLAIN = 'Content-Type must be application/json, got text/plain';
    const revisionNow = async (): Promise<number> => {
      const r = await call('GET', `${a.platform}/api/v1/policies?limit=1`);
      expect(r.status, r.text).to.equal(200);
      return r.json.revision as number;
    };
    /** Runs `refusals` and checks that neither the revision nor the audit trail moved. */
    const unchanged = async (refusals: () => Promise<void>) => {
      const before = { revision: await revisionNow(), audit: await auditCount(a.platform) };
      await refusals();
      expect({ revision: await revisionNow(), audit: await auditCount(a.platform) }).to.deep.equal(before);
    };
    const policyStatus = async (name: string) =>
      (await call('GET', `${a.platform}/api/v1/policies/${name}`)).status;
    const raw = (base: string, method: string, target: string, opts: Partial<RawRequest>) =>
      sendRaw(base, {
        method,
        target,
        headers: [['Authorization', `Bearer ${ADMIN_KEY}`], ...(opts.headers ?? [])],
        body: opts.body,
        chunked: opts.chunked,
      });

    it('POST /api/v1/revisions/{n}/restore: 415 or 400 and no new revision; {} and no body restore', async () => {
      const put = await call('PUT', `${a.platform}/api/v1/policies/bodies-restore`, { body: { rego: RULE } });
      expect(put.status, put.text).to.equal(201);
      const n = await revisionNow();
      expect((await call('DELETE', `${a.platform}/api/v1/policies/bodies-restore`)).status).to.equal(204);
      const url = `${a.platform}/api/v1/revisions/${n}/restore`;
      await unchanged(async () => {
        expectError(await call('POST', url, asJson('{"bogus": true, ')), 400, /^malformed JSON body: /);
        expectError(await call('POST', url, asText('hi')), 415, TEXT_PLAIN);
        for (const body of ['{"bogus": true}', '{"message": "undo"}', '[]', '[{}]', 'null', '0', '"x"']) {
          expectError(
            await call('POST', url, asJson(body)),
            400,
            takesNone('POST', '/api/v1/revisions/{n}/restore'),
          );
        }
        expect(await policyStatus('bodies-restore')).to.equal(404);
      });
      // {} is no body; a body-less DELETE and restore are served as before.
      const restored = await call('POST', url, asJson('{}'));
      expect(restored.status, restored.text).to.equal(200);
      expect(await policyStatus('bodies-restore')).to.equal(200);
      expect(
        (await call('DELETE', `${a.platform}/api/v1/policies/bodies-restore`, asJson('{}'))).status,
      ).to.equal(204);
      const again = await call('POST', url);
      expect(again.status, again.text).to.equal(200);
      expect(again.json.revision).to.equal((restored.json.revision as number) + 2);
      expect((await call('DELETE', `${a.platform}/api/v1/policies/bodies-restore`)).status).to.equal(204);
    });

    it('POST /api/v1/policies/{name}/promote: refused with its body, the module stays in the shadow set', async () => {
      const put = await call('PUT', `${a.platform}/api/v1/policies/bodies-promote?mode=shadow`, {
        body: { rego: RULE },
      });
      expect(put.status, put.text).to.be.within(200, 201);
      const shadowed = async () =>
        ((await call('GET', `${a.platform}/api/v1/shadow`)).json.policies as { name: string }[]).map(
          (p) => p.name,
        );
      const url = `${a.platform}/api/v1/policies/bodies-promote/promote`;
      await unchanged(async () => {
        expectError(await call('POST', url, asText('hello')), 415, TEXT_PLAIN);
        expectError(await call('POST', url, asJson('{"force"')), 400, /^malformed JSON body: /);
        expectError(
          await call('POST', url, asJson('{"force": true}')),
          400,
          takesNone('POST', '/api/v1/policies/{name}/promote'),
        );
        expect(await policyStatus('bodies-promote')).to.equal(404);
        expect(await shadowed()).to.include('bodies-promote');
      });
      const promoted = await call('POST', url, asJson(' {\n} '));
      expect(promoted.status, promoted.text).to.equal(201);
      expect(await shadowed()).to.not.include('bodies-promote');
      expect((await call('DELETE', `${a.platform}/api/v1/policies/bodies-promote`)).status).to.equal(204);
    });

    it('DELETE /api/v1/policies/{name}: refused with its body, chunked or not, typed or not; the policy stays', async () => {
      const put = await call('PUT', `${a.platform}/api/v1/policies/bodies-delete`, { body: { rego: RULE } });
      expect(put.status, put.text).to.equal(201);
      const url = `${a.platform}/api/v1/policies/bodies-delete`;
      const target = '/api/v1/policies/bodies-delete';
      await unchanged(async () => {
        expectError(await call('DELETE', url, asText('garbage')), 415, TEXT_PLAIN);
        expectError(
          await call('DELETE', url, asJson('{"reason": "cleanup"}')),
          400,
          takesNone('DELETE', '/api/v1/policies/{name}'),
        );
        for (const chunked of [false, true]) {
          const typed = await raw(a.platform, 'DELETE', target, {
            headers: [['Content-Type', 'text/plain']],
            body: Buffer.from('garbage'),
            chunked,
          });
          expect(typed.status).to.equal(415);
          expect(JSON.parse(typed.body.toString())).to.deep.equal({ error: TEXT_PLAIN });
          const untyped = await raw(a.platform, 'DELETE', target, { body: Buffer.from('{}'), chunked });
          expect(untyped.status).to.equal(415);
          expect(JSON.parse(untyped.body.toString())).to.deep.equal({
            error: 'Content-Type must be application/json, got none',
          });
          const refused = await raw(a.platform, 'DELETE', target, {
            headers: [['Content-Type', 'application/json']],
            body: Buffer.from('{"all": true}'),
            chunked,
          });
          expect(refused.status).to.equal(400);
          expect(JSON.parse(refused.body.toString())).to.deep.equal({
            error: takesNone('DELETE', '/api/v1/policies/{name}'),
          });
        }
        expect(await policyStatus('bodies-delete')).to.equal(200);
      });
      // An empty chunked body is no body, whatever its Content-Type.
      const r = await raw(a.platform, 'DELETE', target, {
        headers: [['Content-Type', 'text/plain']],
        body: Buffer.alloc(0),
        chunked: true,
      });
      expect(r.status, r.body.toString()).to.equal(204);
      expect(await policyStatus('bodies-delete')).to.equal(404);
    });

    it('DELETE /v1/tokens/{tokenID} (Engine API): refused with its body, the token stays active', async () => {
      const minted = await call('POST', `${a.engine}/v1/tokens/mint`, {
        body: { subject: 'bodies-test', scopes: ['read:x'] },
      });
      expect(minted.status, minted.text).to.equal(201);
      const active = async () =>
        (await call('POST', `${a.engine}/v1/tokens/introspect`, { body: { token: minted.json.token } })).json
          .active as boolean;
      const url = `${a.engine}/v1/tokens/${minted.json.token_id}`;
      expectError(await call('DELETE', url, asText('revoke')), 415, TEXT_PLAIN);
      expectError(await call('DELETE', url, asJson('{"reason"')), 400, /^malformed JSON body: /);
      expectError(
        await call('DELETE', url, asJson('{"reason": "leaked"}')),
        400,
        takesNone('DELETE', '/v1/tokens/{tokenID}'),
      );
      expect(await active()).to.equal(true);
      const revoked = await call('DELETE', url);
      expect(revoked.status, revoked.text).to.equal(200);
      expect(await active()).to.equal(false);
    });

    it('GET and HEAD, on both listeners and public routes too: a body other than {} is refused', async () => {
      const cases = [
        { base: a.engine, target: '/v1/queue?status=pending', template: '/v1/queue' },
        { base: a.platform, target: '/api/v1/policies', template: '/api/v1/policies' },
        { base: a.engine, target: '/healthz', template: '/healthz' },
      ];
      for (const { base, target, template } of cases) {
        for (const method of ['GET', 'HEAD']) {
          // Connection: close, so that a HEAD answer (a Content-Length, no body) ends with the connection.
          const send = (headers: [string, string][], body?: string) =>
            raw(base, method, target, {
              headers: [['Connection', 'close'], ...headers],
              body: body === undefined ? undefined : Buffer.from(body),
            });
          const json: [string, string] = ['Content-Type', 'application/json'];
          const refused = await send([json], '{"status": "denied"}');
          expect(refused.status, `${method} ${target}`).to.equal(400);
          const malformed = await send([json], '{"status": ');
          expect(malformed.status, `${method} ${target}`).to.equal(400);
          const typed = await send([['Content-Type', 'text/plain']], 'status=denied');
          expect(typed.status, `${method} ${target}`).to.equal(415);
          if (method === 'GET') {
            expect(JSON.parse(refused.body.toString())).to.deep.equal({ error: takesNone('GET', template) });
            expect(JSON.parse(malformed.body.toString()).error).to.match(/^malformed JSON body: /);
            expect(JSON.parse(typed.body.toString())).to.deep.equal({ error: TEXT_PLAIN });
          }
          expect((await send([json], '{}')).status, `${method} ${target}`).to.equal(200);
          expect((await send([json], '')).status, `${method} ${target}`).to.equal(200);
          expect((await send([])).status, `${method} ${target}`).to.equal(200);
        }
      }
    });
  });

  it('answers an empty text/plain policy as it answers an empty rego in JSON, and stores nothing', async () => {
    const json = await call('PUT', `${a.platform}/api/v1/policies/empty`, { body: { rego: '' } });
    expectError(json, 400, 'rego must not be empty');
    for (const chunked of [false, true]) {
      const r = await sendRaw(a.platform, {
        method: 'PUT',
        target: '/api/v1/policies/empty',
        headers: [
          ['Authorization', `Bearer ${ADMIN_KEY}`],
          ['Content-Type', 'text/plain'],
        ],
        body: Buffer.alloc(0),
        chunked,
      });
      expect(r.status).to.equal(400);
      expect(JSON.parse(r.body.toString())).to.deep.equal({ error: 'rego must not be empty' });
    }
    expect((await call('GET', `${a.platform}/api/v1/policies/empty`)).status).to.equal(404);
  });

  it('still honours Expect: 100-continue', async () => {
    const body = JSON.stringify(AGENT.allow);
    const raw = await rawRequest(
      new URL(a.engine),
      `POST /v1/agent/authorize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\nExpect: 100-continue\r\n` +
        `Connection: close\r\n\r\n${body}`,
    );
    expect(raw).to.match(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK\r\n/);
  });
});

/** Sends `request` as raw bytes and returns everything the server wrote until it closed. */
function rawRequest(url: URL, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => socket.write(request));
    let out = '';
    socket.on('data', (d) => (out += d.toString('utf8')));
    socket.on('end', () => resolve(out));
    socket.on('error', reject);
  });
}

// Who may read /metrics: nothing is stored, so once (on the SQLite run) is enough.
onceOnly('ARBITER_METRICS_PUBLIC=true', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_METRICS_PUBLIC: 'true' });
  });
  after(async () => {
    await a.close();
  });

  for (const api of ['engine', 'platform'] as const) {
    it(`serves /metrics without a key on the ${api} listener`, async () => {
      const r = await call('GET', (api === 'engine' ? a.engine : a.platform) + '/metrics', { key: null });
      expect(r.status).to.equal(200);
      expect(r.text).to.include('arbiter_http_requests_total');
      expect(r.headers.get('x-request-id')).to.match(UUID_V7);
    });
  }

  it('still requires a key on other routes', async () => {
    expectError(await call('POST', a.engine + '/v1/agent/authorize', { key: null, body: AGENT.allow }), 401);
  });
});
