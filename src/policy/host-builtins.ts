/**
 * Builtins the wasm module imports from the host. OPA's semantics: time.now_ns is constant within
 * one evaluation, so it reads the clock captured when the evaluation starts.
 *
 * Nanosecond timestamps exceed 2^53; through the wasm JSON boundary they are JS numbers, so
 * results are exact to roughly a microsecond, which is what decisions need.
 */

import { installGoBuiltins } from './go-builtins/index.js';

// The SDK's own JS sprintf, regex.split and yaml.* answer differently from OPA: every evaluator
// imports this module, so replacing them here covers the serving and the evaluation threads.
installGoBuiltins();

const NS_PER_MS = 1_000_000;

export interface EvalClock {
  nowNs: number;
}

function asDate(arg: unknown, fn: string): { date: Date; tz: string } {
  let ns: unknown = arg;
  let tz = 'UTC';
  if (Array.isArray(arg)) {
    ns = arg[0];
    if (typeof arg[1] === 'string' && arg[1] !== '') tz = arg[1];
  }
  if (typeof ns !== 'number' || !Number.isFinite(ns)) throw new TypeError(`${fn}: expected a number of ns`);
  return { date: new Date(ns / NS_PER_MS), tz };
}

/** Calendar fields of `date` in time zone `tz` (IANA name or UTC). */
function fieldsIn(date: Date, tz: string) {
  if (tz === 'UTC' || tz === 'Local') {
    return {
      year: date.getUTCFullYear(),
      month: date.getUTCMonth() + 1,
      day: date.getUTCDate(),
      hour: date.getUTCHours(),
      minute: date.getUTCMinutes(),
      second: date.getUTCSeconds(),
      weekday: date.getUTCDay(),
    };
  }
  const parts = new Intl.DateTimeFormat('en-US', {
    timeZone: tz,
    hourCycle: 'h23',
    year: 'numeric',
    month: 'numeric',
    day: 'numeric',
    hour: 'numeric',
    minute: 'numeric',
    second: 'numeric',
    weekday: 'short',
  }).formatToParts(date);
  const get = (t: string) => parts.find((p) => p.type === t)?.value ?? '';
  return {
    year: Number(get('year')),
    month: Number(get('month')),
    day: Number(get('day')),
    hour: Number(get('hour')),
    minute: Number(get('minute')),
    second: Number(get('second')),
    weekday: ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'].indexOf(get('weekday')),
  };
}

const WEEKDAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];

/** Go's time.ParseDuration units, plus the d, w and y OPA v1.22 also takes (checked with opa eval). */
const DURATION_UNITS: Record<string, bigint> = {
  ns: 1n,
  us: 1_000n,
  µs: 1_000n, // U+00B5
  μs: 1_000n, // U+03BC
  ms: 1_000_000n,
  s: 1_000_000_000n,
  m: 60_000_000_000n,
  h: 3_600_000_000_000n,
  d: 86_400_000_000_000n,
  w: 604_800_000_000_000n,
  y: 31_536_000_000_000_000n,
};

const TWO_63 = 1n << 63n;

/**
 * Go's time.ParseDuration, step for step (int64 overflow is an error; a fraction is added through
 * float64 as Go does): [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+. The result is exact as a bigint; the
 * wasm boundary passes it on as a JS number (exact below 2^53 ns, about 104 days).
 */
export function parseDurationBigNs(s: unknown): bigint {
  if (typeof s !== 'string') throw new TypeError('time.parse_duration_ns: expected a string');
  const bad = (): never => {
    throw new TypeError(`time.parse_duration_ns: time: invalid duration ${JSON.stringify(s)}`);
  };
  let rest = s;
  let neg = false;
  if (rest !== '' && (rest[0] === '-' || rest[0] === '+')) {
    neg = rest[0] === '-';
    rest = rest.slice(1);
  }
  if (rest === '0') return 0n;
  if (rest === '') bad();
  let d = 0n;
  while (rest !== '') {
    if (!/^[0-9.]/.test(rest)) bad();
    // leadingInt: [0-9]*, overflow is an error.
    let i = 0;
    let v = 0n;
    while (i < rest.length && rest[i]! >= '0' && rest[i]! <= '9') {
      if (v > TWO_63 / 10n) bad();
      v = v * 10n + BigInt(rest.charCodeAt(i) - 48);
      if (v > TWO_63) bad();
      i++;
    }
    const pre = i > 0;
    rest = rest.slice(i);
    // leadingFraction: (\.[0-9]*)?, digits past int64 precision are skipped.
    let f = 0n;
    let scale = 1;
    let post = false;
    if (rest[0] === '.') {
      rest = rest.slice(1);
      let j = 0;
      let overflow = false;
      while (j < rest.length && rest[j]! >= '0' && rest[j]! <= '9') {
        if (!overflow) {
          if (f > (TWO_63 - 1n) / 10n) overflow = true;
          else {
            const y = f * 10n + BigInt(rest.charCodeAt(j) - 48);
            if (y > TWO_63) overflow = true;
            else {
              f = y;
              scale *= 10;
            }
          }
        }
        j++;
      }
      post = j > 0;
      rest = rest.slice(j);
    }
    if (!pre && !post) bad();
    let k = 0;
    while (k < rest.length && rest[k] !== '.' && !(rest[k]! >= '0' && rest[k]! <= '9')) k++;
    if (k === 0) bad();
    const unit = DURATION_UNITS[rest.slice(0, k)];
    rest = rest.slice(k);
    if (unit === undefined) bad();
    const u = unit as bigint;
    // OPA computes a fraction of d, w or y its own way ("2.3d" is 198719999999999 ns there, not
    // Go's 198720000000000): not reproduced, so refused (a zero fraction, "2.0d", is exact).
    if (f > 0n && u >= DURATION_UNITS.d!)
      throw new TypeError(
        `time.parse_duration_ns: a fraction of d, w or y in ${JSON.stringify(s)} (Arbiter refuses rather than answer differently from OPA)`,
      );
    if (v > TWO_63 / u) bad();
    v *= u;
    if (f > 0n) {
      v += BigInt(Math.trunc(Number(f) * (Number(u) / scale)));
      if (v > TWO_63) bad();
    }
    d += v;
    if (d > TWO_63) bad();
  }
  if (neg) return -d;
  if (d > TWO_63 - 1n) bad();
  return d;
}

