import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgsOnce } from './args.js';
import { ConfigError, loadConfig } from '../config.js';
import { BUILTIN_MODULE_PATH, CompileError, RegoCompiler } from '../policy/compiler.js';
import { EvaluationThread, thresholdErrorsOn } from '../policy/eval-thread.js';
import { dataTree, ruleDataConflict } from '../policy/documents.js';
import { BUNDLED_BUILTIN, readPolicyDir } from '../policy/policy-dir.js';
import { thresholdErrorMessage } from '../policy/thresholds.js';
import { CliUsageError, HttpRefused, Refused } from './policy-errors.js';
import { checkTarget, isPolicyOrDataFile, writeInside } from './policy-files.js';
import { changes, planJson, planOf, planText, type LocalSet, type Plan } from './policy-plan.js';
import { errorOf, isObject, notArbiter, readLive, revisionOf, Server } from './policy-server.js';
import { childEnv } from '../common/child-env.js';
import { canonicalJson } from '../common/canonical-json.js';

export { CliUsageError } from './policy-errors.js';

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

type Out = (line: string) => void;

interface Options {
  json: boolean;
  prune: boolean;
  force: boolean;
  message: string | undefined;
  url: string | undefined;
  key: string | undefined;
}

/** What a command prints: text lines, or with --json one JSON object (and warnings on stderr). */
interface Io {
  json: boolean;
  out: Out;
  err: Out;
}
function print(io: Io, text: string[], json: Record<string, unknown>): void {
  if (io.json) io.out(JSON.stringify(json));
  else for (const line of text) io.out(line);
}

/** The scopes each server command needs, named when the server answers 403. */
const NEEDS: Record<string, string> = {
  diff: 'policies:read',
  pull: 'policies:read',
  push: 'policies:read (to read the live set) and policies:write',
};

/**
 * Runs one `arbiter policy` command; returns its exit code (0, 1 or 2) having printed its output.
 * With --json every outcome, errors included, prints exactly one JSON object on stdout (errors:
 * `{"ok": false, "error", "exit"}`); the message also goes to stderr.
 */
