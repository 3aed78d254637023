import { readFileSync } from 'node:fs';

/** Clock ticks per second of /proc's utime and stime (USER_HZ: 100 on Linux everywhere). */
const USER_HZ = 100;

/**
 * CPU seconds (user + system) used so far by the calling thread, from /proc/thread-self/stat;
 * undefined where there is no such file (not Linux). The benchmark divides its differences by the
 * decisions answered: CPU per decision on the serving thread and on the writer thread.
 */
export function threadCpuSeconds(): number | undefined {
  let stat: string;
  try {
    stat = readFileSync('/proc/thread-self/stat', 'utf8');
  } catch {
    return undefined;
  }
  // Fields after the command name (which is in parentheses and may hold spaces): utime, stime
  // are the 14th and 15th fields of the line, the 12th and 13th after ")".
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const utime = Number(rest[11]);
  const stime = Number(rest[12]);
  return Number.isFinite(utime) && Number.isFinite(stime) ? (utime + stime) / USER_HZ : undefined;
}
