import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { canonicalJson } from '../src/common/canonical-json.js';
import { onEveryBackend } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, call, HUMAN, REPO } from './helpers/harness.js';

const ZEROS = '0'.repeat(64);
const sha256Hex = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

/** The hash of an event as README documents it: hex SHA-256 of the JCS text of all but `hash`. */
function eventHash(e: Record<string, unknown>): string {
  const { hash: _hash, ...content } = e;
  return sha256Hex(canonicalJson(content));
}

interface Anchor {
  head: string;
  count: number;
}

/** The last line of a CLI's stdout, as JSON. */
function cliJson(out: string) {
  const lines = out.trim().split('\n');
  return JSON.parse(lines[lines.length - 1] as string);
}

/** Verifies over HTTP and with the CLI (same answer; exit 0 or 1), optionally against an anchor. */
async function verify(a: Arbiter, anchor?: Anchor) {
  const qs = anchor ? `?head=${anchor.head}&count=${anchor.count}` : '';
  const v = await call('GET', `${a.platform}/api/v1/audit/verify${qs}`);
  expect(v.status, v.text).to.equal(200);
  const cli = a.cli([
    'audit',
    'verify',
    ...(anchor ? ['--head', anchor.head, '--count', String(anchor.count)] : []),
  ]);
  expect(cli.code, cli.stdout + cli.stderr).to.equal(v.json.ok ? 0 : 1);
  expect(cliJson(cli.stdout)).to.deep.equal(v.json);
  return v.json;
}

/** Verification fails, with no event to point at, for a reason matching `reason`. */
async function expectBroken(a: Arbiter, reason: RegExp, anchor?: Anchor) {
  const v = await verify(a, anchor);
  expect(v, JSON.stringify(v)).to.include({ ok: false, first_bad: null });
  expect(v.reason).to.match(reason);
  return v;
}

interface Row {
  seq: number;
  body: string;
  hash: string;
}

async function rows(a: Arbiter): Promise<Row[]> {
  const r = await a.stored<{ seq: number | string; body: string; hash: string }>(
    'SELECT seq, body, hash FROM audit_events ORDER BY seq',
  );
  return r.map((x) => ({ ...x, seq: Number(x.seq) }));
}

const COLUMNS =
  'seq, time, kind, trace_id, request_id, agent_id, user_id, tenant_id, action, outcome, body, hash';

