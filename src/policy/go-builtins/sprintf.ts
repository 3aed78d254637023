import { refuse } from './refused.js';

// ---------------------------------------------------------------------------------------------
// sprintf: OPA (topdown/strings.go builtinSprintf) converts each argument (ast.Number → int64 if
// it is one, else *big.Int, else float64; ast.String → string; anything else → its ast String()
// form as a Go string) and calls Go's fmt.Sprintf.

type GoArg =
  | { kind: 'int64'; n: number }
  | { kind: 'float64'; n: number }
  | { kind: 'string'; s: string }
  // An array, set or object: a Go string to OPA (its ast String()), whose text the host cannot know.
  | { kind: 'composite' };

function toGoArg(v: unknown): GoArg {
  if (typeof v === 'string') return { kind: 'string', s: v };
  if (v === null) return { kind: 'string', s: 'null' };
  if (typeof v === 'boolean') return { kind: 'string', s: String(v) };
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) refuse('sprintf', 'non-finite number');
    if (Object.is(v, -0)) refuse('sprintf', 'cannot tell -0 from -0.0');
    if (Number.isInteger(v)) {
      if (!Number.isSafeInteger(v))
        refuse('sprintf', 'an integer beyond 2^53 has lost digits on its way here');
      return { kind: 'int64', n: v };
    }
    return { kind: 'float64', n: v };
  }
  // Objects print as OPA's ast String(); arrays too, but a set reaches the host as an array too.
  return { kind: 'composite' };
}

function needText(a: GoArg): Exclude<GoArg, { kind: 'composite' }> {
  if (a.kind === 'composite') return refuse('sprintf', 'arrays, sets and objects are not formatted');
  return a;
}

/**
 * %T: the Go type of OPA's conversion (string for strings, booleans, null, arrays, sets and
 * objects; int64 or *big.Int for integers; float64 otherwise). An integral number cannot be told
 * from one written 1.0 or 1e6 (float64 to OPA), so only numbers with a fraction are answered.
 */
function goTypeName(a: GoArg): string {
  if (a.kind === 'string' || a.kind === 'composite') return 'string';
  if (a.kind === 'float64') return 'float64';
  return refuse('sprintf', '%T of an integral number (int64 for 1, float64 for 1.0 or 1e6 in OPA)');
}

/** Exact decimal digits of a finite double: value = 0.digits × 10^exp10 (digits without zeros at the end). */
function exactDecimal(x: number): { digits: string; point: number } {
  const buf = new DataView(new ArrayBuffer(8));
  buf.setFloat64(0, Math.abs(x));
  const bits = buf.getBigUint64(0);
  const expBits = Number((bits >> 52n) & 0x7ffn);
  let mant = bits & ((1n << 52n) - 1n);
  let e2: number;
  if (expBits === 0) e2 = -1074;
  else {
    mant |= 1n << 52n;
    e2 = expBits - 1075;
  }
  if (mant === 0n) return { digits: '0', point: 1 };
  let digits: string;
  let point: number;
  if (e2 >= 0) {
    digits = (mant << BigInt(e2)).toString();
    point = digits.length;
  } else {
    digits = (mant * 5n ** BigInt(-e2)).toString();
    point = digits.length + e2; // value = digits × 10^e2
  }
  const trimmed = digits.replace(/0+$/, '');
  return { digits: trimmed === '' ? '0' : trimmed, point };
}

/** Rounds 0.digits×10^point to `n` significant digits, half to even (as strconv does on exact values). */
function roundDigits(d: { digits: string; point: number }, n: number): { digits: string; point: number } {
  if (n < 0) return { digits: '0', point: d.point };
  if (d.digits.length <= n) return { digits: d.digits.padEnd(n, '0'), point: d.point };
  const keep = d.digits.slice(0, n);
  const rest = d.digits.slice(n);
  const first = rest.charCodeAt(0) - 48;
  const up =
    first > 5 || (first === 5 && (/[1-9]/.test(rest.slice(1)) || Number(keep.at(-1) ?? '0') % 2 === 1));
  if (!up) return { digits: keep, point: d.point };
  const bumped = (BigInt(keep) + 1n).toString();
  if (bumped.length > keep.length) return { digits: bumped.slice(0, n), point: d.point + 1 };
  return { digits: bumped.padStart(n, '0'), point: d.point };
}

