import { expect } from 'chai';
import { onceOnly } from './helpers/backends.js';
import { SHADOW_SAMPLES, shadowedOf, shadowMarksOf, type DecisionToRecord } from '../src/decisions/store.js';

const event = (id: string, outcome: string, result?: string, shadow?: string) => ({
  kind: 'decision',
  request_id: id,
  outcome,
  details: {
    ...(result ? { shadow_result: result } : {}),
    ...(shadow ? { shadow: { status: shadow, message: 'm' } } : {}),
  },
});
type Live = 'allow' | 'requires_approval' | 'deny';
/** A shadowed event whose live policy answer is its outcome (no budget replaced it). */
const shadowed = (generation: number, id: string, outcome: Live, result?: string, shadow?: string) => ({
  generation,
  live: outcome,
  event: event(id, outcome, result, shadow),
});

// What one batch adds to the shadow report's tallies (the stores write exactly this).
onceOnly('Shadow tallies of a batch', () => {
  it('sums counts per generation, result, live answer and shadow status, and skips events without a result', () => {
    const { counts, samples } = shadowMarksOf([
      shadowed(3, 'a', 'allow', 'disagree', 'deny'),
      shadowed(3, 'b', 'allow', 'agree'),
      shadowed(3, 'c', 'allow', 'disagree', 'deny'),
      shadowed(4, 'd', 'deny', 'error', 'deny'),
      shadowed(3, 'f', 'allow'),
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

  it('keeps marks apart that differ in one of generation, result, live answer or shadow status alone', () => {
    const base = ['allow', 'disagree', 'deny'] as const;
    const { counts } = shadowMarksOf([
      shadowed(1, 'a', ...base),
      shadowed(2, 'b', ...base),
      shadowed(1, 'c', 'allow', 'error', 'deny'),
      shadowed(1, 'd', 'requires_approval', 'disagree', 'deny'),
      shadowed(1, 'e', 'allow', 'disagree', 'requires_approval'),
      shadowed(1, 'f', ...base),
    ]);
    expect(counts).to.deep.equal([
      { generation: 1, result: 'disagree', live: 'allow', shadow: 'deny', n: 2 },
      { generation: 2, result: 'disagree', live: 'allow', shadow: 'deny', n: 1 },
      { generation: 1, result: 'error', live: 'allow', shadow: 'deny', n: 1 },
      { generation: 1, result: 'disagree', live: 'requires_approval', shadow: 'deny', n: 1 },
      { generation: 1, result: 'disagree', live: 'allow', shadow: 'requires_approval', n: 1 },
    ]);
  });

  it("counts a budget's deny as the live policy's allow it replaced, as the result was computed", () => {
    const { counts, samples } = shadowMarksOf([
      { generation: 5, live: 'allow', event: event('g', 'deny', 'disagree', 'deny') },
    ]);
    expect(counts).to.deep.equal([
      { generation: 5, result: 'disagree', live: 'allow', shadow: 'deny', n: 1 },
    ]);
    expect(samples).to.deep.equal([{ generation: 5, request_id: 'g', live: 'allow', shadow: 'deny' }]);
  });

  it('takes the shadowed decisions of a batch as recorded, with the live answer they were compared with', () => {
    // What a store passes in: the batch to record, and per item its recorded event or a replay.
    const item = (shadow?: DecisionToRecord['shadow']) => ({ shadow }) as DecisionToRecord;
    const budgetDeny = event('h', 'deny', 'disagree', 'deny');
    const plain = event('i', 'allow');
    const batch = [item({ generation: 6, live: 'allow' }), item(), item({ generation: 6, live: 'allow' })];
    const marked = shadowedOf(batch, [{ event: budgetDeny }, { event: plain }, { replay: {} }]);
    expect(marked).to.deep.equal([{ generation: 6, live: 'allow', event: budgetDeny }]);
    expect(shadowMarksOf(marked).counts).to.deep.equal([
      { generation: 6, result: 'disagree', live: 'allow', shadow: 'deny', n: 1 },
    ]);
    expect(shadowedOf([item(), item()], [{ event: plain }, { event: plain }])).to.deep.equal([]);
  });

  it('writes only the newest disagreements of each generation that the store keeps', () => {
    const many = Array.from({ length: SHADOW_SAMPLES + 5 }, (_, i) =>
      shadowed(7, `r${i}`, 'allow', 'disagree', 'deny'),
    );
    const { counts, samples } = shadowMarksOf([...many, shadowed(8, 'x', 'deny', 'disagree', 'allow')]);
    expect(counts[0]).to.include({ generation: 7, n: SHADOW_SAMPLES + 5 });
    expect(samples.filter((x) => x.generation === 7).map((x) => x.request_id)).to.deep.equal(
      many.slice(5).map((m) => m.event.request_id),
    );
    expect(samples.filter((x) => x.generation === 8)).to.have.length(1);
  });
});
