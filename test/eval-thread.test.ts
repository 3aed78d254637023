import { expect } from 'chai';
import path from 'node:path';
import { onceOnly } from './helpers/backends.js';
import { REPO } from './helpers/harness.js';
import { RegoCompiler } from '../src/policy/compiler.js';
import { EvaluationThread, type ThreadSet } from '../src/policy/eval-thread.js';
import { Evaluator, type PolicyDecision } from '../src/policy/evaluator.js';
import {
  INLINE_MAX_MS,
  MAX_PROVING_DECISIONS,
  PAIR_CHECKED_DECISIONS,
  PAIR_SAMPLED_EVERY,
  PROVING_DECISIONS,
} from '../src/policy/shadow-limits.js';
import { ShadowRunner, type ShadowThread } from '../src/policy/shadow-runner.js';
import { denyReadsSlowOn, SLOW_ITEMS, SPIN, SPIN_ITEMS } from './helpers/policies.js';

const opaBin = process.env.ARBITER_OPA_BIN || path.join(REPO, '.opa-bin', 'opa');
const denying = (reason: string) =>
  `package authz.agent\n\ndeny contains "${reason}" if input.action == "read"\n`;
const READ = { kind: 'agent', agent_id: 'x', action: 'read', resource: 'r', confidence: 1, context: {} };

/**
 * A set's thread whose answers and timings the test chooses (`evaluateTimed`); `restart` is told.
 * It is active once a set was loaded, until cleared or closed.
 */
function fakeThread(
  evaluateTimed: ShadowThread['evaluateTimed'],
  restart: () => void = () => {},
): ShadowThread {
  const thread = {
    active: false,
    load: () => ((thread.active = true), Promise.resolve(undefined)),
    clear: () => void (thread.active = false),
    close: () => ((thread.active = false), Promise.resolve()),
    restart,
    evaluateTimed,
  };
  return thread;
}

