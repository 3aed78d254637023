import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { ADMIN_KEY, REPO } from './harness.js';

export const MAIN = path.join(REPO, 'dist', 'src', 'main.js');

/** The environment of a test instance (ports 0, own data dir), without the rest of ARBITER_*. */
export function baseEnv(overrides: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('ARBITER_')) env[k] = v;
  Object.assign(env, {
    ARBITER_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'arbiter-test-')),
    ARBITER_ENGINE_PORT: '0',
    ARBITER_PLATFORM_PORT: '0',
    ARBITER_ADMIN_KEY: ADMIN_KEY,
    ARBITER_POLICY_DIR: path.join(REPO, 'policies'),
    ARBITER_LOG_LEVEL: 'info',
  });
  for (const [k, v] of Object.entries(overrides)) {
    if (v === undefined) delete env[k];
    else env[k] = v;
  }
  return env;
}

/** Runs `arbiter <args>` to completion (with a time limit) and returns its exit and output. */
export function runSync(
  args: string[],
  env: NodeJS.ProcessEnv,
  timeoutMs = 10_000,
): { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [MAIN, ...args], { env, encoding: 'utf8', timeout: timeoutMs });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

export interface LogLine {
  [field: string]: unknown;
}

/**
 * An `arbiter serve …` process started by hand, with every log line kept in arrival order.
 * `command` replaces the node arguments, and may set the working directory and user (e.g. to run
 * an image's ENTRYPOINT + CMD).
 */
export class ServeProcess {
  readonly lines: string[] = [];
  readonly records: LogLine[] = [];
  readonly exited: Promise<number | null>;
  private readonly child: ChildProcess;
  private waiters: (() => void)[] = [];

  constructor(
    args: string[],
    env: NodeJS.ProcessEnv,
    command: { argv: string[]; file?: string; cwd?: string; uid?: number; gid?: number } = {
      argv: [MAIN, 'serve', ...args],
    },
  ) {
    // `file` runs instead of this node (e.g. tini, which then runs node from PATH).
    const { argv, file = process.execPath, ...options } = command;
    this.child = spawn(file, argv, {
      ...options,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const onLine = (line: string) => {
      this.lines.push(line);
      try {
        this.records.push(JSON.parse(line) as LogLine);
      } catch {
        /* not JSON */
      }
      for (const w of this.waiters) w();
    };
    createInterface({ input: this.child.stdout! }).on('line', onLine);
    createInterface({ input: this.child.stderr! }).on('line', onLine);
    this.exited = new Promise((resolve) => this.child.once('exit', (code) => resolve(code)));
  }

  /** Resolves with the first log record matching `pred`; rejects on exit or after `timeoutMs`. */
  waitFor(pred: (r: LogLine) => boolean, timeoutMs = 60_000): Promise<LogLine> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const hit = this.records.find(pred);
        if (hit) {
          done();
          resolve(hit);
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`log line not seen:\n${this.lines.join('\n')}`));
      }, timeoutMs);
      void this.exited.then((code) => {
        done();
        reject(new Error(`arbiter exited with ${code}:\n${this.lines.join('\n')}`));
      });
      const done = () => {
        clearTimeout(timer);
        this.waiters = this.waiters.filter((w) => w !== check);
      };
      this.waiters.push(check);
      check();
    });
  }

  /** The process's id (of `file`, when it runs one). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  /** SIGTERM and wait for the exit code. */
  async stop(): Promise<number | null> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    return this.exited;
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
