import { type ChildProcess, execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { repoRoot } from '../config.js';
import { ALLOWED_BUILTINS, restrictCapabilities } from './capabilities.js';
import { type LocatedError, type ParsedModule, relocateContractErrors, ruleSites } from './contract.js';
import { PAIRED_ENTRYPOINT } from './paired.js';
import type { ParsedPolicy, RegoAst } from './rego-ast.js';
import { childEnv } from '../common/child-env.js';

/** How many parse trees the compiler keeps (paired.ts reads each module of a set again on every change). */
const PARSED_KEPT = 512;
/** At most this many `opa parse` processes at once: a set of hundreds of modules is parsed a few at a time. */
const PARSES_AT_ONCE = 4;
/** The niceness of the OPA runs nothing waits for (paired modules, in the background). */
const BACKGROUND_PRIORITY = 10;

/** The reserved package of the built-in decision module, and the one entrypoint we evaluate. */
export const RESERVED_PACKAGE = 'data.authz';
export const ENTRYPOINT = 'authz/decision';
/** The built-in module's list of malformed thresholds, checked after every change (not per decision). */
export const THRESHOLD_ERRORS = 'authz/threshold_errors';
/**
 * How many errors `opa check` may find before it stops (its default is 10): the built-in module's
 * errors about one user rule can fill ten alone and hide the next rule's, before they are folded
 * into one per rule (contract.ts). At most MAX_SHOWN are shown, then how many more there were.
 */
const CHECK_MAX_ERRORS = 100;
const MAX_SHOWN = 10;
export const BUILTIN_MODULE_PATH = path.join(repoRoot, 'src', 'policy', 'rego', 'authz.rego');

export interface Module {
  name: string;
  rego: string;
}

/** One located complaint of the compiler: the policy (undefined for the built-in module) and where. */
export interface CompileProblem {
  policy: string | undefined;
  row: number | undefined;
  col: number | undefined;
  message: string;
}

/**
 * A policy set the compiler refused; `message` names policy, row, column and the reason, and
 * `problems` holds the same one by one (the CLI turns them into file:row:col lines).
 */
export class CompileError extends Error {
  constructor(
    message: string,
    readonly problems: CompileProblem[] = [],
  ) {
    super(message);
  }
}

type OpaError = LocatedError;

/**
 * Compiles policy sets with the official OPA CLI: `opa check` (located errors, restricted
 * capabilities), `opa inspect` (reserved package), then `opa build -t wasm`. Called only when
 * policies change, never per decision.
 */
export class RegoCompiler {
  private workDir = '';
  private capsFile = '';
  private allBuiltins = new Set<string>();
  private builtinRego = '';
  private identity = '';
  /** Parse trees by the text parsed: a set's modules rarely all change at once. */
  private readonly parsed = new Map<string, Promise<RegoAst>>();
  private parsing = 0;
  private readonly parseWaiters: (() => void)[] = [];
  /** The `opa` processes running now: close() ends them. */
  private readonly running = new Set<ChildProcess>();

  /** `opaBin`: the `opa` binary (ARBITER_OPA_BIN, or the one `npm ci` built). */
  constructor(readonly opaBin: string) {}

  async init(): Promise<void> {
    this.workDir = await mkdtemp(path.join(os.tmpdir(), 'arbiter-opa-'));
    let current: { builtins: { name: string }[] };
    try {
      const r = await this.run(['capabilities', '--current']);
      if (r.code !== 0) throw new Error(r.stderr);
      current = JSON.parse(r.stdout) as typeof current;
    } catch (e) {
      throw new Error(
        `cannot run the OPA compiler at ${this.opaBin} (${(e as Error).message.split('\n')[0]}). ` +
          'Run `npm ci` to build it, or set ARBITER_OPA_BIN to an opa v1.x binary.',
        { cause: e },
      );
    }
    this.allBuiltins = new Set(current.builtins.map((b) => b.name));
    this.capsFile = path.join(this.workDir, 'capabilities.json');
    await writeFile(this.capsFile, JSON.stringify(restrictCapabilities(current)));
    this.builtinRego = await readFile(BUILTIN_MODULE_PATH, 'utf8');
    const version = await this.run(['version']);
    this.identity = `${version.stdout}\0${JSON.stringify(restrictCapabilities(current))}\0${this.builtinRego}`;
  }

  /** Identifies what a compile would produce: the modules, the built-in module and the compiler. */
  setHash(modules: Module[]): string {
    const h = createHash('sha256').update(this.identity);
    for (const m of [...modules].sort((a, b) => a.name.localeCompare(b.name))) {
      h.update('\0').update(m.name).update('\0').update(m.rego);
    }
    return h.digest('hex');
  }

  /**
   * Ends the `opa` processes still running (their callers see them fail), waiting until each has
   * exited (so that none is left unreaped), and removes the work directory.
   */
  async close(): Promise<void> {
    const exited = [...this.running].map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve();
          child.once('exit', () => resolve());
          child.kill('SIGKILL');
        }),
    );
    await Promise.all(exited);
    if (this.workDir) await rm(this.workDir, { recursive: true, force: true });
  }

  /** Compiles user modules plus the built-in decision module to one wasm binary. */
  async compile(modules: Module[]): Promise<Buffer> {
    const dir = await mkdtemp(path.join(this.workDir, 'set-'));
    try {
      await mkdir(path.join(dir, 'policies'));
      await mkdir(path.join(dir, 'builtin'));
      await writeFile(path.join(dir, 'builtin', 'authz.rego'), this.builtinRego);
      for (const m of modules) await writeFile(path.join(dir, 'policies', `${m.name}.rego`), m.rego);

      const check = await this.run(
        [
          'check',
          '--format',
          'json',
          '--max-errors',
          String(CHECK_MAX_ERRORS),
          '--capabilities',
          this.capsFile,
          '.',
        ],
        dir,
      );
      if (check.code !== 0) throw await this.refusal(check.stderr || check.stdout, dir, modules);

      const inspect = await this.run(['inspect', '--format', 'json', 'policies'], dir);
      if (inspect.code !== 0) throw await this.refusal(inspect.stderr || inspect.stdout, dir, modules);
      const inspected = JSON.parse(inspect.stdout) as { namespaces?: Record<string, string[]> };
      for (const [ns, files] of Object.entries(inspected.namespaces ?? {})) {
        if (ns === RESERVED_PACKAGE) {
          const message =
            "package authz is reserved for Arbiter's decision module; use package authz.agent or authz.human";
          throw new CompileError(
            `${files.map((f) => policyName(f)).join(', ')}: ${message}`,
            files.map((f) => ({ policy: policyOf(f), row: undefined, col: undefined, message })),
          );
        }
      }

      const out = path.join(dir, 'bundle.tar.gz');
      const built = await this.run(
        [
          'build',
          '-t',
          'wasm',
          '-e',
          ENTRYPOINT,
          '-e',
          THRESHOLD_ERRORS,
          '--capabilities',
          this.capsFile,
          '-o',
          out,
          'builtin',
          'policies',
        ],
        dir,
      );
      if (built.code !== 0) throw await this.refusal(built.stderr || built.stdout, dir, modules);
      const wasm = extractFromTarGz(await readFile(out), '/policy.wasm');
      if (!wasm) throw new Error('opa build produced no policy.wasm');
      return wasm;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * `opa parse` of each module (with locations; paired.ts), the built-in decision module as
   * `builtin`. Rejects when one does not parse (a set that compiled always does).
   */
  async parse(modules: Module[]): Promise<{ modules: ParsedPolicy[]; builtin: ParsedPolicy }> {
    const one = async (m: Module): Promise<ParsedPolicy> => ({ ...m, ast: await this.parseText(m.rego) });
    return {
      modules: await Promise.all(modules.map(one)),
      builtin: await one({ name: 'builtin-authz', rego: this.builtinRego }),
    };
  }

  private parseText(rego: string): Promise<RegoAst> {
    const digest = createHash('sha256').update(rego).digest('hex');
    let p = this.parsed.get(digest);
    if (p) {
      // Kept longest is the one used longest ago: a set of up to PARSED_KEPT modules is parsed once.
      this.parsed.delete(digest);
      this.parsed.set(digest, p);
      return p;
    }
    p = this.limited(async () => {
      const dir = await mkdtemp(path.join(this.workDir, 'parse-'));
      try {
        await writeFile(path.join(dir, 'm.rego'), rego);
        const r = await this.run(
          ['parse', '--format', 'json', '--json-include', 'locations,-comments', 'm.rego'],
          dir,
          true,
        );
        if (r.code !== 0) throw new Error(`opa parse failed: ${(r.stderr || r.stdout).trim()}`);
        return JSON.parse(r.stdout) as RegoAst;
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });
    p.catch(() => this.parsed.delete(digest));
    this.parsed.set(digest, p);
    if (this.parsed.size > PARSED_KEPT) this.parsed.delete(this.parsed.keys().next().value as string);
    return p;
  }

  /**
   * Compiles a paired module (paired.ts): the live modules and the built-in decision module as
   * `compile` does, and the generated modules beside them, with the one entrypoint
   * PAIRED_ENTRYPOINT. The live set has compiled already, so no check comes first.
   */
  async compilePaired(live: Module[], generated: Module[]): Promise<Buffer> {
    const dir = await mkdtemp(path.join(this.workDir, 'paired-'));
    try {
      for (const sub of ['policies', 'builtin', 'paired']) await mkdir(path.join(dir, sub));
      await writeFile(path.join(dir, 'builtin', 'authz.rego'), this.builtinRego);
      for (const m of live) await writeFile(path.join(dir, 'policies', `${m.name}.rego`), m.rego);
      for (const m of generated) await writeFile(path.join(dir, 'paired', `${m.name}.rego`), m.rego);
      const out = path.join(dir, 'bundle.tar.gz');
      const built = await this.run(
        [
          'build',
          '-t',
          'wasm',
          '-e',
          PAIRED_ENTRYPOINT,
          '--capabilities',
          this.capsFile,
          '-o',
          out,
          'builtin',
          'policies',
          'paired',
        ],
        dir,
        true,
      );
      if (built.code !== 0)
        throw new Error(`the paired module does not compile: ${(built.stderr || built.stdout).trim()}`);
      const wasm = extractFromTarGz(await readFile(out), '/policy.wasm');
      if (!wasm) throw new Error('opa build produced no policy.wasm');
      return wasm;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * Turns OPA's JSON errors into one error naming policy, row, column and the reason. Errors that
   * the built-in module meets reading a user rule of the wrong shape name that rule instead
   * (contract.ts), since the user cannot change the built-in module's rows.
   */
  private async refusal(output: string, dir: string, modules: Module[]): Promise<CompileError> {
    let errors: OpaError[];
    try {
      errors = (JSON.parse(output) as { errors: OpaError[] }).errors;
    } catch {
      const text = output.trim().replace(/\S*\/policies\//g, '') || 'policy set does not compile';
      return new CompileError(text, [{ policy: undefined, row: undefined, col: undefined, message: text }]);
    }
    const files = modules.map((m) => ({ file: path.join('policies', `${m.name}.rego`), text: m.rego }));
    // Each file is parsed at most once, however many errors or rules ask for it.
    const parsed = new Map<string, Promise<ParsedModule | undefined>>();
    const parse = (file: string) => {
      let p = parsed.get(file);
      if (!p) {
        p = this.run(['parse', '--format', 'json', '--json-include', 'locations,-comments', file], dir).then(
          (r) => (r.code === 0 ? (JSON.parse(r.stdout) as ParsedModule) : undefined),
        );
        parsed.set(file, p);
      }
      return p;
    };
    errors = await relocateContractErrors(
      errors,
      (file) => policyOf(file) === undefined,
      this.builtinRego,
      (kind, name) => ruleSites(files, kind, name, parse),
    );
    const problems = errors.slice(0, MAX_SHOWN).map((e): CompileProblem => {
      let msg = e.message;
      const fn = /^undefined function (\S+)$/.exec(msg)?.[1];
      if (fn && this.allBuiltins.has(fn) && !ALLOWED_BUILTINS.has(fn)) {
        msg = `builtin ${fn} is not allowed: Arbiter evaluates policies in WebAssembly without it`;
      }
      const loc = e.location;
      return {
        policy: loc ? policyOf(loc.file) : undefined,
        row: loc?.row,
        col: loc?.col,
        message: `${e.code ? e.code + ': ' : ''}${msg}`,
      };
    });
    const located = errors.slice(0, MAX_SHOWN).map((e, i) => {
      const loc = e.location;
      const where = loc ? `${policyName(loc.file)}:${loc.row}:${loc.col}: ` : '';
      return `${where}${problems[i]?.message ?? ''}`;
    });
    const more = errors.length > MAX_SHOWN ? `; and ${errors.length - MAX_SHOWN} more errors` : '';
    return new CompileError(located.join('; ') + more, problems);
  }

  /**
   * Runs the OPA CLI; rejects only when it cannot be started or times out. `background` work (a
   * paired module: nothing waits for it) runs at a lower CPU priority, so that decisions come first.
   */
  private run(
    args: string[],
    cwd?: string,
    background = false,
  ): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve, reject) => {
      const child = execFile(
        this.opaBin,
        args,
        { cwd, env: childEnv(), maxBuffer: 64 * 1024 * 1024, timeout: 120_000 },
        (err, stdout, stderr) => {
          this.running.delete(child);
          if (err && typeof err.code !== 'number') return reject(err);
          resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
        },
      );
      this.running.add(child);
      if (background && child.pid !== undefined) {
        try {
          os.setPriority(child.pid, BACKGROUND_PRIORITY);
        } catch {
          // Not allowed here, or it has exited already: it runs at the usual priority.
        }
      }
    });
  }

  /** Runs `fn` when fewer than PARSES_AT_ONCE parses are running. */
  private async limited<T>(fn: () => Promise<T>): Promise<T> {
    while (this.parsing >= PARSES_AT_ONCE) await new Promise<void>((r) => this.parseWaiters.push(r));
    this.parsing++;
    try {
      return await fn();
    } finally {
      this.parsing--;
      this.parseWaiters.shift()?.();
    }
  }
}

/** `policies/foo.rego` → `foo`; undefined for the built-in module. */
function policyOf(file: string): string | undefined {
  return /(?:^|\/)policies\/(.+)\.rego$/.exec(file)?.[1];
}

/** `policies/foo.rego` → `policy foo`; the built-in module keeps its file name. */
function policyName(file: string): string {
  const m = /(?:^|\/)policies\/(.+)\.rego$/.exec(file);
  return m ? `policy ${m[1]}` : file.replace(/^.*\/builtin\//, 'builtin/');
}

/** Reads one file out of a gzipped ustar archive (what `opa build` writes). */
export function extractFromTarGz(gz: Buffer, name: string): Buffer | undefined {
  const tar = gunzipSync(gz);
  let off = 0;
  while (off + 512 <= tar.length) {
    const header = tar.subarray(off, off + 512);
    if (header.every((b) => b === 0)) break;
    const field = (start: number, len: number) =>
      header
        .subarray(start, start + len)
        .toString('utf8')
        .replace(/\0.*$/s, '');
    const prefix = field(345, 155);
    const entry = (prefix ? prefix + '/' : '') + field(0, 100);
    const size = parseInt(field(124, 12).trim() || '0', 8);
    const bodyStart = off + 512;
    if (entry === name || '/' + entry.replace(/^\.?\//, '') === name) {
      return Buffer.from(tar.subarray(bodyStart, bodyStart + size));
    }
    off = bodyStart + Math.ceil(size / 512) * 512;
  }
  return undefined;
}
