import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, auditCount, call, HUMAN } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// These go through storage: every backend.
/** Input that could smuggle scope or reach the prototype, reserved names, paging, parser errors. */
onEveryBackend('unsafe input and edge answers', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('refuses whitespace in action, resource and ids, so no token scope can smuggle in another', async () => {
    const cases = [
      { ...AGENT.allow, resource: 'repo/x deploy:prod/api' },
      { ...AGENT.allow, action: 'read deploy' },
      { ...AGENT.allow, agent_id: 'deploy-bot\n' },
      { ...AGENT.allow, resource: 'repo/x\u0000' },
    ];
    for (const body of cases) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body });
      expectError(r, 400);
      expect(r.json.error).to.match(/whitespace, control or invisible characters|U\+0000/);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, resource: { type: 'project', id: 'p1 admin:all' } },
    });
    expectError(human, 400);
    expect(human.json.error).to.match(/^resource\.id must not contain whitespace/);
  });

  it('refuses "." and ".." resource segments, which a normalising resource server would resolve elsewhere', async () => {
    const recorded = async () => [await auditCount(a.platform), await a.count('decisions')];
    const before = await recorded();
    // Each passed the example policy's repo/** or staging/** rule (200 allow) and names prod/….
    for (const resource of [
      'repo/../prod/db',
      'staging/../prod/db',
      'repo/../prod/secrets/x',
      'repo/./x',
      '..',
      'repo/%2e%2e/prod/db',
      'repo/.%2E/x',
      '%2E',
      // Separators a resource server decodes (once or twice) before it splits the path, or reads
      // as "/": each of these names prod/db or prod/secrets/… once normalised.
      'repo/x%2F..%2F..%2Fprod/db',
      'prod/a%2f..%2fsecrets/k',
      'repo/x%252F..%252Fprod/db',
      'repo\\..\\prod\\db',
      'repo/x%5C..%5Cprod/db',
      'repo/%252e%252e/prod/db',
      // A path parameter (Tomcat's "..;/"), a query or a fragment ends the segment.
      'repo/..;/prod/db',
      'repo/..;x/prod/db',
      'repo/..?x',
      'repo/.#x',
      // Unicode compatibility forms (NFKC, Windows' best-fit mapping): fullwidth and small dots,
      // the one-dot leader, the fullwidth solidus and reverse solidus.
      'repo/\uFF0E\uFF0E/prod/db',
      'repo/\uFE52\uFE52/prod/db',
      'repo/\u2024\u2024/prod/db',
      'repo\uFF0F..\uFF0Fprod/db',
      'repo\uFF3C..\uFF3Cprod/db',
      'repo/\u2025/prod/db',
      'repo\uFE68..\uFE68prod/db',
      // Overlong UTF-8 for "." and "/" (decoded by old servers).
      'repo/%c0%ae%c0%ae/prod/db',
      'repo/x%C0%AF..%C0%AFprod/db',
    ]) {
      for (const path of ['/v1/agent/authorize', '/api/v1/authorize']) {
        const r = await call('POST', a.engine + path, { body: { ...AGENT.deny, resource } });
        expectError(r, 400, 'resource must not contain a "." or ".." path segment');
      }
    }
    for (const [field, type, id] of [
      ['type', '..', 'p1'],
      ['type', 'project/.', 'p1'],
      ['id', 'project', './p1'],
      ['id', 'project', 'p1/../p2'],
      ['id', 'project', '.'],
    ]) {
      const r = await call('POST', a.engine + '/v1/authorize', {
        body: { ...HUMAN.allow, resource: { type, id } },
      });
      expectError(r, 400, `resource.${field} must not contain a "." or ".." path segment`);
    }
    expect(await recorded()).to.deep.equal(before);

    // Dots that are not whole segments are ordinary characters.
    for (const resource of [
      'repo/a.b',
      'repo/.hidden',
      'repo/...',
      'repo/..x',
      'repo/x..',
      'repo/.../y',
      // Encoded separators, ";", "?" and "\\" beside ordinary names are not dot-segments.
      'repo/a%2Fb',
      'repo/a;b/..x',
      'repo/x?..',
      'repo/x\\.hidden',
      'repo/%2e%2e%2e',
    ]) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body: { ...AGENT.allow, resource } });
      expect(r.status, `${resource}: ${r.text}`).to.equal(200);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, action: 'logs.read', resource: { type: '.project', id: '...' } },
    });
    expect(human.status, human.text).to.equal(200);
  });

  // C1 controls (U+0080–U+009F) are not whitespace to JavaScript's \\s, yet NEL breaks a log line
  // and CSI starts a terminal escape: they are refused as C0 controls are, and nothing is recorded.
  it('refuses C1 control characters (NEL U+0085, CSI U+009B) in every token-safe field, recording nothing', async () => {
    const before = (await call('GET', `${a.platform}/api/v1/audit/verify`)).json.checked as number;
    const agent: [string, Record<string, unknown>][] = [
      ['resource', { ...AGENT.allow, resource: 'repo/a\u0085b' }],
      ['action', { ...AGENT.allow, action: 'read\u009b2J' }],
      ['agent_id', { ...AGENT.allow, agent_id: '\u0080deploy-bot' }],
      ['agent_id', { ...AGENT.allow, agent_id: 'deploy-bot\u009f' }],
    ];
    for (const [field, body] of agent) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body });
      expectError(r, 400, `${field} must not contain whitespace, control or invisible characters`);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, resource: { type: 'project', id: 'p1\u0085admin' } },
    });
    expectError(human, 400, 'resource.id must not contain whitespace, control or invisible characters');
    const minted = await call('POST', a.engine + '/v1/tokens/mint', {
      body: { subject: 'ops-bot', scopes: ['read:repo/a\u0085deploy:prod'] },
    });
    expectError(minted, 400, 'scopes.0 must not contain whitespace, control or invisible characters');
    expect((await call('GET', `${a.platform}/api/v1/audit/verify`)).json.checked).to.equal(before);
    // Letters beyond ASCII are not controls: U+00A1 onwards still pass.
    const accented = await call('POST', a.engine + '/v1/agent/authorize', {
      body: { ...AGENT.allow, resource: 'repo/caf\u00e9' },
    });
    expect(accented.status, accented.text).to.equal(200);
    // A key bound to an agent follows the agent id's rule: the CLI refuses a C1 binding.
    const bound = a.cli([
      'keys',
      'create',
      '--name',
      'c1-bound',
      '--scopes',
      'authorize',
      '--agent',
      'bot\u0085x',
    ]);
    expect(bound.code).to.not.equal(0);
    expect(bound.stderr).to.contain(
      'agent must be 1-256 characters without whitespace, control or invisible characters',
    );
  });

  // Format characters are invisible: a right-to-left override makes "\u202Ebd/dorp" read as
  // "prod/db" to a reviewer, while the approval and the token bind the characters as sent.
  it('refuses invisible characters (bidi overrides, zero-width, fillers) in every token-safe field, recording nothing', async () => {
    const before = (await call('GET', `${a.platform}/api/v1/audit/verify`)).json.checked as number;
    const agent: [string, Record<string, unknown>][] = [
      ['resource', { ...AGENT.allow, resource: '\u202Ebd/dorp' }],
      ['resource', { ...AGENT.allow, resource: 'repo/\u2066arbiter\u2069' }],
      ['action', { ...AGENT.allow, action: 'de\u200Bploy' }],
      ['action', { ...AGENT.allow, action: 'read\u200D' }],
      // Default-ignorable, not Cf: a Hangul filler and a variation selector.
      ['resource', { ...AGENT.allow, resource: 'repo/\u3164' }],
      ['action', { ...AGENT.allow, action: 'read\uFE0F' }],
      ['agent_id', { ...AGENT.allow, agent_id: '\uFEFFdeploy-bot' }],
      // A symbol to Unicode, a space to the eye: the Braille pattern blank.
      ['resource', { ...AGENT.allow, resource: 'prod/\u2800secrets/x' }],
    ];
    for (const [field, body] of agent) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body });
      expectError(r, 400, `${field} must not contain whitespace, control or invisible characters`);
    }
    const human = await call('POST', a.engine + '/v1/authorize', {
      body: { ...HUMAN.allow, resource: { type: 'pro\u200Eject', id: 'p1' } },
    });
    expectError(human, 400, 'resource.type must not contain whitespace, control or invisible characters');
    const authzen = await call('POST', a.engine + '/access/v1/evaluation', {
      body: {
        subject: { type: 'user', id: 'alice\u202E' },
        action: { name: 'read' },
        resource: { type: 'doc', id: 'd1' },
      },
    });
    expectError(authzen, 400, 'subject.id must not contain whitespace, control or invisible characters');
    expect((await call('GET', `${a.platform}/api/v1/audit/verify`)).json.checked).to.equal(before);
    // Visible characters beyond ASCII are unchanged: letters, marks, symbols.
    for (const resource of ['repo/caf\u00e9', 'repo/\u65e5\u672c', 'repo/\u{1F680}', 'repo/e\u0301']) {
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body: { ...AGENT.allow, resource } });
      expect(r.status, `${resource}: ${r.text}`).to.equal(200);
    }
    const bound = a.cli([
      'keys',
      'create',
      '--name',
      'cf-bound',
      '--scopes',
      'authorize',
      '--agent',
      'bot\u200B',
    ]);
    expect(bound.code).to.not.equal(0);
    expect(bound.stderr).to.contain(
      'agent must be 1-256 characters without whitespace, control or invisible characters',
    );
  });

  it('reserves the policy name authz, serves both agent paths on both APIs, keeps requested_by internal', async () => {
    const r = await call('PUT', a.platform + '/api/v1/policies/authz', {
      raw: 'package authz.agent\n\nallow if input.action == "x"\n',
      headers: { 'content-type': 'text/plain' },
    });
    expectError(r, 400);
    expect(r.json.error).to.include('reserved');
    expect((await call('POST', a.platform + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const item = await call('GET', a.engine + `/v1/queue/${q.json.request_id}`);
    expect(item.json).to.not.have.property('requested_by');
    const list = await call('GET', a.engine + '/v1/queue/pending');
    expect(list.json.items[0]).to.not.have.property('requested_by');
  });

  it('pages the policy and data lists and names a bad parameter', async () => {
    const first = await call('GET', a.platform + '/api/v1/policies?limit=1');
    expect(first.json.policies).to.have.length(1);
    expect(first.json.next_cursor).to.be.a('string');
    const second = await call(
      'GET',
      a.platform + `/api/v1/policies?limit=1&cursor=${first.json.next_cursor}`,
    );
    expect(second.json.policies[0].name).to.not.equal(first.json.policies[0].name);
    expect((await call('GET', a.platform + '/api/v1/policies')).json.next_cursor).to.equal(null);
    for (const q of ['limit=abc', 'limit=0', 'foo=1', 'cursor=!!']) {
      expectError(await call('GET', a.platform + `/api/v1/policies?${q}`), 400);
      expectError(await call('GET', a.platform + `/api/v1/data?${q}`), 400);
    }
    expect((await call('GET', a.platform + '/api/v1/data?limit=2')).json.documents).to.have.length(2);
  });

  it('answers requests the HTTP parser refuses with a JSON error and an X-Request-Id', async () => {
    const { connect } = await import('node:net');
    const url = new URL(a.engine);
    const raw = await new Promise<string>((resolve) => {
      const s = connect(Number(url.port), url.hostname, () => s.write('GARBAGE\r\n\r\n'));
      let out = '';
      s.on('data', (d) => (out += d.toString()));
      s.on('close', () => resolve(out));
    });
    expect(raw).to.match(/^HTTP\/1\.1 400 /);
    expect(raw).to.match(/X-Request-Id: [0-9a-f-]{36}/);
    expect(raw).to.match(/\{"error":"malformed HTTP request"\}$/);
  });

  it('refuses data path segments that reach Object.prototype, and keeps serving', async () => {
    for (const seg of ['__proto__', 'constructor', 'prototype']) {
      const r = await call('PUT', a.platform + `/api/v1/data/x/${seg}/polluted`, {
        raw: '"yes"',
        headers: { 'content-type': 'application/json' },
      });
      expectError(r, 400);
      expect(r.json.error).to.include(seg);
    }
    expect((await call('GET', a.engine + '/healthz', { key: null })).status).to.equal(200);
    expect((await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow })).status).to.equal(
      200,
    );
    expect(({} as Record<string, unknown>).polluted).to.equal(undefined);
  });
});
