import { expect } from 'chai';
import fc from 'fast-check';
import { compareDecimal } from '../src/common/validation.js';

/**
 * compareDecimal decides whether a number a client sent, exactly as written, lies in a range
 * (a confidence of 1.00000000000000001 is out of range although a double reads it as 1). Held
 * here against exact rational arithmetic over BigInt, on literals written every way JSON allows.
 */

/** A JSON number literal and its exact value as numerator / 10^k (k may be negative). */
interface Literal {
  text: string;
  mantissa: bigint;
  exp10: bigint;
}

const literal: fc.Arbitrary<Literal> = fc
  .record({
    negative: fc.boolean(),
    whole: fc.oneof(fc.constant('0'), fc.stringMatching(/^[1-9][0-9]{0,25}$/)),
    fraction: fc.option(fc.stringMatching(/^[0-9]{1,25}$/), { nil: undefined }),
    exponent: fc.option(
      fc.record({
        e: fc.constantFrom('e', 'E'),
        sign: fc.constantFrom('', '+', '-'),
        digits: fc.oneof(fc.stringMatching(/^[0-9]{1,3}$/), fc.constantFrom('0', '00', '400', '999999')),
      }),
      { nil: undefined },
    ),
  })
  .map(({ negative, whole, fraction, exponent }) => {
    const text =
      (negative ? '-' : '') +
      whole +
      (fraction === undefined ? '' : `.${fraction}`) +
      (exponent === undefined ? '' : exponent.e + exponent.sign + exponent.digits);
    const digits = BigInt(whole + (fraction ?? ''));
    const e = exponent === undefined ? 0n : BigInt(exponent.sign + exponent.digits);
    return {
      text,
      mantissa: negative ? -digits : digits,
      exp10: e - BigInt(fraction?.length ?? 0),
    };
  });

/** Sign of a − b, exactly: both scaled to the smaller power of ten (exponents kept small enough). */
function exact(a: Literal, b: Literal): number {
  const low = a.exp10 < b.exp10 ? a.exp10 : b.exp10;
  const x = a.mantissa * 10n ** (a.exp10 - low);
  const y = b.mantissa * 10n ** (b.exp10 - low);
  return x === y ? 0 : x < y ? -1 : 1;
}

describe('compareDecimal (exact comparison of JSON number literals)', () => {
  it('agrees with exact arithmetic on literals of any form', () => {
    fc.assert(
      fc.property(literal, literal, (a, b) => {
        // Keep the reference's BigInt powers small; a huge exponent is held by the next test.
        fc.pre(a.exp10 - b.exp10 < 2_000n && b.exp10 - a.exp10 < 2_000n);
        expect(compareDecimal(a.text, b.text), `${a.text} vs ${b.text}`).to.equal(exact(a, b));
        expect(compareDecimal(b.text, a.text)).to.equal(-exact(a, b));
      }),
      { numRuns: 3_000, seed: 20261130 },
    );
  });

  it('places the numbers a double cannot hold as written on the right side of a range', () => {
    expect(compareDecimal('1.00000000000000001', '1')).to.equal(1);
    expect(compareDecimal('0.99999999999999999', '1')).to.equal(-1);
    expect(compareDecimal('-1e-400', '0')).to.equal(-1);
    expect(compareDecimal('-0', '0')).to.equal(0);
    expect(compareDecimal('0.0e999', '0')).to.equal(0);
    expect(compareDecimal('1e999', '1')).to.equal(1);
    expect(compareDecimal('-1e999', '0')).to.equal(-1);
    expect(compareDecimal('1e-999999999999', '0')).to.equal(1);
    expect(compareDecimal('10e-1', '1')).to.equal(0);
    expect(compareDecimal('100E-2', '1.0')).to.equal(0);
  });

  it('refuses what is not a JSON number literal', () => {
    for (const bad of ['', '+1', '.5', '1.', '0x10', 'NaN', 'Infinity', '1e', '- 1'])
      expect(() => compareDecimal(bad, '0'), bad).to.throw(/not a JSON number/);
  });
});