export async function policyCommand(args: string[], out: Out, err: Out): Promise<number> {
  const [sub, ...rest] = args;
  // Known before the command line parses, so that even a usage error answers in JSON.
  let json = args.includes('--json');
  const fail = (message: string, exit: number, usage = false): number => {
    err(`arbiter policy: ${message}${usage ? `\n\nusage:\n${POLICY_USAGE}` : ''}`);
    if (json) out(JSON.stringify({ ok: false, error: message, exit }));
    return exit;
  };
  let parsed;
  try {
    parsed = parseArgsOnce({
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
    return fail((e as Error).message, 2, true);
  }
  const { values, positionals } = parsed;
  // `policy --json` (no command): the --json is in the command's place, not among the options.
  json = values.json || sub === '--json';
  const opts: Options = { ...values, message: values.message, url: values.url, key: values.key };
  const io: Io = { json, out, err };
  try {
    if (positionals.length !== 1) {
      throw new CliUsageError(
        sub === undefined || sub.startsWith('-')
          ? 'policy needs a command (check, test, diff, push or pull) and exactly one DIR'
          : `policy ${sub} needs exactly one DIR`,
      );
    }
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
    switch (sub) {
      case 'check':
        return await check(dir, io);
      case 'test':
        return await test(dir, io);
      case 'diff':
        return await diff(dir, opts, io);
      case 'push':
        return await push(dir, opts, io);
      default:
        return await pull(dir, opts, io);
    }
  } catch (e) {
    if (e instanceof CliUsageError) return fail(e.message, 2);
    // A bad ARBITER_* setting is the environment's, as for every other arbiter command: exit 2.
    if (e instanceof ConfigError) return fail(`invalid configuration: ${e.message}`, 2);
    if (e instanceof HttpRefused && e.status === 403 && sub !== undefined && NEEDS[sub]) {
      return fail(`${e.message} (${sub} needs a key with ${NEEDS[sub]})`, 1);
    }
    if (e instanceof Refused) return fail(e.message, 1);
    // Anything else (a file pull cannot write, say) is a failure of this command: exit 1.
    return fail(e instanceof Error ? e.message : String(e), 1);
  }
}

/**
 * DIR as the service would seed it; a missing DIR is a usage error, unreadable content a refusal.
 * `forBundle` (check, diff, push): a data document whose value is null is refused too, since a
 * bundle's null deletes the document (docs/decisions.md).
 */
async function readLocal(dir: string, forBundle: boolean): Promise<LocalSet> {
  const st = await stat(dir).catch(() => undefined);
  if (!st?.isDirectory()) throw new CliUsageError(`${dir} is not a directory`);
  let local: LocalSet;
  try {
    local = await readPolicyDir(dir);
  } catch (e) {
    throw new Refused((e as Error).message);
  }
  if (forBundle) {
    for (const d of local.data) {
      if (d.value !== null) continue;
      throw new Refused(
        `${path.join(dir, local.dataFiles.get(d.path) ?? '')}: data document ${d.path} is null: a bundle's ` +
          `null deletes a document, so a null document cannot be pushed in a bundle; remove it, or ` +
          `write it with PUT /api/v1/data/${d.path}`,
      );
    }
  }
  return local;
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
async function check(dir: string, io: Io): Promise<number> {
  const local = await readLocal(dir, true);
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
      const lines = problems.map((p) => `${p.file}:${p.row}:${p.col}: ${p.message}`);
      // The first problem is the error (as every --json failure has one); `errors` holds them all.
      const more = lines.length > 1 ? ` (and ${lines.length - 1} more)` : '';
      const error = `${lines[0] ?? 'the policies do not compile'}${more}`;
      print(io, lines, { ok: false, errors: problems, error, exit: 1 });
      return 1;
    }
    // A rule where the data hold a value: the server refuses the set (and a seed from it), as OPA
    // does; `opa build` never sees the data, so the compile above cannot tell.
    const clash = ruleDataConflict((await compiler.parse(local.modules)).modules, dataTree(local.data));
    if (clash) {
      const message =
        `${fileOf(clash.policy)}:${clash.row}:1: conflicting rule for data path ${clash.path}: ` +
        `the data hold a value at ${clash.held}; OPA refuses such a set: move the document or the rule`;
      print(io, [message], { ok: false, errors: [{ message }], error: message, exit: 1 });
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
      print(io, [message], { ok: false, errors: [{ message }], error: message, exit: 1 });
      return 1;
    }
    print(io, [`ok: ${local.modules.length} policies and ${local.data.length} data documents compile`], {
      ok: true,
      policies: local.modules.map((m) => m.name),
      data: local.data.map((d) => d.path),
    });
    return 0;
  } finally {
    await compiler.close();
  }
}

/**
 * Runs DIR's Rego tests with OPA's test runner, with the service's built-in module in place of any
 * copy, on exactly what push sends: a copy of DIR's .rego files (policies and *_test.rego) and one
 * data.json built from the data documents as read (never the raw data files, which OPA's loader
 * would read otherwise, nor other .json/.yaml files, which OPA would load as data too). The
 * runner's file paths are DIR's. With --json: `{"ok", "results": [OPA's results]}`, or OPA's own
 * error (a file it cannot load) as `{"ok": false, "error", "exit": 1}`.
 */
async function test(dir: string, io: Io): Promise<number> {
  const set = await readLocal(dir, false);
  const opa = loadConfig().opaBin;
  const work = await mkdtemp(path.join(os.tmpdir(), 'arbiter-policy-test-'));
  try {
    const tree = path.join(work, 'policies');
    const builtin = path.join(work, 'builtin');
    await cp(dir, tree, {
      recursive: true,
      filter: async (src) => {
        const rel = path.relative(dir, src);
        if (rel === '') return true;
        if (rel === BUNDLED_BUILTIN || path.basename(src).startsWith('.')) return false;
        // Directories are walked (empty ones do no harm); of files only the Rego ones.
        return (await stat(src)).isDirectory() || rel.endsWith('.rego');
      },
    });
    await writeFile(path.join(tree, 'data.json'), JSON.stringify(dataTree(set.data)));
    await mkdir(builtin);
    await cp(BUILTIN_MODULE_PATH, path.join(builtin, 'authz.rego'));
    const r = await run(opa, ['test', ...(io.json ? ['--format', 'json'] : ['-v']), builtin, tree], work);
    // The runner's paths: DIR's files under DIR as given, the built-in module as builtin/.
    // In JSON output, the paths inside strings: DIR escaped as a JSON string would be.
    const shownDir = dir.endsWith(path.sep) ? dir : dir + path.sep;
    const inJson = (p: string) => JSON.stringify(p).slice(1, -1);
    const local = (text: string, json = false) => {
      const esc = json ? inJson : (p: string) => p;
      return text
        .trim()
        .split(esc(tree + path.sep))
        .join(esc(shownDir))
        .split(esc(builtin + path.sep))
        .join(`builtin${path.sep}`);
    };
    const exit = r.code === 0 ? 0 : 1;
    if (!io.json) {
      const text = local(r.stdout + r.stderr);
      if (text) io.out(text);
      return exit;
    }
    let results: unknown;
    try {
      results = JSON.parse(local(r.stdout, true));
    } catch {
      results = undefined;
    }
    const stderr = local(r.stderr);
    if (!Array.isArray(results)) {
      throw new Refused(stderr || local(r.stdout) || `the OPA test runner exited with ${r.code}`);
    }
    if (stderr) io.err(stderr);
    const failed = results.filter((x) => isObject(x) && (x.fail === true || x.error !== undefined)).length;
    const error =
      stderr ||
      (failed > 0
        ? `${failed} test${failed === 1 ? '' : 's'} failed`
        : `the OPA test runner exited with ${r.code}`);
    io.out(JSON.stringify({ ok: exit === 0, results, ...(exit === 0 ? {} : { error, exit }) }));
    return exit;
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
    execFile(
      bin,
      args,
      { cwd, env: childEnv(), maxBuffer: 64 * 1024 * 1024, timeout: 300_000 },
      (e, stdout, stderr) => {
        if (e && typeof e.code !== 'number') {
          reject(new CliUsageError(`cannot run the OPA test runner at ${bin}: ${e.message}`));
          return;
        }
        resolve({ code: e ? (e.code as number) : 0, stdout, stderr });
      },
    );
  });
}