// The shadow thread on its own, with the real compiler: no storage involved.
onceOnly('Shadow thread: ordering of set changes and evaluations', () => {
  const compiler = new RegoCompiler(opaBin);
  const sets: ThreadSet[] = [];
  let runner: EvaluationThread;
  before(async () => {
    await compiler.init();
    for (const reason of ['set one', 'set two', 'set three']) {
      const wasm = await compiler.compile([{ name: 'candidate', rego: denying(reason) }]);
      sets.push({
        module: await WebAssembly.compile(wasm),
        data: {},
        revision: sets.length + 1,
        budgetMs: 250,
      });
    }
  });
  beforeEach(() => {
    runner = new EvaluationThread();
  });
  afterEach(async () => {
    await runner.close();
  });
  after(async () => {
    await compiler.close();
  });

  const message = async (p: Promise<{ message: string }>) => (await p).message;

  it('answers each evaluation with the set loaded before it, though no load has finished yet', async () => {
    // All in one tick: the thread has not even started when the first evaluation is posted.
    runner.load(sets[0] as ThreadSet);
    const a = runner.evaluate(READ);
    runner.load(sets[1] as ThreadSet);
    const b = runner.evaluate(READ);
    const c = runner.evaluate(READ);
    runner.load(sets[2] as ThreadSet);
    const d = runner.evaluate(READ);
    expect(await Promise.all([a, b, c, d].map(message))).to.deep.equal([
      'set one',
      'set two',
      'set two',
      'set three',
    ]);
  });

  it('answers what it held when the set is cleared, and nothing is evaluated without a set', async () => {
    runner.load(sets[0] as ThreadSet);
    const held = runner.evaluate(READ);
    runner.clear();
    expect(runner.active).to.equal(false);
    const none = await runner.evaluate(READ);
    expect(none.error).to.equal('no policy set is loaded on the evaluation thread');
    expect(await message(held)).to.equal('set one');
    // A new set starts a new thread.
    runner.load(sets[1] as ThreadSet);
    expect(await message(runner.evaluate(READ))).to.equal('set two');
  });

  it('answers an error, never rejects, when the thread is shut down or the input cannot be sent', async () => {
    runner.load(sets[0] as ThreadSet);
    // Sent in one batch with others: only the unsendable one fails.
    const [before, unsendable, after] = await Promise.all([
      runner.evaluate(READ),
      runner.evaluate({ f: () => 1 }),
      runner.evaluate(READ),
    ]);
    expect(unsendable?.error).to.match(/^evaluation could not be sent: /);
    expect([before?.message, after?.message]).to.deep.equal(['set one', 'set one']);
    // The thread still answers the next one.
    expect(await message(runner.evaluate(READ))).to.equal('set one');
    const pending = runner.evaluate(READ);
    await runner.close();
    const answer = await pending;
    // Shut down before or after it answered: either its answer or an error, never a rejection.
    expect(answer.message).to.be.oneOf(['set one', 'the evaluation thread was shut down']);
    expect((await runner.evaluate(READ)).error).to.equal('no policy set is loaded on the evaluation thread');
  });

  it('resolves a load once the thread holds the set, and also when the thread is shut down first', async () => {
    let loaded = false;
    const first = runner.load(sets[0] as ThreadSet).then(() => (loaded = true));
    // The thread is still starting: not loaded within this turn.
    await Promise.resolve();
    expect(loaded).to.equal(false);
    await first;
    expect(await message(runner.evaluate(READ))).to.equal('set one');
    // A change on the running thread resolves too, and answers what follows.
    await runner.load(sets[1] as ThreadSet);
    expect(await message(runner.evaluate(READ))).to.equal('set two');
    // A set that cannot be sent at all: the load says why and leaves no set (no thread is
    // started again for every evaluation).
    const reason = await runner.load({ ...(sets[0] as ThreadSet), data: { f: () => 1 } });
    expect(reason).to.match(/^the policy set could not be sent to the evaluation thread: /);
    expect(runner.active).to.equal(false);
    expect((await runner.evaluate(READ)).error).to.equal('no policy set is loaded on the evaluation thread');
    // Shut down while a set is loading: the load resolves (never rejects, never hangs).
    const other = new EvaluationThread();
    const pending = other.load(sets[2] as ThreadSet);
    await other.close();
    await pending;
    expect((await other.evaluate(READ)).error).to.equal('no policy set is loaded on the evaluation thread');
  });

  it('replaces a thread that died while it was being started: the next set loads and answers', async () => {
    // A set that cannot be sent (structured clone refuses a function) kills the new thread at once.
    const unsendable = { ...(sets[0] as ThreadSet), data: { f: () => 1 } };
    expect(await runner.load(unsendable as unknown as ThreadSet)).to.match(/could not be sent/);
    expect(runner.active).to.equal(false);
    await runner.load(sets[1] as ThreadSet);
    expect(await message(runner.evaluate(READ))).to.equal('set two');
    expect(await runner.thresholdErrors()).to.deep.equal([]);
  });
});

