import { expect } from 'chai';
import { onceOnly } from './helpers/backends.js';
import { SHADOW_SAMPLES, shadowMarksOf } from '../src/decisions/store.js';

const event = (id: string, outcome: string, result?: string, shadow?: string) => ({
  kind: 'decision',
  request_id: id,
  outcome,
  details: {
    ...(result ? { shadow_result: result } : {}),
    ...(shadow ? { shadow: { status: shadow, message: 'm' } } : {}),
  },
});

// What one batch adds to the shadow report's tallies (the stores write exactly this).
onceOnly('Shadow tallies of a batch', () => {
  it('sums counts per generation, result, outcome and shadow status, and skips unshadowed decisions', () => {
    const { counts, samples } = shadowMarksOf([
      { generation: 3, event: event('a', 'allow', 'disagree', 'deny') },
      { generation: 3, event: event('b', 'allow', 'agree') },
      { generation: 3, event: event('c', 'allow', 'disagree', 'deny') },
      { generation: 4, event: event('d', 'deny', 'error', 'deny') },
      { generation: undefined, event: event('e', 'allow', 'agree') },
      { generation: 3, event: event('f', 'allow') },
    ]);
    expect(counts).to.deep.equal([
      { generation: 3, result: 'disagree', live: 'allow', shadow: 'deny', n: 2 },
      { generation: 3, result: 'agree', live: 'allow', shadow: 'unknown', n: 1 },
      { generation: 4, result: 'error', live: 'deny', shadow: 'deny', n: 1 },
    ]);
    expect(samples).to.deep.equal([
      { generation: 3, request_id: 'a', live: 'allow', shadow: 'deny' },
      { generation: 3, request_id: 'c', live: 'allow', shadow: 'deny' },
    ]);
  });

  it('writes only the newest disagreements of each generation that the store keeps', () => {
    const many = Array.from({ length: SHADOW_SAMPLES + 5 }, (_, i) => ({
      generation: 7,
      event: event(`r${i}`, 'allow', 'disagree', 'deny'),
    }));
    const { counts, samples } = shadowMarksOf([
      ...many,
      { generation: 8, event: event('x', 'deny', 'disagree', 'allow') },
    ]);
    expect(counts[0]).to.include({ generation: 7, n: SHADOW_SAMPLES + 5 });
    expect(samples.filter((x) => x.generation === 7).map((x) => x.request_id)).to.deep.equal(
      many.slice(5).map((m) => m.event.request_id),
    );
    expect(samples.filter((x) => x.generation === 8)).to.have.length(1);
  });
});
