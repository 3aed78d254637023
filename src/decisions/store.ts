import type { AuditEvent, NewAuditEvent } from '../audit/types.js';
import type { QueueItem } from '../queue/types.js';

/** What is kept of an answered decision: enough to replay it and to exchange it for a token. */
export interface DecisionRecord {
  request_id: string;
  kind: 'agent' | 'human';
  status: 'allow' | 'requires_approval' | 'deny';
  /** Id of the API key that asked. */
  key_id: string;
  tenant_id: string | null;
  /** agent_id or user_id */
  subject: string;
  action: string;
  resource: unknown;
  message: string | null;
  trace_id: string;
  created_at: string;
  expires_at: string | null;
  idem_key: string | null;
  body_hash: string | null;
  token_id: string | null;
}

export type RecordOutcome = { recorded: AuditEvent } | { replay: DecisionRecord };

export interface DecisionStore {
  /**
   * Records a decision, its audit event and (for requires_approval) its queue item atomically.
   * When the decision carries an idempotency key already used by the same API key since
   * `idemSince`, nothing is written and the earlier decision is returned to be replayed.
   */
  record(
    decision: DecisionRecord,
    event: NewAuditEvent,
    queueItem: QueueItem | undefined,
    idemSince: string,
  ): Promise<RecordOutcome>;
  findByIdempotencyKey(keyId: string, idemKey: string, since: string): Promise<DecisionRecord | undefined>;
  get(requestId: string): Promise<DecisionRecord | undefined>;
}
