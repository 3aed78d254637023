import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from '../observability/logger.js';
import { busy, conflict, unavailable } from '../errors.js';
import { BUILTIN_MODULE_PATH, type Module } from './compiler.js';
import type { DecisionStatus } from './evaluator.js';
import { childEnv } from '../common/child-env.js';

/** One rule of one policy that succeeded while the decision was evaluated. */
export interface FiredRule {
  policy: string;
  row: number;
  rule: string;
  /** The rule's first source line, trimmed. */
  text: string;
}

export interface Explanation {
  status: DecisionStatus | 'error';
  /** The budgets the decision declared (`limits`), unchecked, as the evaluator gives them. */
  limits?: unknown;
  fired: FiredRule[];
}

const MIB = 1024 * 1024;
/** How long one `opa eval --explain` may take before the explanation is refused (a 503). */
const EXPLAIN_TIMEOUT_MS = 30_000;
/** `opa eval` processes one serving process runs at once; more explanations are a 429. */
const MAX_RUNNING = 2;
/**
 * The address space one `opa eval --explain` may map, in MiB: its RLIMIT_AS, set for that child
 * only. OPA keeps the whole trace in memory until evaluation ends, and a policy that iterates a
 * lot (nested `some … in` over a few hundred items) makes it grow by hundreds of MB a second, to
 * gigabytes; under the limit Go's allocator fails ("out of memory") and OPA exits. Resident
 * memory can never exceed it. Go reserves about 0.7 GiB of address space at start that it never
 * touches, so this leaves OPA about 300 MB of heap: the example policies' explanation needs
 * about 45 MB. Not a setting: how much heap a limit leaves is not monotonic in the limit under
 * Go's runtime (1.2 GiB leaves almost none), so the value is one the tests exercise.
 */
const EXPLAIN_MEMORY_MIB = 1024;
/**
 * The most trace output read from OPA: under EXPLAIN_MEMORY_MIB it writes at most about 35 MB,
 * so this only bounds what this process holds should that ever change.
 */
const MAX_TRACE_BYTES = 64 * MIB;
/**
 * How the Go runtime says its heap could not grow (under RLIMIT_AS): on stderr, as it exits. Not
 * the failures of a runtime that could not even start ("failed to reserve", "failed to create
 * new OS thread"): those say nothing about the decision, and answer 503 like any failure to run.
 */
const GO_OUT_OF_MEMORY =
  /^(fatal error: (runtime: )?(out of memory|cannot allocate memory)|runtime: (out of memory|cannot allocate memory))/m;

/** The bounds of one explanation, as the API document states them. */
export const EXPLAIN_BOUNDS = {
  seconds: EXPLAIN_TIMEOUT_MS / 1000,
  memoryMib: EXPLAIN_MEMORY_MIB,
  traceMib: MAX_TRACE_BYTES / MIB,
} as const;

/** One error of OPA's JSON output (`opa eval --format json`, on stdout, with a non-zero exit). */
interface OpaError {
  code?: string;
  message?: string;
  location?: { file?: string; row?: number; col?: number };
}

/** How `opa eval` ended when it was not killed. */
interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** One event of OPA's JSON trace (`opa eval --format json --explain full`). */
interface TraceEvent {
  Op?: string;
  Node?: { head?: { name?: string; ref?: { type: string; value: unknown }[] } };
  Location?: { file?: string; row?: number };
}

/**
 * OPA's own explanation of one decision: the OPA CLI (`opa eval --explain full`) evaluates
 * data.authz.decision for an input against a policy set and its data, and every rule of a user
 * policy that exited (succeeded) is reported with its location. Runs on the Platform side only,
 * never on the decision path.
 */
export class Explainer {
  private running = 0;

  constructor(
    private readonly opaBin: string,
    private readonly log?: Logger,
    /** How long one `opa eval` may run (ms): EXPLAIN_TIMEOUT_MS but in tests. */
    private readonly timeoutMs = EXPLAIN_TIMEOUT_MS,
  ) {}

  async explain(modules: Module[], data: Record<string, unknown>, input: unknown): Promise<Explanation> {
    if (this.running >= MAX_RUNNING) throw busy('too many explanations are running; try again shortly');
    this.running++;
    try {
      return await this.evaluate(modules, data, input);
    } finally {
      this.running--;
    }
  }

