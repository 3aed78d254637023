/**
 * Which audit event kinds are Arbiter's own. The console imports this file too (to tell an
 * ingested report from Arbiter's record), so it imports nothing.
 */

/**
 * The namespaces of the events Arbiter writes itself: an ingested event cannot use them, so it
 * cannot pass for a decision, a transition or a change (nor make a webhook announce one).
 */
export const RESERVED_KIND_PREFIXES = [
  'queue.',
  'token.',
  'policy.',
  'data.',
  'key.',
  'webhook.',
  'shadow.',
  'limit.',
  'signing_key.',
];

/**
 * Whether `kind` is one Arbiter records itself, exactly as Arbiter writes it (all lowercase); every
 * other kind came through the ingest API. The console and the metrics tell the two apart by this.
 */
export function isReservedKind(kind: string): boolean {
  return kind === 'decision' || RESERVED_KIND_PREFIXES.some((p) => kind.startsWith(p));
}

/** The first word of each of Arbiter's own kinds: `decision`, `queue`, …, `signing` (of `signing_key.`). */
export const RESERVED_KIND_WORDS = [
  'decision',
  ...RESERVED_KIND_PREFIXES.map((p) => /^[a-z0-9]*/.exec(p)?.[0] ?? p),
];

/**
 * Whether an ingested `kind` would read as one of Arbiter's own: it begins with the first word of
 * one of them (up to the first `.`, `_`, `:` or `-`), in any letter case, singular or plural:
 * `Decision`, `Queue.approve`, `tokens.mint`, `Token_mint`, `policies.put`, `decision.override`.
 * Ingest refuses these; kinds of other words (`edge.decision`, `tokenizer.run`) are the engines'.
 * Every kind isReservedKind admits is one of these. The look-alikes that folding does not catch
 * (a trailing space, a zero-width space, a Cyrillic `о`, U+2024 for `.`) never get here: an
 * ingested kind is ASCII letters and digits joined by `.`, `_`, `:` or `-` (ASCII_NAME in
 * src/common/validation.ts).
 */
export function readsAsReservedKind(kind: string): boolean {
  const word = (/^[A-Za-z0-9]*/.exec(kind)?.[0] ?? '').toLowerCase();
  return RESERVED_KIND_WORDS.some(
    (w) => word === w || word === `${w}s` || (w.endsWith('y') && word === `${w.slice(0, -1)}ies`),
  );
}
