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

/** One policy as a revision holds it (its text lives in the content-addressed blob store). */
export interface RevisionPolicy {
  name: string;
  sha256: string;
  version: number;
  description: string;
}

/** One data document as a revision holds it. */
export interface RevisionData {
  path: string;
  sha256: string;
}

export interface RevisionChange {
  kind: 'policy' | 'data';
  name: string;
  op: 'put' | 'delete';
}

/** A revision as GET /api/v1/revisions lists it: who, when and what changed. */
export interface RevisionSummary {
  revision: number;
  time: string;
  actor: string;
  message: string | null;
  changes: RevisionChange[];
}

/** A revision as history keeps it: its summary and the whole set it made live. */
export interface RevisionRecord extends RevisionSummary {
  policies: RevisionPolicy[];
  data: RevisionData[];
}

/** One version of one policy, as its history lists it. */
export interface PolicyVersionRecord {
  name: string;
  version: number;
  revision: number;
  sha256: string;
  time: string;
  actor: string;
  deleted: boolean;
}

/**
 * Every change to policies and data is one of these, applied as ONE revision, all or nothing:
 * a single PUT or DELETE, a bundle, a restore, the first seeding.
 */
export interface PolicyChange {
  /** The live revision the change was compiled against; another one means `stale`. */
  expectedRevision: number;
  /** Policy name → the version it must have now (0: must not exist), from If-Match. */
  ifVersions?: Record<string, number>;
  putPolicies: readonly { name: string; rego: string; description: string; sha256: string }[];
  deletePolicies: readonly string[];
  putData: readonly { path: string; value: unknown; sha256: string }[];
  deleteData: readonly string[];
  actor: string;
  message: string | null;
  /** The first seeding: only into a never-seeded store, which it marks seeded. */
  seed?: boolean;
  /**
   * A promotion (SPEC §11): the shadow module of this name leaves the shadow set in the same
   * transaction, only if it still has this sha256; else the outcome is `absent` with its name.
   */
  promoteShadow?: { name: string; sha256: string };
}

export type CommitOutcome =
  | {
      ok: true;
      revision: number;
      time: string;
      created: string[];
      policies: PolicyRecord[];
      data: DataDocument[];
    }
  /** The live revision moved since the change was compiled: compile again against the new one. */
  | { ok: false; stale: true }
  /** A policy's version is not the one `ifVersions` names. */
  | { ok: false; conflict: string }
  /** A delete names a policy or data document that does not exist, or a promotion a shadow module. */
  | { ok: false; absent: string };

/** A candidate module in the shadow set (SPEC §11): evaluated beside the live set, never answering. */
export interface ShadowPolicy {
  name: string;
  rego: string;
  sha256: string;
  /** When this module entered the shadow set (its last PUT). */
  since: string;
}

/** The shadow set as every process shares it. */
export interface ShadowState {
  /** Bumped by every change of the shadow set: a process whose copy is older reloads it. */
  generation: number;
  /** When the shadow set last changed (null: never); GET /api/v1/shadow counts from here. */
  changed_at: string | null;
  policies: ShadowPolicy[];
}

export interface PolicyStore {
  /** The live set, its revision and whether the store was ever seeded, read consistently. */
  snapshot(): Promise<PolicySnapshot>;
  revision(): Promise<number>;
  /**
   * Applies a change as one revision in one transaction: the live tables, the content-addressed
   * history (an unchanged module is not stored twice), the revision record and its audit events
   * (made by `events(revision)`). Nothing is written unless every condition holds. While a shadow
   * set exists, a live change is a change of the shadow set too (it is the live set with the
   * shadow modules in it): its generation moves on and its report starts again.
   */
  commit(change: PolicyChange, events: (revision: number) => NewAuditEvent[]): Promise<CommitOutcome>;
  /** Compiled wasm for a policy-set hash, if any process compiled that set before. */
  getCompiled(setHash: string): Promise<Buffer | undefined>;
  /** Keeps compiled wasm (the newest few sets only). */
  putCompiled(setHash: string, wasm: Buffer): Promise<void>;
  /**
   * Revisions newest first, those below `before` when given: their summaries only (a revision's
   * manifests grow with the set, and a list does not show them).
   */
  listRevisions(before: number | undefined, limit: number): Promise<RevisionSummary[]>;
  getRevision(revision: number): Promise<RevisionRecord | undefined>;
  /** The texts of policies and values of data documents by their sha256 (content-addressed). */
  blobs(
    policySha: string[],
    dataSha: string[],
  ): Promise<{ rego: Map<string, string>; data: Map<string, unknown> }>;
  /** Versions of one policy, newest first, those below `before` when given. */
  policyVersions(name: string, before: number | undefined, limit: number): Promise<PolicyVersionRecord[]>;
  /** The first revision history has recorded (undefined for an empty history). */
  firstRevision(): Promise<number | undefined>;
  /** The shared shadow set. */
  shadow(): Promise<ShadowState>;
  /** The shadow set's generation alone (cheap: read on every refresh). */
  shadowGeneration(): Promise<number>;
  /**
   * Puts one module into the shadow set (replacing one of that name), with its audit events, in
   * one transaction that bumps the generation; `created` when the name was not shadowed.
   */
  putShadow(
    p: { name: string; rego: string; sha256: string },
    events: NewAuditEvent[],
  ): Promise<{ created: boolean; since: string }>;
  /**
   * Drops one module from the shadow set, with its audit events, bumping the generation; only if
   * it still has `sha256` when given. False (nothing written) when there was nothing to drop.
   */
  dropShadow(name: string, sha256: string | undefined, events: NewAuditEvent[]): Promise<boolean>;
}

/** A recorded decision's policy input, and whether its own evaluation failed (`details.error`). */
export interface RecordedInput {
  requestId: string;
  input: Record<string, unknown>;
  failed: boolean;
}
