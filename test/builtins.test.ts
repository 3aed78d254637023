import { expect } from 'chai';
import { onEveryBackend } from './helpers/backends.js';
import { Arbiter, call } from './helpers/harness.js';
import { expectError } from './helpers/expect-error.js';

// Policies are stored and compiled through storage, decisions recorded: every backend.
/**
 * The capabilities boundary: what the compiler admits must be what the evaluator can run.
 * Host builtins (time.*) and the SDK's JS builtins are exercised through the real pipeline; a
 * sample of builtins the evaluator lacks is refused at PUT time, naming the builtin.
 */
onEveryBackend('builtins', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  // Each probe turns a computed value into a deny reason, so the answer shows what was computed.
  const probe = async (expr: string): Promise<string> => {
    const rego = `package authz.agent\n\ndeny contains json.marshal(v) if {\n\tinput.action == "probe"\n\tv := ${expr}\n}\n`;
    const put = await call('PUT', a.platform + '/api/v1/policies/probe', { body: { rego } });
    expect(put.status, put.text).to.be.oneOf([200, 201]);
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: { agent_id: 'deploy-bot', action: 'probe', resource: 'x', confidence: 0.99 },
    });
    expect(r.status, r.text).to.equal(403);
    return r.json.message as string;
  };

  it('time.parse_rfc3339_ns, time.date, time.clock and time.weekday compute OPA values', async () => {
    const t = 'time.parse_rfc3339_ns("2024-02-29T13:14:15.5Z")';
    expect(JSON.parse(await probe(t))).to.equal(1709212455500000000);
    expect(JSON.parse(await probe(`time.date(${t})`))).to.deep.equal([2024, 2, 29]);
    expect(JSON.parse(await probe(`time.clock(${t})`))).to.deep.equal([13, 14, 15]);
    expect(JSON.parse(await probe(`time.weekday(${t})`))).to.equal('Thursday');
    expect(JSON.parse(await probe(`time.clock([${t}, "America/New_York"])`))).to.deep.equal([8, 14, 15]);
  });

  it('time.add_date and time.parse_duration_ns compute OPA values', async () => {
    const t = 'time.parse_rfc3339_ns("2024-01-31T00:00:00Z")';
    // Go's AddDate normalizes: Jan 31 + 1 month = Mar 2 in a leap year.
    expect(JSON.parse(await probe(`time.date(time.add_date(${t}, 0, 1, 0))`))).to.deep.equal([2024, 3, 2]);
    expect(JSON.parse(await probe('time.parse_duration_ns("1h30m")'))).to.equal(5400e9);
    expect(JSON.parse(await probe('time.parse_duration_ns("-1.5s")'))).to.equal(-1.5e9);
  });

  it('time.now_ns is the evaluation time', async () => {
    const before = Date.now();
    const ns = JSON.parse(await probe('time.now_ns()')) as number;
    expect(ns / 1e6).to.be.within(before - 1000, Date.now() + 1000);
  });

  it('runs the SDK builtins (sprintf, regex.split, yaml.*)', async () => {
    expect(JSON.parse(await probe('sprintf("%s-%d", ["a", 7])'))).to.equal('a-7');
    expect(JSON.parse(await probe('regex.split("[,;]", "a,b;c")'))).to.deep.equal(['a', 'b', 'c']);
    expect(JSON.parse(await probe('yaml.unmarshal("a: 1")'))).to.deep.equal({ a: 1 });
  });

  it('fails closed when a host builtin errors at decision time', async () => {
    const rego =
      'package authz.agent\n\ndeny contains "never" if {\n\tinput.action == "probe"\n\ttime.parse_rfc3339_ns(input.context.t) < 0\n}\n\nallow if input.action == "probe"\n';
    expect((await call('PUT', a.platform + '/api/v1/policies/probe', { body: { rego } })).status).to.equal(
      200,
    );
    const r = await call('POST', a.engine + '/v1/agent/authorize', {
      body: {
        agent_id: 'deploy-bot',
        action: 'probe',
        resource: 'x',
        confidence: 0.99,
        context: { t: 'not a time' },
      },
    });
    expect(r.status).to.equal(403);
    expect(r.json.status).to.equal('deny');
    expect(r.json.message).to.match(/evaluation failed/);
  });

  const refused: [string, string][] = [
    ['http.send', 'http.send({"method": "get", "url": "http://example.com"})'],
    ['net.lookup_ip_addr', 'net.lookup_ip_addr("example.com")'],
    ['crypto.sha256', 'crypto.sha256("x")'],
    ['io.jwt.decode', 'io.jwt.decode("a.b.c")'],
    ['opa.runtime', 'opa.runtime()'],
    ['rand.intn', 'rand.intn("x", 10)'],
    ['time.format', 'time.format(0)'],
    ['uuid.rfc4122', 'uuid.rfc4122("x")'],
    ['units.parse', 'units.parse("1K")'],
  ];
  for (const [builtin, call_] of refused) {
    it(`refuses ${builtin} at PUT time, naming it, and changes nothing`, async () => {
      const before = (await call('GET', a.platform + '/api/v1/policies')).json;
      const rego = `package authz.agent\n\ndeny contains "x" if {\n\tv := ${call_}\n\tv == v\n}\n`;
      const r = await call('PUT', a.platform + `/api/v1/policies/refused-${builtin.replace(/\./g, '-')}`, {
        body: { rego },
      });
      expectError(r, 400);
      expect(r.json.error).to.include(builtin);
      expect((await call('GET', a.platform + '/api/v1/policies')).json).to.deep.equal(before);
    });
  }
});
