import Database from 'better-sqlite3';
import { expect } from 'chai';
import { existsSync, mkdirSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import path from 'node:path';
import { chromium, type Browser, type BrowserContext, type Locator, type Page } from 'playwright-core';
import { onceOnly } from './helpers/backends.js';
import { expectError } from './helpers/expect-error.js';
import { AGENT, Arbiter, call, HUMAN, REPO } from './helpers/harness.js';
import { seedId, seedItems } from './helpers/queue-seed.js';

/** Debian's Chromium (`.ci/run` installs it); ARBITER_TEST_CHROMIUM points elsewhere. */
const CHROMIUM = process.env.ARBITER_TEST_CHROMIUM ?? '/usr/bin/chromium';
/** Screenshots of every step worth looking at (git-ignored). */
const SHOTS = path.join(REPO, 'test-results', 'console');

/** A GET with the path sent exactly as written: fetch() would resolve `..` before sending. */
function rawGet(
  base: string,
  rawPath: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, unknown>; text: string }> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: rawPath, method: 'GET', headers },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** The script and style sheet the page loads (their names carry a content hash). */
function assetsOf(html: string): { script: string; style: string } {
  const script = /<script type="module" src="([^"]+)"><\/script>/.exec(html)?.[1];
  const style = /<link rel="stylesheet" href="([^"]+)"/.exec(html)?.[1];
  expect(script, html).to.be.a('string');
  expect(style, html).to.be.a('string');
  return { script: script as string, style: style as string };
}

