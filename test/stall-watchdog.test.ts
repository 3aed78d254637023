import { expect } from 'chai';
import { onceOnly } from './helpers/backends.js';
import { ADMIN_KEY, AGENT, Arbiter, call } from './helpers/harness.js';
import { SPIN_ITEMS, spinsWhen } from './helpers/policies.js';

/** Never finishes on a request whose context says `boom`; fast on any other. */
const BOOM = spinsWhen('input.context.boom == true');
/** About 0.6 s of comparisons (3 500², a deny that never holds) on a request for repo/slow. */
const SLOW = [
  'package authz.agent',
  '',
  'deny contains "never" if {',
  '\tinput.resource == "repo/slow"',
  '\tsome a in data.slow.items',
  '\tsome b in data.slow.items',
  '\ta > b',
  '\tb > a',
  '}',
  '',
].join('\n');

/** Sends a decision that will not be answered, without waiting for it (the process may die). */
function fireAndForget(a: Arbiter, body: unknown): void {
  void fetch(`${a.engine}/v1/agent/authorize`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  }).catch(() => undefined);
}

async function goLive(
  a: Arbiter,
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

const BOOM_REQUEST = { ...AGENT.allow, context: { boom: true } };

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
      const fatal = a.logs
        .map((l) => {
          try {
            return JSON.parse(l) as { level?: number; msg?: string };
          } catch {
            return {};
          }
        })
        .find((r) => r.level === 60);
      expect(fatal?.msg).to.match(/has run for 2 s without finishing \(ARBITER_EVAL_STALL_SECONDS\)/);
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

  it('leaves a process alone whose evaluations are long but finish', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '2', ARBITER_EVAL_BUDGET_MS: '1500' });
    try {
      const items = Array.from({ length: 3500 }, (_, i) => i);
      await goLive(a, { path: 'slow', value: { items } }, { name: 'slow', rego: SLOW });
      for (let i = 0; i < 3; i++) {
        const started = Date.now();
        const r = await call('POST', `${a.engine}/v1/agent/authorize`, {
          body: { ...AGENT.allow, resource: 'repo/slow' },
        });
        expect(r.status, r.text).to.equal(200);
        // Long enough to be seen by the watchdog (it looks every 250 ms), too short to end it.
        expect(Date.now() - started).to.be.at.least(250);
      }
      expect(await a.exited(3_000)).to.equal(undefined);
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

  it('is off with ARBITER_EVAL_STALL_SECONDS=0: the stuck process is left as it is', async () => {
    const a = await Arbiter.start({ ARBITER_EVAL_STALL_SECONDS: '0' });
    try {
      await goLive(a, { path: 'spin', value: { items: SPIN_ITEMS } }, { name: 'boom', rego: BOOM });
      fireAndForget(a, BOOM_REQUEST);
      expect(await a.exited(4_000)).to.equal(undefined);
    } finally {
      // Stuck for good: SIGTERM's handler would never run.
      await a.kill();
      await a.close();
    }
  });
});