onceOnly('Shadow runner: on its thread until proven, then beside the live set', () => {
  const compiler = new RegoCompiler(opaBin);
  let set: ThreadSet;
  before(async () => {
    await compiler.init();
    const rego = denyReadsSlowOn('reads are off', 'slow');
    set = {
      module: await WebAssembly.compile(await compiler.compile([{ name: 'candidate', rego }])),
      data: { slow: { items: SLOW_ITEMS } },
      revision: 1,
      budgetMs: 10_000,
    };
  });
  after(async () => {
    await compiler.close();
  });
  const local = () => Evaluator.create(set.module, set.data, set.revision, set.budgetMs);
  const SLOW = { ...READ, resource: 'slow' };

  /** Evaluations on the thread until the set moved (a pause of this machine restarts the count). */
  const proving = async (runner: ShadowRunner, max = 20 * PROVING_DECISIONS) => {
    let n = 0;
    while (!runner.evaluatedInline && n < max) {
      const d = runner.evaluate(READ);
      expect(d).to.be.instanceOf(Promise);
      await d;
      n++;
    }
    return n;
  };

  it('moves after enough quick answers in a row, back after a slow one, and then needs twice as many', async () => {
    const moves: boolean[] = [];
    let sentBack = 0;
    const runner = new ShadowRunner({
      inline: true,
      moved: (inline) => moves.push(inline),
      sentBack: () => sentBack++,
    });
    /** Each move back so far, except those of a new set, was a send-back (a slow evaluation inline). */
    const backs = () => moves.filter((inline) => !inline).length;
    try {
      expect(await runner.load(set, await local())).to.equal(undefined);
      // Slow inputs on the thread: answered, but they restart the count.
      expect((await runner.evaluate(SLOW)).message).to.equal('reads are off');
      expect(await proving(runner)).to.be.at.least(PROVING_DECISIONS);
      expect(moves).to.deep.equal([true]);
      // Inline: answered at once, the same answer (unless a pause of this machine just sent it back).
      const inline = runner.evaluate(READ);
      if (runner.evaluatedInline) expect(inline).to.not.be.instanceOf(Promise);
      expect((await inline).message).to.equal('reads are off');
      // A slow evaluation there is still answered, and once its thread has found the input slow
      // too, sends the set back to its thread.
      await proving(runner);
      expect(runner.evaluatedInline).to.equal(true);
      const slow = runner.evaluate(SLOW);
      expect(slow).to.not.be.instanceOf(Promise);
      expect((slow as { message: string }).message).to.equal('reads are off');
      for (let i = 0; i < 500 && runner.evaluatedInline; i++) await new Promise((r) => setTimeout(r, 10));
      expect(runner.evaluatedInline).to.equal(false);
      expect(moves.slice(-2)).to.deep.equal([true, false]);
      expect(sentBack).to.be.at.least(1);
      expect(sentBack).to.equal(backs());
      expect(await proving(runner)).to.be.at.least(2 * PROVING_DECISIONS);
      expect(moves.at(-1)).to.equal(true);
      // A new set starts on its thread again (a move, not a send-back); clearing it leaves nothing inline.
      const sentBefore = sentBack;
      await runner.load(set, await local());
      expect(runner.evaluatedInline).to.equal(false);
      expect(moves.at(-1)).to.equal(false);
      expect(sentBack).to.equal(sentBefore);
      expect(await proving(runner)).to.be.at.least(PROVING_DECISIONS);
      runner.clear();
      expect(runner.evaluatedInline).to.equal(false);
      expect(moves.at(-1)).to.equal(false);
      expect(sentBack).to.equal(sentBefore);
    } finally {
      await runner.close();
    }
  });

  it('never moves a set whose thread could not load it, nor when moving is switched off', async () => {
    // The thread's copy cannot be loaded (a BigInt has no JSON), while this thread's evaluator
    // works: the thread's error answers prove nothing. `control` is the same set, free to move.
    const broken = new ShadowRunner({ inline: true });
    const off = new ShadowRunner({ inline: false });
    const control = new ShadowRunner({ inline: true });
    try {
      await broken.load({ ...set, data: { n: 1n } }, await local());
      await off.load(set, await local());
      await control.load(set, await local());
      let n = 0;
      while (!control.evaluatedInline && n < 20 * PROVING_DECISIONS) {
        const [b, o] = await Promise.all([broken.evaluate(READ), off.evaluate(READ), control.evaluate(READ)]);
        expect(b.error).to.match(/could not be loaded on the evaluation thread/);
        expect(o.message).to.equal('reads are off');
        n++;
      }
      expect(control.evaluatedInline).to.equal(true);
      expect(broken.evaluatedInline).to.equal(false);
      expect(off.evaluatedInline).to.equal(false);
    } finally {
      await Promise.all([broken.close(), off.close(), control.close()]);
    }
  });

  it('needs exactly 1 000 quick answers in a row, twice as many after each send-back (at most 64 000), and 1 000 for a new set', async () => {
    // A thread and an evaluator whose timings the test chooses: the counts, without this
    // machine's pauses. `ms` is what the thread says an evaluation took (undefined: no timing).
    const ALLOW = { status: 'allow' as const, message: 'ok', reasons: [] };
    let ms: number | undefined = 0;
    const thread = fakeThread(() =>
      Promise.resolve({ decision: ALLOW, ...(ms === undefined ? {} : { ms }) }),
    );
    const local = { lastMs: 0, evaluate: () => ALLOW } as unknown as Evaluator & { lastMs: number };
    const runner = new ShadowRunner({ inline: true, thread });
    /** Quick answers on the thread until the set moves; how many it took. */
    const untilMoved = async (taking = 0) => {
      ms = taking;
      let n = 0;
      while (!runner.evaluatedInline && n <= MAX_PROVING_DECISIONS) {
        await runner.evaluate(READ);
        n++;
      }
      return n;
    };
    /** One inline evaluation slower than the limit, which the thread then finds slow too. */
    const sendBack = async () => {
      local.lastMs = INLINE_MAX_MS + 1;
      ms = INLINE_MAX_MS + 1;
      expect(runner.evaluate(READ)).to.not.be.instanceOf(Promise);
      local.lastMs = 0;
      expect(runner.evaluatedInline).to.equal(true);
      await new Promise((r) => setImmediate(r));
      expect(runner.evaluatedInline).to.equal(false);
    };
    await runner.load(set, local);
    // One slow answer (or one without a timing) restarts the count: 1 000 more are needed after it.
    for (const slow of [INLINE_MAX_MS + 0.5, undefined]) {
      ms = 0;
      for (let i = 0; i < PROVING_DECISIONS - 1; i++) await runner.evaluate(READ);
      ms = slow;
      await runner.evaluate(READ);
      expect(runner.evaluatedInline).to.equal(false);
    }
    // Answers that took exactly the limit count.
    expect(await untilMoved(INLINE_MAX_MS)).to.equal(PROVING_DECISIONS);
    // Inline, a quick evaluation keeps it there; a slow one sends it back, each time for twice as many.
    expect(runner.evaluate(READ)).to.not.be.instanceOf(Promise);
    expect(runner.evaluatedInline).to.equal(true);
    const needed: number[] = [];
    for (let i = 0; i < 7; i++) {
      await sendBack();
      needed.push(await untilMoved());
    }
    expect(needed).to.deep.equal([2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 64_000]);
    // A new set starts over: 1 000, not the doubled count; so does one after a live change.
    await runner.load(set, local);
    expect(runner.evaluatedInline).to.equal(false);
    expect(await untilMoved()).to.equal(PROVING_DECISIONS);
    // Answers of the earlier set that arrive after a new one was loaded prove nothing.
    await sendBack();
    ms = 0;
    const stale = Array.from({ length: PROVING_DECISIONS }, () => runner.evaluate(READ));
    await runner.load(set, local);
    await Promise.all(stale);
    expect(runner.evaluatedInline).to.equal(false);
    expect(await untilMoved()).to.equal(PROVING_DECISIONS);
    await runner.close();
  });

  it('keeps a set whose slow inline evaluation its thread finds quick; sends it back when the thread finds it slow, gives no timing or no answer in time, or a second is slow first', async () => {
    // A thread that answers at once while the set proves itself, and afterwards when the test
    // says, with the timing the test chooses; an evaluator whose time the test chooses.
    const ALLOW = { status: 'allow' as const, message: 'ok', reasons: [] };
    const asked: ((ms: number | undefined) => void)[] = [];
    let holding = false;
    const thread = fakeThread(() =>
      holding
        ? new Promise((resolve) =>
            asked.push((ms) => resolve({ decision: ALLOW, ...(ms === undefined ? {} : { ms }) })),
          )
        : Promise.resolve({ decision: ALLOW, ms: 0 }),
    );
    const local = { lastMs: 0, evaluate: () => ALLOW } as unknown as Evaluator & { lastMs: number };
    let kept = 0;
    let sentBack = 0;
    const runner = new ShadowRunner({
      inline: true,
      thread,
      waitMs: 50,
      slowKept: () => kept++,
      sentBack: () => sentBack++,
    });
    const prove = async () => {
      holding = false;
      while (!runner.evaluatedInline) await runner.evaluate(READ);
      holding = true;
    };
    /** One inline evaluation slower than the limit: answered at once all the same. */
    const slow = () => {
      local.lastMs = INLINE_MAX_MS + 1;
      expect(runner.evaluate(READ)).to.deep.equal(ALLOW);
      local.lastMs = 0;
    };
    const answer = async (ms: number | undefined) => {
      expect(asked).to.have.length(1);
      asked.shift()!(ms);
      await new Promise((r) => setImmediate(r));
    };
    const state = () => ({ kept, sentBack, inline: runner.evaluatedInline });
    try {
      await runner.load(set, local);
      await prove();
      // The thread evaluates the input again; meanwhile the set stays, and quick evaluations
      // change nothing. Within the limit there (exactly the limit counts): the machine's pause.
      slow();
      expect(runner.evaluate(READ)).to.deep.equal(ALLOW);
      expect(state()).to.deep.equal({ kept: 0, sentBack: 0, inline: true });
      await answer(INLINE_MAX_MS);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 0, inline: true });
      // A later slow evaluation is timed again; slow on the thread too: sent back.
      slow();
      await answer(INLINE_MAX_MS + 0.5);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 1, inline: false });
      // A second slow evaluation before the thread answers: sent back at once; the late answer,
      // once the set has proven itself again, changes nothing.
      await prove();
      slow();
      expect(state()).to.deep.equal({ kept: 1, sentBack: 1, inline: true });
      slow();
      expect(state()).to.deep.equal({ kept: 1, sentBack: 2, inline: false });
      await prove();
      await answer(INLINE_MAX_MS + 1);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 2, inline: true });
      // The thread gave no timing (it failed): sent back.
      slow();
      await answer(undefined);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 3, inline: false });
      // No answer within the wait: sent back when it ends; the late answer changes nothing.
      await prove();
      slow();
      await new Promise((r) => setTimeout(r, 150));
      expect(state()).to.deep.equal({ kept: 1, sentBack: 4, inline: false });
      await prove();
      await answer(INLINE_MAX_MS + 1);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 4, inline: true });
      // A new set while the thread times the old one's input: that answer is about the old set.
      slow();
      await runner.load(set, local);
      await prove();
      await answer(INLINE_MAX_MS + 1);
      expect(state()).to.deep.equal({ kept: 1, sentBack: 4, inline: true });
      // The new set's first slow evaluation is timed afresh, not taken for a second one.
      slow();
      expect(runner.evaluatedInline).to.equal(true);
      await answer(1);
      expect(state()).to.deep.equal({ kept: 2, sentBack: 4, inline: true });
    } finally {
      await runner.close();
    }
  });

  it('waits for the thread at most the wait, counted from asking, then skips the set for 1 s, 2 s, … while it keeps timing out', async () => {
    const ALLOW = { status: 'allow' as const, message: 'ok', reasons: [] };
    // A thread that answers at once, or never (a stuck or slow set with evaluations queued).
    let hang = true;
    let asked = 0;
    let restarts = 0;
    const thread = fakeThread(
      () => {
        asked++;
        return hang ? new Promise(() => {}) : Promise.resolve({ decision: ALLOW, ms: 0 });
      },
      () => restarts++,
    );
    const local = { lastMs: 0, evaluate: () => ALLOW } as unknown as Evaluator;
    const runner = new ShadowRunner({ inline: true, thread, waitMs: 50 });
    await runner.load(set, local);
    const started = performance.now();
    const [first, second] = await Promise.all([runner.evaluate(READ), runner.evaluate(READ)]);
    expect(performance.now() - started).to.be.at.least(45);
    for (const d of [first, second]) expect(d.error).to.equal('the shadow set did not answer within 50 ms');
    expect(asked).to.equal(2);
    // Its thread is restarted once, dropping what it held.
    expect(restarts).to.equal(1);
    // Skipped: answered at once, without asking the thread.
    const skipped = runner.evaluate(READ);
    expect(skipped).to.not.be.instanceOf(Promise);
    expect((skipped as { error?: string }).error).to.equal(
      'not evaluated: the shadow set timed out and is skipped for 1 s',
    );
    expect(asked).to.equal(2);
    // After the second it is asked again; timing out again skips it for twice as long.
    await new Promise((r) => setTimeout(r, 1_050));
    expect((await runner.evaluate(READ)).error).to.equal('the shadow set did not answer within 50 ms');
    expect(asked).to.equal(3);
    expect((runner.evaluate(READ) as { error?: string }).error).to.equal(
      'not evaluated: the shadow set timed out and is skipped for 2 s',
    );
    // A new set is asked at once, and a thread that answers in time is never skipped.
    hang = false;
    await runner.load(set, local);
    for (let i = 0; i < 3; i++) expect(await runner.evaluate(READ)).to.deep.equal(ALLOW);
    expect(asked).to.equal(6);
    await runner.close();
  });

  it('answers both from one pass once paired: checked against the two sets on their own first and then one in 1 000, dropped on a difference, sent back when slow', async () => {
    // The live set, the shadow set and the paired module are fakes whose answers and timings the
    // test chooses; the thread answers at once, in `threadMs`.
    let threadMs = 0;
    const ALLOW = { status: 'allow' as const, message: 'ok', reasons: [] };
    const DENY = { status: 'deny' as const, message: 'reads are off', reasons: ['reads are off'] };
    const thread = fakeThread(() => Promise.resolve({ decision: DENY, ms: threadMs }));
    const calls = { live: 0, shadow: 0, paired: 0 };
    const live = { revision: 7, evaluate: () => (calls.live++, ALLOW) } as unknown as Evaluator;
    const local = {
      revision: 7,
      lastMs: 0,
      evaluate: () => (calls.shadow++, DENY),
    } as unknown as Evaluator;
    let pairedShadow: PolicyDecision = DENY;
    const paired = {
      revision: 7,
      lastMs: 0,
      evaluatePair: () => (calls.paired++, { live: ALLOW, shadow: pairedShadow }),
    } as unknown as Evaluator & { lastMs: number };
    const pairing: boolean[] = [];
    const differed: string[] = [];
    let sentBack = 0;
    const runner = new ShadowRunner({
      inline: true,
      thread,
      paired: (on) => pairing.push(on),
      pairDiffered: (detail) => differed.push(detail),
      sentBack: () => sentBack++,
    });
    const prove = async () => {
      while (!runner.evaluatedInline) await runner.evaluate(READ);
    };
    const reset = () => Object.assign(calls, { live: 0, shadow: 0, paired: 0 });
    try {
      await runner.load(set, local);
      const epoch = runner.loadedEpoch;
      // Paired while still on the thread: not used until the set is proven.
      runner.setPaired(paired, epoch);
      expect(runner.pair(READ, live)).to.equal(undefined);
      expect(pairing).to.deep.equal([]);
      await prove();
      expect(pairing).to.deep.equal([true]);
      // Checked first: every pass is also evaluated apart, and those answers stand.
      reset();
      for (let i = 0; i < PAIR_CHECKED_DECISIONS; i++) {
        expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      }
      expect(calls).to.deep.equal({
        live: PAIR_CHECKED_DECISIONS,
        shadow: PAIR_CHECKED_DECISIONS,
        paired: PAIR_CHECKED_DECISIONS,
      });
      // Then one pass alone, but for one in PAIR_SAMPLED_EVERY, checked as before.
      reset();
      for (let i = 1; i < PAIR_SAMPLED_EVERY; i++) {
        expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      }
      expect(calls).to.deep.equal({ live: 0, shadow: 0, paired: PAIR_SAMPLED_EVERY - 1 });
      expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      expect(calls).to.deep.equal({ live: 1, shadow: 1, paired: PAIR_SAMPLED_EVERY });
      reset();
      expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      expect(calls).to.deep.equal({ live: 0, shadow: 0, paired: 1 });
      // Another live revision than the pair was built for: no pair.
      expect(runner.pair(READ, { ...live, revision: 8 } as unknown as Evaluator)).to.equal(undefined);
      // A slow pass is answered, and its input evaluated again on the thread: quick there, the
      // pair stays; slow there too, the set goes back to its thread (no pair there).
      paired.lastMs = INLINE_MAX_MS + 1;
      expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      await new Promise((r) => setImmediate(r));
      expect(sentBack).to.equal(0);
      expect(pairing).to.deep.equal([true]);
      threadMs = INLINE_MAX_MS + 1;
      expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      paired.lastMs = 0;
      expect(pairing).to.deep.equal([true]);
      await new Promise((r) => setImmediate(r));
      threadMs = 0;
      expect(sentBack).to.equal(1);
      expect(runner.evaluatedInline).to.equal(false);
      expect(pairing).to.deep.equal([true, false]);
      expect(runner.pair(READ, live)).to.equal(undefined);
      await prove();
      expect(pairing).to.deep.equal([true, false, true]);
      // A pair built for an earlier set is ignored; a new set is checked from the start, and one
      // difference drops its pair: the answers evaluated apart stand.
      await runner.load(set, local);
      runner.setPaired(paired, epoch);
      await prove();
      expect(runner.pair(READ, live)).to.equal(undefined);
      runner.setPaired(paired, runner.loadedEpoch);
      pairedShadow = ALLOW;
      reset();
      expect(runner.pair(READ, live)).to.deep.equal({ live: ALLOW, shadow: DENY });
      expect(calls).to.deep.equal({ live: 1, shadow: 1, paired: 1 });
      expect(differed).to.have.length(1);
      expect(differed[0]).to.include('"shadow":{"status":"allow"');
      expect(pairing.at(-1)).to.equal(false);
      expect(runner.pair(READ, live)).to.equal(undefined);
      expect(runner.evaluatedInline).to.equal(true);
      // A difference met by a sampled check, once the first ones passed, drops the pair too; the
      // answers before it were the pair's.
      await runner.load(set, local);
      await prove();
      runner.setPaired(paired, runner.loadedEpoch);
      pairedShadow = DENY;
      for (let i = 0; i < PAIR_CHECKED_DECISIONS; i++) runner.pair(READ, live);
      pairedShadow = ALLOW;
      let unchecked = 0;
      while (differed.length === 1 && unchecked < 2 * PAIR_SAMPLED_EVERY) {
        const both = runner.pair(READ, live);
        if (both?.shadow.status === 'allow') unchecked++;
      }
      expect(unchecked).to.equal(PAIR_SAMPLED_EVERY - 1);
      expect(differed).to.have.length(2);
      expect(runner.pair(READ, live)).to.equal(undefined);
    } finally {
      await runner.close();
    }
  });

  it('answers an error, never throws, when the inline evaluator throws or the observer does', async () => {
    const runner = new ShadowRunner({
      inline: true,
      moved: () => {
        throw new Error('observer fault');
      },
    });
    try {
      let calls = 0;
      const throwing = {
        evaluate: () => {
          calls++;
          throw new Error('boom');
        },
      } as unknown as Evaluator;
      await runner.load(set, throwing);
      // Proven on the thread (the real set) despite the observer's faults.
      expect(await proving(runner)).to.be.at.least(PROVING_DECISIONS);
      const d = runner.evaluate(READ);
      expect(d).to.not.be.instanceOf(Promise);
      expect((d as { error?: string }).error).to.equal('shadow evaluation failed: boom');
      expect(calls).to.equal(1);
    } finally {
      await runner.close();
    }
  });
});