// The console is static files and a browser driving the same HTTP API the other suites check on
// every backend: nothing here depends on storage, so once (on the SQLite run) is enough.
onceOnly('reviewer console: how it is served', () => {
  let a: Arbiter;
  before(async () => {
    a = await Arbiter.start();
  });
  after(async () => {
    await a.close();
  });

  it('serves the page publicly with a strict CSP, nosniff, no referrer and no framing', async () => {
    const r = await call('GET', `${a.engine}/console/`, { key: null });
    expect(r.status).to.equal(200);
    expect(r.headers.get('content-type')).to.equal('text/html; charset=utf-8');
    const csp = r.headers.get('content-security-policy') ?? '';
    expect(csp).to.match(/(^|; )default-src 'self'(;|$)/);
    expect(csp).to.match(/frame-ancestors 'none'/);
    expect(csp).to.match(/base-uri 'none'/);
    expect(csp).to.match(/object-src 'none'/);
    expect(csp).to.not.match(/unsafe-inline|unsafe-eval|\*|http:|https:|data:/);
    expect(r.headers.get('x-content-type-options')).to.equal('nosniff');
    expect(r.headers.get('referrer-policy')).to.equal('no-referrer');
    expect(r.headers.get('cache-control')).to.equal('no-cache');
    expect(r.headers.get('x-request-id')).to.be.a('string');
    // Nothing inline for the CSP to refuse: every script and style comes from a file.
    expect(r.text).to.not.match(/<script(?![^>]*\ssrc=)[^>]*>/);
    expect(r.text).to.not.match(/<style|\sstyle=|\son[a-z]+=/i);
    expect(r.text).to.not.match(/https?:\/\//);
  });

  it('redirects /console to /console/', async () => {
    const r = await rawGet(a.engine, '/console');
    expect(r.status).to.equal(308);
    expect(r.headers.location).to.equal('/console/');
  });

  it('serves the hashed script and style sheet with their types, cached as immutable, 304 when unchanged', async () => {
    const page = await call('GET', `${a.engine}/console/`, { key: null });
    const { script, style } = assetsOf(page.text);
    expect(script).to.match(/^app-[A-Z0-9]{8}\.js$/);
    expect(style).to.match(/^app-[A-Z0-9]{8}\.css$/);
    const js = await call('GET', `${a.engine}/console/${script}`, { key: null });
    expect(js.status).to.equal(200);
    expect(js.headers.get('content-type')).to.equal('text/javascript; charset=utf-8');
    expect(js.headers.get('cache-control')).to.equal('public, max-age=31536000, immutable');
    expect(js.headers.get('content-security-policy')).to.match(/default-src 'self'/);
    expect(js.headers.get('x-content-type-options')).to.equal('nosniff');
    const css = await call('GET', `${a.engine}/console/${style}`, { key: null });
    expect(css.headers.get('content-type')).to.equal('text/css; charset=utf-8');
    const icon = await call('GET', `${a.engine}/console/favicon.svg`, { key: null });
    expect(icon.headers.get('content-type')).to.equal('image/svg+xml');
    // (fetch() would add Cache-Control: no-cache to a conditional request, which forbids a 304.)
    const etag = js.headers.get('etag') as string;
    const again = await rawGet(a.engine, `/console/${script}`, { 'if-none-match': etag });
    expect(again.status).to.equal(304);
    expect(again.text).to.equal('');
  });

  it('ignores a query string on the page and its files (a shared link, a cache buster); the API does not', async () => {
    const plain = await call('GET', `${a.engine}/console/`, { key: null });
    const { script } = assetsOf(plain.text);
    const page = await call('GET', `${a.engine}/console/?utm_source=slack&utm_source=x&q=%FF`, { key: null });
    expect(page.status, page.text).to.equal(200);
    expect(page.text).to.equal(plain.text);
    const js = await call('GET', `${a.engine}/console/${script}?v=1`, { key: null });
    expect(js.status, js.text).to.equal(200);
    expect(js.headers.get('content-type')).to.equal('text/javascript; charset=utf-8');
    const redirect = await rawGet(a.engine, '/console?utm_source=slack');
    expect(redirect.status).to.equal(308);
    expect(redirect.headers.location).to.equal('/console/');
    // An unknown file is still 404, and the API keeps refusing parameters it does not take.
    expectError(await call('GET', `${a.engine}/console/nope.js?v=1`, { key: null }), 404);
    expectError(await call('GET', `${a.engine}/v1/queue?utm_source=slack`), 400, /utm_source/);
  });

  it('answers 404 {"error"} with X-Request-Id and the CSP for an unknown file', async () => {
    for (const p of [
      '/console/nope.js',
      '/console/app.js',
      '/console/index.html',
      '/console/.env',
      '/console/a/b.js',
    ]) {
      const r = await call('GET', a.engine + p, { key: null });
      expectError(r, 404);
      expect(r.headers.get('x-request-id'), p).to.be.a('string');
      expect(r.headers.get('content-security-policy'), p).to.match(/default-src 'self'/);
    }
  });

  it('never reaches outside the console directory, however the path is spelled', async () => {
    const attempts = [
      '/console/../package.json',
      '/console/../../package.json',
      '/console/..%2fpackage.json',
      '/console/..%2F..%2Fpackage.json',
      '/console/%2e%2e/package.json',
      '/console/%2e%2e%2fpackage.json',
      '/console/%252e%252e%252fpackage.json',
      '/console/..%5cpackage.json',
      '/console/..\\package.json',
      '/console/....//package.json',
      '/console//etc/passwd',
      '/console/%2fetc%2fpasswd',
      '/console/..%00/package.json',
      '/console/index.html%00.js',
      '/console/%c0%ae%c0%ae/package.json',
      '/console/../src/main.ts',
      '/console/../dist/src/main.js',
      '/console/./index.html',
    ];
    for (const p of attempts) {
      const r = await rawGet(a.engine, p);
      expect([400, 404], `${p}: ${r.status} ${r.text.slice(0, 80)}`).to.include(r.status);
      expect(JSON.parse(r.text), p).to.have.keys('error');
      expect(r.text, p).to.not.include('"name": "arbiter"');
      expect(r.headers['x-request-id'], p).to.be.a('string');
    }
  });

  it('answers 405 with Allow for other methods, and is not served by the Platform API', async () => {
    const r = await call('POST', `${a.engine}/console/`, { key: null, body: {} });
    expectError(r, 405);
    expect(r.headers.get('allow')).to.match(/GET/);
    expectError(await call('GET', `${a.platform}/console/`, { key: null }), 404);
  });

  it('is counted in /metrics under bounded route labels, never by file name', async () => {
    await call('GET', `${a.engine}/console/`, { key: null });
    await call('GET', `${a.engine}/console/no-such-file-${Date.now()}.js`, { key: null });
    const m = await call('GET', `${a.engine}/metrics`);
    expect(m.text).to.match(
      /arbiter_http_requests_total\{api="engine",route="\/console\/",method="GET",status="200"\}/,
    );
    expect(m.text).to.match(/route="\/console\/\{asset\}",method="GET",status="404"/);
    expect(m.text).to.not.match(/no-such-file/);
  });
});

onceOnly('reviewer console in Chromium', function () {
  this.timeout(90_000);
  let a: Arbiter;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  /** Console messages and CSP violations seen by the current page. */
  let violations: string[];
  let agentKey: string;
  let reviewer: string;
  let reviewer2: string;
  let reader: string;
  let acmeReviewer: string;

  before(async function () {
    if (!existsSync(CHROMIUM)) {
      throw new Error(
        `Chromium not found at ${CHROMIUM}: apt-get install chromium (or set ARBITER_TEST_CHROMIUM)`,
      );
    }
    mkdirSync(SHOTS, { recursive: true });
    a = await Arbiter.start();
    agentKey = a.createKey('deploy-bot-key', ['authorize', 'queue:read']);
    reviewer = a.createKey('alice-reviewer', ['queue:read', 'queue:review']);
    reviewer2 = a.createKey('bob-reviewer', ['queue:read', 'queue:review']);
    reader = a.createKey('auditor', ['queue:read']);
    acmeReviewer = a.createKey('acme-reviewer', ['queue:read', 'queue:review'], { tenant: 'acme' });
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-quic',
        '--no-first-run',
      ],
    });
  });
  after(async () => {
    await browser?.close();
    await a?.close();
  });

  beforeEach(async () => {
    // A fresh context per test: its own sessionStorage, localStorage and cookies.
    context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
    violations = [];
    page.on('console', (m) => {
      if (/Content[- ]Security[- ]Policy/i.test(m.text())) violations.push(m.text());
    });
    page.on('pageerror', (e) => violations.push(`page error: ${e.message}`));
    // Runs before the page's own scripts (and is not itself subject to the page's CSP).
    await page.addInitScript(`document.addEventListener('securitypolicyviolation', (e) =>
      console.error('Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI));`);
  });
  afterEach(async function () {
    const title = this.currentTest?.title ?? 'test';
    await page
      .screenshot({ path: path.join(SHOTS, `last-${title.replace(/[^a-z0-9]+/gi, '-').slice(0, 60)}.png`) })
      .catch(() => undefined);
    await context.close();
    expect(violations, 'CSP violations or page errors').to.deep.equal([]);
  });

  const shot = (name: string) => page.screenshot({ path: path.join(SHOTS, `${name}.png`) });

  async function signIn(key: string): Promise<void> {
    await page.goto(`${a.engine}/console/`);
    await page.getByLabel('API key').fill(key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Pending requests' }).waitFor();
  }

  async function ask(body: Record<string, unknown>): Promise<string> {
    const human = 'user_id' in body;
    const r = await call('POST', a.engine + (human ? '/v1/authorize' : '/v1/agent/authorize'), {
      key: agentKey,
      body,
    });
    expect(r.status, r.text).to.equal(202);
    return r.json.request_id as string;
  }

  /**
   * Rewrites a stored queue item behind the running service (SQLite; these tests run on it): a row
   * as an older version stored it, or a value no example policy queues.
   */
  function restore(id: string, fields: { resource?: string; action?: string; message?: string }): void {
    const db = new Database(path.join(a.dataDir, 'arbiter.db'), { fileMustExist: true, timeout: 5000 });
    try {
      for (const [column, value] of Object.entries(fields)) {
        const stored = column === 'resource' ? JSON.stringify(value) : value;
        db.prepare(`UPDATE queue_items SET ${column} = ? WHERE id = ?`).run(stored, id);
      }
    } finally {
      db.close();
    }
  }

  const link = (id: string) => page.getByRole('link', { name: `Request ${id}` });
  const rowOf = (id: string): Locator => page.getByRole('row').filter({ has: link(id) });

  async function openItem(id: string): Promise<void> {
    await link(id).click();
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
  }

  async function item(id: string) {
    return (await call('GET', `${a.engine}/v1/queue/${id}`)).json as Record<string, unknown>;
  }

  /**
   * The focused element as its role, accessible name and states (`button "Denied" [pressed]`),
   * from its ARIA snapshot without its content or value; null when the body has the focus.
   */
  async function focused(): Promise<string | null> {
    const target = page.locator('*:focus');
    if ((await target.count()) === 0) return null;
    const line = (await target.ariaSnapshot()).split('\n')[0] as string;
    return /^- (\w+(?: "(?:[^"\\]|\\.)*")?(?: \[[^\]]*\])*)/.exec(line)?.[1] ?? line;
  }

  /** Waits (up to 3 s) for `target` to hold the keyboard focus: a view moves it once it has drawn. */
  async function expectFocusOn(target: Locator, what: string): Promise<void> {
    for (let waited = 0; waited < 3000; waited += 50) {
      if ((await target.and(page.locator(':focus')).count()) === 1) return;
      await page.waitForTimeout(50);
    }
    expect.fail(`${what}: the focus is on ${(await focused()) ?? 'the page body'}`);
  }

  /**
   * True when the focused element's focus ring can be seen all round: in each 3 px band just
   * outside its box (where the ring is drawn; bands off the window aside), some pixels change
   * between focused and not. A ring clipped by a parent leaves the bands on that side as they were.
   */
  async function ringVisible(): Promise<boolean> {
    const target = page.locator('*:focus');
    const box = (await target.boundingBox())!;
    const view = page.viewportSize()!;
    const bands = [
      { x: box.x - 4, y: box.y - 4, width: box.width + 8, height: 3 },
      { x: box.x - 4, y: box.y + box.height + 1, width: box.width + 8, height: 3 },
      { x: box.x - 4, y: box.y, width: 3, height: box.height },
      { x: box.x + box.width + 1, y: box.y, width: 3, height: box.height },
    ].filter((b) => b.x >= 0 && b.y >= 0 && b.x + b.width <= view.width && b.y + b.height <= view.height);
    const shoot = () => Promise.all(bands.map((clip) => page.screenshot({ clip })));
    const on = await shoot();
    const handle = await target.elementHandle();
    await page.evaluate('document.activeElement.blur()');
    const off = await shoot();
    await handle!.focus();
    return on.every((shot, i) => !shot.equals(off[i]!));
  }

  /** Asks for and denies `n` requests (History shows 50 a page). */
  async function decideMany(n: number, prefix: string): Promise<void> {
    for (let i = 0; i < n; i++) {
      const id = await ask({ ...AGENT.approval, resource: `${prefix}-${i}` });
      const r = await call('POST', `${a.engine}/v1/queue/${id}/deny`, { key: reviewer2 });
      expect(r.status, r.text).to.equal(200);
    }
  }

  /**
   * How many pixels of a screenshot stand out (3:1 or more) from its commonest colour: the strokes
   * of a readable label. Decoded in a blank page of the same browser (the console's CSP rightly
   * refuses data: images).
   */
  async function contrastingPixels(png: Buffer): Promise<number> {
    const blank = await context.newPage();
    try {
      return (await blank.evaluate(`(async () => {
        const bytes = Uint8Array.from(atob('${png.toString('base64')}'), (c) => c.charCodeAt(0));
        const bitmap = await createImageBitmap(new Blob([bytes], { type: 'image/png' }));
        const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
        const g = canvas.getContext('2d');
        g.drawImage(bitmap, 0, 0);
        const d = g.getImageData(0, 0, bitmap.width, bitmap.height).data;
        const lum = (i) => [0.2126, 0.7152, 0.0722].reduce((sum, w, k) => {
          const c = d[i + k] / 255;
          return sum + w * (c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
        }, 0);
        const counts = new Map();
        for (let i = 0; i < d.length; i += 4) {
          const key = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
          counts.set(key, (counts.get(key) ?? 0) + 1);
        }
        const common = [...counts.entries()].sort((x, y) => y[1] - x[1])[0][0];
        const base = lum([...d.keys()].find((i) => i % 4 === 0 && ((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]) === common));
        let n = 0;
        for (let i = 0; i < d.length; i += 4) {
          const l = lum(i);
          if ((Math.max(l, base) + 0.05) / (Math.min(l, base) + 0.05) >= 3) n++;
        }
        return n;
      })()`)) as number;
    } finally {
      await blank.close();
    }
  }

  /** What covers the focused element's first few pixels, when that is not the element itself. */
  const coveredBy = `(() => {
    const el = document.activeElement;
    const r = el.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + Math.min(r.width / 2, 10), r.top + Math.min(r.height / 2, 8));
    return hit !== null && (el.contains(hit) || hit.contains(el)) ? null : String(hit && hit.className);
  })()`;

  it('refuses a wrong key with the server’s message and stores nothing', async () => {
    await page.goto(`${a.engine}/console/`);
    await page.getByLabel('API key').fill('arb_this-is-not-a-key');
    await page.getByRole('button', { name: 'Sign in' }).click();
    const alert = page.getByRole('alert').filter({ hasText: 'invalid or revoked API key' });
    await alert.waitFor();
    await shot('signin-error');
    expect(await page.evaluate('sessionStorage.length')).to.equal(0);
    expect(await page.evaluate('localStorage.length')).to.equal(0);
    expect(await page.getByRole('heading', { name: 'Pending requests' }).count()).to.equal(0);
  });

  it('refuses a key without queue:read', async () => {
    await page.goto(`${a.engine}/console/`);
    const noQueue = a.createKey('token-only', ['tokens:mint']);
    await page.getByLabel('API key').fill(noQueue);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').filter({ hasText: 'API key lacks scope queue:read' }).waitFor();
    expect(await page.evaluate('sessionStorage.length')).to.equal(0);
  });

  it('signs in with the key in sessionStorage only (no localStorage, cookie or URL) and signs out', async () => {
    await signIn(reviewer);
    expect(await page.evaluate('Object.values(sessionStorage)')).to.deep.equal([reviewer]);
    expect(await page.evaluate('localStorage.length')).to.equal(0);
    expect(await context.cookies()).to.deep.equal([]);
    expect(page.url()).to.not.include(reviewer);
    await page.getByText('alice-reviewer').first().waitFor();
    await page.getByText('all tenants').waitFor();
    // A reload keeps the session (same tab); signing out forgets the key.
    await page.reload();
    await page.getByRole('heading', { name: 'Pending requests' }).waitFor();
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('API key').waitFor();
    expect(await page.evaluate('sessionStorage.length')).to.equal(0);
  });

  it('shows a new request within 2 s without a reload, with its fields and a ticking time left', async () => {
    await signIn(reviewer);
    let navigations = 0;
    page.on('framenavigated', (f) => {
      if (f === page.mainFrame()) navigations++;
    });
    const asked = Date.now();
    const id = await ask({ ...AGENT.approval, context: { ticket: 'CHG-2001' } });
    await rowOf(id).waitFor({ timeout: 2000 });
    expect(Date.now() - asked).to.be.below(2000);
    // Marked as new for a few seconds, in words as well as by a tint.
    await rowOf(id).getByRole('cell').first().filter({ hasText: /New$/ }).waitFor({ timeout: 2000 });
    expect(navigations).to.equal(0);
    const cells = await rowOf(id).getByRole('cell').allInnerTexts();
    expect(cells.join(' | ')).to.match(/deploy-bot/);
    expect(cells).to.include.members([
      'deploy',
      'prod/api',
      '0.95',
      'deploy to production requires approval',
    ]);
    const left = rowOf(id).locator('time.time-left');
    const first = await left.innerText();
    expect(first).to.match(/^\d+:\d\d$/);
    // It ticks every second; a loaded machine may render a tick late, so allow a few.
    let now = first;
    for (let waited = 0; now === first && waited < 5000; waited += 250) {
      await page.waitForTimeout(250);
      now = await left.innerText();
    }
    expect(now, 'time left counts down').to.not.equal(first);
    expect(now).to.match(/^\d+:\d\d$/);
    // A screen reader hears it in words, not "59 colon 57".
    const heard = await rowOf(id)
      .getByRole('cell')
      .filter({ has: page.locator('time.time-left') })
      .ariaSnapshot();
    expect(heard).to.match(/\d+ minutes? \d+ seconds?/);
    expect(heard).not.to.match(/\b\d+:\d\d\b/);
    await shot('pending-new-item');
    // Another one arrives while the page stays as it is.
    const second = await ask({ ...AGENT.approval, resource: 'prod/billing' });
    await rowOf(second).waitFor({ timeout: 2000 });
    expect(navigations).to.equal(0);
  });

  it('opens an item by keyboard: context, policy reasons, time left, audit trail, Note, Approve and Deny', async () => {
    const id = await ask({
      ...AGENT.approval,
      context: { ticket: 'CHG-2002', change: { window: 'tonight' } },
    });
    await signIn(reviewer);
    await rowOf(id).waitFor();
    // There before the list was first read: not marked as new.
    expect(await rowOf(id).getByText('New', { exact: true }).count()).to.equal(0);
    await link(id).focus();
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
    await page.getByRole('heading', { name: 'Context' }).waitFor();
    const context = await page.getByLabel('Context as JSON').innerText();
    expect(JSON.parse(context)).to.deep.equal({ ticket: 'CHG-2002', change: { window: 'tonight' } });
    await page.getByRole('heading', { name: 'Policy reasons' }).waitFor();
    await page
      .getByRole('listitem')
      .filter({ hasText: 'deploy to production requires approval' })
      .first()
      .waitFor();
    await page.getByText('Policy decision').first().waitFor();
    await page.getByText(/asked by\s+deploy-bot-key/).waitFor();
    expect(await page.getByText(id, { exact: true }).count()).to.be.greaterThan(0);
    await page
      .getByText(/Time left/)
      .first()
      .waitFor();
    await page.getByRole('textbox', { name: 'Note' }).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).isEnabled()).to.equal(true);
    expect(await page.getByRole('button', { name: 'Deny' }).isEnabled()).to.equal(true);
    await shot('item-view');
  });

  it('names the user an agent acts for (on_behalf_of) in the pending list and the item', async () => {
    const id = await ask({
      ...AGENT.approval,
      resource: 'prod/delegated',
      on_behalf_of: { tenant_id: 'acme', user_id: 'alice' },
    });
    const own = await ask({ ...AGENT.approval, resource: 'prod/own' });
    await signIn(reviewer);
    const subject = rowOf(id).locator('td.cell-subject');
    await subject.waitFor();
    expect((await subject.innerText()).replace(/\s+/g, ' ')).to.match(/deploy-bot for user alice$/i);
    await rowOf(own).waitFor();
    expect(await rowOf(own).locator('td.cell-subject').innerText()).to.not.match(/for user/i);
    await shot('pending-on-behalf-of');
    await openItem(id);
    const request = page.getByRole('region', { name: 'Request', exact: true });
    const fields = (await request.innerText()).replace(/\s+/g, ' ');
    expect(fields).to.match(/On behalf of user alice of tenant acme/);
    expect((await page.locator('.item-sub').innerText()).replace(/\s+/g, ' ')).to.match(
      /deploy-bot for user alice/i,
    );
    await shot('item-on-behalf-of');
    await page.goto(`${a.engine}/console/#/item/${own}`);
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
    await page.getByRole('heading', { name: /prod\/own/ }).waitFor();
    expect(await request.innerText()).to.not.match(/On behalf of/);
  });

  it('shows an AuthZEN request’s subject, action and resource properties; a native request has no such panel', async () => {
    const evaluation = {
      subject: { type: 'agent', id: 'deploy-bot', properties: { confidence: 0.95, team: 'payments' } },
      action: { name: 'deploy', properties: { amount: 1_000_000 } },
      resource: { type: 'prod', id: 'api', properties: { region: 'eu' } },
    };
    const r = await call('POST', `${a.engine}/access/v1/evaluation`, { key: agentKey, body: evaluation });
    expect(r.status, r.text).to.equal(200);
    expect(r.json.context.status).to.equal('requires_approval');
    const id = r.json.context.request_id as string;
    const native = await ask(AGENT.approval);
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('heading', { name: 'AuthZEN request' }).waitFor();
    const shown = await page.getByLabel('AuthZEN request as JSON').innerText();
    expect(JSON.parse(shown)).to.deep.equal({ ...evaluation, context: {} });
    await shot('item-view-authzen');
    await page.getByRole('link', { name: /Pending requests/ }).click();
    await openItem(native);
    await page.getByRole('heading', { name: 'Context' }).waitFor();
    expect(await page.getByRole('heading', { name: 'AuthZEN request' }).count()).to.equal(0);
  });

  it('opens a link to an item (#/item/<id>) once the reviewer has signed in', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/deep-link' });
    await page.goto(`${a.engine}/console/#/item/${id}`);
    await page.getByLabel('API key').fill(reviewer);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
    await page.getByRole('heading', { name: /deploy\s+on\s+prod\/deep-link/ }).waitFor();
  });

  it('shows a link that names no view, or an id that does not decode, as not found with a way back', async () => {
    await signIn(reviewer);
    for (const hash of ['#/item/%E0%A4%A', '#/item/%', '#/nowhere']) {
      // Opened afresh, as a link from elsewhere would be (the key is still in this tab).
      await page.goto('about:blank');
      await page.goto(`${a.engine}/console/${hash}`);
      await page.getByRole('heading', { name: 'Page not found' }).waitFor();
      expect(await page.locator('main').textContent()).to.include(hash);
    }
    await shot('not-found');
    await page
      .getByRole('main')
      .getByRole('link', { name: /Pending requests/ })
      .click();
    await page.getByRole('heading', { name: 'Pending requests' }).waitFor();
    // The same from within the page (a hash change, no load).
    await page.evaluate(`location.hash = '#/item/%E0%A4%A'`);
    await page.getByRole('heading', { name: 'Page not found' }).waitFor();
  });

  it('skips to the content without leaving the view it is on', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/skip' });
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('link', { name: 'Skip to content' }).focus();
    await page.keyboard.press('Enter');
    expect(await page.evaluate('document.activeElement.id')).to.equal('main');
    await page.waitForTimeout(100);
    await page.getByRole('heading', { name: /deploy\s+on\s+prod\/skip/ }).waitFor({ timeout: 500 });
  });

  it('approves with a note: the item leaves the pending list and the API shows who and why', async () => {
    const id = await ask(AGENT.approval);
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('textbox', { name: 'Note' }).fill('change ticket CHG-3001 checked');
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.getByRole('status').filter({ hasText: 'Approved as alice-reviewer' }).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    await page.getByRole('listitem').filter({ hasText: 'change ticket CHG-3001 checked' }).waitFor();
    await shot('item-approved');
    expect(await item(id)).to.include({
      status: 'approved',
      decided_by: 'alice-reviewer',
      note: 'change ticket CHG-3001 checked',
    });
    await page
      .getByRole('link', { name: /Pending/ })
      .first()
      .click();
    await page.getByRole('heading', { name: 'Pending requests' }).waitFor();
    await page.getByText(/requests? waiting/).waitFor();
    expect(await rowOf(id).count()).to.equal(0);
  });

  it('denies with a note: the item leaves the pending list and the API shows who and why', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/payments' });
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('textbox', { name: 'Note' }).fill('no change ticket');
    await page.getByRole('button', { name: 'Deny' }).click();
    await page.getByRole('status').filter({ hasText: 'Denied as alice-reviewer' }).waitFor();
    expect(await item(id)).to.include({
      status: 'denied',
      decided_by: 'alice-reviewer',
      note: 'no change ticket',
    });
    await page.goBack();
    await page.getByRole('heading', { name: 'Pending requests' }).waitFor();
    await page.waitForTimeout(1200); // at least one more poll
    expect(await rowOf(id).count()).to.equal(0);
  });

  it('says who decided first when another reviewer was quicker (409)', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/search' });
    // The open item waits on the queue and would show the other decision before the click; held
    // here, that wait stands for the moment between the other decision and its answer.
    await page.route(/\/v1\/queue\/[^/?]+\?wait=/, () => undefined);
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('textbox', { name: 'Note' }).fill('looks wrong to me');
    const first = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
      key: reviewer2,
      body: { note: 'approved on the phone with the owner' },
    });
    expect(first.status).to.equal(200);
    await page.getByRole('button', { name: 'Deny' }).click();
    const alert = page.getByRole('alert').filter({ hasText: 'Already approved by bob-reviewer' });
    await alert.waitFor();
    const text = await alert.innerText();
    expect(text).to.include('approved on the phone with the owner');
    expect(text).to.include('Your denial was not recorded');
    expect(text).to.include('Your note was not sent; here it is to copy: “looks wrong to me”');
    expect(await page.getByRole('button', { name: 'Deny' }).count()).to.equal(0);
    await shot('item-conflict');
    expect(await item(id)).to.include({ status: 'approved', decided_by: 'bob-reviewer' });
  });

  it('shows at once that another reviewer decided the open item, and takes its buttons away', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/meanwhile' });
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('textbox', { name: 'Note' }).fill('half-written note');
    const r = await call('POST', `${a.engine}/v1/queue/${id}/deny`, {
      key: reviewer2,
      body: { note: 'rolled back already' },
    });
    expect(r.status, r.text).to.equal(200);
    // No click, no reload: the open item follows the queue.
    await page
      .getByRole('alert')
      .filter({ hasText: /While you had this request open,\s+bob-reviewer\s+denied it/ })
      .waitFor();
    await page.getByRole('alert').filter({ hasText: 'rolled back already' }).waitFor();
    // The reviewer's own half-written note is not lost with the form: it is shown, to copy.
    await page
      .getByRole('alert')
      .filter({ hasText: /Your note was not sent; here it is to copy: “half-written note”/ })
      .waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    expect(await page.getByRole('button', { name: 'Deny' }).count()).to.equal(0);
    await page.locator('.item-head .badge', { hasText: 'Denied' }).waitFor();
    await shot('item-decided-meanwhile');
  });

  it('pauses between waits on the open item that come back pending at once (a server shutting down)', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/early-answers' });
    // Every wait answered at once, still pending, as a server that is stopping answers them.
    let waits = 0;
    await page.route(/\/v1\/queue\/[^/?]+\?wait=/, (route) => {
      waits++;
      void route.continue({
        url: route
          .request()
          .url()
          .replace(/wait=\d+/, 'wait=0'),
      });
    });
    await signIn(reviewer);
    await openItem(id);
    await page.getByRole('button', { name: 'Approve' }).waitFor();
    const from = waits;
    await page.waitForTimeout(2000);
    // One pause of 3 s between such answers: at most a wait or two in 2 s, not one per round trip.
    expect(waits - from).to.be.at.most(2);
    expect(await item(id)).to.include({ status: 'pending' });
  });

  it('keeps the reasons and the trail it read when a decision fails and the server is gone', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/outage' });
    await signIn(reviewer);
    await openItem(id);
    const reasons = page.getByRole('region', { name: 'Policy reasons' });
    await reasons
      .getByRole('listitem')
      .filter({ hasText: 'deploy to production requires approval' })
      .waitFor();
    await page.getByText('Policy decision').first().waitFor();
    // The server goes away: the decision and the re-read of the trail after it both fail.
    await page.route(/\/v1\/queue\//, (route) => route.abort('connectionrefused'));
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.getByRole('alert').filter({ hasText: 'cannot reach the Arbiter server' }).waitFor();
    await page.getByText(/Cannot refresh the audit trail: cannot reach the Arbiter server/).waitFor();
    expect(await reasons.getByRole('listitem').allInnerTexts()).to.deep.equal([
      'deploy to production requires approval',
    ]);
    expect(await reasons.getByText('No reasons were recorded').count()).to.equal(0);
    expect(await page.getByText('Policy decision').count()).to.equal(1);
    expect(await page.getByText('No audit events found').count()).to.equal(0);
    await shot('item-server-gone');
    await page.unroute(/\/v1\/queue\//);
    expect((await item(id)).status).to.equal('pending');
    // Back again: the view waits on the item once more, so a decision made meanwhile shows.
    const r = await call('POST', `${a.engine}/v1/queue/${id}/approve`, { key: reviewer2 });
    expect(r.status, r.text).to.equal(200);
    await page
      .getByRole('alert')
      .filter({ hasText: /bob-reviewer\s+approved it/ })
      .waitFor();
  });

  it('History lists decided items with status, decider and note, filters by status and loads more', async () => {
    // More decided items than one page holds (50).
    const approved: string[] = [];
    for (let i = 0; i < 52; i++) {
      const id = await ask({ ...AGENT.approval, resource: `prod/svc-${i}` });
      const r = await call('POST', `${a.engine}/v1/queue/${id}/approve`, {
        key: reviewer2,
        body: { note: `batch ${i}` },
      });
      expect(r.status).to.equal(200);
      approved.push(id);
    }
    const denied = await ask({ ...AGENT.approval, resource: 'prod/ledger' });
    await call('POST', `${a.engine}/v1/queue/${denied}/deny`, {
      key: reviewer,
      body: { note: 'ledger is frozen' },
    });

    await signIn(reader);
    await page.getByRole('link', { name: 'History' }).click();
    await page.getByRole('heading', { name: 'History' }).waitFor();
    const deniedRow = rowOf(denied);
    await deniedRow.waitFor();
    const cells = await deniedRow.getByRole('cell').allInnerTexts();
    expect(cells).to.include.members(['Denied', 'alice-reviewer', 'ledger is frozen']);
    await rowOf(approved[51]!).waitFor();
    expect((await rowOf(approved[51]!).getByRole('cell').allInnerTexts()).join('|')).to.match(
      /Approved\|.*bob-reviewer\|batch 51/,
    );
    await shot('history');
    // The oldest of the batch is on a later page.
    expect(await rowOf(approved[0]!).count()).to.equal(0);
    await page.getByRole('button', { name: 'Load more' }).click();
    await rowOf(approved[0]!).waitFor();
    // Filtered to denied items only.
    await page.getByRole('button', { name: 'Denied' }).click();
    await page.getByRole('button', { name: 'Denied' }).and(page.locator('[aria-pressed="true"]')).waitFor();
    await deniedRow.waitFor();
    await page.waitForTimeout(300);
    expect(await rowOf(approved[51]!).count()).to.equal(0);
  });

  it('History reads on past empty pages, which a bounded server page may be, and says when it stops', async () => {
    // initech: 25 000 denials and two approvals, one among the newest 2 500, one among the oldest.
    // A tenant-bound key's Approved page examines 2 000 of its tenant's items (QUEUE_EXAMINE):
    // most pages come back empty, with a next_cursor.
    const seed = { tenant: 'initech', agent: 'initech-bot', action: "'op'" };
    await seedItems(a, { ...seed, prefix: 'qi', upTo: 25_000, where: 'i >= 1', status: "'denied'" });
    await seedItems(a, {
      ...seed,
      prefix: 'qj',
      upTo: 22_500,
      where: 'i IN (100, 22500)',
      status: "'approved'",
    });
    const key = a.createKey('initech-reviewer', ['queue:read', 'queue:review'], { tenant: 'initech' });
    let asked = 0;
    page.on('request', (r) => {
      if (/\/v1\/queue\?.*status=approved(&|$)/.test(r.url())) asked++;
    });
    const pager = page.getByRole('status').filter({ hasText: /shown/ });
    await signIn(key);
    await page.getByRole('link', { name: 'History' }).click();
    await pager.filter({ hasText: '50 shown, more available' }).waitFor();
    await page.getByRole('button', { name: 'Approved' }).click();
    // The first page examined only denials: the console read the next, which had the approval.
    await rowOf(seedId('qj', 22_500)).waitFor();
    await pager.filter({ hasText: '1 shown, more available' }).waitFor();
    expect(asked).to.equal(2);
    // Ten empty pages: it stops, says so, and Load more reads on from there.
    asked = 0;
    await page.getByRole('button', { name: 'Load more' }).click();
    await pager
      .filter({
        hasText: '1 shown; 10 more pages searched without a match. Load more searches further back.',
      })
      .waitFor();
    expect(asked).to.equal(10);
    await shot('history-searched');
    asked = 0;
    await page.getByRole('button', { name: 'Load more' }).click();
    await rowOf(seedId('qj', 100)).waitFor();
    await pager.filter({ hasText: /^2 shown$/ }).waitFor();
    expect(asked).to.equal(1);
    expect(await page.getByRole('button', { name: 'Load more' }).count()).to.equal(0);
    const shown = await page.locator('tbody .id-link').evaluateAll((links) => links.map((l) => l.title));
    expect(shown).to.deep.equal([seedId('qj', 22_500), seedId('qj', 100)]);
  });

  it('shows an event sent to the ingest API as a report by its key, never as an approval', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/forged' });
    const forger = a.createKey('edge-forwarder', ['audit:write']);
    const r = await call('POST', `${a.platform}/api/v1/audit/ingest`, {
      key: forger,
      body: { kind: 'Approved', outcome: 'approved', request_id: id, message: 'approved by the CISO' },
    });
    expect(r.status, r.text).to.equal(202);
    await signIn(reviewer);
    await openItem(id);
    const report = page.getByRole('listitem').filter({ hasText: 'approved by the CISO' });
    await report.waitFor();
    expect(await report.getAttribute('class')).to.equal('trail-reported');
    expect(await report.textContent()).to.match(/^Reported by edge-forwarder: Approved/);
    // Only Arbiter's own events carry its labels; the item is still pending and can be decided.
    expect(await page.locator('.trail strong').allTextContents()).to.deep.equal(['Policy decision']);
    await page.getByRole('button', { name: 'Approve' }).waitFor();
    await shot('item-reported-event');
  });

  it('shows invisible and reordering characters in what was asked as marked code points', async () => {
    const RLO = '\u202E';
    const ZWSP = '\u200B';
    const id = await ask({
      ...AGENT.approval,
      resource: 'prod/unicode',
      context: { [`ticket${ZWSP}`]: `CHG-${RLO}2001`, target: `${RLO}bd/dorp` },
    });
    // A row stored before identifiers were checked: a resource that shows as "prod/db", and a
    // zero-width space in the action and in the message.
    restore(id, {
      resource: `${RLO}bd/dorp`,
      action: `de${ZWSP}ploy`,
      message: `needs${ZWSP} approval ${RLO}ti evorppa`,
    });
    await signIn(reviewer);
    const row = rowOf(id);
    await row.waitFor();
    const rowText = (await row.textContent()) as string;
    expect(rowText).to.include('⟨U+202E⟩bd/dorp').and.include('de⟨U+200B⟩ploy');
    expect(rowText).to.include('needs⟨U+200B⟩ approval ⟨U+202E⟩ti evorppa');
    expect(await row.getByTitle('⟨U+202E⟩bd/dorp').count()).to.equal(1);
    await openItem(id);
    const heading = page.getByRole('heading', { level: 1 });
    expect(await heading.textContent()).to.match(/^de⟨U\+200B⟩ploy\s+on\s+⟨U\+202E⟩bd\/dorp$/);
    const context = (await page.getByLabel('Context as JSON').textContent()) as string;
    expect(context).to.include('"ticket⟨U+200B⟩": "CHG-⟨U+202E⟩2001"');
    expect(context).to.include('"target": "⟨U+202E⟩bd/dorp"');
    // Nothing on the page still holds the characters themselves, so nothing is reordered or hidden.
    const main = (await page.locator('main').textContent()) as string;
    expect(main).to.not.match(/[\u202E\u200B]/);
    // What the reviewer sees reads in the order it was sent: each character of the resource in the
    // heading lies to the right of the one before it (with U+202E in effect they would run leftwards).
    const lefts = (await page.evaluate(`(() => {
      const el = document.querySelectorAll('h1 .verbatim')[1];
      const xs = [];
      const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n !== null; n = walker.nextNode()) {
        for (let i = 0; i < n.textContent.length; i++) {
          const r = document.createRange();
          r.setStart(n, i);
          r.setEnd(n, i + 1);
          xs.push(r.getBoundingClientRect().left);
        }
      }
      return xs;
    })()`)) as number[];
    expect(lefts.length).to.equal('⟨U+202E⟩bd/dorp'.length);
    for (let i = 1; i < lefts.length; i++) expect(lefts[i], `character ${i}`).to.be.above(lefts[i - 1]!);
    await shot('item-invisible-characters');
  });

  it('marks letters that pass for others in what was asked: another script among Latin letters, compatibility forms, foreign digits', async () => {
    const CYRILLIC_A = '\u0430'; // "а", drawn as the Latin "a"
    const FULLWIDTH_A = '\uFF41'; // "ａ"
    const ARABIC_INDIC_ONE = '\u0661'; // "١"
    const id = await ask({
      ...AGENT.approval,
      resource: `prod/${CYRILLIC_A}pi`,
      context: {
        ticket: `CHG-${ARABIC_INDIC_ONE}2`,
        region: `r${FULLWIDTH_A}`,
        city: 'Москва',
        price: '100 €',
      },
    });
    await signIn(reviewer);
    const row = rowOf(id);
    await row.waitFor();
    expect((await row.textContent()) as string).to.include('prod/⟨U+0430⟩pi');
    expect(await row.getByTitle('prod/⟨U+0430⟩pi').count()).to.equal(1);
    await openItem(id);
    const heading = page.getByRole('heading', { level: 1 });
    expect(await heading.textContent()).to.match(/\s+on\s+prod\/⟨U\+0430⟩pi$/);
    expect(await heading.getAttribute('title')).to.match(/ on prod\/⟨U\+0430⟩pi$/);
    const mark = heading.locator('.lookalike-char');
    expect(await mark.getAttribute('title')).to.match(
      /^U\+0430 “\u0430”, a letter of another script than the Latin/,
    );
    const context = (await page.getByLabel('Context as JSON').textContent()) as string;
    expect(context).to.include('"ticket": "CHG-⟨U+0661⟩2"');
    expect(context).to.include('"region": "r⟨U+FF41⟩"');
    // A value wholly in one script is shown as it is: only a mix with Latin letters is marked.
    expect(context).to.include('"city": "Москва"');
    // Signs beyond ASCII are text in the context ...
    expect(context).to.include('"price": "100 €"');
    // The message (prose) is the policy's own text, shown as written.
    await shot('item-lookalike-characters');
    // ... and marked in an identifier, as are phonetic letters: "prod/ɑpi∕v2" reads "prod/api/v2".
    const signs = await ask({ ...AGENT.approval, resource: 'prod/\u0251pi\u2215v2' });
    await page.getByRole('link', { name: 'Pending requests' }).click();
    await link(signs).waitFor();
    await openItem(signs);
    await page.getByRole('heading', { level: 1 }).filter({ hasText: 'prod/⟨U+0251⟩pi⟨U+2215⟩v2' }).waitFor();
  });

  it('keeps every column and panel on screen at 1280 px, however long an action or message is', async () => {
    const action = `${'a'.repeat(120)}-${'b'.repeat(135)}`; // 256 characters, the most allowed
    const message = `${'long-message-'.repeat(40)} and then ${'many words '.repeat(60)}`;
    const resource = `prod/${'r'.repeat(1000)}`;
    const id = await ask({
      ...AGENT.approval,
      resource: 'prod/layout',
      context: { query: `SELECT ${'column_name, '.repeat(40)}1`, token: 'z'.repeat(500) },
    });
    restore(id, { action, message, resource });
    await signIn(reviewer);
    const row = rowOf(id);
    await row.waitFor();
    const width = 1280;
    const inView = async (what: string, box: Promise<{ x: number; width: number } | null>) => {
      const b = await box;
      expect(b, what).to.not.equal(null);
      expect(b!.x, `${what} starts on screen`).to.be.at.least(0);
      expect(b!.x + b!.width, `${what} ends on screen`).to.be.at.most(width);
    };
    for (const name of ['Action', 'Resource', 'Confidence', 'Time left', 'Message']) {
      await inView(`${name} column`, page.getByRole('columnheader', { name }).boundingBox());
    }
    const cells = row.getByRole('cell');
    for (let i = 0; i < (await cells.count()); i++) await inView(`cell ${i}`, cells.nth(i).boundingBox());
    // The full values are there on hover.
    expect(await row.getByTitle(action, { exact: true }).count()).to.equal(1);
    expect(await row.getByTitle(resource, { exact: true }).count()).to.equal(1);
    expect(await row.getByTitle(message, { exact: true }).count()).to.equal(1);
    await shot('pending-long-values');

    await openItem(id);
    const side = await page.getByRole('complementary', { name: 'Decision and audit trail' }).boundingBox();
    await inView('decision sidebar', Promise.resolve(side));
    for (const name of ['Request', 'Context', 'Policy reasons']) {
      const panel = page.getByRole('region', { name, exact: true });
      const b = await panel.boundingBox();
      expect(b!.x + b!.width, `${name} panel ends before the sidebar`).to.be.at.most(side!.x);
    }
    // Nothing inside a panel sticks out of it.
    const overflows = await page.evaluate(
      `[...document.querySelectorAll('.panel')].map((p) => p.scrollWidth - p.clientWidth)`,
    );
    expect(overflows).to.deep.equal([0, 0, 0, 0, 0]);
    const heading = page.getByRole('heading', { level: 1 });
    await inView('heading', heading.boundingBox());
    expect((await heading.boundingBox())!.height, 'heading cut after a few lines').to.be.below(120);
    expect(await heading.getAttribute('title')).to.equal(`${action} on ${resource}`);
    expect(await page.evaluate('document.documentElement.scrollWidth')).to.be.at.most(width);
    await page.screenshot({ path: path.join(SHOTS, 'item-long-values.png'), fullPage: true });
  });

  it('keeps the top bar, who is signed in and Sign out on screen in a narrow (phone) window', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/phone' });
    await page.setViewportSize({ width: 375, height: 740 });
    await signIn(reviewer);
    const bar = (await page.locator('header.topbar').boundingBox())!;
    for (const [what, el] of [
      ['Sign out', page.getByRole('button', { name: 'Sign out' })],
      ['key name', page.locator('.identity .who')],
      ['History tab', page.getByRole('link', { name: 'History' })],
    ] as const) {
      const b = (await el.boundingBox())!;
      expect(b.x, `${what} starts on screen`).to.be.at.least(0);
      expect(b.x + b.width, `${what} ends on screen`).to.be.at.most(375);
      // On the bar's dark background, where its light text can be read.
      expect(b.x + b.width, `${what} inside the bar`).to.be.at.most(bar.x + bar.width);
      expect(b.y + b.height, `${what} inside the bar`).to.be.at.most(bar.y + bar.height);
    }
    expect(await page.evaluate('document.documentElement.scrollWidth')).to.be.at.most(375);
    await shot('pending-phone');
    await openItem(id);
    expect(await page.evaluate('document.documentElement.scrollWidth')).to.be.at.most(375);
    const approve = (await page.getByRole('button', { name: 'Approve' }).boundingBox())!;
    expect(approve.x + approve.width).to.be.at.most(375);
    await page.screenshot({ path: path.join(SHOTS, 'item-phone.png'), fullPage: true });
  });

  it('gives a read-only key (queue:read only) no Approve or Deny buttons', async () => {
    const id = await ask({ ...AGENT.approval, resource: 'prod/cdn' });
    await signIn(reader);
    await page.getByText('read-only').waitFor();
    await openItem(id);
    await page.getByText(/lacks\s+queue:review/).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    expect(await page.getByRole('button', { name: 'Deny' }).count()).to.equal(0);
    expect(await page.getByRole('textbox', { name: 'Note' }).count()).to.equal(0);
    await shot('item-read-only');
    expect((await item(id)).status).to.equal('pending');
  });

  it('gives Approve and Deny only to a key that could decide: not to an agent-bound key, nor to the asker', async () => {
    const theirs = await ask({ ...AGENT.approval, resource: 'prod/theirs' });
    const self = a.createKey('self-reviewer', ['authorize', 'queue:read', 'queue:review']);
    const r = await call('POST', `${a.engine}/v1/agent/authorize`, {
      key: self,
      body: { ...AGENT.approval, resource: 'prod/mine' },
    });
    expect(r.status, r.text).to.equal(202);
    const mine = r.json.request_id as string;
    const decisionPanel = page.getByRole('region', { name: 'Decision' });

    // A key bound to the agent sees its requests and may decide none of them.
    const botReviewer = a.createKey('bot-reviewer', ['queue:read', 'queue:review'], { agent: 'deploy-bot' });
    await signIn(botReviewer);
    await page.getByText('read-only').waitFor();
    await openItem(theirs);
    await decisionPanel.getByText(/bound to agent\s+deploy-bot/).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    expect(await page.getByRole('button', { name: 'Deny' }).count()).to.equal(0);
    await shot('item-agent-bound');
    expectError(await call('POST', `${a.engine}/v1/queue/${theirs}/approve`, { key: botReviewer }), 403);

    // The key that made a request: no buttons on that one, buttons on another's.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(self);
    expect(await page.getByText('read-only').count()).to.equal(0);
    await openItem(mine);
    await decisionPanel.getByText(/Your key made this request/).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    expect(await page.getByRole('button', { name: 'Deny' }).count()).to.equal(0);
    expectError(await call('POST', `${a.engine}/v1/queue/${mine}/approve`, { key: self }), 403);
    await page.goto(`${a.engine}/console/#/item/${theirs}`);
    await page.getByRole('button', { name: 'Approve' }).waitFor();
    expect((await item(mine)).status).to.equal('pending');
  });

  it('shows a tenant-bound reviewer only its tenant’s items', async () => {
    const acmeItem = await ask({ ...HUMAN.approval, resource: { type: 'project', id: 'acme-web' } });
    const globexItem = await ask({
      ...HUMAN.approval,
      tenant_id: 'globex',
      user_id: 'bob',
      resource: { type: 'project', id: 'globex-web' },
    });
    const agentItem = await ask({ ...AGENT.approval, resource: 'prod/tenantless' });
    await signIn(acmeReviewer);
    await page.getByText('tenant acme').waitFor();
    await rowOf(acmeItem).waitFor({ timeout: 2000 });
    await page.waitForTimeout(1200);
    expect(await rowOf(globexItem).count()).to.equal(0);
    expect(await rowOf(agentItem).count()).to.equal(0);
    const tenants = await page.locator('tbody tr td:nth-child(3)').allInnerTexts();
    expect(tenants.length).to.be.greaterThan(0);
    for (const t of tenants) expect(t).to.equal('acme');
    await shot('pending-tenant-acme');
    // A link to another tenant's item shows the server's refusal, not the item.
    await page.goto(`${a.engine}/console/#/item/${globexItem}`);
    await page.getByRole('alert').filter({ hasText: 'API key is bound to tenant acme' }).waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
  });

  it('can be used by keyboard alone, in a sensible order, with a visible focus ring at every stop', async () => {
    await page.emulateMedia({ reducedMotion: 'reduce' });
    const id = await ask({ ...AGENT.approval, resource: 'prod/keyboard', context: { ticket: 'CHG-7001' } });
    // Sign in: the key field has the focus, Tab reaches the button, Enter signs in.
    await page.goto(`${a.engine}/console/`);
    await expectFocusOn(page.getByLabel('API key'), 'on load');
    expect(await ringVisible(), 'API key ring').to.equal(true);
    await page.keyboard.type(reviewer);
    await page.keyboard.press('Tab');
    expect(await focused()).to.equal('button "Sign in"');
    expect(await ringVisible(), 'Sign in ring').to.equal(true);
    await page.keyboard.press('Enter');
    // The list's heading takes the focus (not the body, where the form that had it was).
    await expectFocusOn(
      page.getByRole('heading', { name: 'Pending requests', level: 1 }),
      'after signing in',
    );
    await link(id).waitFor();
    // From there Tab goes into the list; back from the list, through the bar to the skip link.
    await page.keyboard.press('Tab');
    expect(await focused()).to.match(/^link "Request [0-9a-f-]{36}"$/);
    expect(await ringVisible(), 'request link ring').to.equal(true);
    const bar: string[] = [];
    for (let i = 0; i < 4; i++) {
      await page.keyboard.press('Shift+Tab');
      bar.push((await focused()) ?? 'body');
      expect(await ringVisible(), `${bar[i]} ring`).to.equal(true);
    }
    expect(bar).to.have.length(4);
    expect(bar[0]).to.equal('button "Sign out"');
    expect(bar[1]).to.equal('link "History"');
    expect(bar[2]).to.match(/^link "Pending \d+"$/);
    expect(bar[3]).to.equal('link "Skip to content"');
    // An item opens on its heading; Tab then reaches the context, the Note and the two buttons.
    await link(id).focus();
    await page.keyboard.press('Enter');
    await expectFocusOn(
      page.getByRole('heading', { name: /deploy\s+on\s+prod\/keyboard/, level: 1 }),
      'item',
    );
    const stops: string[] = [];
    for (let i = 0; i < 4; i++) {
      await page.keyboard.press('Tab');
      stops.push((await focused()) ?? 'body');
      expect(await ringVisible(), `${stops[i]} ring`).to.equal(true);
    }
    expect(stops).to.deep.equal([
      'group "Context as JSON"',
      'textbox "Note"',
      'button "Approve"',
      'button "Deny"',
    ]);
    // The way back to the list, and the list takes the focus again (the link that had it is gone).
    await page.getByRole('link', { name: '← Pending requests' }).focus();
    expect(await ringVisible(), 'back link ring').to.equal(true);
    await page.keyboard.press('Enter');
    await expectFocusOn(
      page.getByRole('heading', { name: 'Pending requests', level: 1 }),
      'back to the list',
    );
    // History from the bar: its heading, then the status filters and Refresh, each with its ring.
    await page.getByRole('navigation', { name: 'Views' }).getByRole('link', { name: 'History' }).focus();
    await page.keyboard.press('Enter');
    await expectFocusOn(page.getByRole('heading', { name: 'History', level: 1 }), 'History');
    const filters: string[] = [];
    for (let i = 0; i < 5; i++) {
      await page.keyboard.press('Tab');
      filters.push((await focused()) ?? 'body');
      expect(await ringVisible(), `${filters[i]} ring`).to.equal(true);
    }
    // The check mark that shows the chosen filter is silent: aria-pressed says it.
    expect(filters).to.deep.equal([
      'button "All decided" [pressed]',
      'button "Approved"',
      'button "Denied"',
      'button "Expired"',
      'button "Refresh"',
    ]);
    // Space chooses a filter, and the focus stays on it.
    await page.keyboard.press('Shift+Tab');
    await page.keyboard.press('Space');
    await page.getByRole('button', { name: 'Expired', exact: true, pressed: true }).waitFor();
    expect(await focused()).to.equal('button "Expired" [pressed]');
    await shot('keyboard-history-filter');
  });

  it('keeps the focus where it was while a list reloads, and takes it to the first new row after Load more', async () => {
    await decideMany(51, 'prod/page'); // a second page, whatever earlier tests decided
    await signIn(reviewer);
    await page.getByRole('link', { name: 'History' }).click();
    const pager = page.getByRole('status').filter({ hasText: /\d+ shown/ });
    await pager.filter({ hasText: 'more available' }).waitFor();
    // Refresh is unavailable while it loads, but keeps the focus (a disabled button drops it).
    await page.route(/\/v1\/queue\?/, async (route) => {
      await new Promise((r) => setTimeout(r, 300));
      await route.continue();
    });
    const refresh = page.getByRole('button', { name: 'Refresh' });
    await refresh.focus();
    await page.keyboard.press('Enter');
    await page.getByRole('status').filter({ hasText: 'Loading…' }).waitFor();
    expect(await refresh.getAttribute('aria-disabled')).to.equal('true');
    expect(await focused()).to.equal('button "Refresh" [disabled]');
    await pager.filter({ hasText: '50 shown, more available' }).waitFor();
    expect(await focused()).to.equal('button "Refresh"');
    await page.unroute(/\/v1\/queue\?/);
    // Load more: the focus goes to the first row it added, ready to read on.
    await page.getByRole('button', { name: 'Load more' }).focus();
    await page.keyboard.press('Enter');
    const row51 = page.getByRole('row').nth(51); // row 0 is the header
    await expectFocusOn(row51.getByRole('link', { name: /^Request / }), 'after Load more');
  });

  it('never hides the focused control under the top bar, at 1280 px and at 200 % zoom', async () => {
    await decideMany(51, 'prod/rows'); // more rows than a window holds, and a Load more
    await page.emulateMedia({ reducedMotion: 'reduce' });
    for (const [width, height, zoom] of [
      [1280, 800, 1],
      [640, 400, 2], // a 1280 × 800 window zoomed to 200 %
    ] as const) {
      const zoomed = await browser.newContext({ viewport: { width, height }, deviceScaleFactor: zoom });
      const p = await zoomed.newPage();
      try {
        await p.goto(`${a.engine}/console/`);
        await p.getByLabel('API key').fill(reviewer);
        await p.keyboard.press('Enter');
        await p.getByRole('heading', { name: 'Pending requests' }).waitFor();
        await p.getByRole('link', { name: 'History' }).click();
        await p.getByRole('button', { name: 'Load more' }).focus();
        // Backwards through the rows: each scrolled into view, clear of the bar.
        for (let i = 0; i < 40; i++) {
          await p.keyboard.press('Shift+Tab');
          expect(await p.evaluate(coveredBy), `${width} px, Shift+Tab ${i + 1}`).to.equal(null);
        }
        expect(
          await p.evaluate('document.documentElement.scrollWidth'),
          'no sideways scrolling',
        ).to.be.at.most(width);
        await p.screenshot({ path: path.join(SHOTS, `history-keyboard-${width}.png`) });
      } finally {
        await zoomed.close();
      }
    }
  });

  it('sends one decision however often Approve is pressed, keeps the focus on it meanwhile, then on the outcome', async () => {
    const held = await ask({ ...AGENT.approval, resource: 'prod/held-key' });
    const twice = await ask({ ...AGENT.approval, resource: 'prod/double-click' });
    let decisions = 0;
    await page.route(/\/v1\/queue\/[^/?]+\/(approve|deny)$/, async (route) => {
      decisions++;
      await new Promise((r) => setTimeout(r, 400));
      await route.continue();
    });
    await signIn(reviewer);
    await openItem(held);
    await page.getByRole('textbox', { name: 'Note' }).focus();
    await page.keyboard.type('checked the change');
    await page.keyboard.press('Tab');
    expect(await focused()).to.equal('button "Approve"');
    // Enter held down: the key repeats while the decision is on its way.
    for (let i = 0; i < 6; i++) await page.keyboard.down('Enter');
    expect(await focused()).to.equal('button "Approving…" [disabled]');
    expect(
      await page.evaluate('getComputedStyle(document.activeElement).opacity'),
      'looks unavailable',
    ).to.equal('0.6');
    await page.keyboard.up('Enter');
    const done = page.getByRole('status').filter({ hasText: 'Approved as alice-reviewer, with your note' });
    await done.waitFor();
    await expectFocusOn(done.locator('.notice'), 'after approving');
    expect(decisions).to.equal(1);
    expect(await item(held)).to.include({ status: 'approved', note: 'checked the change' });
    // Two presses in one go, before the page has drawn the first (a double click, a bounce).
    await page.goto(`${a.engine}/console/#/item/${twice}`);
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
    await page.getByRole('button', { name: 'Approve' }).evaluate((b: { click(): void }) => {
      b.click();
      b.click();
    });
    const conflict = page.getByRole('alert').filter({ hasText: 'not recorded' });
    await page.getByRole('status').filter({ hasText: 'Approved as alice-reviewer' }).or(conflict).waitFor();
    expect(await conflict.count(), 'a second decision sent, refused as 409').to.equal(0);
    expect(decisions).to.equal(2);
  });

  it('takes the focus to the news when the item is decided elsewhere while the reviewer is deciding, and only then', async () => {
    const writing = await ask({ ...AGENT.approval, resource: 'prod/writing' });
    const reading = await ask({
      ...AGENT.approval,
      resource: 'prod/reading',
      context: { ticket: 'CHG-7002' },
    });
    await signIn(reviewer);
    await openItem(writing);
    await page.getByRole('textbox', { name: 'Note' }).focus();
    await page.keyboard.type('half-written');
    expect((await call('POST', `${a.engine}/v1/queue/${writing}/deny`, { key: reviewer2 })).status).to.equal(
      200,
    );
    const news = page
      .getByRole('alert')
      .filter({ hasText: /While you had this request open,\s+bob-reviewer\s+denied/ });
    await news.waitFor();
    // The Note it was in is gone: the focus is on the alert, not lost on the body.
    await expectFocusOn(news.locator('.notice'), 'decided while writing a note');
    // A reviewer reading the context keeps their place.
    await page.goto(`${a.engine}/console/#/item/${reading}`);
    await page.getByRole('heading', { name: 'Audit trail' }).waitFor();
    const context = page.getByRole('group', { name: 'Context as JSON' });
    await context.focus();
    expect(
      (await call('POST', `${a.engine}/v1/queue/${reading}/approve`, { key: reviewer2 })).status,
    ).to.equal(200);
    await page
      .getByRole('alert')
      .filter({ hasText: /bob-reviewer\s+approved/ })
      .waitFor();
    await page.waitForTimeout(200);
    expect(await focused()).to.equal('group "Context as JSON"');
  });

  it('names the sign-in error in the key field’s description, and keeps the focus in the field', async () => {
    await page.goto(`${a.engine}/console/`);
    const field = page.getByLabel('API key');
    await field.fill('arb_not-a-key');
    await page.keyboard.press('Enter');
    await page.getByRole('alert').filter({ hasText: 'invalid or revoked API key' }).waitFor();
    expect(await focused()).to.equal('textbox "API key" [invalid]');
    const ids = ((await field.getAttribute('aria-describedby')) ?? '').split(' ');
    const described = await Promise.all(ids.map((id) => page.locator(`#${id}`).textContent()));
    expect(described.join(' ')).to.match(/^invalid or revoked API key/);
  });

  it('marks the current view and the chosen filter in forced colours (Windows high contrast), not by colour alone', async () => {
    await signIn(reviewer);
    await page.getByRole('link', { name: 'History' }).click();
    await page.getByRole('button', { name: 'All decided', pressed: true }).waitFor();
    await page.emulateMedia({ forcedColors: 'active' });
    await page.evaluate('document.activeElement.blur()');
    // The same small piece of each tab's underline, and of each filter's face: the current one
    // must not look like the others.
    const underline = async (name: RegExp) => {
      const b = (await page
        .getByRole('navigation', { name: 'Views' })
        .getByRole('link', { name })
        .boundingBox())!;
      return page.screenshot({ clip: { x: b.x + 4, y: b.y + b.height - 3, width: 30, height: 3 } });
    };
    expect((await underline(/^History$/)).equals(await underline(/^Pending/)), 'current tab').to.equal(false);
    const face = async (name: string) => {
      const b = (await page.getByRole('button', { name, exact: true }).boundingBox())!;
      return page.screenshot({ clip: { x: b.x + b.width - 8, y: b.y + 2, width: 4, height: 4 } });
    };
    expect((await face('All decided')).equals(await face('Approved')), 'chosen filter').to.equal(false);
    // And its label can still be read there (the system's backplate once hid HighlightText).
    const label = (await page.evaluate(`(() => {
      const range = document.createRange();
      range.selectNodeContents(document.querySelector('.segmented [aria-pressed="true"]'));
      const r = range.getBoundingClientRect();
      return { x: r.x, y: r.y, width: r.width, height: r.height };
    })()`)) as { x: number; y: number; width: number; height: number };
    expect(
      await contrastingPixels(await page.screenshot({ clip: label })),
      'chosen filter label',
    ).to.be.above(20);
    await shot('history-forced-colors');
  });
});
