// Starts the three servers the benchmark compares: Arbiter as users run it, OPA's own server on
// the same Rego, and a bare node:http server.
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort, spawnManaged, waitHttp, type Managed } from './proc.js';

/** Repository root: this file runs as dist/bench/lib/targets.js. */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const MAIN = path.join(REPO, 'dist', 'src', 'main.js');
export const POLICY_DIR = path.join(REPO, 'policies');
/** The small agent policy of the "small" scenario (four actions, one deny, one approval rule). */
export const SMALL_POLICY_DIR = path.join(REPO, 'bench', 'policies', 'small');
export const BUILTIN_REGO = path.join(REPO, 'src', 'policy', 'rego', 'authz.rego');
export const ADMIN_KEY = 'bench-admin-key-0123456789abcdef';

/** The OPA CLI the project builds (ARBITER_OPA_BIN wins, as in scripts/opa-path.mjs). */
export function opaBin(): string {
  return process.env.ARBITER_OPA_BIN || path.join(REPO, '.opa-bin', 'opa');
}

const tempDirs: string[] = [];
export function tempDir(prefix: string): string {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.push(d);
  return d;
}
export function removeTempDirs(): void {
  for (const d of tempDirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

export interface ArbiterProc {
  proc: Managed;
  engine: string;
  platform: string;
  dataDir: string;
  agentKey: string;
  workers: string | undefined;
}

/**
 * Arbiter with the example policies, SQLite in a fresh data directory and the default (durable)
 * settings: only ports, keys, the data directory and the log level are set. ARBITER_WORKERS is
 * passed through when the caller set it. The load uses an agent key made with the CLI.
 */
export async function startArbiter(
  nodeFlags: string[] = [],
  opts: {
    databaseUrl?: string;
    agentKey?: string;
    policyDir?: string;
    /** Settings a benchmark compares (ARBITER_* variables), beside the defaults. */
    settings?: Record<string, string>;
  } = {},
): Promise<ArbiterProc> {
  const dataDir = tempDir('arbiter-bench-');
  const [enginePort, platformPort] = [await freePort(), await freePort()];
  // Inherit nothing ARBITER_* from the caller's shell except the two settings that say where
  // things are or how many processes to run: the benchmark measures the defaults.
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('ARBITER_')) env[k] = v;
  Object.assign(env, {
    ARBITER_DATA_DIR: dataDir,
    ARBITER_ENGINE_PORT: String(enginePort),
    ARBITER_PLATFORM_PORT: String(platformPort),
    ARBITER_ADMIN_KEY: ADMIN_KEY,
    ARBITER_POLICY_DIR: opts.policyDir ?? POLICY_DIR,
    ARBITER_LOG_LEVEL: 'warn',
    ARBITER_OPA_BIN: opaBin(),
    // One key sends every request, a share of them to review, thousands a second: with the cap on
    // pending approvals (1 000 by default) they would turn into its denies within a second. The
    // bench measures deciding, so no cap (docs/performance.md measures the cap's own cost).
    ARBITER_QUEUE_MAX_PENDING_PER_KEY: '0',
  });
  const workers = process.env.ARBITER_WORKERS;
  if (workers) env.ARBITER_WORKERS = workers;
  if (opts.databaseUrl) env.ARBITER_DATABASE_URL = opts.databaseUrl;
  Object.assign(env, opts.settings ?? {});

  // A second process on a shared database uses the key the first one made.
  let agentKey = opts.agentKey;
  if (agentKey === undefined) {
    const created = spawnSync(
      process.execPath,
      [MAIN, 'keys', 'create', '--name', 'bench', '--scopes', 'authorize'],
      { env, encoding: 'utf8' },
    );
    if (created.status !== 0) throw new Error(`arbiter keys create failed: ${created.stderr}`);
    agentKey = (JSON.parse(created.stdout) as { key: string }).key;
  }

  // Started through a symlink so that its command line is not `…/dist/src/main.js serve`: a full
  // run takes minutes, and someone stopping their own dev server with `pkill -f main.js` on the
  // same machine should not take the benchmark's Arbiter with it. Node runs the real file.
  const entry = path.join(tempDir('arbiter-bench-entry-'), 'arbiter-bench-serve.js');
  symlinkSync(MAIN, entry);
  const proc = spawnManaged('arbiter', process.execPath, [...nodeFlags, entry, 'serve'], { env, cwd: REPO });
  const engine = `http://127.0.0.1:${enginePort}`;
  const platform = `http://127.0.0.1:${platformPort}`;
  await waitHttp(`${engine}/healthz`, proc);
  await waitHttp(`${platform}/healthz`, proc);
  return { proc, engine, platform, dataDir, agentKey, workers };
}

export interface OpaProc {
  proc: Managed;
  url: string;
  version: string;
}

/**
 * `opa run --server` on the example modules (without tests), the built-in decision module and
 * the example data, answering POST /v1/data/authz/decision.
 */
export async function startOpa(policyDir = POLICY_DIR): Promise<OpaProc> {
  const dir = tempDir('arbiter-bench-opa-');
  const bundle = path.join(dir, 'bundle');
  mkdirSync(path.join(bundle, 'policies'), { recursive: true });
  mkdirSync(path.join(bundle, 'builtin'), { recursive: true });
  for (const f of readdirSync(policyDir)) {
    // policies/authz.rego is a copy of the built-in module, copied below from its source.
    if (f.endsWith('.rego') && !f.endsWith('_test.rego') && f !== 'authz.rego') {
      copyFileSync(path.join(policyDir, f), path.join(bundle, 'policies', f));
    }
  }
  if (existsSync(path.join(policyDir, 'data.json'))) {
    copyFileSync(path.join(policyDir, 'data.json'), path.join(bundle, 'data.json'));
  }
  copyFileSync(BUILTIN_REGO, path.join(bundle, 'builtin', 'authz.rego'));
  const bin = opaBin();
  const v = spawnSync(bin, ['version'], { encoding: 'utf8' });
  if (v.status !== 0) throw new Error(`cannot run ${bin}: ${v.stderr || v.error?.message}`);
  const version = /^Version:\s*(\S+)/m.exec(v.stdout)?.[1] ?? 'unknown';
  const port = await freePort();
  const proc = spawnManaged('opa', bin, [
    'run',
    '--server',
    '--addr',
    `127.0.0.1:${port}`,
    '--log-level',
    'error',
    bundle,
  ]);
  const url = `http://127.0.0.1:${port}`;
  await waitHttp(`${url}/health`, proc);
  return { proc, url, version };
}

export interface NodeHttpProc {
  proc: Managed;
  url: string;
}

export async function startNodeHttp(): Promise<NodeHttpProc> {
  const port = await freePort();
  const script = path.join(REPO, 'dist', 'bench', 'node-http.js');
  const proc = spawnManaged('node_http', process.execPath, [script], {
    env: { ...process.env, PORT: String(port) },
  });
  const url = `http://127.0.0.1:${port}`;
  // node:http answers GET too; readiness only.
  await waitHttp(url, proc);
  return { proc, url };
}