export function parseDurationNs(s: unknown): number {
  return Number(parseDurationBigNs(s));
}

/**
 * What Go's time.Parse(time.RFC3339, s) accepts (its fast path falls back to the general parser,
 * whose rules are these): a 4-digit year, 2-digit month and day, a 1- or 2-digit hour, 2-digit
 * minute and second, each in range (day within its month, hour < 24, second < 60); a fraction
 * after "." or "," of any length (truncated to ns); "Z" or ±hh:mm with hh <= 24, mm <= 60.
 * Upper-case T and Z only. OPA then refuses a time outside int64 nanoseconds.
 */
const RFC3339 =
  /^(\d{4})-(\d{2})-(\d{2})T(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:Z|([+-])(\d{2}):(\d{2}))$/;

function daysFromCivil(y0: number, m: number, d: number): number {
  const y = m <= 2 ? y0 - 1 : y0;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146097 + doe - 719468;
}

function daysIn(month: number, year: number): number {
  if (month === 2) return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0 ? 29 : 28;
  return [4, 6, 9, 11].includes(month) ? 30 : 31;
}

export function parseRfc3339BigNs(s: unknown): bigint {
  const bad = (why: string): never => {
    throw new TypeError(`time.parse_rfc3339_ns: ${why}`);
  };
  if (typeof s !== 'string') return bad('expected a string');
  const m = RFC3339.exec(s);
  if (!m) return bad(`cannot parse ${JSON.stringify(s)} as RFC 3339`);
  const [year, month, day, hour, min, sec] = m.slice(1, 7).map(Number) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  if (month < 1 || month > 12) bad('month out of range');
  if (hour > 23) bad('hour out of range');
  if (min > 59) bad('minute out of range');
  if (sec > 59) bad('second out of range');
  if (day < 1 || day > daysIn(month, year)) bad('day out of range');
  const nsec = BigInt((m[7] ?? '').slice(0, 9).padEnd(9, '0'));
  let offset = 0;
  if (m[8] !== undefined) {
    const oh = Number(m[9]);
    const om = Number(m[10]);
    if (oh > 24) bad('time zone offset hour out of range');
    if (om > 60) bad('time zone offset minute out of range');
    offset = (oh * 60 + om) * 60 * (m[8] === '-' ? -1 : 1);
  }
  const secs =
    BigInt(daysFromCivil(year, month, day)) * 86400n + BigInt(hour * 3600 + min * 60 + sec - offset);
  const ns = secs * 1_000_000_000n + nsec;
  if (ns < -TWO_63 || ns > TWO_63 - 1n) bad('time outside of valid range');
  return ns;
}

export function hostBuiltins(clock: EvalClock): Record<string, (...args: unknown[]) => unknown> {
  return {
    'time.now_ns': () => clock.nowNs,
    'time.parse_rfc3339_ns': (s: unknown) => Number(parseRfc3339BigNs(s)),
    'time.parse_duration_ns': parseDurationNs,
    'time.date': (arg: unknown) => {
      const { date, tz } = asDate(arg, 'time.date');
      const f = fieldsIn(date, tz);
      return [f.year, f.month, f.day];
    },
    'time.clock': (arg: unknown) => {
      const { date, tz } = asDate(arg, 'time.clock');
      const f = fieldsIn(date, tz);
      return [f.hour, f.minute, f.second];
    },
    'time.weekday': (arg: unknown) => {
      const { date, tz } = asDate(arg, 'time.weekday');
      return WEEKDAYS[fieldsIn(date, tz).weekday];
    },
    'time.add_date': (ns: unknown, years: unknown, months: unknown, days: unknown) => {
      const { date } = asDate(ns, 'time.add_date');
      if (![years, months, days].every((n) => Number.isInteger(n))) {
        throw new TypeError('time.add_date: years, months and days must be integers');
      }
      const sub = (ns as number) % NS_PER_MS;
      const d = new Date(date.getTime());
      d.setUTCFullYear(d.getUTCFullYear() + (years as number), d.getUTCMonth() + (months as number));
      d.setUTCDate(d.getUTCDate() + (days as number));
      return d.getTime() * NS_PER_MS + sub;
    },
  };
}
