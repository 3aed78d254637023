/**
 * The scenarios of `npm run bench` on their own (issue 13): the example and the small policy in
 * Arbiter beside OPA's server, at saturation and at a fixed rate, with CPU per decision by thread.
 * For quick before/after measurements of one change; `npm run bench` remains the report.
 *
 *   npm run bench:scenarios -- [--duration 10] [--only small|example] [--rate 1000] [--cpu-prof]
 */
import { copyFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { summarizeProfile } from './lib/profile.js';
import { benchScenarios } from './lib/scenarios.js';
import { removeTempDirs, REPO, tempDir } from './lib/targets.js';

const { values } = parseArgs({
  options: {
    duration: { type: 'string', default: '10' },
    connections: { type: 'string', default: '32' },
    rate: { type: 'string', default: '1000' },
    only: { type: 'string' },
    'cpu-prof': { type: 'boolean', default: false },
  },
});
const only = values.only;
if (only !== undefined && only !== 'small' && only !== 'example') {
  console.error('--only is small or example');
  process.exit(2);
}
const log = (s: string) => console.log(s);
const profDir = values['cpu-prof'] ? tempDir('arbiter-bench-prof-') : undefined;
try {
  await benchScenarios({
    duration: Number(values.duration),
    connections: Number(values.connections),
    rate: Number(values.rate),
    rateConnections: 16,
    log,
    ...(only ? { only } : {}),
    ...(profDir ? { nodeFlags: ['--cpu-prof', `--cpu-prof-dir=${profDir}`] } : {}),
  });
  for (const f of profDir ? readdirSync(profDir).filter((x) => x.endsWith('.cpuprofile')) : []) {
    // Kept (git-ignored) for a closer look in a profile viewer.
    const keep = path.join(REPO, 'bench', 'results', `scenarios-${f}`);
    copyFileSync(path.join(profDir as string, f), keep);
    const p = summarizeProfile(keep, 30);
    log(`\nprofile ${keep} (${p.totalMs} ms sampled), self time by area:`);
    for (const a of p.byArea.slice(0, 14)) log(`  ${String(a.pct).padStart(5)}%  ${a.area}`);
    log('top functions:');
    for (const t of p.top) log(`  ${String(t.pct).padStart(5)}%  ${t.fn}  ${t.where}`);
  }
} finally {
  removeTempDirs();
}
