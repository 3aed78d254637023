import { expect } from 'chai';
import { newId, newSpanId, newTraceId } from '../src/ids.js';

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('ids (drawn from a pooled CSPRNG buffer)', () => {
  it('are UUIDv7, unique and in creation order across many pool refills', () => {
    // 4 bytes per id from a 4 KiB pool: 60k ids refill it dozens of times, mid-id included.
    const ids = Array.from({ length: 60_000 }, () => {
      newSpanId(); // odd-sized draws in between, so that refills fall at every offset
      return newId();
    });
    for (const id of ids) expect(id).to.match(UUID_V7);
    expect(new Set(ids).size).to.equal(ids.length);
    expect([...ids].sort()).to.deep.equal(ids);
    // The random part differs between neighbours (not a repeated buffer).
    const tails = new Set(ids.map((id) => id.slice(-12)));
    expect(tails.size).to.equal(ids.length);
  });

  it('trace and span ids are lowercase hex of the W3C lengths, never all zero, unique', () => {
    const traces = Array.from({ length: 20_000 }, newTraceId);
    for (const t of traces) expect(t).to.match(/^(?!0+$)[0-9a-f]{32}$/);
    expect(new Set(traces).size).to.equal(traces.length);
    // Time first (so that the audit trail's trace index grows at its end), random after.
    const ms = (t: string) => parseInt(t.slice(0, 12), 16);
    expect(Math.abs(ms(traces.at(-1) as string) - Date.now())).to.be.below(60_000);
    for (let i = 1; i < traces.length; i++) {
      expect(ms(traces[i] as string)).to.be.at.least(ms(traces[i - 1] as string));
    }
    expect(new Set(traces.map((t) => t.slice(12))).size).to.equal(traces.length);
    const spans = Array.from({ length: 20_000 }, newSpanId);
    for (const s of spans) expect(s).to.match(/^[0-9a-f]{16}$/);
    expect(new Set(spans).size).to.equal(spans.length);
  });
});