/** How long diff waits in all for a replay that is already running (429) to finish. */
const BUSY_BUDGET_MS = 30_000;

/** Retry-After (seconds or an HTTP date) in ms: at least 1 s, 1 s when absent or unreadable. */
function retryAfterMs(header: string | null): number {
  if (header === null) return 1000;
  const ms = /^\d+$/.test(header.trim()) ? Number(header.trim()) * 1000 : Date.parse(header) - Date.now();
  return Number.isFinite(ms) ? Math.max(1000, ms) : 1000;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * The impact replay of the plan, when the server offers POST /api/v1/impact; else why not.
 * `refused` (exit 1): the server refused the candidate set or the request (any 4xx but 404/405,
 * which mean impact is not offered). `failed` (exit 2): the server is busy with another replay
 * for longer than diff waits, or failed (5xx).
 */
async function impactOf(
  server: Server,
  p: Plan,
): Promise<{ text: string[]; json: unknown; refused?: string; failed?: string }> {
  if (changes(p) === 0) return { text: ['impact: no changes to replay'], json: null };
  const policies: Record<string, string | null> = {};
  for (const n of [...p.policies.create, ...p.policies.update]) policies[n] = p.bundle.policies[n] as string;
  for (const n of p.policies.delete) policies[n] = null;
  const data: Record<string, unknown> = {};
  for (const n of [...p.data.create, ...p.data.update, ...p.data.delete]) data[n] = p.bundle.data[n];
  // On the monotonic clock: a wall clock stepped back meanwhile must not stretch the budget.
  const deadline = performance.now() + BUSY_BUDGET_MS;
  let r = await server.call('POST', '/api/v1/impact', { policies, data });
  // One replay runs at a time per server process: wait as it asks, within the budget.
  while (r.status === 429) {
    const wait = retryAfterMs(r.headers.get('retry-after'));
    if (performance.now() + wait > deadline) {
      const failed =
        `the impact replay could not run: the server is busy (429 ${errorOf(r.json)}) and asks to wait ` +
        `${Math.ceil(wait / 1000)} s more, beyond the ${BUSY_BUDGET_MS / 1000} s diff waits in all; try again later`;
      return { text: [], json: null, failed };
    }
    await sleep(wait);
    r = await server.call('POST', '/api/v1/impact', { policies, data });
  }
  if (r.status === 404 || r.status === 405) return { text: ['impact: not available'], json: null };
  if (r.status >= 400 && r.status <= 499) {
    // The candidate set (400 does not compile with the live set, 409 overlaps live data, 413
    // too large) or the request itself is refused: push would be refused too, so the plan
    // fails here already.
    const refused =
      r.status === 400 || r.status === 409
        ? `the plan would be refused: ${errorOf(r.json) || r.status}`
        : `the plan would be refused: the impact replay answered ${r.status} ${errorOf(r.json)}`.trim();
    return { text: [refused], json: r.json, refused };
  }
  if (r.status >= 500) {
    return {
      text: [],
      json: null,
      failed:
        `the impact replay failed: ${r.status} ${errorOf(r.json)} (the server failed; try again)`.trim(),
    };
  }
  const c = r.json.changes ?? {};
  if (
    r.status !== 200 ||
    typeof r.json.replayed !== 'number' ||
    typeof r.json.changed !== 'number' ||
    !isObject(c) ||
    !Object.values(c).every((v) => typeof v === 'number')
  ) {
    throw notArbiter('POST /api/v1/impact', `answered ${r.status} without replayed, changed and changes`);
  }
  const detail = Object.entries(c)
    .map(([k, v]) => `${k} ${String(v)}`)
    .join(', ');
  const errors = typeof r.json.errors === 'number' ? r.json.errors : 0;
  return {
    text: [
      `impact: ${r.json.changed} of ${r.json.replayed} recent decisions would change${detail ? ` (${detail})` : ''}`,
      ...(errors > 0
        ? [
            `impact: ${errors} of the ${r.json.replayed} would be a deny with an evaluation error (see the samples' error)`,
          ]
        : []),
    ],
    json: r.json,
  };
}

async function diff(dir: string, opts: Options, io: Io): Promise<number> {
  const local = await readLocal(dir, true);
  const server = new Server(opts);
  const plan = planOf(local, await readLive(server), opts.prune);
  const impact = await impactOf(server, plan);
  const text = [...planText(plan, server.shown), ...impact.text];
  if (impact.failed) {
    // The plan is still worth printing; the replay's failure is a server problem: exit 2.
    if (!io.json) for (const line of text) io.out(line);
    io.err(`arbiter policy: ${impact.failed}`);
    if (io.json)
      io.out(
        JSON.stringify({ ok: false, plan: planJson(plan), impact: null, error: impact.failed, exit: 2 }),
      );
    return 2;
  }
  print(io, text, {
    ok: !impact.refused,
    plan: planJson(plan),
    impact: impact.json,
    ...(impact.refused ? { refused: impact.refused, error: impact.refused, exit: 1 } : {}),
  });
  return impact.refused ? 1 : 0;
}

/** Applies the plan as one bundle, conditional on the revision it was made against. */
async function push(dir: string, opts: Options, io: Io): Promise<number> {
  const local = await readLocal(dir, true);
  const server = new Server(opts);
  const plan = planOf(local, await readLive(server), opts.prune);
  const text = planText(plan, server.shown);
  if (changes(plan) === 0) {
    print(io, [...text, `nothing to push: revision ${plan.revision} is live`], {
      ok: true,
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
  if (r.status >= 400 && r.status <= 499) {
    throw new HttpRefused(r.status, `push refused: ${r.status} ${errorOf(r.json)}`.trim());
  }
  if (r.status >= 500) {
    throw new CliUsageError(
      `push failed: ${r.status} ${errorOf(r.json)} (the server failed; diff shows what is live)`,
    );
  }
  if (r.status !== 200) throw notArbiter('POST /api/v1/bundle', `answered ${r.status}`);
  const revision = revisionOf(r.json, 'POST /api/v1/bundle');
  print(io, [...text, `pushed: revision ${revision} is live`], {
    ok: true,
    plan: planJson(plan),
    revision,
    pushed: true,
    result: r.json,
  });
  return 0;
}

/**
 * Writes the live set in DIR's layout: NAME.rego per policy, top-level data documents in
 * data.json, deeper ones in PATH/data.json. DIR must be empty or absent unless --force, which
 * writes each one back to the file of DIR that holds it (leaving a file already live untouched)
 * and removes the other policy and data files DIR holds (never its *_test.rego files). Nothing is
 * written outside DIR: a link (or anything but a regular file or directory) where pull would
 * write is refused, and links anywhere in DIR count as content for the --force guard.
 */
async function pull(dir: string, opts: Options, io: Io): Promise<number> {
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
  // With --force over a directory that reads as a policy directory, each policy and data
  // document goes back to the file that holds it (team/x.rego stays team/x.rego, rbac/data.json
  // stays), and a file whose content is already live is left as it is, byte for byte: a pull at
  // the live revision changes nothing in git.
  const existing = st && opts.force ? await readPolicyDir(dir).catch(() => undefined) : undefined;
  const files = new Map<string, string>();
  /** Files of `files` that already hold exactly what is live: not written. */
  const kept = new Set<string>();
  for (const [name, rego] of [...live.rego].sort(([a], [b]) => a.localeCompare(b))) {
    const there = existing?.modules.find((m) => m.name === name);
    const rel = there?.file ?? `${name}.rego`;
    files.set(rel, rego);
    if (there?.rego === rego) kept.add(rel);
  }
  const rootFile = [...(existing?.dataFiles.values() ?? [])].find((f) => !f.includes('/')) ?? 'data.json';
  /** Each data file's documents: the root one's by path, a deeper one's value alone. */
  const dataFiles = new Map<string, Map<string, unknown>>();
  for (const [p, value] of [...live.data].sort(([a], [b]) => a.localeCompare(b))) {
    const rel = existing?.dataFiles.get(p) ?? (p.includes('/') ? `${p}/data.json` : rootFile);
    const docs = dataFiles.get(rel) ?? new Map<string, unknown>();
    docs.set(p, value);
    dataFiles.set(rel, docs);
  }
  for (const [rel, docs] of dataFiles) {
    const root = !rel.includes('/');
    const value = root ? Object.fromEntries(docs) : docs.values().next().value;
    // A data.yaml is written as JSON (which YAML reads as the same value under any schema).
    files.set(rel, JSON.stringify(value, null, 2) + '\n');
    const before = existing?.data.filter((d) => existing.dataFiles.get(d.path) === rel) ?? [];
    if (
      before.length > 0 &&
      before.length === docs.size &&
      before.every((d) => docs.has(d.path) && canonicalJson(docs.get(d.path)) === canonicalJson(d.value))
    ) {
      kept.add(rel);
    }
  }
  if (st) {
    for (const rel of files.keys()) await checkTarget(dir, rel);
    const entries = await readdir(dir, { recursive: true, withFileTypes: true });
    const ours: string[] = [];
    const odd: string[] = [];
    for (const e of entries) {
      if (e.isDirectory()) continue;
      const rel = path.relative(dir, path.join(e.parentPath, e.name)).split(path.sep).join('/');
      if (isPolicyOrDataFile(rel)) ours.push(rel);
      else if (!e.isFile()) odd.push(rel);
    }
    const holds = [...ours, ...odd];
    if (holds.length > 0 && !opts.force) {
      throw new Refused(
        `${dir} already holds policies or data, or links (${holds[0]}…); pass --force to replace them`,
      );
    }
    // Removing a link removes the link, never what it points to. A file that stays is replaced
    // (or kept) below.
    for (const rel of ours) if (!files.has(rel)) await rm(path.join(dir, rel));
  }
  await mkdir(dir, { recursive: true });
  for (const [rel, text] of files) if (!kept.has(rel)) await writeInside(dir, rel, text);
  const written = [...files.keys()];
  // A bundle's null deletes a document, so push refuses a null one: say so now (pulled all the
  // same: left out, the next push --prune would delete the live document).
  const warnings = [...live.data]
    .filter(([, v]) => v === null)
    .map(
      ([p]) =>
        `warning: data document ${p} is null; it is written to ${p.includes('/') ? `${p}/data.json` : 'data.json'}, ` +
        "but check, diff and push refuse a null document (a bundle's null deletes it): give it a value, or " +
        `remove it from the directory, push without --prune and manage it with PUT /api/v1/data/${p}`,
    );
  for (const w of warnings) io.err(w);
  print(
    io,
    [
      `pulled revision ${live.revision} into ${dir}:`,
      ...written.map((f) => `  ${f}${kept.has(f) ? ' (unchanged)' : ''}`),
    ],
    {
      ok: true,
      revision: live.revision,
      files: written,
      unchanged: written.filter((f) => kept.has(f)),
      ...(warnings.length > 0 ? { warnings } : {}),
    },
  );
  return 0;
}
