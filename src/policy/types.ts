import type { NewAuditEvent } from '../audit/types.js';

export interface PolicyRecord {
  name: string;
  description: string;
  rego: string;
  sha256: string;
  version: number;
  updated_at: string;
}

export interface DataDocument {
  /** Slash-separated path under `data`, e.g. `rbac/roles` is `data.rbac.roles`. */
  path: string;
  value: unknown;
  updated_at: string;
}

export interface PolicySnapshot {
  revision: number;
  policies: PolicyRecord[];
  data: DataDocument[];
  seeded: boolean;
}

export interface PolicyStore {
  snapshot(): Promise<PolicySnapshot>;
  revision(): Promise<number>;
  /**
   * Creates or updates a policy and bumps the revision, atomically with its audit event.
   * `ifVersion` (when given) must equal the stored version (0 = must not exist), else 'conflict'.
   */
  putPolicy(
    p: Omit<PolicyRecord, 'version' | 'updated_at'>,
    ifVersion: number | undefined,
    event: (revision: number) => NewAuditEvent,
  ): Promise<{ policy: PolicyRecord; created: boolean; revision: number } | 'conflict'>;
  deletePolicy(
    name: string,
    ifVersion: number | undefined,
    event: (revision: number) => NewAuditEvent,
  ): Promise<{ revision: number } | 'absent' | 'conflict'>;
  putData(
    path: string,
    value: unknown,
    event: (revision: number) => NewAuditEvent,
  ): Promise<{ created: boolean; revision: number; doc: DataDocument }>;
  deleteData(
    path: string,
    event: (revision: number) => NewAuditEvent,
  ): Promise<{ revision: number } | 'absent'>;
  /** Compiled wasm for a policy-set hash, if any process compiled that set before. */
  getCompiled(setHash: string): Promise<Buffer | undefined>;
  /** Keeps compiled wasm (the newest few sets only). */
  putCompiled(setHash: string, wasm: Buffer): Promise<void>;
  /** Loads the initial set into an empty, never-seeded store; a no-op once seeded. */
  seed(
    policies: Omit<PolicyRecord, 'version' | 'updated_at'>[],
    data: { path: string; value: unknown }[],
    event: (revision: number) => NewAuditEvent,
  ): Promise<boolean>;
}
