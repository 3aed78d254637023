import type { AuditStore } from '../audit/store.js';
import type { DecisionStore, LimitStore } from '../decisions/store.js';
import type { KeyStore } from '../keys/types.js';
import type { PolicyStore } from '../policy/types.js';
import type { QueueStore } from '../queue/store.js';
import type { TokenStore } from '../tokens/types.js';
import type { WebhookStore } from '../webhooks/types.js';

/**
 * The storage contract: what Arbiter needs from a database, in the domain's own terms, with no
 * backend in it. SQLite (src/storage/sqlite) and PostgreSQL (src/storage/postgres) implement it,
 * and one test suite (test/storage/contract.ts) holds both to it. Stores hold SQL and nothing else:
 * the rules (chain linking, idempotency window, expiry) live in the services and src/audit/chain.ts.
 *
 * Every method is async and atomic on its own; a method that changes state also appends its audit
 * events in the same transaction. A storage failure rejects with an `unavailable` AppError when
 * the database cannot be reached (see src/storage/failure.ts), never with a partial write.
 */
export interface Stores {
  readonly backend: 'sqlite' | 'postgres';
  readonly audit: AuditStore;
  readonly decisions: DecisionStore;
  readonly limits: LimitStore;
  readonly queue: QueueStore;
  readonly tokens: TokenStore;
  readonly keys: KeyStore;
  readonly policies: PolicyStore;
  readonly webhooks: WebhookStore;
  /** Changes other processes of the deployment make, for what must reach every process. */
  readonly changes: ChangeFeed;
  /** CPU seconds of the thread that commits decisions, when it is a thread of its own (metrics). */
  writerCpuSeconds?(): Promise<number | undefined>;
  /**
   * For /healthz: undefined when storage can record now (a read succeeds, writes are accepted and
   * the audit chain can be appended to), else why not, in words fit for an unauthenticated caller.
   * Never throws.
   */
  health(): Promise<string | undefined>;
  /**
   * The value stored under `name` (a secret every process of the deployment shares, such as the
   * key that seals list cursors), storing `ifNone` first when there is none: the first process to
   * ask decides it, the others and later starts read the same.
   */
  sharedSecret(name: 'cursor_key', ifNone: string): Promise<string>;
  /**
   * Why this build must not use the database any more (a newer Arbiter has migrated it, see
   * unknownMigrations in src/storage/failure.ts), or undefined. Rejects when it cannot be read.
   */
  schemaProblem(): Promise<string | undefined>;
  close(): Promise<void>;
}

/**
 * What another process changed: the policy set (a new revision), a queue item (a long-poll may
 * end), keys (a revocation), the signing keys (a rotation). `resync` means notifications may have been missed (the feed
 * reconnected): re-read everything that is cached.
 */
export type Change =
  | { topic: 'revision' }
  | { topic: 'queue'; id: string }
  | { topic: 'keys' }
  | { topic: 'signing_keys' }
  | { topic: 'resync' };

export interface ChangeFeed {
  /**
   * Whether changes made by other processes arrive here. SQLite's feed carries none (its
   * several-worker mode relays changes itself, src/cluster.ts); PostgreSQL's is LISTEN/NOTIFY.
   */
  readonly crossProcess: boolean;
  subscribe(listener: (change: Change) => void): () => void;
}

/** Compiled sets kept: the live one and a few recent ones (a rollback loads without compiling). */
export const KEEP_COMPILED_SETS = 8;

/** A feed that never reports anything: one process, or a backend whose processes relay changes. */
export const SILENT_FEED: ChangeFeed = { crossProcess: false, subscribe: () => () => undefined };
