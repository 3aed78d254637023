import { expect } from 'chai';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onEveryBackend } from './helpers/backends.js';
import { AGENT, Arbiter, call, HUMAN, REPO } from './helpers/harness.js';

// Compiled policy sets are stored and loaded back: every backend.
onEveryBackend('the authorize path', () => {
  let a: Arbiter;
  let dir: string;
  let invocations: string;
  before(async () => {
    // An OPA "binary" that records each time it is run, then runs the real one.
    dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-opa-spy-'));
    invocations = path.join(dir, 'invocations.log');
    const spy = path.join(dir, 'opa');
    writeFileSync(
      spy,
      `#!/bin/sh\necho "$1" >> '${invocations}'\nexec '${path.join(REPO, '.opa-bin', 'opa')}' "$@"\n`,
    );
    chmodSync(spy, 0o755);
    a = await Arbiter.start({ ARBITER_OPA_BIN: spy });
  });
  after(async () => {
    await a.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const runs = () => readFileSync(invocations, 'utf8').trim().split('\n');

  it('compiles with the OPA CLI at start-up only, never per decision', async () => {
    const atStart = runs();
    expect(atStart).to.include('build');
    for (let i = 0; i < 50; i++) {
      const bodies = [AGENT.allow, AGENT.approval, AGENT.deny];
      const r = await call('POST', a.engine + '/v1/agent/authorize', { body: bodies[i % 3] });
      expect(r.status).to.be.oneOf([200, 202, 403]);
      const h = await call('POST', a.engine + '/v1/authorize', { body: HUMAN.allow });
      expect(h.status).to.equal(200);
    }
    expect(runs()).to.deep.equal(atStart);
  });

  it('runs the compiler again only when a policy changes', async () => {
    const before = runs().length;
    const put = await call('PUT', a.platform + '/api/v1/policies/extra', {
      body: {
        rego: 'package authz.agent\n\ndeny contains "no reading secrets" if input.resource == "repo/secrets"\n',
      },
    });
    expect(put.status).to.equal(201);
    const after = runs();
    expect(after.length).to.be.greaterThan(before);
    expect(after.slice(before)).to.include('build');
    await call('POST', a.engine + '/v1/agent/authorize', { body: AGENT.allow });
    expect(runs().length).to.equal(after.length);
  });
});
