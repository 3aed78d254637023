/**
 * Pools the rounds of several `npm run bench:shadow` runs and asks whether the bench can tell a
 * standing shadow set from none (issue 10, docs/performance.md):
 *
 *   npm run bench:shadow -- --rounds 12 --duration 5 --candidate none  > none-1.log
 *   npm run bench:shadow -- --rounds 12 --duration 5 --candidate agree > agree-1.log
 *   … (alternating, several of each) …
 *   npm run bench:shadow:pool -- none-*.log agree-*.log
 *
 * It reads the runs' printed lines (`autocannon round N <run> with|without shadow: …`), so a run
 * kept with `> file` or `tee` is its input. Per round it takes what `bench:shadow` compares:
 * throughput at saturation as with ÷ without − 1, p50 at 1 000/s as with − without, and the
 * serving and writer thread's CPU per decision at saturation as with − without. The rounds of
 * every run of one candidate are pooled; `--candidate none` runs (no shadow set in the "with"
 * slot) are the control, the bench's own spread and bias.
 *
 * For each candidate it prints the pooled median and quartiles of each figure, the difference of
 * its median from the control's, and a two-sided permutation test of that difference (the rounds
 * of the candidate and of the control shuffled together 20 000 times, a fixed seed): `p` is the
 * share of shuffles whose difference of medians is at least as large. A small `p` (below 0.05)
 * says the bench sees the shadow set; a large one says these rounds cannot tell it from none.
 * One 12-round run's quartiles understate how far two runs of one code differ, which is why runs
 * are pooled.
 */
import { readFileSync } from 'node:fs';
import { median } from './lib/stats.js';

/** One round's comparison: with the set (or the control's empty slot) against without. */
interface Round {
  saturation: number;
  p50_ms: number;
  serving_us: number;
  writer_us: number;
}

