import type { AuditEvent, NewAuditEvent } from './types.js';

/** Append-only audit storage. `append` is atomic: all events land, chained, or none do. */
export interface AuditStore {
  append(events: NewAuditEvent[]): Promise<AuditEvent[]>;
  /** Every event in chain order (for verification and tests). */
  iterate(): Iterable<AuditEvent>;
  count(): Promise<number>;
}