function expSuffix(exp: number, upper: boolean): string {
  const a = Math.abs(exp);
  return (upper ? 'E' : 'e') + (exp < 0 ? '-' : '+') + (a < 10 ? '0' + a : String(a));
}

function fmtE(x: number, prec: number, upper: boolean): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0.' + '0'.repeat(prec) + expSuffix(0, upper);
  const r = roundDigits(exactDecimal(x), prec + 1);
  return sign + r.digits[0] + (prec > 0 ? '.' + r.digits.slice(1) : '') + expSuffix(r.point - 1, upper);
}

function fmtF(x: number, prec: number): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0.' + '0'.repeat(prec);
  const d = exactDecimal(x);
  // Significant digits kept: those left of the point plus `prec` after it.
  const n = d.point + prec;
  let r: { digits: string; point: number };
  if (n < 0) r = { digits: '', point: d.point };
  else if (n === 0) {
    // Only the rounding of 0.digits to 0 or 1 unit of 10^-prec.
    const first = d.digits.charCodeAt(0) - 48;
    const up = first > 5 || (first === 5 && d.digits.length > 1);
    r = up ? { digits: '1', point: d.point + 1 } : { digits: '', point: d.point };
  } else r = roundDigits(d, n);
  // Lay the digits out on a fixed grid.
  let intPart: string;
  let frac: string;
  const digits = r.digits;
  if (r.point <= 0) {
    intPart = '0';
    frac = ('0'.repeat(-r.point) + digits).padEnd(prec, '0').slice(0, prec);
  } else {
    intPart = digits.slice(0, r.point).padEnd(r.point, '0');
    frac = digits.slice(r.point).padEnd(prec, '0').slice(0, prec);
  }
  return sign + intPart.replace(/^0+(?=\d)/, '') + (prec > 0 ? '.' + frac : '');
}

/** Go's %v of each kind, as in "%!d(float64=1.5)". */
function goV(arg: GoArg): string {
  const a = needText(arg);
  if (a.kind === 'string') return a.s;
  if (a.kind === 'int64') return String(a.n);
  return fmtGShortestV(a.n);
}

function fmtGShortestV(x: number): string {
  return fmtGShortestWith(x, false);
}

/**
 * fmt's %v and %g of a float64: strconv.AppendFloat(x, 'g', -1, 64), the shortest digits, in %e
 * form when exp < -4 || exp >= 6 (with the shortest precision strconv decides with eprec = 6).
 * Checked against `opa eval` (v1.22): 1e6 → "1e+06", 123456.5 → "123456.5",
 * 1234567.5 → "1.2345675e+06", 0.0001 → "0.0001", 1e-05 → "1e-05", 1.5e20 → "1.5e+20". (Not 21:
 * that threshold is encoding/json's, not fmt's.)
 */
function fmtGShortestWith(x: number, upper: boolean): string {
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  if (x === 0) return sign + '0';
  const [mant, e] = Math.abs(x).toExponential().split('e') as [string, string];
  const digits = mant.replace('.', '');
  const exp = Number(e);
  // strconv ftoa.go, %g: eprec := prec (-1 → shortest: digs.nd); if eprec > digs.nd && digs.nd >= digs.dp { eprec = digs.nd }; if shortest { eprec = 6 }
  if (exp < -4 || exp >= 6) {
    return sign + digits[0] + (digits.length > 1 ? '.' + digits.slice(1) : '') + expSuffix(exp, upper);
  }
  if (exp < 0) return sign + '0.' + '0'.repeat(-exp - 1) + digits;
  if (digits.length <= exp + 1) return sign + digits.padEnd(exp + 1, '0');
  return sign + digits.slice(0, exp + 1) + '.' + digits.slice(exp + 1);
}

