import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { ADMIN_KEY, AGENT, Arbiter, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// These go through storage: every backend.
onEveryBackend('bounded long-polls and traces', () => {
  let a: Arbiter;
  before(async () => {
    // One key (the admin's) fills the process-wide limit here: its share is the whole of it.
    a = await Arbiter.start({ ARBITER_MAX_LONG_POLLS: '2', ARBITER_MAX_LONG_POLLS_PER_KEY: '2' });
  });
  after(async () => {
    await a.close();
  });

  it('answers 429 with Retry-After once the long-poll limit is reached', async () => {
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const url = a.engine + `/v1/queue/${q.json.request_id}?wait=2`;
    const held = [call('GET', url), call('GET', url)];
    await new Promise((r) => setTimeout(r, 300));
    const third = await call('GET', url);
    expectError(third, 429);
    expect(third.headers.get('retry-after')).to.equal('1');
    expect((await Promise.all(held)).map((r) => r.status)).to.deep.equal([200, 200]);
    expect((await call('GET', url)).status).to.equal(200);
  });

  it('frees the place of a long-poll whose client hung up, at once rather than when its wait ends', async () => {
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const url = a.engine + `/v1/queue/${q.json.request_id}`;
    // Both places taken by waits of 30 s whose clients give up after 300 ms.
    const hangUp = new AbortController();
    const abandoned = [0, 1].map(() =>
      fetch(`${url}?wait=30`, {
        headers: { authorization: `Bearer ${ADMIN_KEY}` },
        signal: hangUp.signal,
      }).catch(() => 'aborted'),
    );
    await new Promise((r) => setTimeout(r, 300));
    expectError(await call('GET', `${url}?wait=1`), 429);
    hangUp.abort();
    expect(await Promise.all(abandoned)).to.deep.equal(['aborted', 'aborted']);
    // The server notices the hang-ups within a moment, not after 30 s.
    let status = 0;
    for (let i = 0; i < 20 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 100));
      status = (await call('GET', `${url}?wait=0.1`)).status;
    }
    expect(status).to.equal(200);
  });

  it('pages a trace that grew past the limit, oldest first, without gaps', async () => {
    const trace = 'abcdefabcdefabcdefabcdefabcdef01';
    const events = Array.from({ length: 7 }, (_, i) => ({
      kind: 'engine.step',
      trace_id: trace,
      message: `s${i}`,
    }));
    expect((await call('POST', a.platform + '/api/v1/audit/ingest', { body: { events } })).status).to.equal(
      202,
    );
    const seen: string[] = [];
    let cursor: string | null = null;
    let firstCursor: string | null = null;
    do {
      const r = await call(
        'GET',
        a.platform + `/api/v1/audit/trace/${trace}?limit=3${cursor ? `&cursor=${cursor}` : ''}`,
      );
      expect(r.status, r.text).to.equal(200);
      seen.push(...r.json.events.map((e: { message: string }) => e.message));
      cursor = r.json.next_cursor;
      firstCursor ??= cursor;
    } while (cursor);
    expect(seen).to.deep.equal(['s0', 's1', 's2', 's3', 's4', 's5', 's6']);
    const whole = await call('GET', a.platform + `/api/v1/audit/trace/${trace}`);
    expect(whole.json.events).to.have.length(7);
    expect(whole.json.next_cursor).to.equal(null);
    // A cursor belongs to its trace.
    const other = await call('GET', a.platform + `/api/v1/audit/trace/ffff?cursor=${firstCursor}`);
    expectError(other, 400);
  });
});

// The per-key share of long-polls is kept beside the stored item each wait re-reads: every backend.
onEveryBackend('long-polls: one API key holds at most its share', () => {
  let a: Arbiter;
  let hog: string;
  let other: string;
  before(async () => {
    a = await Arbiter.start({ ARBITER_MAX_LONG_POLLS: '6', ARBITER_MAX_LONG_POLLS_PER_KEY: '2' });
    hog = a.createKey('poll-hog', ['queue:read']);
    other = a.createKey('poll-other', ['queue:read']);
  });
  after(async () => {
    await a.close();
  });

  /** A 30 s wait by `key` that the test hangs up on. */
  const hold = (url: string, key: string, signal: AbortSignal) =>
    fetch(`${url}?wait=30`, { headers: { authorization: `Bearer ${key}` }, signal }).catch(() => 'aborted');

  it('answers 429 with Retry-After to a key over its share, while another key still waits', async () => {
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const url = a.engine + `/v1/queue/${q.json.request_id}`;
    const hangUp = new AbortController();
    const held = [hold(url, hog, hangUp.signal), hold(url, hog, hangUp.signal)];
    await new Promise((r) => setTimeout(r, 300));

    const refused = await call('GET', `${url}?wait=5`, { key: hog });
    expectError(refused, 429, /per key \(2\)/);
    expect(refused.headers.get('retry-after')).to.equal('1');
    // A read without a wait holds nothing: still answered.
    expect((await call('GET', url, { key: hog })).status).to.equal(200);

    // Another key (and the admin key) are not refused: each is held for its whole wait.
    const started = Date.now();
    const [theirs, admins] = await Promise.all([
      call('GET', `${url}?wait=1`, { key: other }),
      call('GET', `${url}?wait=1`),
    ]);
    expect([theirs.status, admins.status]).to.deep.equal([200, 200]);
    expect(theirs.json.status).to.equal('pending');
    expect(Date.now() - started).to.be.greaterThanOrEqual(900);

    // Hanging up frees the key's places at once.
    hangUp.abort();
    expect(await Promise.all(held)).to.deep.equal(['aborted', 'aborted']);
    let status = 0;
    for (let i = 0; i < 20 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 100));
      status = (await call('GET', `${url}?wait=0.1`, { key: hog })).status;
    }
    expect(status).to.equal(200);
    // Both places, not one.
    const again = await Promise.all([
      call('GET', `${url}?wait=0.3`, { key: hog }),
      call('GET', `${url}?wait=0.3`, { key: hog }),
    ]);
    expect(again.map((r) => r.status)).to.deep.equal([200, 200]);
  });

  it('still answers the process-wide limit when several keys fill it', async () => {
    const q = await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.approval });
    const url = a.engine + `/v1/queue/${q.json.request_id}`;
    const hangUp = new AbortController();
    const third = a.createKey('poll-third', ['queue:read']);
    const held = [hog, hog, other, other, third, third].map((k) => hold(url, k, hangUp.signal));
    await new Promise((r) => setTimeout(r, 300));
    const refused = await call('GET', `${url}?wait=1`);
    expectError(refused, 429, /too many requests are waiting/);
    expect(refused.headers.get('retry-after')).to.equal('1');
    hangUp.abort();
    expect(await Promise.all(held)).to.have.length(6);
  });
});
