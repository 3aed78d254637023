import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { canonicalJson } from '../common/canonical-json.js';
import { loadConfig } from '../config.js';
import { BUILTIN_MODULE_PATH, CompileError, RegoCompiler } from '../policy/compiler.js';
import { EvaluationThread, thresholdErrorsOn } from '../policy/eval-thread.js';
import { dataTree, regoSha256 } from '../policy/documents.js';
import { BUNDLED_BUILTIN, readPolicyDir } from '../policy/policy-dir.js';
import { thresholdErrorMessage } from '../policy/thresholds.js';

/**
 * `arbiter policy check|test|diff|push|pull DIR` (SPEC §11): the policy lifecycle from a git
 * directory in the layout of the repository's policies/. Exit 0 ok, 1 refused or failed, 2 usage
 * or connection error.
 */
export const POLICY_USAGE = `  arbiter policy check DIR [--json]
  arbiter policy test DIR [--json]
  arbiter policy diff DIR [--prune] [--url URL] [--key KEY] [--json]
  arbiter policy push DIR [--prune] [--message M] [--url URL] [--key KEY] [--json]
  arbiter policy pull DIR [--force] [--url URL] [--key KEY] [--json]`;

/** Exit 2: the command line is wrong, or the server cannot be reached. */
export class CliUsageError extends Error {}
/** Exit 1: the policies, the server or the tests said no. */
class Refused extends Error {}

type Out = (line: string) => void;

interface Options {
  json: boolean;
  prune: boolean;
  force: boolean;
  message: string | undefined;
  url: string | undefined;
  key: string | undefined;
}