function quoteGo(s: string): string {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0) as number;
    if (cp >= 0xd800 && cp <= 0xdfff) refuse('sprintf', 'a lone surrogate has no UTF-8 form');
    if (ch === '"' || ch === '\\') out += '\\' + ch;
    else if (cp >= 0x20 && cp < 0x7f) out += ch;
    else if (cp === 7) out += '\\a';
    else if (cp === 8) out += '\\b';
    else if (cp === 12) out += '\\f';
    else if (cp === 10) out += '\\n';
    else if (cp === 13) out += '\\r';
    else if (cp === 9) out += '\\t';
    else if (cp === 11) out += '\\v';
    else if (cp < 0x20 || cp === 0x7f) out += '\\x' + cp.toString(16).padStart(2, '0');
    else if (cp < 0xa0) out += '\\u' + cp.toString(16).padStart(4, '0');
    else if (cp > 0x24f) {
      // Go's unicode.IsPrint follows the Unicode version Go was built with, Node's \p{…} a newer
      // one: beyond Latin Extended-B (fully assigned long ago) they can disagree.
      refuse('sprintf', '%q of characters beyond U+024F');
    } else if (/^[\p{L}\p{M}\p{N}\p{P}\p{S}]$/u.test(ch)) out += ch;
    else out += '\\u' + cp.toString(16).padStart(4, '0');
  }
  return out + '"';
}

function hexBytes(s: string, upper: boolean): string {
  const h = Buffer.from(s, 'utf8').toString('hex');
  return upper ? h.toUpperCase() : h;
}

function badVerb(verb: string, a: GoArg): string {
  return `%!${verb}(${a.kind}=${goV(a)})`;
}

/** One verb applied to one argument, or a refusal. */
function formatOne(verb: string, arg: GoArg): string {
  const a = needText(arg);
  switch (a.kind) {
    case 'string':
      switch (verb) {
        case 'v':
        case 's':
          return a.s;
        case 'q':
          return quoteGo(a.s);
        case 'x':
        case 'X':
          return hexBytes(a.s, verb === 'X');
        case 'd': case 't': case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
          return badVerb(verb, a);
      } // prettier-ignore
      break;
    case 'int64':
      switch (verb) {
        case 'v':
        case 'd':
          return String(a.n);
        case 'x':
        case 'X': {
          const h = Math.abs(a.n).toString(16);
          return (a.n < 0 ? '-' : '') + (verb === 'X' ? h.toUpperCase() : h);
        }
        case 's': case 't': case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
          return badVerb(verb, a);
      } // prettier-ignore
      break;
    case 'float64':
      switch (verb) {
        case 'v':
        case 'g':
          return fmtGShortestWith(a.n, false);
        case 'G':
          return fmtGShortestWith(a.n, true);
        case 'e':
        case 'E':
          return fmtE(a.n, 6, verb === 'E');
        case 'f':
        case 'F':
          return fmtF(a.n, 6);
        case 's':
        case 't':
        case 'd':
        case 'q':
          return badVerb(verb, a);
      }
      break;
  }
  return refuse('sprintf', `%${verb} of a ${a.kind} is not implemented`);
}

function extraKind(arg: GoArg): string {
  const a = needText(arg);
  return `${a.kind}=${goV(a)}`;
}

export function goSprintf(format: unknown, values: unknown): string {
  if (typeof format !== 'string') return refuse('sprintf', 'the format must be a string');
  if (!Array.isArray(values)) return refuse('sprintf', 'the values must be an array');
  const args = values.map(toGoArg);
  let out = '';
  let argNum = 0;
  for (let i = 0; i < format.length;) {
    const pct = format.indexOf('%', i);
    if (pct < 0) {
      out += format.slice(i);
      break;
    }
    out += format.slice(i, pct);
    i = pct + 1;
    if (i >= format.length) {
      out += '%!(NOVERB)';
      break;
    }
    const cp = format.codePointAt(i) as number;
    const verb = String.fromCodePoint(cp);
    i += verb.length;
    if (verb === '%') {
      out += '%';
      continue;
    }
    if (/[-+# 0-9.*[]/.test(verb))
      refuse('sprintf', 'flags, width, precision and argument indexes are not supported');
    if (!/^[a-zA-Z]$/.test(verb)) refuse('sprintf', `the verb %${verb} is not supported`);
    if (argNum >= args.length) {
      out += `%!${verb}(MISSING)`;
      continue;
    }
    const a = args[argNum++] as GoArg;
    if (verb === 'T') out += goTypeName(a);
    else if ('vsqxXdtfFeEgG'.includes(verb)) out += formatOne(verb, a);
    else if ('bcoOUp'.includes(verb)) refuse('sprintf', `the verb %${verb} is not implemented`);
    else out += badVerb(verb, a);
  }
  if (argNum < args.length) out += '%!(EXTRA ' + args.slice(argNum).map(extraKind).join(', ') + ')';
  return out;
}
