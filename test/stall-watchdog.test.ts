import { expect } from 'chai';
import { readFileSync, rmSync } from 'node:fs';
import { ConfigError, loadConfig } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { AGENT, Arbiter, call } from './helpers/harness.js';
import { slowOn, SPIN_ITEMS, spinsWhen } from './helpers/policies.js';
import { baseEnv, MAIN, ServeProcess, sleep } from './helpers/process.js';

/** Never finishes on a request whose context says `boom`; fast on any other. */
const BOOM = spinsWhen('input.context.boom == true');
const BOOM_REQUEST = { ...AGENT.allow, context: { boom: true } };
/** About 0.2 s of comparisons with 2 500 items as `data.slow.items`, on a request for repo/slow. */
const SLOW = slowOn('repo/slow');

/** Sends a decision that will not be answered, without waiting for it (the process may die). */
function fireAndForget(a: { engine: string }, body: unknown): void {
  void call('POST', `${a.engine}/v1/agent/authorize`, { body }).catch(() => undefined);
}

async function goLive(
  a: { platform: string },
  data: { path: string; value: unknown },
  policy: { name: string; rego: string },
) {
  const d = await call('PUT', `${a.platform}/api/v1/data/${data.path}`, { body: data.value });
  expect(d.status, d.text).to.equal(201);
  const p = await call('PUT', `${a.platform}/api/v1/policies/${policy.name}`, {
    body: { rego: policy.rego },
  });
  expect(p.status, p.text).to.equal(201);
}

/** The watchdog's fatal line, once the process has written it (its output may trail its exit). */
async function fatalLine(a: Arbiter, ms: number): Promise<Record<string, unknown> | undefined> {
  const deadline = Date.now() + ms;
  for (;;) {
    for (const l of a.logs) {
      try {
        const r = JSON.parse(l) as Record<string, unknown>;
        if (r.level === 'fatal') return r;
      } catch {
        // not JSON
      }
    }
    if (Date.now() > deadline) return undefined;
    await new Promise((r) => setTimeout(r, 50));
  }
}

