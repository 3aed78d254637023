import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { onEveryBackend } from './helpers/backends.js';
import { Arbiter, REPO } from './helpers/harness.js';

// The README's walk-through stores decisions, queue items and tokens: every backend.
/** The README's walk-through, run as written against a real instance (only the URLs and key differ). */
onEveryBackend('README walk-through', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start({ ARBITER_ADMIN_KEY: 'dev-admin-key-change-me' });
  });
  after(async () => {
    await a.close();
  });

  it('runs end to end and shows every outcome it promises', () => {
    const readme = readFileSync(path.join(REPO, 'README.md'), 'utf8');
    const start = readme.indexOf('## A five-minute walk-through');
    const open = readme.indexOf('```sh\n', start) + '```sh\n'.length;
    const script = readme.slice(open, readme.indexOf('```\n', open));
    expect(script).to.include('E=http://127.0.0.1:8080; P=http://127.0.0.1:8081');
    const r = spawnSync(
      'bash',
      [
        '-c',
        script.replace('E=http://127.0.0.1:8080; P=http://127.0.0.1:8081', `E=${a.engine}; P=${a.platform}`),
      ],
      {
        cwd: REPO,
        env: { ...a.fullEnv() },
        encoding: 'utf8',
        timeout: 60_000,
      },
    );
    expect(r.status, r.stderr).to.equal(0);
    const out = r.stdout;
    for (const expected of [
      '"status":"ok"',
      '"status":"allow"',
      '"message":"destructive action delete on production resource prod/db"',
      'below the deny threshold',
      '{"error":"confidence out of range: must be between 0.0 and 1.0, got 1.5"}',
      '"status":"approved"',
      '"token_type":"Bearer"',
      '"active":true',
      '"revoked":true',
      '{"active":false}',
      'decision requires_approval deploy-bot',
      'queue.approve approved alice-reviewer',
      'token.mint minted deploy-bot',
      'token.revoke revoked admin',
      '{"ok":true',
      'all production changes are frozen',
      'builtin http.send is not allowed',
      '204',
    ]) {
      expect(out, expected).to.include(expected);
    }
  });
});