/** Runs one `arbiter policy` command; returns its exit code (0, 1 or 2) having printed its output. */
export async function policyCommand(args: string[], out: Out, err: Out): Promise<number> {
  const [sub, ...rest] = args;
  let parsed;
  try {
    parsed = parseArgs({
      args: rest,
      allowPositionals: true,
      strict: true,
      options: {
        json: { type: 'boolean', default: false },
        prune: { type: 'boolean', default: false },
        force: { type: 'boolean', default: false },
        message: { type: 'string' },
        url: { type: 'string' },
        key: { type: 'string' },
      },
    });
  } catch (e) {
    err(`arbiter policy: ${(e as Error).message}\n\nusage:\n${POLICY_USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  const opts: Options = { ...values, message: values.message, url: values.url, key: values.key };
  try {
    if (positionals.length !== 1) throw new CliUsageError(`policy ${sub ?? ''} needs exactly one DIR`.trim());
    const dir = positionals[0] as string;
    const allowed: Record<string, (keyof Options)[]> = {
      check: ['json'],
      test: ['json'],
      diff: ['json', 'prune', 'url', 'key'],
      push: ['json', 'prune', 'message', 'url', 'key'],
      pull: ['json', 'force', 'url', 'key'],
    };
    const known = sub === undefined ? undefined : allowed[sub];
    if (!known) throw new CliUsageError(`unknown policy command ${sub ?? '(none)'}`);
    for (const [k, v] of Object.entries(values)) {
      if (v !== undefined && v !== false && !known.includes(k as keyof Options)) {
        throw new CliUsageError(`policy ${sub} takes no --${k}`);
      }
    }
    const print = (text: string[], json: unknown) => {
      if (opts.json) out(JSON.stringify(json));
      else for (const line of text) out(line);
    };
    switch (sub) {
      case 'check':
        return await check(dir, print);
      case 'test':
        return await test(dir, opts, out);
      case 'diff':
        return await diff(dir, opts, print);
      case 'push':
        return await push(dir, opts, print);
      default:
        return await pull(dir, opts, print);
    }
  } catch (e) {
    if (e instanceof CliUsageError) {
      err(`arbiter policy: ${e.message}`);
      return 2;
    }
    if (e instanceof Refused) {
      err(`arbiter policy: ${e.message}`);
      return 1;
    }
    throw e;
  }
}

type Print = (text: string[], json: unknown) => void;
type LocalSet = Awaited<ReturnType<typeof readPolicyDir>>;

/** DIR as the service would seed it; a missing DIR is a usage error, unreadable content a refusal. */
async function readLocal(dir: string): Promise<LocalSet> {
  const st = await stat(dir).catch(() => undefined);
  if (!st?.isDirectory()) throw new CliUsageError(`${dir} is not a directory`);
  try {
    return await readPolicyDir(dir);
  } catch (e) {
    throw new Refused((e as Error).message);
  }
}

/** A RegoCompiler over the configured opa binary; one that cannot run is an environment (exit 2) error. */
async function compilerOf(): Promise<RegoCompiler> {
  const compiler = new RegoCompiler(loadConfig().opaBin);
  try {
    await compiler.init();
  } catch (e) {
    await compiler.close();
    throw new CliUsageError((e as Error).message);
  }
  return compiler;
}

/** Compiles DIR exactly as the service compiles a change: the OPA compiler, then the thresholds. */
async function check(dir: string, print: Print): Promise<number> {
  const local = await readLocal(dir);
  const fileOf = (policy: string | undefined) => {
    const m = local.modules.find((x) => x.name === policy);
    return m ? path.join(dir, m.file) : policy === undefined ? 'builtin/authz.rego' : policy;
  };
  const compiler = await compilerOf();
  try {
    let wasm: Buffer;
    try {
      wasm = await compiler.compile(local.modules);
    } catch (e) {
      if (!(e instanceof CompileError)) throw e;
      const problems = e.problems.map((p) => ({
        file: fileOf(p.policy),
        row: p.row ?? 1,
        col: p.col ?? 1,
        message: p.message,
      }));
      print(
        problems.map((p) => `${p.file}:${p.row}:${p.col}: ${p.message}`),
        { ok: false, errors: problems },
      );
      return 1;
    }
    // On a thread, as the service checks a change: a `thresholds` rule that never finishes is
    // reported after the eval budget plus 1 s instead of hanging the CI job.
    const thread = new EvaluationThread();
    let errors: string[];
    try {
      const set = {
        module: await WebAssembly.compile(wasm),
        data: dataTree(local.data),
        revision: 0,
        budgetMs: loadConfig().evalBudgetMs,
      };
      errors = await thresholdErrorsOn(thread, set);
    } finally {
      await thread.close();
    }
    if (errors.length > 0) {
      const message = thresholdErrorMessage(local.modules, errors).replace(
        /policy ([a-z0-9][a-z0-9._-]*):(\d+)/g,
        (_all, name: string, row: string) => `${fileOf(name)}:${row}:1`,
      );
      print([message], { ok: false, errors: [{ message }] });
      return 1;
    }
    print([`ok: ${local.modules.length} policies and ${local.data.length} data documents compile`], {
      ok: true,
      policies: local.modules.map((m) => m.name),
      data: local.data.map((d) => d.path),
    });
    return 0;
  } finally {
    await compiler.close();
  }
}

/** Runs DIR's Rego tests with OPA's test runner, with the service's built-in module in place of any copy. */
async function test(dir: string, opts: Options, out: Out): Promise<number> {
  await readLocal(dir);
  const opa = loadConfig().opaBin;
  const work = await mkdtemp(path.join(os.tmpdir(), 'arbiter-policy-test-'));
  try {
    const tree = path.join(work, 'policies');
    await cp(dir, tree, {
      recursive: true,
      filter: (src) => path.relative(dir, src) !== BUNDLED_BUILTIN && !path.basename(src).startsWith('.'),
    });
    await mkdir(path.join(work, 'builtin'));
    await cp(BUILTIN_MODULE_PATH, path.join(work, 'builtin', 'authz.rego'));
    const r = await run(
      opa,
      ['test', ...(opts.json ? ['--format', 'json'] : ['-v']), 'builtin', 'policies'],
      work,
    );
    const text = (r.stdout + r.stderr)
      .trim()
      .split(work + path.sep)
      .join('');
    if (text) out(text);
    return r.code === 0 ? 0 : 1;
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

function run(
  bin: string,
  args: string[],
  cwd: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(bin, args, { cwd, maxBuffer: 64 * 1024 * 1024, timeout: 300_000 }, (e, stdout, stderr) => {
      if (e && typeof e.code !== 'number') {
        reject(new CliUsageError(`cannot run the OPA test runner at ${bin}: ${e.message}`));
        return;
      }
      resolve({ code: e ? (e.code as number) : 0, stdout, stderr });
    });
  });
}

/** The Platform API at --url / ARBITER_URL with the key at --key / ARBITER_KEY. */
class Server {
  readonly base: string;
  private readonly key: string;
  constructor(opts: Options) {
    const url = opts.url ?? process.env.ARBITER_URL;
    const key = opts.key ?? process.env.ARBITER_KEY;
    if (!url) throw new CliUsageError('the server is unknown: pass --url or set ARBITER_URL');
    if (!key) throw new CliUsageError('no API key: pass --key or set ARBITER_KEY');
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new CliUsageError(`--url ${url} is not a URL`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new CliUsageError(`--url ${url} must be http:// or https://`);
    }
    this.base = url.replace(/\/+$/, '');
    this.key = key;
  }

  /** One request; a transport failure is exit 2, an error answer is returned to the caller. */
  async call(
    method: string,
    p: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<{ status: number; json: Record<string, unknown> }> {
    let res: Response;
    try {
      res = await fetch(this.base + p, {
        method,
        headers: {
          authorization: `Bearer ${this.key}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          ...headers,
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(120_000),
      });
    } catch (e) {
      const cause = (e as { cause?: { code?: string; message?: string } }).cause;
      throw new CliUsageError(
        `cannot reach ${this.base}: ${cause?.code ?? cause?.message ?? (e as Error).message}`,
      );
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      throw new CliUsageError(`${method} ${p}: the answer broke off: ${(e as Error).message}`);
    }
    let json: Record<string, unknown>;
    try {
      json = text === '' ? {} : (JSON.parse(text) as Record<string, unknown>);
    } catch {
      // Not Arbiter answering (a proxy's error page, another service): a connection problem.
      throw new CliUsageError(`${method} ${p}: answered ${res.status} with a body that is not JSON`);
    }
    return { status: res.status, json };
  }

  /** A 2xx answer's body; anything else is a refusal naming the server's error. */
  async ok(method: string, p: string, body?: unknown, headers?: Record<string, string>) {
    const r = await this.call(method, p, body, headers);
    if (r.status < 200 || r.status > 299) {
      throw new Refused(`${method} ${p}: ${r.status} ${String(r.json.error ?? '')}`.trim());
    }
    return r.json;
  }

  /** Every item of a paginated list. */
  async all<T>(p: string, field: string): Promise<{ items: T[]; revision: number }> {
    const items: T[] = [];
    let cursor: string | null = null;
    const revisions = new Set<number>();
    do {
      const q = `?limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`;
      const page = await this.ok('GET', p + q);
      items.push(...(page[field] as T[]));
      revisions.add(page.revision as number);
      cursor = page.next_cursor as string | null;
    } while (cursor !== null);
    // Pages read at different revisions are not one set: -1 makes the caller read again.
    return { items, revision: revisions.size === 1 ? ([...revisions][0] as number) : -1 };
  }
}

interface LiveSet {
  revision: number;
  policies: Map<string, { sha256: string }>;
  data: Map<string, unknown>;
}

/** The live set at one revision (read again if a change landed between the reads). */
async function readLive(server: Server, withRego = false): Promise<LiveSet & { rego: Map<string, string> }> {
  for (let tries = 0; tries < 5; tries++) {
    const policies = await server.all<{ name: string; sha256: string }>('/api/v1/policies', 'policies');
    const docs = await server.all<{ path: string }>('/api/v1/data', 'documents');
    const data = new Map<string, unknown>();
    for (const d of docs.items) {
      data.set(d.path, (await server.ok('GET', `/api/v1/data/${d.path}`)).value);
    }
    const rego = new Map<string, string>();
    if (withRego) {
      for (const p of policies.items) {
        rego.set(p.name, (await server.ok('GET', `/api/v1/policies/${p.name}`)).rego as string);
      }
    }
    const again = (await server.ok('GET', '/api/v1/policies?limit=1')).revision as number;
    if (policies.revision === docs.revision && docs.revision === again) {
      return {
        revision: again,
        policies: new Map(policies.items.map((p) => [p.name, { sha256: p.sha256 }])),
        data,
        rego,
      };
    }
  }
  throw new Refused('the live policy set kept changing while it was read; try again');
}

interface Plan {
  revision: number;
  policies: { create: string[]; update: string[]; delete: string[]; keep: string[]; unchanged: string[] };
  data: { create: string[]; update: string[]; delete: string[]; keep: string[]; unchanged: string[] };
  bundle: { policies: Record<string, string>; data: Record<string, unknown>; prune: boolean };
}

/** What pushing DIR would change in the live set: per policy and per data document. */
function planOf(local: LocalSet, live: LiveSet, prune: boolean): Plan {
  const plan: Plan = {
    revision: live.revision,
    policies: { create: [], update: [], delete: [], keep: [], unchanged: [] },
    data: { create: [], update: [], delete: [], keep: [], unchanged: [] },
    bundle: { policies: {}, data: {}, prune },
  };
  const localNames = new Set(local.modules.map((m) => m.name));
  for (const m of local.modules) {
    plan.bundle.policies[m.name] = m.rego;
    const current = live.policies.get(m.name);
    if (!current) plan.policies.create.push(m.name);
    else if (current.sha256 !== regoSha256(m.rego)) plan.policies.update.push(m.name);
    else plan.policies.unchanged.push(m.name);
  }
  for (const name of live.policies.keys()) {
    if (!localNames.has(name)) (prune ? plan.policies.delete : plan.policies.keep).push(name);
  }
  const localPaths = new Set(local.data.map((d) => d.path));
  for (const d of local.data) {
    const has = live.data.has(d.path);
    if (!has) plan.data.create.push(d.path);
    else if (canonicalJson(live.data.get(d.path)) !== canonicalJson(d.value)) plan.data.update.push(d.path);
    else {
      plan.data.unchanged.push(d.path);
      continue;
    }
    plan.bundle.data[d.path] = d.value;
  }
  for (const p of live.data.keys()) {
    if (localPaths.has(p)) continue;
    if (prune) {
      plan.data.delete.push(p);
      plan.bundle.data[p] = null;
    } else plan.data.keep.push(p);
  }
  for (const list of [...Object.values(plan.policies), ...Object.values(plan.data)]) list.sort();
  return plan;
}

const changes = (p: Plan) =>
  p.policies.create.length +
  p.policies.update.length +
  p.policies.delete.length +
  p.data.create.length +
  p.data.update.length +
  p.data.delete.length;

/** The plan as a person reads it in a CI log. */
function planText(p: Plan, server: string): string[] {
  const lines = [`plan against revision ${p.revision} of ${server}:`];
  for (const [verb, names] of [
    ['create', p.policies.create],
    ['update', p.policies.update],
    ['delete', p.policies.delete],
  ] as const) {
    for (const n of names) lines.push(`  ${verb.padEnd(6)} policy ${n}`);
  }
  for (const [verb, names] of [
    ['create', p.data.create],
    ['update', p.data.update],
    ['delete', p.data.delete],
  ] as const) {
    for (const n of names) lines.push(`  ${verb.padEnd(6)} data   ${n}`);
  }
  for (const n of p.policies.keep) lines.push(`  keep   policy ${n} (live only; --prune deletes it)`);
  for (const n of p.data.keep) lines.push(`  keep   data   ${n} (live only; --prune deletes it)`);
  if (changes(p) === 0) lines.push('  no changes');
  lines.push(
    `  unchanged: ${p.policies.unchanged.length} policies, ${p.data.unchanged.length} data documents`,
  );
  return lines;
}

/** The impact replay of the plan, when the server offers POST /api/v1/impact; else why not. */
async function impactOf(
  server: Server,
  p: Plan,
): Promise<{ text: string[]; json: unknown; refused?: string }> {
  if (changes(p) === 0) return { text: ['impact: no changes to replay'], json: null };
  const policies: Record<string, string | null> = {};
  for (const n of [...p.policies.create, ...p.policies.update]) policies[n] = p.bundle.policies[n] as string;
  for (const n of p.policies.delete) policies[n] = null;
  const data: Record<string, unknown> = {};
  for (const n of [...p.data.create, ...p.data.update, ...p.data.delete]) data[n] = p.bundle.data[n];
  const r = await server.call('POST', '/api/v1/impact', { policies, data });
  if (r.status === 404 || r.status === 405) return { text: ['impact: not available'], json: null };
  if (r.status === 400 || r.status === 409) {
    // The candidate set itself is refused (it does not compile with the live set, or its data
    // overlaps live data): push would be refused too, so the plan fails here already.
    const refused = `the plan would be refused: ${String(r.json.error ?? r.status)}`;
    return { text: [refused], json: r.json, refused };
  }
  if (r.status !== 200) {
    return { text: [`impact: not available (${r.status} ${String(r.json.error ?? '')})`], json: null };
  }
  const c = (r.json.changes ?? {}) as Record<string, number>;
  const detail = Object.entries(c)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  return {
    text: [
      `impact: ${String(r.json.changed)} of ${String(r.json.replayed)} recent decisions would change${detail ? ` (${detail})` : ''}`,
    ],
    json: r.json,
  };
}

const planJson = ({ bundle: _b, ...rest }: Plan) => rest;

async function diff(dir: string, opts: Options, print: Print): Promise<number> {
  const local = await readLocal(dir);
  const server = new Server(opts);
  const plan = planOf(local, await readLive(server), opts.prune);
  const impact = await impactOf(server, plan);
  print([...planText(plan, server.base), ...impact.text], {
    plan: planJson(plan),
    impact: impact.json,
    ...(impact.refused ? { refused: impact.refused } : {}),
  });
  return impact.refused ? 1 : 0;
}

/** Applies the plan as one bundle, conditional on the revision it was made against. */
async function push(dir: string, opts: Options, print: Print): Promise<number> {
  const local = await readLocal(dir);
  const server = new Server(opts);
  const plan = planOf(local, await readLive(server), opts.prune);
  const text = planText(plan, server.base);
  if (changes(plan) === 0) {
    print([...text, `nothing to push: revision ${plan.revision} is live`], {
      plan: planJson(plan),
      revision: plan.revision,
      pushed: false,
    });
    return 0;
  }
  const r = await server.call(
    'POST',
    '/api/v1/bundle',
    { ...plan.bundle, message: opts.message ?? `arbiter policy push ${path.basename(path.resolve(dir))}` },
    { 'if-match': `"rev-${plan.revision}"` },
  );
  if (r.status === 412) {
    throw new Refused(
      `the live set changed since the plan was made against revision ${plan.revision}; nothing was pushed, run diff again`,
    );
  }
  if (r.status !== 200) throw new Refused(`push refused: ${r.status} ${String(r.json.error ?? '')}`);
  print([...text, `pushed: revision ${String(r.json.revision)} is live`], {
    plan: planJson(plan),
    revision: r.json.revision,
    pushed: true,
    result: r.json,
  });
  return 0;
}

/**
 * Writes the live set in DIR's layout: NAME.rego per policy, top-level data documents in
 * data.json, deeper ones in PATH/data.json. DIR must be empty or absent unless --force, which
 * first removes the policy and data files DIR holds (never its *_test.rego files).
 */
async function pull(dir: string, opts: Options, print: Print): Promise<number> {
  const server = new Server(opts);
  const st = await stat(dir).catch(() => undefined);
  if (st && !st.isDirectory()) throw new CliUsageError(`${dir} is not a directory`);
  // Read the live set first: a refused or unreachable server must leave the directory as it was.
  const live = await readLive(server, true);
  // NAME_test.rego is a test file in this layout: such a policy would not come back on push.
  const unrepresentable = [...live.rego.keys()].filter((n) => n.endsWith('_test'));
  if (unrepresentable.length > 0) {
    throw new Refused(
      `live policies ${unrepresentable.join(', ')} end in _test: their files would be read as tests, ` +
        'so push --prune would delete them; rename them first',
    );
  }
  if (st) {
    const entries = await readdir(dir, { recursive: true, withFileTypes: true });
    const ours = entries
      .filter((e) => e.isFile())
      .map((e) => path.relative(dir, path.join(e.parentPath, e.name)))
      .filter(
        (rel) =>
          (rel.endsWith('.rego') && !rel.endsWith('_test.rego') && rel !== BUNDLED_BUILTIN) ||
          /(^|\/)data\.(json|ya?ml)$/.test(rel.split(path.sep).join('/')),
      );
    if (ours.length > 0 && !opts.force) {
      throw new Refused(`${dir} already holds policies or data (${ours[0]}…); pass --force to replace them`);
    }
    for (const rel of ours) await rm(path.join(dir, rel));
  }
  await mkdir(dir, { recursive: true });
  const written: string[] = [];
  for (const [name, rego] of [...live.rego].sort(([a], [b]) => a.localeCompare(b))) {
    await writeFile(path.join(dir, `${name}.rego`), rego);
    written.push(`${name}.rego`);
  }
  const root: Record<string, unknown> = {};
  for (const [p, value] of [...live.data].sort(([a], [b]) => a.localeCompare(b))) {
    if (!p.includes('/')) {
      root[p] = value;
      continue;
    }
    await mkdir(path.join(dir, ...p.split('/')), { recursive: true });
    await writeFile(path.join(dir, ...p.split('/'), 'data.json'), JSON.stringify(value, null, 2) + '\n');
    written.push(`${p}/data.json`);
  }
  if (Object.keys(root).length > 0) {
    await writeFile(path.join(dir, 'data.json'), JSON.stringify(root, null, 2) + '\n');
    written.push('data.json');
  }
  print([`pulled revision ${live.revision} into ${dir}:`, ...written.map((f) => `  ${f}`)], {
    revision: live.revision,
    files: written,
  });
  return 0;
}
