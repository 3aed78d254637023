import type { AuditEvent, NewAuditEvent } from '../audit/types.js';
import type { QueueItem } from '../queue/types.js';

/** Records a decision: its audit event and, for requires_approval, its queue item, atomically. */
export interface DecisionStore {
  record(event: NewAuditEvent, queueItem: QueueItem | undefined): Promise<AuditEvent>;
}
