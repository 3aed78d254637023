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
