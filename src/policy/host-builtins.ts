/**
 * Builtins the wasm module imports from the host. OPA's semantics: time.now_ns is constant within
 * one evaluation, so it reads the clock captured when the evaluation starts.
 *
 * Nanosecond timestamps exceed 2^53; through the wasm JSON boundary they are JS numbers, so
 * results are exact to roughly a microsecond, which is what decisions need.
 */

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

const DURATION_UNITS: Record<string, number> = {
  ns: 1,
  us: 1e3,
  µs: 1e3,
  μs: 1e3,
  ms: 1e6,
  s: 1e9,
  m: 60e9,
  h: 3600e9,
};

/** Go's time.ParseDuration grammar: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+ */
export function parseDurationNs(s: unknown): number {
  if (typeof s !== 'string') throw new TypeError('time.parse_duration_ns: expected a string');
  const m = /^([-+]?)((?:\d*\.?\d+(?:ns|us|µs|μs|ms|s|m|h))+|0)$/.exec(s);
  if (!m) throw new TypeError(`time.parse_duration_ns: invalid duration ${s}`);
  let total = 0;
  for (const part of (m[2] as string).matchAll(/(\d*\.?\d+)(ns|us|µs|μs|ms|s|m|h)/g)) {
    total += Number(part[1]) * (DURATION_UNITS[part[2] as string] as number);
  }
  return m[1] === '-' ? -total : total;
}

const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

export function hostBuiltins(clock: EvalClock): Record<string, (...args: unknown[]) => unknown> {
  return {
    'time.now_ns': () => clock.nowNs,
    'time.parse_rfc3339_ns': (s: unknown) => {
      if (typeof s !== 'string' || !RFC3339.test(s))
        throw new TypeError('time.parse_rfc3339_ns: invalid time');
      const ms = Date.parse(s);
      if (Number.isNaN(ms)) throw new TypeError('time.parse_rfc3339_ns: invalid time');
      const frac = /\.(\d+)/.exec(s)?.[1] ?? '';
      const subMsNs = Number((frac + '000000000').slice(3, 9));
      return ms * NS_PER_MS + subMsNs;
    },
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