// The watchdog concerns the process, not storage: once (on the SQLite run).
onceOnly('An evaluation that never finishes ends the process (ARBITER_EVAL_STALL_SECONDS)', () => {
  it('kills a process stuck in one evaluation for that long, logging why; restarted, it answers again', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '2' });
    try {
      await goLive(a, { path: 'spin', value: { items: SPIN_ITEMS } }, { name: 'boom', rego: BOOM });
      expect((await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow })).status).to.equal(
        200,
      );
      const sent = Date.now();
      fireAndForget(a, BOOM_REQUEST);
      const ended = await a.exited(30_000);
      expect(ended, 'the stuck process was not ended').to.deep.equal({ code: null, signal: 'SIGKILL' });
      expect(Date.now() - sent, 'ended before the evaluation had run for 2 s').to.be.at.least(1_900);
      // In the service's own log format (pino's level label, an ISO time).
      const fatal = await fatalLine(a, 5_000);
      expect(fatal?.msg).to.match(/has run for 2 s without finishing \(ARBITER_EVAL_STALL_SECONDS\)/);
      expect(fatal?.time).to.match(/^\d{4}-\d\d-\d\dT/);
      // What was being evaluated, so that the operator can find the input and the policy (the
      // decision is never recorded): the set and revision, subject, action and resource, no context.
      expect(fatal?.evaluating).to.match(
        /^live set, revision \d+ kind="agent" agent_id="deploy-bot" action="read" resource="repo\/arbiter"$/,
      );
      // Restarted over the same state: it answers, and the trail it wrote is intact.
      await a.restart();
      expect((await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow })).status).to.equal(
        200,
      );
      const verify = await call('GET', `${a.platform}/api/v1/audit/verify`);
      expect(verify.status, verify.text).to.equal(200);
      expect(verify.json.ok).to.equal(true);
    } finally {
      await a.close();
    }
  });

  it('leaves a process alone whose evaluations are long but finish, however many run back to back', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '2', ARBITER_EVAL_BUDGET_MS: '1000' });
    try {
      const items = Array.from({ length: 2500 }, (_, i) => i);
      await goLive(a, { path: 'slow', value: { items } }, { name: 'slow', rego: SLOW });
      // Twenty at once: the serving thread evaluates for seconds on end, longer than the limit in
      // all, each evaluation much shorter than it.
      const started = Date.now();
      const answers = await Promise.all(
        Array.from({ length: 20 }, () =>
          call('POST', `${a.engine}/v1/agent/authorize`, { body: { ...AGENT.allow, resource: 'repo/slow' } }),
        ),
      );
      for (const r of answers) expect(r.status, r.text).to.equal(200);
      expect(Date.now() - started, 'the evaluations were too short to test anything').to.be.at.least(2_000);
      expect(await a.exited(0)).to.equal(undefined);
      expect((await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow })).status).to.equal(
        200,
      );
    } finally {
      await a.close();
    }
  });

  it('with --workers, only the stuck worker is ended, and the primary starts another', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '2', ARBITER_WORKERS: '2' });
    try {
      await goLive(a, { path: 'spin', value: { items: SPIN_ITEMS } }, { name: 'boom', rego: BOOM });
      fireAndForget(a, BOOM_REQUEST);
      const deadline = Date.now() + 30_000;
      const replaced = () =>
        a.logs.some((l) => /worker exited; starting a replacement/.test(l) && /SIGKILL/.test(l));
      while (!replaced() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      expect(replaced(), 'the primary did not replace a killed worker').to.equal(true);
      expect(await a.exited(0)).to.equal(undefined);
      // The other worker, and then the replacement, answer.
      for (let i = 0; i < 6; i++) {
        const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
        expect(r.status, r.text).to.equal(200);
      }
    } finally {
      await a.close();
    }
  });

  it('in a PID namespace (as in a container) ends node under tini as PID 1; node as PID 1 warns it cannot', async function () {
    this.timeout(120_000);
    /** `arbiter serve` as the first process of a new PID namespace, or under tini as that process. */
    const dirs: string[] = [];
    const inNamespace = (underTini: boolean) => {
      const env = baseEnv({ ARBITER_EVAL_STALL_SECONDS: '2' });
      dirs.push(env.ARBITER_DATA_DIR as string);
      return new ServeProcess([], env, {
        file: '/usr/bin/unshare',
        argv: [
          '--pid',
          '--fork',
          ...(underTini ? ['/usr/bin/tini', '--'] : []),
          process.execPath,
          MAIN,
          'serve',
        ],
      });
    };
    /**
     * Ends what is left (unshare passes no signal on): its child, seen from this namespace, then
     * it; and removes the data directories.
     */
    const end = async (p: ServeProcess) => {
      const pid = p.pid ?? 0;
      let children: string[] = [];
      try {
        children = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/);
      } catch {
        // already gone
      }
      for (const c of [...children.filter(Boolean).map(Number), pid]) {
        try {
          if (c > 0) process.kill(c, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      await p.exited;
      for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
    };
    const urls = async (p: ServeProcess) => ({
      engine: (await p.waitFor((r) => r.api === 'engine' && typeof r.url === 'string')).url as string,
      platform: (await p.waitFor((r) => r.api === 'platform' && typeof r.url === 'string')).url as string,
    });

    // Under tini, as the image's ENTRYPOINT runs it: node is not PID 1, and the watchdog ends it.
    const tini = inNamespace(true);
    try {
      const a = await urls(tini);
      expect(tini.records.some((r) => /running as PID 1/.test(String(r.msg)))).to.equal(false);
      await goLive(a, { path: 'spin', value: { items: SPIN_ITEMS } }, { name: 'boom', rego: BOOM });
      fireAndForget(a, BOOM_REQUEST);
      const code = await Promise.race([tini.exited, sleep(30_000).then(() => 'still running')]);
      // tini exits with 128 + the signal that ended its child.
      expect(code, tini.lines.join('\n')).to.equal(128 + 9);
      expect(tini.records.some((r) => r.level === 'fatal')).to.equal(true);
    } finally {
      await end(tini);
    }

    // node itself as PID 1: the kernel would drop the watchdog's SIGKILL, and it says so at start.
    const bare = inNamespace(false);
    try {
      await urls(bare);
      const warning = await bare.waitFor((r) => /running as PID 1/.test(String(r.msg)), 10_000);
      expect(warning.level).to.equal('warn');
    } finally {
      await end(bare);
    }
  });

  it('takes a limit of at least the eval budget plus 1 s: a default follows a long budget, a setting below is refused', () => {
    expect(loadConfig({}).evalStallSeconds).to.equal(30);
    expect(loadConfig({ ARBITER_EVAL_BUDGET_MS: '40000' }).evalStallSeconds).to.equal(41);
    const at = (budget: string, stall: string) =>
      loadConfig({ ARBITER_EVAL_BUDGET_MS: budget, ARBITER_EVAL_STALL_SECONDS: stall }).evalStallSeconds;
    expect(at('1500', '3')).to.equal(3);
    expect(at('40000', '0')).to.equal(0);
    expect(() => at('1500', '2'))
      .to.throw(ConfigError)
      .with.property('message')
      .that.matches(
        /ARBITER_EVAL_STALL_SECONDS must be 0 \(off\) or at least ARBITER_EVAL_BUDGET_MS plus 1 s \(3\)/,
      );
  });

  it('is off with ARBITER_EVAL_STALL_SECONDS=0: the stuck process is left as it is', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '0' });
    try {
      await goLive(a, { path: 'spin', value: { items: SPIN_ITEMS } }, { name: 'boom', rego: BOOM });
      fireAndForget(a, BOOM_REQUEST);
      expect(await a.exited(4_000)).to.equal(undefined);
      // Stuck indeed: not even /healthz is answered.
      const health = await fetch(`${a.engine}/healthz`, { signal: AbortSignal.timeout(1_000) }).then(
        () => 'answered',
        () => 'no answer',
      );
      expect(health).to.equal('no answer');
    } finally {
      // Stuck for good: SIGTERM's handler would never run.
      await a.kill();
      await a.close();
    }
  });
});
