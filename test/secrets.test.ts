import { expect } from 'chai';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onceOnly, onEveryBackend, onSqliteOnly } from './helpers/backends.js';
import { AGENT, Arbiter, auditEvents, call, REPO, storedText } from './helpers/harness.js';
import { baseEnv, runSync } from './helpers/process.js';

/** The permission bits of a file or directory. */
const modeOf = (p: string) => statSync(p).mode & 0o777;

// Where secrets must not end up: files others can read, logs, answers, the audit trail.

// The SQLite file holds the signing keys' private halves, webhook secrets, the cursor key and
// every decision: a directory Arbiter creates for it, and the file, are the service user's alone.
onSqliteOnly('files Arbiter creates for its state', () => {
  let parent: string;
  let a: Arbiter;
  before(async () => {
    parent = mkdtempSync(path.join(os.tmpdir(), 'arbiter-modes-'));
    // Not there yet: Arbiter creates it (and its parent `state`), as it does ./data by default.
    a = await Arbiter.start({}, path.join(parent, 'state', 'data'));
    // Something written, so that the WAL and its index exist.
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    expect(r.status, r.text).to.equal(200);
  });
  after(async () => {
    await a.close();
    rmSync(parent, { recursive: true, force: true });
  });

  it('creates the data directory (and its missing parents) readable by its owner only', () => {
    expect(modeOf(path.join(parent, 'state')).toString(8)).to.equal('700');
    expect(modeOf(a.dataDir).toString(8)).to.equal('700');
  });

  it('creates the database, its WAL and its shared-memory index readable by their owner only', () => {
    const files = readdirSync(a.dataDir).sort();
    expect(files).to.include.members(['arbiter.db', 'arbiter.db-wal', 'arbiter.db-shm']);
    for (const f of files) expect(`${f} ${modeOf(path.join(a.dataDir, f)).toString(8)}`).to.equal(`${f} 600`);
  });
});

// Masking happens before storage, so every stored row of either backend is searched.
onEveryBackend('masked fields inside arrays', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_AUDIT_MASK_FIELDS: 'context.cards.number,context.ssn' });
  });
  after(async () => {
    await a.close();
  });

  // `context.cards.number` names each card's number when `cards` is a list of cards, as it names
  // the one card's number when `cards` is an object: the agent chooses the shape, not the operator.
  it('masks the named member of every object of an array on the way, in every stored row', async () => {
    const context = {
      cards: [{ number: '4111-ARRAY-ONE', brand: 'visa' }, { number: '5500-ARRAY-TWO' }, 'not-a-card'],
      ssn: ['SSN-IN-A-LIST'],
      nested: [[{ cards: { number: 'NOT-NAMED' } }]],
    };
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: { ...AGENT.approval, context } });
    expect(r.status, r.text).to.equal(202);
    const everything = await storedText(a);
    expect(everything).to.include(r.json.request_id);
    for (const secret of ['4111-ARRAY-ONE', '5500-ARRAY-TWO', 'SSN-IN-A-LIST']) {
      expect(everything).to.not.include(secret);
    }
    const masked = {
      cards: [{ number: '[masked]', brand: 'visa' }, { number: '[masked]' }, 'not-a-card'],
      ssn: '[masked]',
      nested: [[{ cards: { number: 'NOT-NAMED' } }]],
    };
    const [event] = await auditEvents(a.platform, { request_id: r.json.request_id, kind: 'decision' });
    expect(event.details.context).to.deep.equal(masked);
    const item = await call('GET', `${a.engine}/v1/queue/${r.json.request_id}`);
    expect(item.json.context).to.deep.equal(masked);
  });
});

// CI runs the policy CLI and keeps what it prints: the key it was given must not be among it.
onceOnly('the policy CLI and its API key', () => {
  const policies = path.join(REPO, 'policies');
  // Nothing listens on port 9 (discard): the key never reaches a server in these tests.
  const run = (args: string[], env: Record<string, string> = {}) =>
    runSync(['policy', 'diff', policies, '--url', 'http://127.0.0.1:9', ...args], baseEnv(env), 60_000);

  it('refuses a key that cannot be sent in a header without echoing it (exit 2), also with --json', () => {
    for (const [how, key] of [
      ['--key', 'arb_0123456789abcdef_SECRET-PART\nSECOND-LINE'],
      ['ARBITER_KEY', 'arb_0123456789abcdef_SECRET-PART\u0001SOH'],
      ['--key', 'arb_0123456789abcdef_SECRET-PART with a space'],
      ['ARBITER_KEY', 'arb_0123456789abcdef_SECRET-PART€'],
    ] as const) {
      for (const json of [[], ['--json']]) {
        const r = how === '--key' ? run(['--key', key, ...json]) : run(json, { ARBITER_KEY: key });
        expect(r.code, r.stderr).to.equal(2);
        const said = r.stdout + r.stderr;
        expect(said).to.match(/API key/);
        expect(said).to.not.include('SECRET-PART');
      }
    }
  });

  it('still sends a key with surrounding whitespace (a file read with its line break), as fetch does', () => {
    const r = run(['--key', 'arb_0123456789abcdef_SECRET-PART\r\n']);
    // It got as far as the connection: refused there, not for the key.
    expect(r.code, r.stderr).to.equal(2);
    expect(r.stderr).to.match(/cannot reach/);
    expect(r.stderr).to.not.include('SECRET-PART');
  });
});

