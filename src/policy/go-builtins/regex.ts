import { refuse, Refused } from './refused.js';

// ---------------------------------------------------------------------------------------------
// regex.split: Go's regexp (RE2) Split(s, -1). The pattern is translated to an equivalent JS
// RegExp for a conservative subset of RE2 syntax; anything else is refused.

const SYNTAX_CHARS = '^$\\.*+?()[]{}|/';
const GO_SPACE = '\\t\\n\\f\\r ';

function translateRe2(p: string): string {
  let out = '';
  let i = 0;
  const fail = (why: string): never => refuse('regex.split', `${why} in ${JSON.stringify(p)}`);
  const escape = (inClass: boolean): string => {
    const c = p[i + 1];
    if (c === undefined) return fail('a trailing backslash');
    i += 2;
    if (c === 'd' || c === 'D' || c === 'w' || c === 'W') return '\\' + c;
    if (c === 's') return inClass ? GO_SPACE : `[${GO_SPACE}]`;
    if (c === 'S') return inClass ? fail('\\S inside a class') : `[^${GO_SPACE}]`;
    if ((c === 'b' || c === 'B') && !inClass) return '\\' + c;
    if ('tnrfv'.includes(c)) return '\\' + c;
    if (SYNTAX_CHARS.includes(c) || (inClass && c === '-')) return '\\' + c;
    return fail(`the escape \\${c} is not supported`);
  };
  // RE2 is linear; JS backtracks. A repeated group that itself repeats or alternates ((a+)+,
  // (a|a)*, (?:\s*,\s*)+) can take exponential time on JS: refused. One stack entry per open
  // group: whether it contains a repetition or an alternation.
  const groups: boolean[] = [false];
  let closed: boolean | undefined; // the group that just closed, if the last token was ")"
  const mark = (): void => {
    groups[groups.length - 1] = true;
  };
  const repeat = (group: boolean | undefined, bounded01: boolean): void => {
    if (group === true && !bounded01) fail('a repeated group that repeats or alternates inside');
    mark();
  };
  // Whether the last token was a repetition (*, +, ?, {n,m}): only then is a ? its lazy marker.
  // Decided by tokens, never by the previous character, which may be an escaped \* or \?.
  let quantified = false;
  while (i < p.length) {
    const c = p[i] as string;
    const after = closed;
    closed = undefined;
    const afterRepetition = quantified;
    quantified = false;
    if (c === '\\') out += escape(false);
    else if (c === '.') {
      out += '[^\\n]';
      i++;
    } else if (c === '(') {
      if (p[i + 1] === '?') {
        if (!p.startsWith('(?:', i)) return fail('flags, named groups and lookarounds are not supported');
        out += '(?:';
        i += 3;
      } else {
        // A capturing group: Go's Split ignores captures, JS's split would insert them.
        out += '(?:';
        i++;
      }
      groups.push(false);
    } else if (c === '[') {
      out += '[';
      i++;
      if (p[i] === '^') {
        out += '^';
        i++;
      }
      if (p[i] === ']') return fail('a ] first in a class');
      let closed = false;
      while (i < p.length) {
        const d = p[i] as string;
        if (d === ']') {
          out += ']';
          i++;
          closed = true;
          break;
        }
        if (d === '[') return fail('[ inside a class');
        if (d === '\\') out += escape(true);
        else {
          out += d;
          i++;
        }
      }
      if (!closed) return fail('an unclosed class');
    } else if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(p.slice(i));
      if (!m) return fail('a { that is not a repetition');
      if (Number(m[1]) > 1000 || (m[3] !== undefined && m[3] !== '' && Number(m[3]) > 1000))
        return fail('a repetition above 1000');
      repeat(after, m[2] === undefined ? Number(m[1]) <= 1 : m[3] !== '' && Number(m[3]) <= 1);
      quantified = true;
      out += m[0];
      i += m[0].length;
    } else if (c === '}' || c === ']') return fail(`a lone ${c}`);
    else {
      if (c === ')') {
        const inner = groups.length > 1 ? (groups.pop() as boolean) : false;
        if (inner) mark();
        closed = inner;
      } else if (c === '|') mark();
      else if (c === '*' || c === '+' || c === '?') {
        // A ? right after a repetition makes it lazy; it repeats nothing itself.
        const lazy = c === '?' && afterRepetition && after === undefined;
        if (!lazy) {
          repeat(after, c === '?');
          quantified = true;
        }
      }
      out += c;
      i++;
    }
  }
  return out;
}

export function goRegexSplit(pattern: unknown, s: unknown): string[] {
  if (typeof pattern !== 'string' || typeof s !== 'string')
    return refuse('regex.split', 'expected two strings');
  let re: RegExp;
  try {
    re = new RegExp(translateRe2(pattern), 'gu');
  } catch (e) {
    if (e instanceof Refused) throw e;
    return refuse(
      'regex.split',
      `the pattern ${JSON.stringify(pattern)} is not supported: ${(e as Error).message}`,
    );
  }
  if (pattern.length > 0 && s.length === 0) return [''];
  // regexp.FindAllStringIndex(s, -1), then Split's assembly.
  const matches: [number, number][] = [];
  let pos = 0;
  let prevEnd = -1;
  while (pos <= s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) break;
    const start = m.index;
    const end = start + m[0].length;
    let accept = true;
    if (end === start) {
      if (start === prevEnd) accept = false;
      const cp = s.codePointAt(start);
      pos = start + (cp !== undefined && cp > 0xffff ? 2 : 1);
    } else pos = end;
    prevEnd = end;
    if (accept) matches.push([start, end]);
  }
  const out: string[] = [];
  let beg = 0;
  let end = 0;
  for (const [a, b] of matches) {
    end = a;
    if (b !== 0) out.push(s.slice(beg, end));
    beg = b;
  }
  if (end !== s.length) out.push(s.slice(beg));
  return out;
}
