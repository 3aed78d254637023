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

/** Whether `kind` is one Arbiter records itself; every other kind came through the ingest API. */
export function isReservedKind(kind: string): boolean {
  return kind === 'decision' || RESERVED_KIND_PREFIXES.some((p) => kind.startsWith(p));
}
