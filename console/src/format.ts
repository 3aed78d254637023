import { INVISIBLE_CLASS } from '../../src/common/invisible.js';
import type { QueueItem } from './api.js';

/** "12:04:05" today, else "2026-11-23 12:04:05" (local time; the title carries the ISO instant). */
export function formatTime(iso: string | null, now = Date.now()): string {
  if (iso === null) return '—';
  const d = new Date(iso);
  const pad = (n: number) => String(n).padStart(2, '0');
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const today = new Date(now);
  const sameDay =
    d.getFullYear() === today.getFullYear() &&
    d.getMonth() === today.getMonth() &&
    d.getDate() === today.getDate();
  return sameDay ? time : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

/**
 * Time left until `iso` in its two largest units: minutes and seconds under an hour, hours and
 * minutes under two days, else days and hours; undefined once past.
 */
function leftParts(
  iso: string,
  now: number,
): { units: 'm s' | 'h m' | 'd h'; a: number; b: number } | undefined {
  const ms = Date.parse(iso) - now;
  if (ms <= 0) return undefined;
  const s = Math.floor(ms / 1000);
  if (s < 3600) return { units: 'm s', a: Math.floor(s / 60), b: s % 60 };
  const h = Math.floor(s / 3600);
  if (h < 48) return { units: 'h m', a: h, b: Math.floor((s % 3600) / 60) };
  return { units: 'd h', a: Math.floor(h / 24), b: h % 24 };
}

/** Time left until `iso`: "59:07", "1 h 02 min", "2 d 3 h"; "expired" once past. */
export function timeLeft(iso: string, now: number): string {
  const p = leftParts(iso, now);
  if (!p) return 'expired';
  const pad = String(p.b).padStart(2, '0');
  return p.units === 'm s'
    ? `${p.a}:${pad}`
    : p.units === 'h m'
      ? `${p.a} h ${pad} min`
      : `${p.a} d ${p.b} h`;
}

const SPOKEN_UNITS = {
  'm s': ['minute', 'second'],
  'h m': ['hour', 'minute'],
  'd h': ['day', 'hour'],
} as const;

/**
 * `timeLeft` in words, as a screen reader should say it ("59:07" reads as a time of day or a
 * ratio): "59 minutes 7 seconds", "1 hour 2 minutes", "2 days 3 hours"; "expired". Every place
 * that shows it labels it "Time left".
 */
export function timeLeftSpoken(iso: string, now: number): string {
  const p = leftParts(iso, now);
  if (!p) return 'expired';
  const [ua, ub] = SPOKEN_UNITS[p.units];
  const n = (count: number, unit: string) => `${count} ${unit}${count === 1 ? '' : 's'}`;
  return `${n(p.a, ua)} ${n(p.b, ub)}`;
}

/** Under five minutes left: shown as urgent. */
export function isUrgent(iso: string, now: number): boolean {
  return Date.parse(iso) - now < 5 * 60_000;
}

/** An agent's resource is a string; a human's is {type, id}. */
export function formatResource(resource: unknown): string {
  if (typeof resource === 'string') return resource;
  if (resource && typeof resource === 'object' && 'type' in resource && 'id' in resource) {
    const r = resource as { type: unknown; id: unknown };
    return `${String(r.type)}/${String(r.id)}`;
  }
  return JSON.stringify(resource);
}

/** UUIDv7 ids share their leading (time) digits: the tail tells neighbours apart. */
export function shortId(id: string): string {
  return id.length > 8 ? `…${id.slice(-8)}` : id;
}

export function subjectOf(item: QueueItem): { kind: 'agent' | 'user'; id: string } {
  return item.kind === 'agent'
    ? { kind: 'agent', id: item.agent_id ?? '?' }
    : { kind: 'user', id: item.user_id ?? '?' };
}

export function formatConfidence(c: number | null): string {
  return c === null ? '—' : c.toFixed(2);
}

export const STATUS_LABEL: Record<string, string> = {
  pending: 'Pending',
  approved: 'Approved',
  denied: 'Denied',
  expired: 'Expired',
};

/** Audit event kinds as a reviewer reads them. */
export const EVENT_LABEL: Record<string, string> = {
  decision: 'Policy decision',
  'queue.approve': 'Approved',
  'queue.deny': 'Denied',
  'queue.expire': 'Expired',
  'token.mint': 'Token minted',
  'token.revoke': 'Token revoked',
};

/**
 * Characters a reader would not see, or that change how the characters around them are shown:
 * format characters (\p{Cf}: bidi overrides and isolates, zero-width spaces and joiners, tags),
 * controls, surrogates, private-use and unassigned code points, every space but U+0020, line and
 * paragraph separators, and the rest of Unicode's default-ignorables (variation selectors, Hangul
 * fillers). An agent chooses these strings, so "\u202Ebd/dorp" must not read as "prod/db".
 */
const INVISIBLE = new RegExp(`[${INVISIBLE_CLASS}\\p{Cc}\\p{Cs}\\p{Co}\\p{Cn}\\p{Zs}\\p{Zl}\\p{Zp}]`, 'u');

/** Names for the invisible characters a reviewer is most likely to meet (shown on hover). */
const INVISIBLE_NAMES: Record<number, string> = {
  0x00a0: 'NO-BREAK SPACE',
  0x00ad: 'SOFT HYPHEN',
  0x061c: 'ARABIC LETTER MARK',
  0x200b: 'ZERO WIDTH SPACE',
  0x200c: 'ZERO WIDTH NON-JOINER',
  0x200d: 'ZERO WIDTH JOINER',
  0x200e: 'LEFT-TO-RIGHT MARK',
  0x200f: 'RIGHT-TO-LEFT MARK',
  0x202a: 'LEFT-TO-RIGHT EMBEDDING',
  0x202b: 'RIGHT-TO-LEFT EMBEDDING',
  0x202c: 'POP DIRECTIONAL FORMATTING',
  0x202d: 'LEFT-TO-RIGHT OVERRIDE',
  0x202e: 'RIGHT-TO-LEFT OVERRIDE',
  0x2060: 'WORD JOINER',
  0x2066: 'LEFT-TO-RIGHT ISOLATE',
  0x2067: 'RIGHT-TO-LEFT ISOLATE',
  0x2068: 'FIRST STRONG ISOLATE',
  0x2069: 'POP DIRECTIONAL ISOLATE',
  0xfeff: 'ZERO WIDTH NO-BREAK SPACE',
};

/**
 * One piece of a string as shown: text as it is, or a character made visible as its code point:
 * an invisible one, or (in an identifier) one that passes for another.
 */
export type Piece = { text: string } | { code: string; name: string; lookalike?: true };

/**
 * Letters of the scripts that identifiers may mix with Latin (Unicode TS #39, "highly
 * restrictive": Latin with Han, Hiragana, Katakana, Bopomofo or Hangul), and characters of no
 * script of their own (punctuation, combining marks).
 */
const MIXES_WITH_LATIN =
  /[\p{sc=Latin}\p{sc=Han}\p{sc=Hiragana}\p{sc=Katakana}\p{sc=Bopomofo}\p{sc=Hangul}\p{sc=Common}\p{sc=Inherited}]/u;
const LATIN_LETTER = /\p{sc=Latin}/u;
const LETTER = /\p{L}/u;
const DIGIT = /\p{Nd}/u;
/**
 * Punctuation and symbols beyond ASCII, emoji aside: "∕" (U+2215) and "⁄" (U+2044) pass for "/",
 * "‐" (U+2010) for "-", "ː" (U+02D0) for ":".
 */
const SIGN = /(?!\p{Extended_Pictographic})[\p{P}\p{S}\p{Lm}\p{Sk}]/u;
/**
 * Latin letters of the phonetic blocks (IPA "ɑ" U+0251, small capitals "ᴀ" U+1D00, "ɡ" U+0261,
 * the click letter "ǃ" U+01C3), drawn as ordinary letters or signs but not written in names.
 */
const PHONETIC = /[\u01C0-\u01C3\u0250-\u02FF\u1D00-\u1DBF\uA720-\uA7FF]/u;

/**
 * Why `ch`, in an identifier, could pass for a character it is not, or undefined: a compatibility
 * form (fullwidth "ａ", mathematical "𝖺", the ligature "ﬁ": NFKC changes it), a digit of another
 * script, or, when the identifier holds Latin letters, a letter of a script that identifiers do not
 * mix with Latin (Cyrillic "а" in "prod/аpi", Greek "ο"): a reviewer reads "prod/api", which it
 * is not; so are punctuation and symbols beyond ASCII (SIGN; emoji aside) and phonetic Latin
 * letters (PHONETIC). An identifier wholly in one script (Cyrillic, Greek, …) is shown as it is,
 * and so are accented and other Latin letters written in names ("é", "ß", Turkish "ı").
 */
function lookalike(ch: string, withLatin: boolean, identifier: boolean): string | undefined {
  if (ch.normalize('NFKC') !== ch) return `a compatibility form of “${ch.normalize('NFKC')}”`;
  if (DIGIT.test(ch) && !(ch >= '0' && ch <= '9')) return 'a digit of another script than 0–9';
  // Signs and phonetic letters only in identifiers: in data (a context's "100 €") they are text.
  if (identifier && ch > '\u007f' && SIGN.test(ch))
    return 'a sign beyond ASCII, which may pass for an ASCII one';
  if (identifier && PHONETIC.test(ch)) return 'a phonetic letter, which may pass for an ordinary one';
  if (withLatin && LETTER.test(ch) && !MIXES_WITH_LATIN.test(ch)) {
    return 'a letter of another script than the Latin letters beside it';
  }
  return undefined;
}

/**
 * How much of a string is marked beyond its invisible characters: nothing in `prose` (messages,
 * notes), look-alikes of other scripts, compatibility forms and foreign digits in `data` (the
 * context's keys and strings), and also signs beyond ASCII and phonetic letters in an
 * `identifier` (ids, actions, resources: compared code point by code point, read by eye).
 */
export type Marking = 'prose' | 'data' | 'identifier';

/**
 * Splits `value` into visible text and invisible characters, each of those as its code point
 * ("U+202E"). `keep` lists characters that are shown as they are (a note's line breaks).
 * Outside prose, characters that could pass for others (see lookalike) are made visible too.
 */
export function pieces(value: string, keep = '', marking: Marking = 'prose'): Piece[] {
  const out: Piece[] = [];
  const identifier = marking === 'identifier';
  const withLatin = marking !== 'prose' && LATIN_LETTER.test(value);
  let run = '';
  for (const ch of value) {
    const unseen = ch !== ' ' && !keep.includes(ch) && INVISIBLE.test(ch);
    const passesFor =
      !unseen && marking !== 'prose' && ch !== ' ' ? lookalike(ch, withLatin, identifier) : undefined;
    if (!unseen && passesFor === undefined) {
      run += ch;
      continue;
    }
    if (run !== '') out.push({ text: run });
    run = '';
    const cp = ch.codePointAt(0) as number;
    const code = `U+${cp.toString(16).toUpperCase().padStart(4, '0')}`;
    out.push(
      passesFor === undefined
        ? { code, name: INVISIBLE_NAMES[cp] ?? 'invisible character' }
        : { code, name: `“${ch}”, ${passesFor}`, lookalike: true },
    );
  }
  if (run !== '') out.push({ text: run });
  return out;
}

/**
 * `value` with each invisible character (and outside prose, each look-alike) as a ⟨U+XXXX⟩
 * token: for a title attribute.
 */
export function visible(value: string, keep = '', marking: Marking = 'prose'): string {
  return pieces(value, keep, marking)
    .map((p) => ('text' in p ? p.text : `⟨${p.code}⟩`))
    .join('');
}
