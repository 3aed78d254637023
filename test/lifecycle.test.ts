import Database from 'better-sqlite3';
import { expect } from 'chai';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { createServer, type AddressInfo } from 'node:net';
import path from 'node:path';
import pg from 'pg';
import { onceOnly, onEveryBackend, onSqliteOnly } from './helpers/backends.js';
import { loadConfig } from '../src/config.js';
import { ADMIN_KEY, AGENT, Arbiter, auditEvents, call, HUMAN } from './helpers/harness.js';
import { baseEnv, runSync, ServeProcess, sleep } from './helpers/process.js';

const text = (body: string) => ({ body, headers: { 'content-type': 'text/plain' } });

/** Holds SQLite's write lock on the instance's database from this process until released. */
function lockDatabase(dataDir: string): { release(): void } {
  const db = new Database(path.join(dataDir, 'arbiter.db'), { fileMustExist: true });
  db.pragma('busy_timeout = 10000');
  db.exec('BEGIN EXCLUSIVE');
  return {
    release() {
      db.exec('ROLLBACK');
      db.close();
    },
  };
}

/**
 * Makes the instance's audit writes wait until released, on either backend: SQLite's write lock,
 * or on PostgreSQL the chain head row that every writing transaction locks first.
 */
async function holdAuditWrites(a: Arbiter): Promise<{ release(): Promise<void> }> {
  if (!a.databaseUrl) {
    const lock = lockDatabase(a.dataDir);
    return { release: async () => lock.release() };
  }
  const c = new pg.Client({ connectionString: a.databaseUrl });
  await c.connect();
  await c.query('BEGIN');
  await c.query("SELECT value FROM meta WHERE key IN ('audit_head', 'audit_count') FOR UPDATE");
  return {
    async release() {
      await c.query('ROLLBACK');
      await c.end();
    },
  };
}