// A real thread: the timeouts, the restart and the skip periods together.
onceOnly('Shadow runner: a set that never finishes, on a real thread', () => {
  const compiler = new RegoCompiler(opaBin);
  let set: ThreadSet;
  before(async () => {
    await compiler.init();
    set = {
      module: await WebAssembly.compile(await compiler.compile([{ name: 'candidate', rego: SPIN }])),
      data: { spin: { items: SPIN_ITEMS } },
      revision: 1,
      budgetMs: 250,
    };
  });
  after(async () => {
    await compiler.close();
  });

  it('fails the waiters together, restarts the thread, and skips 1 s then 2 s while it keeps timing out', async () => {
    const local = await Evaluator.create(set.module, set.data, set.revision, set.budgetMs);
    const runner = new ShadowRunner({ inline: true, waitMs: 300 });
    try {
      await runner.load(set, local);
      const APPROVE = { ...READ, action: 'deploy' };
      // Quick on anything but a read: the set answers (which resets nothing yet).
      expect((await runner.evaluate(APPROVE)).error).to.equal(undefined);
      // Three reads at once, each never finishing: every one of them is answered with an error
      // in about the wait, the first by its own wait, the others by the restart.
      const started = performance.now();
      const first = await Promise.all([runner.evaluate(READ), runner.evaluate(READ), runner.evaluate(READ)]);
      expect(performance.now() - started).to.be.below(1_250);
      for (const d of first) expect(d.error).to.be.a('string');
      expect(first.map((d) => d.error)).to.include('the shadow set did not answer within 300 ms');
      expect((runner.evaluate(APPROVE) as { error?: string }).error).to.equal(
        'not evaluated: the shadow set timed out and is skipped for 1 s',
      );
      // After the second, a new thread answers at once; reads time out again: twice as long.
      await new Promise((r) => setTimeout(r, 1_050));
      const again = await Promise.all([runner.evaluate(READ), runner.evaluate(READ)]);
      for (const d of again) expect(d.error).to.be.a('string');
      expect((runner.evaluate(APPROVE) as { error?: string }).error).to.equal(
        'not evaluated: the shadow set timed out and is skipped for 2 s',
      );
    } finally {
      await runner.close();
    }
  });
});
