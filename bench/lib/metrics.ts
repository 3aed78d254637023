// Reading an Arbiter process's /metrics in the benchmarks.
import { ADMIN_KEY } from './targets.js';

/** The Prometheus text of an Arbiter process, read with the admin key. */
export async function scrape(platform: string): Promise<string> {
  const r = await fetch(`${platform}/metrics`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  if (!r.ok) throw new Error(`GET /metrics answered ${r.status}`);
  return r.text();
}

/** `name{label="value"} number` lines of one metric, by the value of `label`. */
export function byLabel(text: string, name: string, label: string): Record<string, number> {
  const out: Record<string, number> = {};
  const re = new RegExp(`^${name}\\{[^}]*${label}="([^"]+)"[^}]*\\} ([0-9.e+-]+)$`, 'gm');
  for (const m of text.matchAll(re)) out[m[1]!] = (out[m[1]!] ?? 0) + Number(m[2]);
  return out;
}

/** The value of an unlabelled metric, when it is there. */
export function plain(text: string, name: string): number | undefined {
  const m = new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}