/** Stores `content` as the row at `seq` with its body, hash and index columns all consistent. */
async function putRow(a: Arbiter, seq: number, content: Record<string, unknown>, insert: boolean) {
  const body = canonicalJson(content);
  const cols = [
    'time',
    'kind',
    'trace_id',
    'request_id',
    'agent_id',
    'user_id',
    'tenant_id',
    'action',
    'outcome',
  ];
  const values = [...cols.map((c) => content[c] ?? null), body, sha256Hex(body)];
  if (insert) {
    await a.alter(
      `INSERT INTO audit_events (${COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
      [seq, ...values],
    );
  } else {
    // Placeholders in order: SQLite's are positional.
    await a.alter(
      `UPDATE audit_events SET ${[...cols, 'body', 'hash'].map((c, i) => `${c} = $${i + 1}`).join(', ')} WHERE seq = $12`,
      [...values, seq],
    );
  }
  return sha256Hex(body);
}

/**
 * A forged approval, as the probe inserted it: a well-formed event (linked after the last one,
 * its body hashing to its hash) stored at `seq`. Returns its id.
 */
async function forgeApproval(a: Arbiter, seq: number): Promise<string> {
  const all = await rows(a);
  const last = all[all.length - 1]!;
  const id = randomUUID();
  const content = { ...(JSON.parse(last.body) as Record<string, unknown>) };
  Object.assign(content, {
    id,
    kind: 'queue.approve',
    outcome: 'approved',
    actor: 'nobody',
    prev_hash: last.hash,
  });
  await putRow(a, seq, content, true);
  return id;
}

const setMeta = (a: Arbiter, key: string, value: string) =>
  a.alter('UPDATE meta SET value = $1 WHERE key = $2', [value, key]);

// Tampering is done to the database itself, behind the running service: every backend.
onEveryBackend('audit verify: rows outside the chain and its recorded head', () => {
  const started: Arbiter[] = [];
  afterEach(async () => {
    while (started.length) await started.pop()!.close();
  });

  async function withEvents(): Promise<Arbiter> {
    const a = await Arbiter.start();
    started.push(a);
    for (const body of [AGENT.allow, AGENT.deny, AGENT.approval, HUMAN.allow]) {
      const r = await call(
        'POST',
        `${a.engine}${'user_id' in body ? '/v1/authorize' : '/v1/agent/authorize'}`,
        {
          body,
        },
      );
      expect(r.status, r.text).to.be.oneOf([200, 202, 403]);
    }
    expect(await verify(a)).to.include({ ok: true });
    return a;
  }

  it('fails on a forged row at number 0, -7, count+1 or 1000000, which the list would serve', async () => {
    const a = await withEvents();
    const n = (await rows(a)).length;
    for (const [seq, reason] of [
      [0, /event is stored at number 0, before the chain's first/],
      [-7, /event is stored at number -7, before the chain's first/],
      [n + 1, new RegExp(`event is stored at number ${n + 1}, beyond the ${n} the chain records`)],
      [1000000, new RegExp(`event is stored at number 1000000, beyond the ${n} the chain records`)],
    ] as const) {
      const id = await forgeApproval(a, seq);
      const listed = await call('GET', `${a.platform}/api/v1/audit?kind=queue.approve`);
      expect(listed.json.events.map((e: { id: string }) => e.id)).to.include(id);
      const v = await expectBroken(a, reason);
      expect(v.checked).to.equal(n);
      await a.alter('DELETE FROM audit_events WHERE seq = $1', [seq]);
      expect(await verify(a)).to.deep.include({ ok: true, checked: n });
    }
  });

  it('points at an event whose body was replaced by JSON that is not an event, hash recomputed', async () => {
    const a = await withEvents();
    const [first, second] = await rows(a);
    const notObject = /^event 2 has a body that is not a JSON object: it was modified$/;
    const unlinked = /^prev_hash does not match the event before it/;
    for (const [body, reason] of [
      ['null', notObject],
      ['1', notObject],
      ['"x"', notObject],
      ['[]', notObject],
      ['{"id":7}', unlinked],
      ['{"id":"fake","prev_hash":null}', unlinked],
      // Linked, but without the fields its row's columns hold.
      [`{"id":"fake","prev_hash":"${first!.hash}"}`, /^the indexed columns of this event differ/],
    ] as const) {
      await a.alter('UPDATE audit_events SET body = $1, hash = $2 WHERE seq = 2', [body, sha256Hex(body)]);
      // 200 {ok: false} naming the event by number (its id is not to be trusted), never a 500.
      const v = await verify(a);
      expect(v, body).to.deep.equal({
        ok: false,
        checked: 1,
        first_bad: body.includes('fake') ? 'fake' : null,
        reason: v.reason,
      });
      expect(v.reason, body).to.match(reason);
    }
    await a.alter('UPDATE audit_events SET body = $1, hash = $2 WHERE seq = 2', [second!.body, second!.hash]);
    expect(await verify(a)).to.include({ ok: true });
  });

  it('fails when the forged row is recorded as the head too: a gap in the numbering', async () => {
    const a = await withEvents();
    const n = (await rows(a)).length;
    const id = await forgeApproval(a, 1000000);
    const forged = (await rows(a)).find((r) => r.seq === 1000000)!;
    await setMeta(a, 'audit_count', '1000000');
    await setMeta(a, 'audit_head', forged.hash);
    const v = await verify(a);
    expect(v).to.include({ ok: false, first_bad: id, checked: n });
    expect(v.reason).to.match(
      new RegExp(`event ${n + 1} is missing: the next stored event is number 1000000`),
    );
  });

  it('fails when the recorded count is lowered, with or without a head to match', async () => {
    const a = await withEvents();
    const all = await rows(a);
    const n = all.length;
    await setMeta(a, 'audit_count', String(n - 2));
    await expectBroken(a, new RegExp(`event ${n - 2} does not hash to the recorded head`));
    // The head of event n-2 as well: the walk ends there consistently; the two rows after it do not.
    await setMeta(a, 'audit_head', all[n - 3]!.hash);
    await expectBroken(
      a,
      new RegExp(`event is stored at number ${n}, beyond the ${n - 2} the chain records`),
    );
  });

  it('fails when the recorded head is reset to an empty chain (count 0, 64 zeros)', async () => {
    const a = await withEvents();
    const n = (await rows(a)).length;
    await setMeta(a, 'audit_count', '0');
    await setMeta(a, 'audit_head', ZEROS);
    const v = await expectBroken(
      a,
      new RegExp(`event is stored at number ${n}, beyond the 0 the chain records`),
    );
    expect(v.checked).to.equal(0);
  });

  it('fails, naming them, when the meta rows of the head are deleted', async () => {
    const a = await withEvents();
    await a.alter("DELETE FROM meta WHERE key = 'audit_count'");
    await expectBroken(a, /the chain head is not recorded: meta audit_count is missing/);
    await a.alter("DELETE FROM meta WHERE key = 'audit_head'");
    await expectBroken(a, /the chain head is not recorded: meta audit_head and audit_count are missing/);
  });

  it('fails on a recorded count or head that is not a number or a hash, never NaN', async () => {
    const a = await withEvents();
    const n = (await rows(a)).length;
    for (const bad of ['abc', 'NaN', '', '12abc', '1e2', '-1', '007', ' 7', `${n}.5`]) {
      await setMeta(a, 'audit_count', bad);
      const v = await expectBroken(
        a,
        /the recorded event count \(meta audit_count\) is not a non-negative integer/,
      );
      expect(JSON.stringify(v)).to.not.include('NaN');
    }
    // As SQLite once wrote it (a REAL's text), it reads as the same count.
    await setMeta(a, 'audit_count', `${n}.0`);
    expect(await verify(a)).to.deep.include({ ok: true, checked: n });
    await setMeta(a, 'audit_count', String(n));
    expect(await verify(a)).to.deep.include({ ok: true, checked: n });
    await setMeta(a, 'audit_head', 'not-a-hash');
    await expectBroken(a, /the recorded chain head \(meta audit_head\) is not a SHA-256 hex hash/);
  });

  it('still verifies a database with no events at all', async () => {
    const a = await Arbiter.start();
    started.push(a);
    await a.alter('DELETE FROM audit_events');
    await setMeta(a, 'audit_count', '0');
    await setMeta(a, 'audit_head', ZEROS);
    expect(await verify(a)).to.deep.equal({ ok: true, checked: 0, head: ZEROS });
  });
});

onEveryBackend('audit verify against an anchored head', () => {
  const started: Arbiter[] = [];
  afterEach(async () => {
    while (started.length) await started.pop()!.close();
  });

  async function decide(a: Arbiter, n: number) {
    for (let i = 0; i < n; i++) {
      const r = await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.allow });
      expect(r.status, r.text).to.equal(200);
    }
  }

  it('passes on an untouched chain that has grown since, and fails when it is shorter than the anchor', async () => {
    const a = await Arbiter.start();
    started.push(a);
    await decide(a, 3);
    const first = await verify(a);
    expect(first.ok).to.equal(true);
    await decide(a, 2);
    const later = await verify(a, { head: first.head, count: first.checked });
    expect(later).to.include({ ok: true });
    expect(later.checked).to.be.greaterThan(first.checked);
    expect(await verify(a, { head: later.head, count: later.checked })).to.deep.equal(later);

    const beyond = await verify(a, { head: later.head, count: later.checked + 5 });
    expect(beyond).to.include({ ok: false, first_bad: null, checked: later.checked });
    expect(beyond.reason).to.match(new RegExp(`^the chain has only ${later.checked} events`));
  });

  it('fails against the old anchor once an event is rewritten and the chain and head re-hashed', async () => {
    const a = await Arbiter.start();
    started.push(a);
    await decide(a, 4);
    const anchored = await verify(a);
    expect(anchored.ok).to.equal(true);
    const all = await rows(a);
    const early = { head: all[0]!.hash, count: 1 };

    // Event 2 rewritten; every event after it re-linked and re-hashed, and the head with them.
    let prev = all[0]!.hash;
    for (const r of all.slice(1)) {
      const content = JSON.parse(r.body) as Record<string, unknown>;
      if (r.seq === 2) content.message = 'rewritten';
      content.prev_hash = prev;
      prev = await putRow(a, r.seq, content, false);
    }
    await setMeta(a, 'audit_head', prev);

    // Consistent on its own: the walk alone cannot tell.
    expect(await verify(a)).to.deep.equal({ ok: true, checked: all.length, head: prev });
    expect(prev).to.not.equal(anchored.head);
    const v = await verify(a, { head: anchored.head, count: anchored.checked });
    expect(v).to.include({ ok: false, first_bad: null, checked: all.length });
    expect(v.reason).to.equal(
      `event ${anchored.checked} hashes to ${prev}, not to the anchored head ${anchored.head}: the chain was rewritten up to it`,
    );
    // An anchor from before the rewrite still holds.
    expect(await verify(a, early)).to.include({ ok: true });
  });

  it('refuses a malformed anchor or half of one: 400 over HTTP, exit 2 from the CLI', async () => {
    const a = await Arbiter.start();
    started.push(a);
    const doc = await call('GET', `${a.platform}/openapi.json`);
    const params = doc.json.paths['/api/v1/audit/verify'].get.parameters as {
      name: string;
      schema: object;
    }[];
    expect(params.map((p) => [p.name, p.schema])).to.deep.equal([
      ['head', { type: 'string', pattern: '^[0-9a-f]{64}$' }],
      ['count', { type: 'integer', minimum: 1, maximum: Number.MAX_SAFE_INTEGER }],
    ]);
    const head = 'a'.repeat(64);
    for (const [qs, field] of [
      [`head=${head}`, /head and count/],
      ['count=3', /head and count/],
      [`head=${'A'.repeat(64)}&count=1`, /head must be 64 lowercase hex digits/],
      [`head=${'a'.repeat(63)}&count=1`, /head must be 64 lowercase hex digits/],
      [`head=${head}&count=0`, /count must be a positive integer/],
      [`head=${head}&count=-1`, /count must be a positive integer/],
      [`head=${head}&count=1.5`, /count must be a positive integer/],
      [`head=${head}&count=abc`, /count must be a positive integer/],
      [`head=${head}&count=99999999999999999`, /count must be a positive integer/],
    ] as const) {
      expectError(await call('GET', `${a.platform}/api/v1/audit/verify?${qs}`), 400, field);
      const args = qs.split('&').map((p) => `--${p}`);
      const cli = a.cli(['audit', 'verify', ...args]);
      expect(cli.code, `${qs}: ${cli.stdout}${cli.stderr}`).to.equal(2);
      expect(cli.stderr).to.match(field);
    }
  });
});

onEveryBackend('the audit hash recipe in README', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
    await call('POST', `${a.engine}/v1/agent/authorize`, { body: AGENT.approval });
    await call('POST', `${a.engine}/v1/authorize`, { body: HUMAN.allow });
    const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
      body: {
        kind: 'ext.check',
        confidence: 0.375,
        resource: { type: 'doc', id: 'é/🚀' },
        details: { z: [1, 2.5, { b: null, a: 'x' }], '10': true, '9': 'nine', ü: '\u2028' },
      },
    });
    expect(r.status, r.text).to.equal(202);
  });
  after(async () => {
    await a.close();
  });

  const listed = async () => {
    const r = await call('GET', `${a.platform}/api/v1/audit?limit=1000`);
    expect(r.status, r.text).to.equal(200);
    return r.text;
  };

  it('recomputes every event hash and link from GET /api/v1/audit alone', async () => {
    const events = (JSON.parse(await listed()).events as Record<string, unknown>[]).reverse();
    expect(events.length).to.be.greaterThan(2);
    let prev = ZEROS;
    for (const e of events) {
      expect(e.prev_hash, `prev_hash of ${String(e.id)}`).to.equal(prev);
      expect(eventHash(e), `hash of ${String(e.kind)} ${String(e.id)}`).to.equal(e.hash);
      prev = e.hash as string;
    }
    const v = await call('GET', `${a.platform}/api/v1/audit/verify`);
    expect(v.json).to.deep.equal({ ok: true, checked: events.length, head: prev });
  });

  it("the README's own script says ok for each event, and MISMATCH for an edited one", async () => {
    const readme = readFileSync(path.join(REPO, 'README.md'), 'utf8');
    const at = readme.indexOf('**The audit hash chain**');
    expect(at).to.be.greaterThan(0);
    const open = readme.indexOf("node -e '\n", at) + "node -e '\n".length;
    const script = readme.slice(open, readme.indexOf("\n});'\n", open) + '\n});'.length);
    const run = (input: string) =>
      spawnSync(process.execPath, ['-e', script], { input, encoding: 'utf8', timeout: 30_000 });

    const text = await listed();
    const n = JSON.parse(text).events.length as number;
    const ok = run(text);
    expect(ok.status, ok.stderr).to.equal(0);
    expect(ok.stdout.trim().split('\n')).to.have.length(n);
    expect(ok.stdout).to.not.include('MISMATCH');

    const doc = JSON.parse(text);
    doc.events[1].message = 'edited';
    const bad = run(JSON.stringify(doc));
    expect(bad.stdout.match(/MISMATCH/g)).to.have.length(1);
  });
});
