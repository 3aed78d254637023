import { eventFromStored } from '../audit/chain.js';
import type { AuditEvent } from '../audit/types.js';
import type { DecisionRecord } from '../decisions/store.js';
import type { ApiKeyRecord, Scope } from '../keys/types.js';
import type { DataDocument, RevisionChange, RevisionRecord, RevisionSummary } from '../policy/types.js';
import type { QueueItem } from '../queue/types.js';
import type { TokenRecord } from '../tokens/types.js';
import type { WebhookRecord } from '../webhooks/types.js';

/**
 * Rows as both backends return them (the same columns; JSON values as text) to the domain's
 * records, and back. One mapper per record, shared by SQLite and PostgreSQL.
 */
export type Row = Record<string, unknown>;

const json = <T>(v: unknown): T => JSON.parse(v as string) as T;
const jsonOrNull = <T>(v: unknown): T | null => (v === null || v === undefined ? null : json<T>(v));

/** An audit row as the store's queries return it: the event, its seq, its stored text's length. */
export const auditFromRow = (r: Row): { seq: number; event: AuditEvent; length: number } => ({
  seq: r.seq as number,
  event: eventFromStored(r.body as string, r.hash as string),
  length: (r.body as string).length,
});

export const decisionFromRow = (r: Row): DecisionRecord => ({
  ...(r as unknown as DecisionRecord),
  resource: json(r.resource),
});

export const decisionToRow = (d: DecisionRecord): Row => ({
  request_digest: null,
  policy_revision: null,
  user_id: null,
  ...d,
  resource: JSON.stringify(d.resource),
});

export const queueFromRow = (r: Row): QueueItem => ({
  ...(r as unknown as QueueItem),
  resource: json(r.resource),
  context: json(r.context),
  on_behalf_of: jsonOrNull(r.on_behalf_of),
  limits: jsonOrNull(r.limits),
});

export const queueToRow = (item: QueueItem): Row => ({
  request_digest: null,
  policy_revision: null,
  ...item,
  resource: JSON.stringify(item.resource),
  context: JSON.stringify(item.context),
  on_behalf_of: item.on_behalf_of ? JSON.stringify(item.on_behalf_of) : null,
  limits: item.limits ? JSON.stringify(item.limits) : null,
});

export const tokenFromRow = (r: Row): TokenRecord => ({
  ...(r as unknown as TokenRecord),
  scopes: json(r.scopes),
});

export const tokenToRow = (t: TokenRecord): Row => ({
  request_digest: null,
  policy_revision: null,
  signing_kid: null,
  user_id: null,
  ...t,
  scopes: JSON.stringify(t.scopes),
});

export const keyFromRow = (r: Row): ApiKeyRecord => ({
  ...(r as unknown as ApiKeyRecord),
  scopes: json<Scope[]>(r.scopes),
});

export const hookFromRow = (r: Row): WebhookRecord => ({
  ...(r as unknown as WebhookRecord),
  events: json(r.events),
});

export const dataFromRow = (r: Row): DataDocument => ({
  path: r.path as string,
  value: json(r.value),
  updated_at: r.updated_at as string,
});

/** The columns of a revision's summary, as both backends select them for a list. */
export const REVISION_SUMMARY_COLUMNS = 'revision, time, actor, message, changes';

export const revisionSummaryFromRow = (r: Row): RevisionSummary => ({
  revision: r.revision as number,
  time: r.time as string,
  actor: r.actor as string,
  message: r.message as string | null,
  changes: json<RevisionChange[]>(r.changes),
});

export const revisionFromRow = (r: Row): RevisionRecord => ({
  ...revisionSummaryFromRow(r),
  policies: json(r.policies),
  data: json(r.data),
});
