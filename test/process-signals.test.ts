import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { connect, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { onceOnly } from './helpers/backends.js';
import { AGENT, call, REPO } from './helpers/harness.js';
import { baseEnv, runSync, ServeProcess, sleep, type LogLine } from './helpers/process.js';

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

// Signals, --version and --help concern the process, not storage: once (on the SQLite run).
onceOnly('the process a supervisor starts', () => {
  it('answers requests on the first listener while the second one is still binding', async () => {
    const env = baseEnv({
      NODE_OPTIONS: `--import=${path.join(REPO, 'test', 'fixtures', 'delay-second-listen.mjs')}`,
    });
    const p = new ServeProcess([], env);
    try {
      await p.waitFor((r) => r.msg === 'test: delaying the second listener');
      const first = (await p.waitFor(
        (r) => typeof r.url === 'string' && r.msg === 'engine API listening',
      )) as LogLine & {
        url: string;
      };
      const answers = await Promise.all([
        call('GET', `${first.url}/healthz`, { key: null }),
        call('POST', `${first.url}/v1/agent/authorize`, { body: AGENT.allow }),
      ]);
      expect(answers.map((r) => r.status)).to.deep.equal([200, 200]);
      await p.waitFor((r) => r.msg === 'platform API listening');
      expect((await call('GET', `${first.url}/healthz`, { key: null })).status).to.equal(200);
      expect(await p.stop()).to.equal(0);
    } finally {
      await p.stop();
      rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
    }
  });

  it('stops on SIGTERM while clients keep sockets open after CONNECT and after a malformed request', async function () {
    this.timeout(60_000);
    const p = new ServeProcess([], baseEnv({}));
    const sockets: Socket[] = [];
    try {
      const engine = (await p.waitFor(
        (r) => typeof r.url === 'string' && r.msg === 'engine API listening',
      )) as LogLine & {
        url: string;
      };
      const { hostname, port } = new URL(engine.url);
      // Each client reads its answer and then keeps its end open, never closing it.
      const answers = await Promise.all(
        ['CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n', 'NOT A REQUEST\r\n\r\n'].map(
          (raw) =>
            new Promise<string>((resolve, reject) => {
              const s = connect({ host: hostname, port: Number(port), allowHalfOpen: true }, () =>
                s.write(raw),
              );
              sockets.push(s);
              let got = '';
              s.on('data', (d) => {
                got += d.toString('latin1');
                if (got.includes('\r\n\r\n')) resolve(got);
              });
              s.on('error', reject);
            }),
        ),
      );
      expect(answers.map((a) => a.split(' ')[1])).to.deep.equal(['400', '400']);
      const started = Date.now();
      expect(await p.stop()).to.equal(0);
      // Well inside the 30 s grace a stuck keep-alive connection would get.
      expect(Date.now() - started).to.be.below(10_000);
    } finally {
      for (const s of sockets) s.destroy();
      await p.stop();
    }
  });

  it('stops on SIGTERM to `npm start`: the node process itself gets the signal and exits', async function () {
    this.timeout(180_000);
    const env = baseEnv();
    const npm = spawn('npm', ['start', '--silent'], { cwd: REPO, env, stdio: ['ignore', 'pipe', 'pipe'] });
    const records: LogLine[] = [];
    const lines: string[] = [];
    const onLine = (l: string) => {
      lines.push(l);
      try {
        records.push(JSON.parse(l) as LogLine);
      } catch {
        /* npm's own output */
      }
    };
    createInterface({ input: npm.stdout }).on('line', onLine);
    createInterface({ input: npm.stderr }).on('line', onLine);
    const npmExit = new Promise<number | null>((resolve) => npm.once('exit', (code) => resolve(code)));
    try {
      const deadline = Date.now() + 150_000;
      let listening: LogLine | undefined;
      while (!(listening = records.find((r) => r.msg === 'platform API listening'))) {
        if (Date.now() > deadline || npm.exitCode !== null)
          throw new Error(`npm start did not serve:\n${lines.join('\n')}`);
        await sleep(100);
      }
      const pid = listening.pid as number;
      expect(pid).to.be.a('number').and.not.equal(npm.pid);
      npm.kill('SIGTERM');
      const code = await Promise.race([npmExit, sleep(20_000).then(() => 'timeout')]);
      expect(code, lines.join('\n')).to.not.equal('timeout');
      for (let i = 0; i < 100 && alive(pid); i++) await sleep(100);
      expect(alive(pid), 'the serving node process outlived npm').to.equal(false);
      expect(records.some((r) => r.msg === 'stopped')).to.equal(true);
    } finally {
      if (npm.exitCode === null) npm.kill('SIGKILL');
      for (const r of records) if (typeof r.pid === 'number' && alive(r.pid)) process.kill(r.pid, 'SIGKILL');
      rmSync(env.ARBITER_DATA_DIR as string, { recursive: true, force: true });
    }
  });
});

onceOnly('arbiter --version and --help', () => {
  const version = (JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string })
    .version;

  it('prints the version with --version and exits 0', () => {
    for (const flag of ['--version', '-v', 'version']) {
      const r = runSync([flag], baseEnv());
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout.trim()).to.equal(`arbiter ${version}`);
    }
  });

  it('prints the usage for `serve --help` (and other commands) without starting anything', () => {
    for (const args of [['serve', '--help'], ['keys', '--help'], ['audit', '-h'], ['--help']]) {
      const r = runSync(args, baseEnv());
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).to.equal(0);
      expect(r.stdout).to.match(/usage:\n {2}arbiter --version\n {2}arbiter serve/);
    }
  });
});
