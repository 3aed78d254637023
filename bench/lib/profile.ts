// Summarizes a V8 .cpuprofile (node --cpu-prof): self time per function and per area.
import { readFileSync } from 'node:fs';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileSummary {
  file: string;
  totalMs: number;
  top: { fn: string; where: string; selfMs: number; pct: number }[];
  byArea: { area: string; selfMs: number; pct: number }[];
}

function area(url: string, fn: string): string {
  if (url === '') return fn.startsWith('(') ? fn : '(native/V8)';
  const m = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (m) return m[1] as string;
  if (url.startsWith('node:')) return 'node core';
  const src = /\/dist\/(src\/[^/]+)/.exec(url);
  if (src) return `arbiter ${src[1]}`;
  if (url.startsWith('wasm://')) return 'policy wasm';
  return url;
}

export function summarizeProfile(file: string, topN = 20): ProfileSummary {
  const p = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<number, number>();
  let total = 0;
  for (let i = 0; i < p.samples.length; i++) {
    const dt = (p.timeDeltas[i] ?? 0) / 1000;
    total += dt;
    const id = p.samples[i] as number;
    self.set(id, (self.get(id) ?? 0) + dt);
  }
  const fns = new Map<string, { fn: string; where: string; selfMs: number }>();
  const areas = new Map<string, number>();
  for (const [id, ms] of self) {
    const n = byId.get(id);
    if (!n) continue;
    const { functionName, url, lineNumber } = n.callFrame;
    const fn = functionName || '(anonymous)';
    const where = url
      ? `${url.replace(/^file:\/\/.*?\/(node_modules|dist)\//, '$1/')}:${lineNumber + 1}`
      : '';
    const key = `${fn} ${where}`;
    const e = fns.get(key) ?? { fn, where, selfMs: 0 };
    e.selfMs += ms;
    fns.set(key, e);
    const a = area(url, fn);
    areas.set(a, (areas.get(a) ?? 0) + ms);
  }
  const pct = (ms: number) => Math.round((1000 * ms) / total) / 10;
  return {
    file,
    totalMs: Math.round(total),
    top: [...fns.values()]
      .sort((x, y) => y.selfMs - x.selfMs)
      .slice(0, topN)
      .map((e) => ({ ...e, selfMs: Math.round(e.selfMs), pct: pct(e.selfMs) })),
    byArea: [...areas.entries()]
      .sort((x, y) => y[1] - x[1])
      .slice(0, topN)
      .map(([a, ms]) => ({ area: a, selfMs: Math.round(ms), pct: pct(ms) })),
  };
}
