/** Every field of an audit event, in canonical order (storage columns, hashing, docs). */
export const AUDIT_FIELDS = [
  'id',
  'time',
  'kind',
  'trace_id',
  'request_id',
  'actor',
  'agent_id',
  'user_id',
  'tenant_id',
  'action',
  'resource',
  'outcome',
  'message',
  'confidence',
  'policy_revision',
  'latency_us',
  'details',
  'hash',
  'prev_hash',
] as const;

/** One audit event as stored and served (SPEC §8). */
export interface AuditEvent {
  id: string;
  time: string;
  kind: string;
  trace_id: string | null;
  request_id: string | null;
  actor: string | null;
  agent_id: string | null;
  user_id: string | null;
  tenant_id: string | null;
  action: string | null;
  resource: unknown;
  outcome: string | null;
  message: string | null;
  confidence: number | null;
  policy_revision: number | null;
  latency_us: number | null;
  details: Record<string, unknown>;
  hash: string;
  prev_hash: string;
}

/** What a caller supplies; id, time, hash and prev_hash are assigned on append. */
export type NewAuditEvent = Partial<Omit<AuditEvent, 'id' | 'hash' | 'prev_hash' | 'kind'>> & {
  kind: string;
  id?: string;
};

/**
 * The user an event about a request concerns: the human of a human decision, or the user an
 * agent acted on behalf of (SPEC §13), so that `GET /api/v1/audit?user_id=` finds everything done
 * as them; `details.on_behalf_of` says which.
 */
export const eventUserId = (s: {
  user_id: string | null;
  on_behalf_of?: { user_id: string } | null;
}): string | null => s.user_id ?? s.on_behalf_of?.user_id ?? null;
