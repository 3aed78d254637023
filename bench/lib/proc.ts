// Child processes for the benchmark: spawned in their own process group, tracked, and stopped on
// every way out (normal end, error, SIGINT/SIGTERM), plus free ports, readiness polling and
// RSS sampling from /proc.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync, realpathSync } from 'node:fs';
import net from 'node:net';
import { createInterface } from 'node:readline';

export interface Managed {
  name: string;
  pid: number;
  child: ChildProcess;
  /** The last lines of stdout and stderr (for error messages). */
  logs: string[];
  /** Resolves with the exit code (or the signal name) once the process has gone. */
  exited: Promise<number | string | null>;
  /** SIGTERM, then SIGKILL to the whole group after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

const live = new Set<Managed>();
const MAX_LOG_LINES = 200;

export function spawnManaged(
  name: string,
  cmd: string,
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; cwd?: string } = {},
): Managed {
  const child = spawn(cmd, args, {
    env: opts.env ?? process.env,
    cwd: opts.cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true, // own process group: we signal it as a whole, and Ctrl-C reaches only us
  });
  if (child.pid === undefined) throw new Error(`${name}: could not spawn ${cmd}`);
  const logs: string[] = [];
  const onLine = (line: string) => {
    logs.push(line);
    if (logs.length > MAX_LOG_LINES) logs.shift();
  };
  createInterface({ input: child.stdout! }).on('line', onLine);
  createInterface({ input: child.stderr! }).on('line', onLine);
  const exited = new Promise<number | string | null>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal));
  });
  const pid = child.pid;
  const m: Managed = {
    name,
    pid,
    child,
    logs,
    exited,
    async stop(graceMs = 10_000) {
      if (child.exitCode === null && child.signalCode === null) {
        signalGroup(pid, 'SIGTERM');
        const timer = setTimeout(() => signalGroup(pid, 'SIGKILL'), graceMs);
        await exited;
        clearTimeout(timer);
      }
      // Anything the process left behind in its group (e.g. a compiler run) goes too.
      signalGroup(pid, 'SIGKILL');
      live.delete(m);
    },
  };
  live.add(m);
  return m;
}

function signalGroup(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pid, sig);
  } catch {
    /* already gone */
  }
}

/** Stops every child still running, politely first. */
export async function stopAll(): Promise<void> {
  await Promise.all([...live].map((m) => m.stop(5_000)));
}

/** Last resort from a synchronous 'exit' handler: SIGKILL every group we started. */
export function killAllSync(): void {
  for (const m of live) signalGroup(m.pid, 'SIGKILL');
  live.clear();
}

/** A TCP port that was free a moment ago (bind to 0, read it, release it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** Polls `url` until it answers 200; fails early when `proc` exits, or after `timeoutMs`. */
export async function waitHttp(url: string, proc: Managed, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let gone = false;
  void proc.exited.then(() => (gone = true));
  let last = '';
  while (Date.now() < deadline) {
    if (gone) {
      throw new Error(`${proc.name} exited before it was ready:\n${proc.logs.slice(-40).join('\n')}`);
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
      await res.arrayBuffer();
      if (res.status === 200) return;
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = (e as Error).message;
    }
    await sleep(100);
  }
  throw new Error(
    `${proc.name} not ready at ${url} after ${timeoutMs} ms (${last}):\n${proc.logs.join('\n')}`,
  );
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** VmHWM / VmRSS of one process in KiB, or undefined once it has gone. */
export function procMemory(pid: number): { hwmKb: number; rssKb: number } | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return undefined;
  }
  const field = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? '0');
  return { hwmKb: field('VmHWM'), rssKb: field('VmRSS') };
}

/**
 * CPU seconds (user + system, every thread) used so far by `pid` and its Node descendants, from
 * /proc/PID/stat: what a change costs the whole service, threads it starts included.
 */
export function processCpuSeconds(pid: number): number {
  let ticks = 0;
  for (const p of processTree(pid).filter((q) => q === pid || isNode(q))) {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(rest[11]) + Number(rest[12]);
    } catch {
      /* ended */
    }
  }
  // USER_HZ: 100 on Linux everywhere.
  return ticks / 100;
}

/** `pid` and all its descendants (so that a multi-process mode is measured whole). */
export function processTree(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    const p = out[i] as number;
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        for (const c of readFileSync(`/proc/${p}/task/${t}/children`, 'utf8').trim().split(/\s+/)) {
          if (c !== '' && !out.includes(Number(c))) out.push(Number(c));
        }
      } catch {
        /* task ended */
      }
    }
  }
  return out;
}

/**
 * Samples the memory of a process tree every `intervalMs`. The peak is VmHWM (the kernel's own
 * high-water mark, so nothing between samples is missed), summed over the tree's processes; the
 * largest summed VmRSS seen is kept as well.
 */
export class RssSampler {
  peakHwmKb = 0;
  peakRssKb = 0;
  lastRssKb = 0;
  samples = 0;
  processes = 1;
  private timer: NodeJS.Timeout | undefined;
  private readonly hwm = new Map<number, number>();

  constructor(private readonly pid: number) {}

  start(intervalMs = 250): void {
    this.sample();
    this.timer = setInterval(() => this.sample(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    this.sample();
    if (this.timer) clearInterval(this.timer);
  }

  sample(): void {
    // Node processes only: the OPA compiler runs Arbiter spawns briefly are not Arbiter's memory.
    const pids = processTree(this.pid).filter((p) => p === this.pid || isNode(p));
    let rss = 0;
    let seen = 0;
    for (const p of pids) {
      const m = procMemory(p);
      if (!m) continue;
      seen++;
      rss += m.rssKb;
      this.hwm.set(p, Math.max(this.hwm.get(p) ?? 0, m.hwmKb));
    }
    if (seen === 0) return;
    this.samples++;
    this.processes = Math.max(this.processes, seen);
    this.lastRssKb = rss;
    this.peakRssKb = Math.max(this.peakRssKb, rss);
    let hwm = 0;
    for (const v of this.hwm.values()) hwm += v;
    this.peakHwmKb = Math.max(this.peakHwmKb, hwm);
  }
}

const nodeExe = realpathSync(process.execPath);
function isNode(pid: number): boolean {
  try {
    return readlinkSync(`/proc/${pid}/exe`) === nodeExe;
  } catch {
    return false;
  }
}