// Start-up errors go to a journal or a container log: they name the setting, never its value.
onceOnly('a configuration file that is not valid YAML', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-config-'));
  });
  after(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('is refused naming the file, line and column, never quoting the line (which may hold a secret)', () => {
    for (const [name, text, line] of [
      ['nested.yaml', 'admin_key: SUPERSECRET-admin-key-0123: x\n', 1],
      ['quote.yaml', 'log_level: info\ndatabase_url: "postgres://arbiter:SUPERSECRET@db/arbiter\n', 3],
      ['block.yaml', 'admin_key: |SUPERSECRET-admin-key-0123\n', 1],
      ['flow.yaml', 'admin_key: [SUPERSECRET-admin-key-0123\n', 2],
    ] as const) {
      const file = path.join(dir, name);
      writeFileSync(file, text);
      const r = runSync(['keys', 'list'], baseEnv({ ARBITER_CONFIG: file }));
      expect(r.code, `${name}: ${r.stderr}`).to.equal(2);
      expect(r.stderr, name).to.include(`ARBITER_CONFIG: ${file} is not valid YAML`);
      expect(r.stderr, name).to.match(new RegExp(`line ${line}, column \\d+`));
      expect(r.stdout + r.stderr, name).to.not.include('SUPERSECRET');
    }
  });

  it('prints no YAML warning quoting a line either', () => {
    const file = path.join(dir, 'tag.yaml');
    writeFileSync(file, 'admin_key: !SUPERSECRET-tag-0123456789 x\n');
    const r = runSync(['keys', 'list'], baseEnv({ ARBITER_CONFIG: file }));
    expect(r.stdout + r.stderr).to.not.include('SUPERSECRET');
  });
});

// The OPA CLI compiles and explains policies from this process: it needs none of its secrets.
onEveryBackend('the environment of the OPA processes Arbiter runs', () => {
  let dir: string;
  let a: Arbiter;
  const seen = () => readFileSync(path.join(dir, 'env.txt'), 'utf8');
  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-opa-env-'));
    // An `opa` that writes down the environment it was given, then runs the real one.
    const real = path.join(REPO, '.opa-bin', 'opa');
    const wrapper = path.join(dir, 'opa');
    writeFileSync(wrapper, `#!/bin/sh\nenv >> '${path.join(dir, 'env.txt')}'\nexec '${real}' "$@"\n`);
    chmodSync(wrapper, 0o700);
    a = await Arbiter.start({ ARBITER_OPA_BIN: wrapper, PGPASSWORD: 'PG-ENV-SECRET' });
  });
  after(async () => {
    await a.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('holds no ARBITER_* setting and no PG* variable: not the admin key, not the database URL', async () => {
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.deny });
    expect(r.status, r.text).to.equal(403);
    // An explanation runs `opa eval`, as a compile runs `opa check` and `opa build`.
    const x = await call('GET', `${a.platform}/api/v1/decisions/${r.json.request_id}/explain`);
    expect(x.status, x.text).to.equal(200);
    const env = seen();
    expect(env).to.match(/^PATH=/m);
    expect(env).to.not.include(a.fullEnv().ARBITER_ADMIN_KEY);
    expect(env).to.not.match(/^(ARBITER_|PG)/m);
    if (a.databaseUrl) expect(env).to.not.include(new URL(a.databaseUrl).host);
  });
});

// A failed evaluation is recorded with its error, and a builtin's error quotes its operand.
onEveryBackend('a masked field quoted by a failing builtin', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_AUDIT_MASK_FIELDS: 'context.expiry' });
    const put = await call('PUT', a.platform + '/api/v1/policies/expiry', {
      raw: [
        'package authz.agent',
        '',
        'deny contains "expired" if {',
        '  input.action == "renew"',
        '  time.parse_rfc3339_ns(input.context.expiry) < time.now_ns()',
        '}',
        '',
      ].join('\n'),
      headers: { 'content-type': 'text/plain' },
    });
    expect(put.status, put.text).to.equal(201);
  });
  after(async () => {
    await a.close();
  });

  it('is stored nowhere: the fail-closed message and the recorded error hold [masked] instead', async () => {
    const body = { ...AGENT.allow, action: 'renew', context: { expiry: 'MASKED-NOT-A-TIME-42' } };
    const r = await call('POST', a.engine + '/v1/agent/authorize', { body });
    expect(r.status, r.text).to.equal(403);
    expect(r.json.message).to.match(/^policy evaluation failed: time\.parse_rfc3339_ns/);
    expect(r.json.message).to.include('[masked]');
    const everything = await storedText(a);
    expect(everything).to.include(r.json.request_id);
    expect(everything).to.not.include('MASKED-NOT-A-TIME-42');
    const [event] = await auditEvents(a.platform, { request_id: r.json.request_id, kind: 'decision' });
    expect(event.details.error).to.include('[masked]');
  });
});