const LINE =
  /autocannon round (\d+) (saturation|1000\/s)\s+(with|without) shadow\s*: (\d+) req\/s, p50 ([\d.]+) ms.*?\{"serving":(\d+),"writer":(\d+)/;

/** The candidate a run names in its first line, and its rounds. */
function roundsOf(text: string): { candidate: string; rounds: Round[] } {
  const candidate = /shadow benchmark: .*candidate ([\w-]+)/.exec(text)?.[1];
  if (candidate === undefined) throw new Error('not the output of npm run bench:shadow');
  const runs = new Map<string, { rps: number; p50: number; serving: number; writer: number }>();
  for (const line of text.split('\n')) {
    const m = LINE.exec(line);
    if (!m) continue;
    const [, round, run, side, rps, p50, serving, writer] = m;
    runs.set(`${round} ${run} ${side}`, {
      rps: Number(rps),
      p50: Number(p50),
      serving: Number(serving),
      writer: Number(writer),
    });
  }
  const rounds: Round[] = [];
  for (let r = 1; runs.has(`${r} saturation with`) || runs.has(`${r} saturation without`); r++) {
    const [sw, so, fw, fo] = [
      runs.get(`${r} saturation with`),
      runs.get(`${r} saturation without`),
      runs.get(`${r} 1000/s with`),
      runs.get(`${r} 1000/s without`),
    ];
    // A round cut short (the run stopped) is left out whole.
    if (!sw || !so || !fw || !fo) continue;
    rounds.push({
      saturation: sw.rps / so.rps - 1,
      p50_ms: fw.p50 - fo.p50,
      serving_us: sw.serving - so.serving,
      writer_us: sw.writer - so.writer,
    });
  }
  return { candidate, rounds };
}

/** Lower and upper quartile (medians of the lower and upper half). */
function quartiles(xs: number[]): [number, number] {
  const s = [...xs].sort((x, y) => x - y);
  const h = Math.floor(s.length / 2);
  return [median(s.slice(0, h)), median(s.slice(s.length - h))];
}

/** A small seeded generator (mulberry32): the same shuffles, so the same `p`, on every run. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Two-sided permutation test of the difference of medians of `a` and `b`: the share of
 * `shuffles` random relabellings whose difference is at least as large in size as the observed.
 */
function permutationP(a: number[], b: number[], shuffles = 20_000, seed = 20261130): number {
  const observed = Math.abs(median(a) - median(b));
  const all = [...a, ...b];
  const random = seeded(seed);
  let atLeast = 0;
  for (let k = 0; k < shuffles; k++) {
    for (let i = all.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [all[i], all[j]] = [all[j] as number, all[i] as number];
    }
    const d = Math.abs(median(all.slice(0, a.length)) - median(all.slice(a.length)));
    // A small tolerance: equal medians computed in another order must count as equal.
    if (d >= observed - 1e-12) atLeast++;
  }
  return atLeast / shuffles;
}

const signed = (x: number, digits: number, unit: string) => `${x >= 0 ? '+' : ''}${x.toFixed(digits)}${unit}`;

/** Each figure of a round; `speed`: a small `p` says the bench sees it slower, else the work. */
const FIGURES: { key: keyof Round; label: string; speed: boolean; show: (x: number) => string }[] = [
  { key: 'saturation', label: 'saturation', speed: true, show: (x) => signed(x * 100, 1, '%') },
  { key: 'p50_ms', label: '1000/s p50', speed: true, show: (x) => signed(x, 2, ' ms') },
  { key: 'serving_us', label: 'serving CPU', speed: false, show: (x) => signed(x, 1, ' µs') },
  { key: 'writer_us', label: 'writer CPU', speed: false, show: (x) => signed(x, 1, ' µs') },
];

function main(files: string[]): void {
  if (files.length === 0) {
    console.error('usage: npm run bench:shadow:pool -- RUN.log [RUN.log …] (runs of npm run bench:shadow)');
    process.exit(2);
  }
  const pooled = new Map<string, { runs: number; rounds: Round[] }>();
  for (const f of files) {
    let run: ReturnType<typeof roundsOf>;
    try {
      run = roundsOf(readFileSync(f, 'utf8'));
    } catch (e) {
      console.error(`${f}: ${e instanceof Error ? e.message : String(e)}`);
      process.exit(2);
    }
    const { candidate, rounds } = run;
    const p = pooled.get(candidate) ?? { runs: 0, rounds: [] };
    p.runs++;
    p.rounds.push(...rounds);
    pooled.set(candidate, p);
  }
  // A control without one complete round is none: nothing to compare against.
  const control = pooled.get('none')?.rounds.length ? pooled.get('none') : undefined;
  for (const [candidate, p] of [...pooled].sort(([x], [y]) => (x === 'none' ? -1 : y === 'none' ? 1 : 0))) {
    console.log(
      `${candidate === 'none' ? 'none (control)' : candidate}: ${p.runs} runs, ${p.rounds.length} rounds`,
    );
    if (p.rounds.length === 0) {
      console.log('  no complete round: nothing to compare');
      continue;
    }
    for (const f of FIGURES) {
      const xs = p.rounds.map((r) => r[f.key]);
      const [lo, hi] = quartiles(xs);
      let line = `  ${f.label.padEnd(11)} ${f.show(median(xs))} (${f.show(lo)} … ${f.show(hi)})`;
      if (control && candidate !== 'none') {
        const ys = control.rounds.map((r) => r[f.key]);
        const pValue = permutationP(xs, ys);
        line += `; against the control ${f.show(median(xs) - median(ys))}, p = ${pValue.toFixed(3)}`;
        line +=
          pValue >= 0.05
            ? ': not told apart from the control'
            : f.speed
              ? ': the bench sees it slower'
              : ': the bench sees the work';
      }
      console.log(line);
    }
  }
  if (!control)
    console.log('(no complete round of a --candidate none run among these: nothing to compare against)');
}

main(process.argv.slice(2));