// Start-up, restarts, crashes and shutdown with whatever storage the run uses: every backend,
// except the configuration checks and --role (nothing stored: once) and the test that locks the
// SQLite file to make the audit unwritable (SQLite itself; PostgreSQL outages are covered by
// test/postgres-cluster.test.ts).
onEveryBackend('process lifecycle', () => {
  onceOnly('configuration is validated at start-up', () => {
    const tmp = mkdtempSync(path.join(os.tmpdir(), 'arbiter-config-'));
    after(() => rmSync(tmp, { recursive: true, force: true }));

    it('defaults as SPEC §1 says: 127.0.0.1, Engine 8080, Platform 8081, ./data, ./policies, TTLs 3600/300/3600 s, metrics behind a key', () => {
      const c = loadConfig({});
      expect({
        host: c.host,
        enginePort: c.enginePort,
        platformPort: c.platformPort,
        dataDir: c.dataDir,
        policyDir: c.policyDir,
        queueTtlSeconds: c.queueTtlSeconds,
        tokenTtlSeconds: c.tokenTtlSeconds,
        tokenMaxTtlSeconds: c.tokenMaxTtlSeconds,
        issuer: c.issuer,
        metricsPublic: c.metricsPublic,
        maxBodyBytes: c.maxBodyBytes,
      }).to.deep.equal({
        host: '127.0.0.1',
        enginePort: 8080,
        platformPort: 8081,
        dataDir: path.resolve('data'),
        policyDir: path.resolve('policies'),
        queueTtlSeconds: 3600,
        tokenTtlSeconds: 300,
        tokenMaxTtlSeconds: 3600,
        issuer: 'arbiter',
        metricsPublic: false,
        maxBodyBytes: 1024 * 1024,
      });
    });

    const cases: [string, string, RegExp][] = [
      ['ARBITER_ENGINE_PORT', 'abc', /ARBITER_ENGINE_PORT/],
      ['ARBITER_ENGINE_PORT', '70000', /ARBITER_ENGINE_PORT/],
      ['ARBITER_PLATFORM_PORT', '-1', /ARBITER_PLATFORM_PORT/],
      ['ARBITER_LOG_LEVEL', 'loud', /ARBITER_LOG_LEVEL/],
      ['ARBITER_QUEUE_TTL_SECONDS', '0', /ARBITER_QUEUE_TTL_SECONDS/],
      // Values a date or a timer cannot hold: refused at start, not a 500 on every use.
      [
        'ARBITER_QUEUE_TTL_SECONDS',
        '9007199254740991',
        /ARBITER_QUEUE_TTL_SECONDS must be .* up to 315360000/,
      ],
      ['ARBITER_TOKEN_MAX_TTL_SECONDS', '315360001', /ARBITER_TOKEN_MAX_TTL_SECONDS/],
      ['ARBITER_EVAL_BUDGET_MS', '3000000000', /ARBITER_EVAL_BUDGET_MS must be .* up to 2147483647/],
      ['ARBITER_METRICS_PUBLIC', 'maybe', /ARBITER_METRICS_PUBLIC/],
      ['ARBITER_SHADOW_INLINE', 'sometimes', /ARBITER_SHADOW_INLINE/],
      ['ARBITER_SHADOW_PAIRED', 'perhaps', /ARBITER_SHADOW_PAIRED/],
      ['ARBITER_EVAL_STALL_SECONDS', '-1', /ARBITER_EVAL_STALL_SECONDS/],
      ['ARBITER_EVAL_STALL_SECONDS', '1.5', /ARBITER_EVAL_STALL_SECONDS/],
      ['ARBITER_ADMIN_KEY', 'short', /ARBITER_ADMIN_KEY/],
      ['ARBITER_MAX_LONG_POLLS_PER_KEY', '0', /ARBITER_MAX_LONG_POLLS_PER_KEY must be a positive integer/],
      [
        'ARBITER_QUEUE_MAX_PENDING_PER_KEY',
        '-1',
        /ARBITER_QUEUE_MAX_PENDING_PER_KEY must be 0 or a positive/,
      ],
      [
        'ARBITER_QUEUE_MAX_PENDING_PER_KEY',
        'many',
        /ARBITER_QUEUE_MAX_PENDING_PER_KEY must be 0 or a positive/,
      ],
      [
        'ARBITER_QUEUE_MAX_PENDING_PER_KEY',
        '1000001',
        /ARBITER_QUEUE_MAX_PENDING_PER_KEY must be .* up to 1000000/,
      ],
      // SPEC §10: PostgreSQL is named by a postgres:// or postgresql:// URL, sized by a positive pool.
      ['ARBITER_DATABASE_URL', 'mysql://db.example/arbiter', /ARBITER_DATABASE_URL must be a postgres:\/\//],
      ['ARBITER_DATABASE_POOL', '0', /ARBITER_DATABASE_POOL must be a positive integer/],
    ];
    for (const [name, value, pattern] of cases) {
      it(`refuses to start with ${name}=${value} and names the setting`, () => {
        const r = runSync(['serve'], baseEnv({ [name]: value }));
        expect(r.signal, 'arbiter did not exit on its own').to.equal(null);
        expect(r.code).to.not.equal(0);
        expect(r.stderr).to.match(pattern);
        expect(r.stdout).to.not.match(/API listening/);
      });
    }

    it('refuses a stall limit an evaluation within its budget could reach', () => {
      const r = runSync(
        ['serve'],
        baseEnv({ ARBITER_EVAL_STALL_SECONDS: '1', ARBITER_EVAL_BUDGET_MS: '500' }),
      );
      expect(r.signal).to.equal(null);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.match(
        /ARBITER_EVAL_STALL_SECONDS must be 0 \(off\) or at least ARBITER_EVAL_BUDGET_MS plus 1 s \(2\)/,
      );
    });

    it('names the settings when it cannot listen: a port in use, a host that is not this machine', async () => {
      const taken = createServer();
      await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', () => resolve()));
      try {
        const port = String((taken.address() as AddressInfo).port);
        const inUse = runSync(['serve'], baseEnv({ ARBITER_ENGINE_PORT: port }));
        expect(inUse.signal).to.equal(null);
        expect(inUse.code).to.equal(2);
        expect(inUse.stderr).to.contain(
          `invalid configuration: the engine API cannot listen on 127.0.0.1:${port} (ARBITER_HOST, ARBITER_ENGINE_PORT): EADDRINUSE`,
        );
      } finally {
        await new Promise((resolve) => taken.close(resolve));
      }
      // 192.0.2.1 is TEST-NET-1: an address no machine here has.
      const foreign = runSync(['serve'], baseEnv({ ARBITER_HOST: '192.0.2.1' }));
      expect(foreign.code).to.equal(2);
      expect(foreign.stderr).to.match(
        /cannot listen on 192\.0\.2\.1:0 \(ARBITER_HOST, ARBITER_ENGINE_PORT\): EADDRNOTAVAIL/,
      );
    });

    it('names the database setting when the database cannot be opened, without its password', async () => {
      // A port nothing listens on: bound once, then closed.
      const probe = createServer();
      await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', () => resolve()));
      const port = (probe.address() as AddressInfo).port;
      await new Promise((resolve) => probe.close(resolve));
      const down = runSync(
        ['serve'],
        baseEnv({ ARBITER_DATABASE_URL: `postgres://arbiter:pg-sekrit@127.0.0.1:${port}/arbiter` }),
      );
      expect(down.signal, 'arbiter did not exit on its own').to.equal(null);
      expect(down.code).to.equal(1);
      expect(down.stderr).to.contain(
        `cannot open the PostgreSQL database of ARBITER_DATABASE_URL (postgres://arbiter:***@127.0.0.1:${port}/arbiter): `,
      );
      expect(down.stderr).to.match(/ECONNREFUSED/);
      expect(down.stderr).to.not.include('pg-sekrit');

      const file = path.join(tmp, 'a-file');
      writeFileSync(file, '');
      for (const [dir, error] of [
        [path.join(file, 'data'), 'ENOTDIR'],
        // mkdir answers ENOENT under /proc though /proc exists: Node's recursive mkdirSync never
        // returned there.
        ['/proc/arbiter-test/data', 'ENOENT'],
      ] as const) {
        const r = runSync(['serve'], baseEnv({ ARBITER_DATA_DIR: dir }));
        expect(r.signal, `arbiter did not exit on its own for ${dir}`).to.equal(null);
        expect(r.code).to.equal(1);
        expect(r.stderr).to.contain(`cannot open the SQLite database in ARBITER_DATA_DIR (${dir}): ${error}`);
        expect(r.stdout).to.not.match(/API listening/);
      }
    });

    it('does not echo a rejected admin key back in the error', () => {
      const r = runSync(['serve'], baseEnv({ ARBITER_ADMIN_KEY: 'sekrit' }));
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.not.include('sekrit');
    });

    it('refuses a YAML config file with an unknown setting and names it', () => {
      const file = path.join(tmp, 'unknown.yaml');
      writeFileSync(file, 'engine_port: 0\nenigne_port: 0\n');
      const r = runSync(['serve'], baseEnv({ ARBITER_CONFIG: file }));
      expect(r.signal).to.equal(null);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.include('enigne_port');
    });

    it('refuses a list or a mapping where a setting takes one value, naming it; a list setting takes a list of names', () => {
      for (const [yaml, pattern] of [
        ['queue_ttl_seconds: [60]\n', /queue_ttl_seconds \(in .*\) must be a single value, got a list/],
        ['db_sync: [full]\n', /db_sync \(in .*\) must be a single value, got a list/],
        ['issuer: {a: b}\n', /issuer \(in .*\) must be a single value, got a mapping/],
        ['audit_mask_fields: [[a]]\n', /audit_mask_fields \(in .*\) must be a list of names/],
      ] as const) {
        const file = path.join(tmp, 'typed.yaml');
        writeFileSync(file, yaml);
        const r = runSync(['serve'], baseEnv({ ARBITER_CONFIG: file }));
        expect(r.signal).to.equal(null);
        expect(r.code, yaml).to.equal(2);
        expect(r.stderr, yaml).to.match(pattern);
      }
    });

    it('warns of an ARBITER_* variable that names no setting (a typo), and starts', async () => {
      const env = baseEnv({ ARBITER_ENGIN_PORT: '5', ARBITER_TEST_BACKEND: 'sqlite' });
      const p = new ServeProcess([], env);
      try {
        await p.waitFor((r) => r.api === 'engine' && typeof r.url === 'string');
        const warned = p.records.filter((r) => r.variable !== undefined).map((r) => r.variable);
        expect(warned).to.deep.equal(['ARBITER_ENGIN_PORT']);
      } finally {
        expect(await p.stop()).to.equal(0);
        rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
      }
    });

    it('refuses a YAML config file that is not valid YAML', () => {
      const file = path.join(tmp, 'broken.yaml');
      writeFileSync(file, 'engine_port: [0\nlog_level: : info\n');
      const r = runSync(['serve'], baseEnv({ ARBITER_CONFIG: file }));
      expect(r.signal).to.equal(null);
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.match(/ARBITER_CONFIG/);
    });

    it('refuses a bad value in the YAML file and names the setting', () => {
      const file = path.join(tmp, 'bad-value.yaml');
      writeFileSync(file, 'queue_ttl_seconds: -5\n');
      const r = runSync(['serve'], baseEnv({ ARBITER_CONFIG: file }));
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.match(/queue_ttl_seconds/i);
    });

    it('refuses an unknown --role with exit code 2', () => {
      const r = runSync(['serve', '--role', 'bogus'], baseEnv());
      expect(r.signal).to.equal(null);
      expect(r.code).to.equal(2);
      expect(r.stderr).to.match(/role/);
    });

    it('reads settings from a YAML file, with the environment winning over it', async () => {
      const env = baseEnv({
        ARBITER_ENGINE_PORT: undefined,
        ARBITER_PLATFORM_PORT: undefined,
        ARBITER_ADMIN_KEY: ADMIN_KEY,
      });
      const file = path.join(tmp, 'valid.yaml');
      writeFileSync(
        file,
        [
          'engine_port: 0',
          'platform_port: 0',
          'admin_key: yaml-admin-key-0123456789',
          'queue_ttl_seconds: 120',
          'log_level: info',
          '',
        ].join('\n'),
      );
      env.ARBITER_CONFIG = file;
      const p = new ServeProcess([], env);
      try {
        const engine = (await p.waitFor((r) => r.api === 'engine' && typeof r.url === 'string'))
          .url as string;
        const platform = (await p.waitFor((r) => r.api === 'platform' && typeof r.url === 'string'))
          .url as string;
        // Ports 0 from the file: not the 8080/8081 defaults.
        expect(engine).to.not.match(/:8080$/);
        expect(platform).to.not.match(/:8081$/);
        // queue_ttl_seconds from the file.
        const r = await call('POST', engine + '/v1/agent/authorize', { body: AGENT.approval });
        expect(r.status).to.equal(202);
        const ttl = (Date.parse(r.json.expires_at) - Date.now()) / 1000;
        expect(ttl).to.be.within(60, 121);
        // The environment's admin key wins over the file's.
        const yamlKey = await call('GET', platform + '/api/v1/policies', {
          key: 'yaml-admin-key-0123456789',
        });
        expect(yamlKey.status).to.equal(401);
        const envKey = await call('GET', platform + '/api/v1/policies', { key: ADMIN_KEY });
        expect(envKey.status).to.equal(200);
      } finally {
        expect(await p.stop()).to.equal(0);
        rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
      }
    });
  });

  onceOnly('serve --role engine', () => {
    it('serves only the Engine API', async () => {
      const env = baseEnv();
      const p = new ServeProcess(['--role', 'engine'], env);
      try {
        const engine = (await p.waitFor((r) => r.api === 'engine' && typeof r.url === 'string'))
          .url as string;
        const h = await call('GET', engine + '/healthz', { key: null });
        expect(h.status).to.equal(200);
        const d = await call('POST', engine + '/v1/agent/authorize', { body: AGENT.allow });
        expect(d.status).to.equal(200);
        const policies = await call('GET', engine + '/api/v1/policies');
        expect(policies.status).to.equal(404);
        expect(policies.json).to.have.all.keys('error');
        expect(p.records.filter((r) => r.api === 'platform')).to.deep.equal([]);
        expect(p.lines.join('\n')).to.not.match(/platform API listening/);
      } finally {
        expect(await p.stop()).to.equal(0);
        rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
      }
    });
  });

  describe('state survives a restart', () => {
    let a: Arbiter;
    before(async () => {
      a = await Arbiter.start();
    });
    after(async () => {
      await a.close();
    });

    it('keeps queue items, audit events, policy changes and the revision, and does not re-seed', async () => {
      const approval = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
      expect(approval.status).to.equal(202);
      const freeze = await call(
        'PUT',
        a.platform + '/api/v1/policies/persist-freeze',
        text('package authz.agent\n\ndeny contains "reads are frozen" if input.action == "read"\n'),
      );
      expect(freeze.status, freeze.text).to.equal(201);
      // A seeded example policy, deleted: it must not come back.
      const del = await call('DELETE', a.platform + '/api/v1/policies/human');
      expect(del.status, del.text).to.equal(204);

      const frozen = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
      expect(frozen.status).to.equal(403);
      expect(frozen.json.message).to.match(/reads are frozen/);
      const human = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
      expect(human.status).to.equal(403);

      const revision = (await call('GET', a.engine + '/healthz', { key: null })).json.revision as number;
      const listBefore = (await call('GET', a.platform + '/api/v1/policies')).json as {
        policies: { name: string; sha256: string }[];
      };
      // The whole chain, oldest first.
      const chain = async () =>
        (await auditEvents(a.platform))
          .reverse()
          .map((e) => ({ id: e.id as string, hash: e.hash as string }));
      const auditBefore = await chain();
      expect(auditBefore.length).to.be.greaterThan(3);

      await a.restart();

      const item = await call('GET', `${a.engine}/v1/queue/${approval.json.request_id}`);
      expect(item.status, item.text).to.equal(200);
      expect(item.json.status).to.equal('pending');
      const auditAfter = await chain();
      expect(auditAfter.slice(0, auditBefore.length)).to.deep.equal(auditBefore);

      const h = await call('GET', a.engine + '/healthz', { key: null });
      expect(h.json).to.deep.equal({ status: 'ok', revision });
      const listAfter = (await call('GET', a.platform + '/api/v1/policies')).json as {
        policies: { name: string; sha256: string }[];
        revision: number;
      };
      expect(listAfter.revision).to.equal(revision);
      expect(listAfter.policies.map((x) => [x.name, x.sha256])).to.deep.equal(
        listBefore.policies.map((x) => [x.name, x.sha256]),
      );
      expect(listAfter.policies.map((x) => x.name))
        .to.include('persist-freeze')
        .and.not.include('human');

      const stillFrozen = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
      expect(stillFrozen.status).to.equal(403);
      expect(stillFrozen.json.message).to.match(/reads are frozen/);
      const stillNoHuman = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
      expect(stillNoHuman.status).to.equal(403);
      expect(await auditEvents(a.platform, { kind: 'policy.seed' })).to.have.length(1);
      const loaded = a.logs
        .map((l) => {
          try {
            return JSON.parse(l) as { msg?: string; seeded?: boolean };
          } catch {
            return {};
          }
        })
        .filter((l) => l.msg === 'policy set loaded')
        .map((l) => l.seeded);
      expect(loaded).to.deep.equal([true, false]);
    });
  });

  describe('crash safety', () => {
    it('keeps the audit event of every answered decision after SIGKILL', async () => {
      const a = await Arbiter.start();
      let b: Arbiter | undefined;
      try {
        const bodies = [AGENT.allow, AGENT.approval, AGENT.deny, AGENT.lowConfidence, AGENT.unknownAgent];
        const answers = await Promise.all(
          Array.from({ length: 50 }, (_, i) =>
            call('POST', a.engine + '/v1/agent/authorize', { body: bodies[i % bodies.length] }),
          ),
        );
        for (const r of answers) expect([200, 202, 403]).to.include(r.status);
        await a.kill();

        b = await Arbiter.start({}, a.dataDir);
        const ids = answers.map((r) => r.json.request_id as string);
        const stored = (await auditEvents(b.platform, { kind: 'decision' }))
          .filter((e) => ids.includes(e.request_id))
          .map((e) => ({ request_id: e.request_id as string, outcome: e.outcome as string }));
        const byId = new Map(stored.map((s) => [s.request_id, s.outcome]));
        for (const r of answers)
          expect(byId.get(r.json.request_id), r.json.request_id).to.equal(r.json.status);
        const queued = answers.filter((r) => r.status === 202).map((r) => r.json.request_id as string);
        expect(queued.length).to.be.greaterThan(0);
        for (const id of queued) {
          const item = await call('GET', `${b.engine}/v1/queue/${id}`);
          expect(item.status, `${id}: ${item.text}`).to.equal(200);
          expect(item.json.status).to.equal('pending');
        }
        const h = await call('GET', b.engine + '/healthz', { key: null });
        expect(h.status).to.equal(200);
      } finally {
        if (b) await b.close();
        await a.close();
      }
    });
  });

  describe('fail closed', () => {
    let a: Arbiter;
    before(async () => {
      a = await Arbiter.start();
    });
    after(async () => {
      await a.close();
    });

    it('denies with "evaluation failed" and records the error when a policy fails at run time', async () => {
      const put = await call(
        'PUT',
        a.platform + '/api/v1/policies/eval-fault',
        text(
          'package authz.agent\n\ndeny contains "bad time" if time.parse_rfc3339_ns(input.context.t) > 0\n',
        ),
      );
      expect(put.status, put.text).to.equal(201);
      try {
        // Without context.t the rule is undefined and the example policies decide.
        const fine = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
        expect(fine.status).to.equal(200);

        const r = await call('POST', a.engine + '/v1/agent/authorize', {
          body: { ...AGENT.allow, context: { t: 'not a time' } },
        });
        expect(r.status).to.equal(403);
        expect(r.json.status).to.equal('deny');
        expect(r.json.message).to.match(/evaluation failed/);
        const [ev] = await auditEvents(a.platform, { request_id: r.json.request_id });
        expect(ev.outcome).to.equal('deny');
        const details = ev.details as { error?: unknown };
        expect(details.error).to.be.a('string').and.not.equal('');
      } finally {
        const del = await call('DELETE', a.platform + '/api/v1/policies/eval-fault');
        expect(del.status).to.equal(204);
      }
      const after = await call('POST', a.engine + '/v1/agent/authorize', {
        body: { ...AGENT.allow, context: { t: 'not a time' } },
      });
      expect(after.status).to.equal(200);
    });

    it('reports {"status":"ok","revision":N} on /healthz of both APIs', async () => {
      const list = await call('GET', a.platform + '/api/v1/policies');
      for (const base of [a.engine, a.platform]) {
        const h = await call('GET', base + '/healthz', { key: null });
        expect(h.status).to.equal(200);
        expect(h.json).to.deep.equal({ status: 'ok', revision: list.json.revision });
        expect(h.json.revision).to.be.a('number').and.at.least(1);
      }
    });

    // Locks the SQLite file from outside to make the audit unwritable (on PostgreSQL, see
    // test/postgres-cluster.test.ts for an unreachable database).
    onSqliteOnly('when the database file is locked', () => {
      it('answers 503 and never allow when the audit cannot be written, then recovers', async () => {
        const lock = lockDatabase(a.dataDir);
        let r;
        try {
          // The service waits out its busy timeout (5 s), then must refuse to answer the decision.
          r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
        } finally {
          lock.release();
        }
        expect(r.status).to.equal(503);
        expect(r.json).to.have.all.keys('error');
        expect(r.json.error).to.be.a('string').and.not.equal('');
        const requestId = r.headers.get('x-request-id');
        expect(requestId).to.be.a('string');
        expect(await auditEvents(a.platform, { request_id: requestId! })).to.deep.equal([]);

        const ok = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
        expect(ok.status).to.equal(200);
        expect(ok.json.status).to.equal('allow');
      });
    });
  });

  describe('graceful shutdown', () => {
    it('stops on SIGINT as on SIGTERM: logs the shutdown and exits 0, and keeps what it answered', async () => {
      const a = await Arbiter.start();
      try {
        const r = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
        expect(r.status).to.equal(200);
        process.kill(a.pid!, 'SIGINT');
        expect(await a.exited(30_000)).to.deep.equal({ code: 0, signal: null });
        expect(a.logs.join('\n')).to.match(/shutting down/i);
        const refused = await fetch(a.engine + '/healthz').then(
          () => 'answered',
          () => 'refused',
        );
        expect(refused).to.equal('refused');
        expect(await a.count('audit_events', "kind = 'decision'")).to.equal(1);
      } finally {
        await a.close();
      }
    });

    it('finishes the in-flight request on SIGTERM, exits 0 and logs the shutdown', async () => {
      const a = await Arbiter.start();
      try {
        // Holding the write lock keeps the authorize request in flight (its audit write waits).
        const lock = await holdAuditWrites(a);
        let released = false;
        try {
          const inFlight = call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
          await sleep(1000);
          const stopped = a.stop();
          await sleep(500);
          await lock.release();
          released = true;
          const r = await inFlight;
          expect(r.status).to.equal(200);
          expect(r.json.status).to.equal('allow');
          expect(await stopped).to.equal(0);
        } finally {
          if (!released) await lock.release();
        }
        for (let i = 0; i < 20 && !a.logs.some((l) => /shutting down/i.test(l)); i++) await sleep(100);
        expect(a.logs.join('\n')).to.match(/shutting down/i);
        // The decision answered during shutdown was recorded.
        // (Read with the service stopped: straight from storage.)
        expect(await a.count('audit_events', "kind = 'decision'")).to.equal(1);
      } finally {
        await a.close();
      }
    });
  });
});

/** The processes whose parent is `pid` (a primary's workers), from /proc. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // "pid (comm) state ppid …": comm may hold spaces, so read after its closing parenthesis.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return out;
}

onSqliteOnly('several workers (--workers)', function () {
  this.timeout(120_000);

  it('answers a change made just after a worker died without waiting for its replacement (found by a crash probe)', async () => {
    // The primary sent the change to the replacement before it listened, and waited out its 5 s
    // sync timeout for an answer that never came ("workers did not confirm a change in time").
    const a = await Arbiter.start({ ARBITER_WORKERS: '2' });
    try {
      const workers = childrenOf(a.pid as number);
      expect(workers, 'two workers').to.have.length(2);
      process.kill(workers[0] as number, 'SIGKILL');
      // The change is made while the replacement is starting (forked, not yet serving).
      const deadline = Date.now() + 30_000;
      const replaced = () => childrenOf(a.pid as number).some((p) => !workers.includes(p));
      while (!replaced() && Date.now() < deadline) await sleep(20);
      expect(replaced(), 'no replacement was forked').to.equal(true);
      const put = await call('PUT', `${a.platform}/api/v1/data/after-kill`, { body: { n: 1 } });
      expect(put.status, put.text).to.equal(201);
      const revision = put.json.revision as number;
      expect(revision).to.be.a('number');
      // Every worker that answers serves the change, the replacement too once it has loaded (the
      // two first workers and it: three loads).
      const loads = () => a.logs.filter((l) => /worker loaded the policy set/.test(l)).length;
      while (loads() < 3 && Date.now() < deadline) await sleep(100);
      expect(loads(), 'the replacement did not start').to.equal(3);
      for (let i = 0; i < 12; i++) {
        const h = await call('GET', `${a.engine}/healthz`, { headers: { connection: 'close' } });
        expect(h.json.revision).to.equal(revision);
      }
      expect(a.logs.filter((l) => /did not confirm a change in time/.test(l))).to.deep.equal([]);
    } finally {
      await a.close();
    }
  });
});
