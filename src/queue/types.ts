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
  /** base64url SHA-256 of the call as received (SPEC §13): what an approval is bound to. */
  request_digest?: string | null;
  /** The policy revision that asked for approval. */
  policy_revision?: number | null;
  /** The user an agent acts for (SPEC §13). */
  on_behalf_of?: { tenant_id: string; user_id: string } | null;
  /** Budgets the request consumes when approved (internal: not shown). */
  limits?: LimitDeclaration[] | null;
}

/**
 * A queue item as the API shows it (SPEC §6; `present` in service.ts): which key asked, and the
 * budgets it will consume, are Arbiter's business only. The console reads this type too.
 */
export type QueueItemView = Omit<QueueItem, 'requested_by' | 'limits'>;

/** A budget as a policy declared it, in micro-units (SPEC §13 `limits`). */
export interface LimitDeclaration {
  key: string;
  /** As declared, e.g. "1h". */
  window: string;
  windowMs: number;
  /** Micro-units (1 = 1e-6): exact integer arithmetic across processes. */
  max: number;
  cost: number;
}

/** One budget charged at one instant: the declaration and the fixed window the instant is in. */
export interface LimitUse extends LimitDeclaration {
  windowStart: string;
}
