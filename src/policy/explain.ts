import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { busy, unavailable } from '../errors.js';
import { BUILTIN_MODULE_PATH, type Module } from './compiler.js';
import type { DecisionStatus } from './evaluator.js';

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
  fired: FiredRule[];
}

/** How long one `opa eval --explain` may take before the explanation is refused (a 503). */
const EXPLAIN_TIMEOUT_MS = 30_000;
/** `opa eval` processes one serving process runs at once; more explanations are a 429. */
const MAX_RUNNING = 2;

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

  constructor(private readonly opaBin: string) {}

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
      const out = await this.run(args, JSON.stringify(input));
      let parsed: {
        result?: { expressions?: { value?: { status?: unknown } }[] }[];
        explanation?: TraceEvent[];
      };
      try {
        parsed = JSON.parse(out) as typeof parsed;
      } catch {
        throw unavailable('the OPA explanation could not be read');
      }
      const value = parsed.result?.[0]?.expressions?.[0]?.value;
      const status =
        value && (value.status === 'allow' || value.status === 'deny' || value.status === 'requires_approval')
          ? value.status
          : 'error';
      return { status, fired: firedRules(parsed.explanation ?? [], files) };
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  private run(args: string[], stdin: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const child = execFile(
        this.opaBin,
        args,
        { maxBuffer: 256 * 1024 * 1024, timeout: EXPLAIN_TIMEOUT_MS },
        (err, stdout, stderr) => {
          if (err) {
            const detail = (stderr || err.message).split('\n')[0] ?? '';
            return reject(unavailable(`the OPA explanation failed: ${detail}`));
          }
          resolve(stdout);
        },
      );
      child.stdin?.end(stdin);
    });
  }
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
