import { expect } from 'chai';
import fc from 'fast-check';
import { canonicalJson } from '../src/common/canonical-json.js';

/** The definition (the original implementation): sort keys at every depth, write as JSON does. */
function reference(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value ?? null);
  if (Array.isArray(value)) return `[${value.map(reference).join(',')}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${reference(obj[k])}`).join(',')}}`;
}

// Keys that V8 orders or treats specially besides ordinary ones.
const key = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 6 }),
  fc.constantFrom('0', '1', '7', '10', '01', '-1', '1.5', '4294967295', '__proto__', 'constructor', ''),
);
const leaf = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 8 }),
  fc.double(),
  fc.integer(),
  fc.boolean(),
  fc.constant(null),
  fc.constant(undefined),
);
const { tree } = fc.letrec((tie) => ({
  tree: fc.oneof({ depthSize: 'small' }, leaf, tie('array'), tie('object')),
  array: fc.array(tie('tree'), { maxLength: 5 }),
  // Built as JSON.parse builds objects: every key an own data property, `__proto__` included.
  object: fc.array(fc.tuple(key, tie('tree')), { maxLength: 6 }).map((entries) => {
    const o: Record<string, unknown> = {};
    for (const [k, v] of entries)
      Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
    return o;
  }),
}));

describe('canonical JSON (what the audit chain and request digests hash)', () => {
  it('writes exactly the text of its definition, for any JSON-like value', () => {
    fc.assert(
      fc.property(tree, (v) => {
        expect(canonicalJson(v)).to.equal(reference(v));
      }),
      { numRuns: 3000 },
    );
  });

  it('sorts keys by UTF-16 code units, integer-like keys included, and keeps __proto__ as data', () => {
    const parsed = JSON.parse('{"b":1,"10":2,"9":3,"__proto__":{"x":1},"a":[{"2":0,"1":0}]}') as unknown;
    expect(canonicalJson(parsed)).to.equal('{"10":2,"9":3,"__proto__":{"x":1},"a":[{"1":0,"2":0}],"b":1}');
    expect(canonicalJson({ z: 1, a: { d: undefined, c: [undefined, 'é\ud800'] } })).to.equal(
      '{"a":{"c":[null,"é\\ud800"]},"z":1}',
    );
  });
});
