import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call, HUMAN } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// What can and cannot be stored is the point: every backend.
/**
 * A lone UTF-16 surrogate cannot be stored as UTF-8 (SQLite and PostgreSQL would replace it), and
 * U+0000 cannot be stored in PostgreSQL text: either would make the stored event differ from the
 * hashed one. Such strings are refused at the edge, in every JSON body and every string field.
 */
onEveryBackend('strings that cannot be stored as received', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  /** A JSON text with `value` spliced in as raw escape text (JSON.stringify would escape it twice). */
  const withRaw = (body: object, field: string, escaped: string) =>
    JSON.stringify({ ...body, [field]: '@@' }).replace('"@@"', `"${escaped}"`);

  const verifyOk = async () => {
    const v = await call('GET', `${a.platform}/api/v1/audit/verify`);
    expect(v.json, v.text).to.include({ ok: true });
    return v.json.checked as number;
  };

  const cases: [string, string, object, string][] = [
    ['agent action', '/v1/agent/authorize', AGENT.allow, 'action'],
    ['agent_id', '/v1/agent/authorize', AGENT.allow, 'agent_id'],
    ['user_id', '/v1/authorize', HUMAN.allow, 'user_id'],
    ['tenant_id', '/v1/authorize', HUMAN.allow, 'tenant_id'],
  ];
  for (const [what, path, body, field] of cases) {
    for (const escaped of ['\\ud800', 'x\\udfff', '\\u0000']) {
      it(`refuses ${escaped} in the ${what} with 400 and records nothing`, async () => {
        const before = await verifyOk();
        const r = await call('POST', a.engine + path, {
          raw: withRaw(body, field, escaped),
          headers: { 'content-type': 'application/json' },
        });
        expectError(r, 400, new RegExp(`^${field} .*(surrogate|U\\+0000)`));
        expect(await verifyOk()).to.equal(before);
      });
    }
  }

  it('refuses a lone surrogate deep in the context, and in an object key', async () => {
    for (const context of ['{"a":{"b":["ok","\\udc00"]}}', '{"\\ud83d":1}']) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        raw: JSON.stringify(AGENT.allow).replace(/}$/, `,"context":${context}}`),
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400, /surrogate/);
    }
  });

  it('accepts a well-formed surrogate pair (an emoji) and an escaped backslash-u text', async () => {
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      raw: JSON.stringify(AGENT.allow).replace(
        /}$/,
        ',"context":{"why":"\\ud83d\\ude80 ok","lit":"\\\\ud800"}}',
      ),
      headers: { 'content-type': 'application/json' },
    });
    expect(r.status, r.text).to.equal(200);
    const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
    expect(ev.details.context).to.deep.equal({ why: '\u{1F680} ok', lit: '\\ud800' });
    await verifyOk();
  });

  it('refuses a lone surrogate in an ingested event and keeps the chain verifiable', async () => {
    const before = await verifyOk();
    for (const field of ['kind', 'agent_id', 'message', 'tenant_id']) {
      const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
        raw: withRaw({ kind: 'edge.decision' }, field, 'bad\\ud800'),
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400, /surrogate/);
    }
    expect(await verifyOk()).to.equal(before);
  });

  it('refuses a data document holding a lone surrogate (400, nothing changes)', async () => {
    const rev = (await call('GET', `${a.engine}/healthz`, { key: null })).json.revision;
    const r = await call('PUT', `${a.platform}/api/v1/data/probe`, {
      raw: '{"name":"\\ud800"}',
      headers: { 'content-type': 'application/json' },
    });
    expectError(r, 400, /surrogate/);
    expect((await call('GET', `${a.platform}/api/v1/data/probe`)).status).to.equal(404);
    expect((await call('GET', `${a.engine}/healthz`, { key: null })).json.revision).to.equal(rev);
  });

  it('refuses NUL in a text/plain policy', async () => {
    const r = await call('PUT', `${a.platform}/api/v1/policies/nul`, {
      raw: 'package authz.agent\n\ndeny contains "x\u0000" if false\n',
      headers: { 'content-type': 'text/plain' },
    });
    expectError(r, 400, /U\+0000/);
  });
  // Bytes that are not UTF-8 used to be decoded with U+FFFD in their place: different bodies
  // became one request (one request digest), and a stored policy's sha256 was not that of its bytes.
  describe('a body that is not valid UTF-8', () => {
    const agentBody = (resource: Buffer) =>
      Buffer.concat([
        Buffer.from('{"agent_id":"deploy-bot","action":"read","resource":"repo/'),
        resource,
        Buffer.from('","confidence":0.95}'),
      ]);
    const notUtf8 = [
      ['\\xff\\xfe', Buffer.from([0xff, 0xfe])],
      ['a truncated sequence', Buffer.from([0xe2, 0x82])],
      ['an overlong encoding', Buffer.from([0xc0, 0xaf])],
      ['an encoded surrogate', Buffer.from([0xed, 0xa0, 0x80])],
    ] as const;
    for (const [what, bytes] of notUtf8) {
      it(`refuses ${what} in a JSON body with 400 and records nothing`, async () => {
        const before = await verifyOk();
        const r = await call('POST', a.engine + '/v1/agent/authorize', {
          raw: agentBody(bytes),
          headers: { 'content-type': 'application/json' },
        });
        expectError(r, 400, 'request body is not valid UTF-8');
        expect(await verifyOk()).to.equal(before);
      });
    }

    it('refuses it after Content-Encoding is undone too', async () => {
      const r = await call('POST', a.engine + '/v1/agent/authorize', {
        raw: gzipSync(agentBody(Buffer.from([0xff, 0xfe]))),
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
      });
      expectError(r, 400, 'request body is not valid UTF-8');
    });

    it('refuses a text/plain policy holding \\xff\\xfe with 400 and stores nothing', async () => {
      const rev = (await call('GET', `${a.engine}/healthz`, { key: null })).json.revision;
      const r = await call('PUT', `${a.platform}/api/v1/policies/not-utf8`, {
        raw: Buffer.concat([
          Buffer.from('package authz.agent\n\n# '),
          Buffer.from([0xff, 0xfe]),
          Buffer.from('\nnot_utf8 := true\n'),
        ]),
        headers: { 'content-type': 'text/plain' },
      });
      expectError(r, 400, 'request body is not valid UTF-8');
      expect((await call('GET', `${a.platform}/api/v1/policies/not-utf8`)).status).to.equal(404);
      expect((await call('GET', `${a.engine}/healthz`, { key: null })).json.revision).to.equal(rev);
    });

    it('accepts U+FFFD itself when it is sent as UTF-8: the stored sha256 is that of the bytes sent', async () => {
      const bytes = Buffer.from('package authz.agent\n\n# \ufffd \u00e9 \u{1F680}\nreplacement_ok := true\n');
      const r = await call('PUT', `${a.platform}/api/v1/policies/replacement-char`, {
        raw: bytes,
        headers: { 'content-type': 'text/plain' },
      });
      expect(r.status, r.text).to.equal(201);
      expect(r.json.sha256).to.equal(createHash('sha256').update(bytes).digest('hex'));
      await call('DELETE', `${a.platform}/api/v1/policies/replacement-char`);
    });
  });

  // Path segments and query values reach the stores too (PostgreSQL text cannot hold U+0000).
  for (const [method, url] of [
    ['GET', '/v1/queue/%00'],
    ['GET', '/v1/queue/x%00/events'],
    ['DELETE', '/v1/tokens/%00'],
    ['GET', '/v1/queue?status=pending&cursor=%00'],
  ] as const) {
    it(`refuses U+0000 in ${method} ${url} with 400`, async () => {
      const r = await call(method, a.engine + url);
      expectError(r, 400, /(path|query) parameter \w+ holds a lone UTF-16 surrogate or a U\+0000/);
    });
  }
  // Node's querystring would read bytes that are not UTF-8 as U+FFFD, and a filter would match
  // nothing (200, an empty list) where a body of the same bytes is a 400.
  it('refuses percent-escapes that are not UTF-8 in any query value or name with 400', async () => {
    for (const [base, url] of [
      [a.platform, '/api/v1/audit?kind=%ED%A0%80'],
      [a.platform, '/api/v1/audit?agent_id=ok&action=%C3'],
      [a.platform, '/api/v1/audit?kind=%FF%FE'],
      [a.platform, '/api/v1/audit/verify?x%80=1'],
      [a.engine, '/v1/queue?status=pending&cursor=%E2%82'],
      [a.platform, '/api/v1/policies?cursor=%C0%AF'],
    ] as const) {
      expectError(await call('GET', base + url), 400, 'the query string is not percent-encoded UTF-8');
    }
    // Well-formed escapes, and a lone % that escapes nothing, are read as before.
    const ok = await call('GET', `${a.platform}/api/v1/audit?kind=%C3%A9%F0%9F%9A%80`);
    expect(ok.status, ok.text).to.equal(200);
    expect(ok.json.events).to.deep.equal([]);
    const pct = await call('GET', `${a.platform}/api/v1/audit?kind=100%`);
    expect(pct.status, pct.text).to.equal(200);
  });

  // The router keeps a parameter it cannot decode as its literal text: it was a 404 (not found
  // under that text) where a body of the same bytes is a 400.
  it('refuses percent-escapes that are not UTF-8 in a path parameter with 400', async () => {
    for (const [base, url] of [
      [a.platform, '/api/v1/audit/trace/%ED%A0%80'],
      [a.platform, '/api/v1/policies/x%C3'],
      [a.engine, '/v1/queue/%FF%FE'],
      [a.platform, '/api/v1/decisions/%C0%AF/explain'],
    ] as const) {
      expectError(await call('GET', base + url), 400, 'the path is not percent-encoded UTF-8');
    }
    // A well-formed escape is decoded as before (and the trace id read as written: not found).
    expectError(await call('GET', `${a.platform}/api/v1/audit/trace/caf%C3%A9`), 404, /café/);
  });

  it('refuses U+0000 in a policy name and a data path on the Platform API with 400', async () => {
    for (const url of [
      '/api/v1/policies/x%00',
      '/api/v1/data/x%00',
      '/api/v1/webhooks/x%00',
      '/api/v1/audit/trace/x%00',
      '/api/v1/audit?agent_id=x%00',
    ]) {
      const r = await call('GET', a.platform + url);
      expectError(r, 400, /U\+0000/);
    }
  });
});