  private async evaluate(
    modules: Module[],
    data: Record<string, unknown>,
    input: unknown,
  ): Promise<Explanation> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'arbiter-explain-'));
    try {
      const files = new Map<string, Module>();
      const args = ['eval', '--format', 'json', '--explain', 'full', '--stdin-input'];
      for (const [i, m] of modules.entries()) {
        // Names are [a-z0-9._-]: a safe file name; the index keeps them apart from data.json.
        const file = path.join(dir, `${i}-${m.name}.rego`);
        await writeFile(file, m.rego);
        files.set(file, m);
        args.push('-d', file);
      }
      const builtin = path.join(dir, 'authz.rego');
      await writeFile(builtin, await readFile(BUILTIN_MODULE_PATH, 'utf8'));
      const dataFile = path.join(dir, 'data.json');
      await writeFile(dataFile, JSON.stringify(data));
      args.push('-d', builtin, '-d', dataFile, 'data.authz.decision');
      const run = await this.run(args, JSON.stringify(input));
      let parsed: {
        result?: { expressions?: { value?: { status?: unknown; limits?: unknown } }[] }[];
        explanation?: TraceEvent[];
        errors?: OpaError[];
      } = {};
      try {
        parsed = JSON.parse(run.stdout) as typeof parsed;
      } catch {
        if (run.code === 0) throw unavailable('the OPA explanation could not be read');
      }
      if (run.code !== 0) {
        const errors = Array.isArray(parsed.errors) ? parsed.errors : [];
        // OPA's own diagnostic about the policy set (a conflict, say): it fails the same way every
        // time, so it is a 409 naming policies and rows, never the temporary files.
        if (errors.length > 0) {
          throw conflict(`the OPA explanation failed: ${describe(errors, dir, files, builtin, dataFile)}`);
        }
        // Anything else (OPA could not start, a crash) is for the operator's log, not the caller.
        this.log?.warn(
          { code: run.code, stderr: run.stderr.split('\n')[0] ?? '' },
          'opa eval --explain failed',
        );
        throw unavailable('the OPA explanation failed');
      }
      const value = parsed.result?.[0]?.expressions?.[0]?.value;
      const status =
        value && (value.status === 'allow' || value.status === 'deny' || value.status === 'requires_approval')
          ? value.status
          : 'error';
      return {
        status,
        ...(value?.limits !== undefined ? { limits: value.limits } : {}),
        fired: firedRules(parsed.explanation ?? [], files),
      };
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * Runs `opa eval` under the memory and time bounds. Rejects with a message of its own when a
   * bound ends it; resolves with its exit code otherwise. Node's error messages are never passed
   * on: they hold the whole command line, temporary paths included.
   */
  private run(args: string[], stdin: string): Promise<Run> {
    return new Promise((resolve, reject) => {
      // POSIX sh sets the limit for itself, then becomes OPA ("$0" "$@": no quoting to get wrong).
      const limit = `ulimit -v ${EXPLAIN_MEMORY_MIB * 1024} && exec "$0" "$@"`;
      const child = execFile(
        '/bin/sh',
        ['-c', limit, this.opaBin, ...args],
        { env: childEnv(), maxBuffer: MAX_TRACE_BYTES, timeout: this.timeoutMs, killSignal: 'SIGKILL' },
        (err, stdout, stderr) => {
          if (!err) return resolve({ code: 0, stdout, stderr });
          // A bound on memory ends it the same way every time: a 409, not a 503 inviting a retry.
          // Time can run out on a loaded machine: that one is a 503.
          if (err.code === 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER') {
            return reject(conflict(`the explanation's trace was larger than ${EXPLAIN_BOUNDS.traceMib} MiB`));
          }
          if (err.killed) {
            return reject(unavailable(`the explanation did not finish within ${this.timeoutMs / 1000} s`));
          }
          if (GO_OUT_OF_MEMORY.test(stderr)) {
            return reject(
              conflict(`the explanation needed more than ${EXPLAIN_BOUNDS.memoryMib} MiB of memory`),
            );
          }
          resolve({ code: typeof err.code === 'number' ? err.code : -1, stdout, stderr });
        },
      );
      // OPA may exit before it has read its input (it could not start, a bound ended it): the
      // write then fails with EPIPE, which must not become an uncaught error that ends the
      // process. How the child ended is reported by the callback above.
      child.stdin?.on('error', () => undefined);
      child.stdin?.end(stdin);
    });
  }
}

/**
 * OPA's errors as `policy agent:34:1: eval_conflict_error: …`, at most three, with every temporary
 * file named by the policy it holds (as compile errors name them) and on one line.
 */
function describe(
  errors: OpaError[],
  dir: string,
  files: Map<string, Module>,
  builtin: string,
  dataFile: string,
): string {
  const names = new Map<string, string>([
    [builtin, 'builtin/authz.rego'],
    [dataFile, 'data'],
  ]);
  for (const [file, m] of files) names.set(file, `policy ${m.name}`);
  const clean = (text: string) => {
    let t = text;
    for (const [file, name] of names) t = t.split(file).join(name);
    // Whatever else names the directory (nothing OPA writes today) loses it too.
    return t
      .split(dir + path.sep)
      .join('')
      .split(dir)
      .join('')
      .replace(/\s*\n\s*/g, ' ');
  };
  return errors
    .slice(0, 3)
    .map((e) => {
      const loc = e.location;
      const where = loc?.file ? `${clean(loc.file)}:${loc.row ?? 0}:${loc.col ?? 0}: ` : '';
      return clean(`${where}${e.code ? e.code + ': ' : ''}${e.message ?? 'evaluation failed'}`);
    })
    .join('; ');
}

/** Every rule of a user policy that exited, once per (policy, row), in policy then row order. */
function firedRules(trace: TraceEvent[], files: Map<string, Module>): FiredRule[] {
  const fired = new Map<string, FiredRule>();
  for (const e of trace) {
    if (e.Op !== 'Exit' || !e.Node?.head || !e.Location?.file || !e.Location.row) continue;
    const m = files.get(e.Location.file);
    if (!m) continue;
    const key = `${m.name}\0${e.Location.row}`;
    if (fired.has(key)) continue;
    const head = e.Node.head;
    const rule =
      head.name ??
      (head.ref ?? [])
        .map((t, i) => (i === 0 || t.type !== 'string' ? String(t.value) : `[${JSON.stringify(t.value)}]`))
        .join('');
    const text = (m.rego.split('\n')[e.Location.row - 1] ?? '').trim();
    fired.set(key, { policy: m.name, row: e.Location.row, rule, text });
  }
  return [...fired.values()].sort((a, b) => a.policy.localeCompare(b.policy) || a.row - b.row);
}
