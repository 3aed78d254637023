export type QueueStatus = 'pending' | 'approved' | 'denied' | 'expired';

/** A human-review item (SPEC §6). Its id is the request_id of the decision that created it. */
export interface QueueItem {
  id: string;
  status: QueueStatus;
  kind: 'agent' | 'human';
  agent_id: string | null;
  user_id: string | null;
  tenant_id: string | null;
  action: string;
  resource: unknown;
  confidence: number | null;
  context: Record<string, unknown>;
  message: string;
  trace_id: string;
  created_at: string;
  expires_at: string;
  decided_at: string | null;
  decided_by: string | null;
  note: string | null;
  /** Id of the API key that asked; that key may not decide the item. */
  requested_by: string;
}
