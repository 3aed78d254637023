import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import YAML from 'yaml';
import { loadConfig, SETTING_ENV_NAMES } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { Arbiter, call, REPO } from './helpers/harness.js';

const EXAMPLE = path.join(REPO, 'arbiter.example.yaml');

// Configuration parsing and start-up touch no stored state of their own: once (SQLite run).
onceOnly('arbiter.example.yaml', () => {
  it('names every setting, each by its YAML key, and holds nothing else', () => {
    const doc = YAML.parse(readFileSync(EXAMPLE, 'utf8')) as Record<string, unknown>;
    const keys = SETTING_ENV_NAMES.map((e) => e.replace(/^ARBITER_/, '').toLowerCase());
    expect(Object.keys(doc).sort()).to.deep.equal([...keys].sort());
  });

  it('loads as the defaults: the example changes nothing by being used', () => {
    const fromFile = loadConfig({ ARBITER_CONFIG: EXAMPLE });
    const defaults = loadConfig({});
    expect(fromFile).to.deep.equal(defaults);
  });

  it('reads each value of the file as the text written there, as the environment would give it', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-config-text-'));
    try {
      const file = path.join(dir, 'arbiter.yaml');
      writeFileSync(
        file,
        [
          'admin_key: 1234567890123456789',
          'authzen_default_tenant: 00123',
          'max_body_bytes: 2000',
          'max_long_polls_per_key: ~',
          'public_url:',
          'metrics_public: true',
          'audit_mask_fields: [context.ssn, 0012]',
          '',
        ].join('\n'),
      );
      const c = loadConfig({ ARBITER_CONFIG: file });
      // A number to YAML's core schema: read as one, it was 1234567890123456800 and 123.
      expect(c.adminKey).to.equal('1234567890123456789');
      expect(c.authzenDefaultTenant).to.equal('00123');
      expect(c.maxBodyBytes).to.equal(2000);
      expect(c.maxLongPollsPerKey).to.equal(loadConfig({}).maxLongPollsPerKey);
      expect(c.publicUrl).to.equal(loadConfig({}).publicUrl);
      expect(c.metricsPublic).to.equal(true);
      expect(c.auditMaskFields).to.deep.equal(['context.ssn', '0012']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('takes mask paths under context and an AuthZEN request, and refuses those a decision records in the clear', () => {
    const ok = 'context.ssn, authzen.resource.properties.card, authzen.subject.properties.passport, password';
    expect(loadConfig({ ARBITER_AUDIT_MASK_FIELDS: ok }).auditMaskFields).to.deep.equal([
      'context.ssn',
      'authzen.resource.properties.card',
      'authzen.subject.properties.passport',
      // Ingested audit events' own details may hold it.
      'password',
    ]);
    for (const bad of [
      'resource',
      'agent_id',
      'action',
      'tenant_id',
      'user_id',
      'principal.name',
      'context',
      'authzen',
      'authzen.resource.id',
      'authzen.action.name',
      // An AuthZEN request's context is the decision's (context.<field> masks it); these
      // properties are read as the decision's confidence and tenant.
      'authzen.context',
      'authzen.context.ssn',
      'authzen.subject.properties.confidence',
      'authzen.subject.properties.tenant_id',
    ]) {
      expect(() => loadConfig({ ARBITER_AUDIT_MASK_FIELDS: bad }), bad).to.throw(`"${bad}" cannot be masked`);
    }
    expect(() => loadConfig({ ARBITER_AUDIT_MASK_FIELDS: 'context.' })).to.throw('is not a dotted path');
  });

  it('derives the long-polls one key may hold from the process-wide cap, unless set', () => {
    expect(loadConfig({}).maxLongPollsPerKey).to.equal(100);
    expect(loadConfig({ ARBITER_MAX_LONG_POLLS: '25' }).maxLongPollsPerKey).to.equal(2);
    expect(loadConfig({ ARBITER_MAX_LONG_POLLS: '5' }).maxLongPollsPerKey).to.equal(1);
    expect(
      loadConfig({ ARBITER_MAX_LONG_POLLS: '5', ARBITER_MAX_LONG_POLLS_PER_KEY: '3' }).maxLongPollsPerKey,
    ).to.equal(3);
  });

  describe('starts the service through ARBITER_CONFIG', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-example-'));
    let a: Arbiter | undefined;
    afterEach(async () => {
      await a?.close();
      a = undefined;
    });
    after(() => rmSync(dir, { recursive: true, force: true }));

    it('as it is', async () => {
      a = await Arbiter.start({ ARBITER_CONFIG: EXAMPLE });
      const r = await call('GET', a.engine + '/healthz', { key: null });
      expect(r.status).to.equal(200);
      expect(r.json.status).to.equal('ok');
    });

    it('with a value edited in the file, which the process then applies', async () => {
      // The harness sets ports, data directory, admin key, policy directory and log level in the
      // environment (which wins); a setting it leaves alone comes from the file.
      const edited = path.join(dir, 'arbiter.yaml');
      const text = readFileSync(EXAMPLE, 'utf8');
      expect(text).to.match(/^max_body_bytes: 1048576 /m);
      writeFileSync(edited, text.replace(/^max_body_bytes: 1048576 /m, 'max_body_bytes: 2000 '));
      a = await Arbiter.start({ ARBITER_CONFIG: edited });
      const body = { agent_id: 'deploy-bot', action: 'read', resource: 'repo/x', confidence: 0.9 };
      const small = await call('POST', a.engine + '/v1/agent/authorize', { body });
      expect(small.status).to.equal(200);
      const big = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...body, context: { pad: 'x'.repeat(3000) } },
      });
      expectError(big, 413);
    });
  });
});
