import type { NewAuditEvent } from '../audit/types.js';
import { conflict, invalid, isKind, notFound, precondition, unavailable } from '../errors.js';
import type { RegoCompiler } from './compiler.js';
import {
  checkDataPath,
  checkName,
  checkRego,
  dataSha256,
  dataTree,
  overlaps,
  regoSha256,
} from './documents.js';
import { readPolicyDir } from './policy-dir.js';
import type { Evaluator } from './evaluator.js';
import {
  type BundleRequest,
  type BundleResult,
  candidateSet,
  checkBundle,
  isEmptyPlan,
  type Plan,
  planBundle,
  planRestore,
  setAfter,
} from './plans.js';
import { ShadowSet, shadowModules } from './shadow-set.js';
import { SetBuilder } from './set-builder.js';
import type {
  DataDocument,
  PolicyRecord,
  PolicySnapshot,
  PolicyStore,
  RecordedInput,
  ShadowState,
} from './types.js';

/** Who changed something and in which flow, for the audit event. */
export interface ChangeContext {
  actor: string;
  traceId: string;
  requestId: string;
}

/** What the service reports (metrics, logs, the cluster relay): keeps prom-client and IPC out of it. */
export interface CompileObserver {
  compiled(ok: boolean, seconds: number): void;
  revision(revision: number): void;
  /**
   * Called after a change is stored and live here, before it is answered; with several serving
   * processes it resolves once every process has loaded it. Never inside the serialized section:
   * another process's refresh must be able to run meanwhile.
   */
  changed?(revision: number): Promise<void>;
  /** The shadow set moved to the serving thread (proven) or back to its own thread, or was dropped. */
  shadowInline?(inline: boolean): void;
  /** A slow evaluation on the serving thread sent the shadow set back to its own thread. */
  shadowSentBack?(): void;
  /** A slow evaluation on the serving thread was the machine's, not the set's: the set stayed. */
  shadowSlowKept?(): void;
  /** The shadow set started (true) or stopped (false) being evaluated in one pass with the live set. */
  shadowPaired?(paired: boolean): void;
  /** A paired answer differed from the two sets' own (the pair was dropped); `detail` shows both. */
  shadowPairDiffered?(detail: string): void;
  /** The shadow set loaded last cannot be paired with the live set, and why. */
  shadowUnpaired?(why: string): void;
}

/** A policy as lists and write answers show it: everything but its text. */
export type PolicyMeta = Omit<PolicyRecord, 'rego'>;

/**
 * A condition a caller sets on a policy's current state (over HTTP: `If-Match`). `holds` sees the
 * current policy (undefined when there is none); `failure` is the message when it does not hold.
 */
export interface Precondition {
  holds(current: PolicyMeta | undefined): boolean;
  failure: string;
}
/** `p` without its text. */
export const metaOf = ({ rego: _rego, ...meta }: PolicyRecord): PolicyMeta => meta;

/** A change of nothing, to spread a change's own fields onto. */
const NO_CHANGE = {
  putPolicies: [],
  deletePolicies: [],
  putData: [],
  deleteData: [],
  message: null,
} as const;
/** An attempt's answer when the store's revision moved since its snapshot. */
const STALE = Symbol('stale');
/** Attempts of one change before giving up (each one lost a race to another process's change). */
const MAX_CHANGE_ATTEMPTS = 5;
const notFoundOf = (name: string): never => {
  throw notFound(`${name} not found`);
};

/** 404: `name` is not (or no longer) in the shadow set. */
const notInShadow = (name: string, why?: string) =>
  notFound(`policy ${name} is not in the shadow set${why ? `: ${why}` : ''}`);

/** What a policy write answers. */
interface PutResult {
  policy: PolicyMeta;
  created: boolean;
  revision: number;
  dryRun: boolean;
}

/**
 * Owns the live policy set: compiles changes with the real OPA compiler, stores them, and swaps
 * the evaluator atomically. Changes are serialized; the store's revision is the single counter.
 */
export class PolicyService {
  private live: Evaluator | undefined;
  /** The shadow set as this process evaluates it. */
  readonly shadowSet: ShadowSet;
  /** Compiles, instantiates and checks the sets this service makes live or shadows. */
  private readonly sets: SetBuilder;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: PolicyStore,
    compiler: RegoCompiler,
    evalBudgetMs: number,
    private readonly observer: CompileObserver,
    /**
     * Whether a proven shadow set moves to the serving thread (ADR 0010), and whether there it is
     * evaluated in one pass with the live set where it can be (ADR 0012).
     */
    shadow: { inline: boolean; paired: boolean },
    /** The policy inputs of the most recent recorded decisions, newest first (the audit trail). */
    recentInputs?: (n: number) => Promise<RecordedInput[]>,
  ) {
    this.sets = new SetBuilder(store, compiler, evalBudgetMs, observer, () => this.live, recentInputs);
    this.shadowSet = new ShadowSet({
      inline: shadow.inline,
      moved: (inline) => observer.shadowInline?.(inline),
      sentBack: () => observer.shadowSentBack?.(),
      slowKept: () => observer.shadowSlowKept?.(),
      paired: (paired) => observer.shadowPaired?.(paired),
      pairDiffered: (detail) => observer.shadowPairDiffered?.(detail),
      unpaired: (why) => observer.shadowUnpaired?.(why),
    });
    this.shadowPaired = shadow.inline && shadow.paired;
  }

  /** Whether an inline shadow set is paired with the live set (ADR 0012). */
  private readonly shadowPaired: boolean;

  /** The live evaluator; undefined only before start() has loaded a set. */
  get evaluator(): Evaluator | undefined {
    return this.live;
  }

  /** Stops the check, plan and shadow threads; shadow evaluations still waiting count an error. */
  async close(): Promise<void> {
    await Promise.allSettled([this.sets.close(), this.shadowSet.close()]);
  }

  /** Loads the stored set, seeding an empty never-seeded store from `policyDir` first. */
  async start(policyDir: string, ctx: ChangeContext): Promise<{ seeded: boolean; revision: number }> {
    return this.serialized(async () => {
      const snap = await this.store.snapshot();
      if (!snap.seeded && snap.policies.length === 0 && snap.data.length === 0) {
        const revision = await this.seed(snap, policyDir, ctx);
        if (revision !== undefined) return { seeded: true, revision };
      }
      const now = await this.store.snapshot();
      await this.load(now);
      return { seeded: false, revision: now.revision };
    });
  }

  /**
   * Stores and installs the set of `policyDir` as the first revision over the empty `snap`; the
   * revision, or undefined when another process seeded first (then its set is loaded instead).
   */
  private async seed(
    snap: PolicySnapshot,
    policyDir: string,
    ctx: ChangeContext,
  ): Promise<number | undefined> {
    const initial = await readPolicyDir(policyDir);
    // Refuse to seed a set that does not compile or whose thresholds are malformed.
    const module = await this.sets.compiled(initial.modules);
    const next = await this.sets.prepare(
      module,
      dataTree(initial.data),
      snap.revision + 1,
      initial.modules,
      'live',
    );
    const r = await this.store.commit(
      {
        expectedRevision: snap.revision,
        putPolicies: initial.modules.map((m) => ({
          name: m.name,
          rego: m.rego,
          description: m.description,
          sha256: regoSha256(m.rego),
        })),
        deletePolicies: [],
        putData: initial.data.map((d) => ({ ...d, sha256: dataSha256(d.value) })),
        deleteData: [],
        actor: ctx.actor,
        message: `seeded from ${policyDir}`,
        seed: true,
      },
      (revision) => [
        {
          ...changeEvent('policy.seed', undefined, revision, ctx, {
            policies: initial.modules.map((m) => m.name),
            data: initial.data.map((d) => d.path),
          }),
          message: `seeded ${initial.modules.length} policies and ${initial.data.length} data documents from ${policyDir}`,
        },
      ],
    );
    if (!r.ok) return undefined;
    await this.install(next, r.revision);
    return r.revision;
  }

  /** Reloads from the store if another process changed it (no-op when the revision is current). */
  async refresh(): Promise<void> {
    await this.serialized(async () => {
      if ((await this.store.revision()) !== this.live?.revision) await this.load(await this.store.snapshot());
      else if ((await this.store.shadowGeneration()) !== this.shadowSet.loadedGeneration)
        await this.reshadow();
    });
  }

  /** The live policies without their texts, and the live revision. */
  async list(): Promise<{ policies: PolicyMeta[]; revision: number }> {
    const snap = await this.store.snapshot();
    return { policies: snap.policies.map(metaOf), revision: snap.revision };
  }

  /** One live policy with its text; 404 when it is not live. */
  async get(name: string): Promise<PolicyRecord> {
    checkName(name);
    const p = (await this.store.snapshot()).policies.find((x) => x.name === name);
    if (!p) throw notFound(`policy ${name} not found`);
    return p;
  }

  /**
   * Creates or replaces a policy as a new revision, compiled with the whole live set and checked
   * before anything is stored (a dry run stops there); `precondition` is the caller's If-Match.
   */
  async put(
    name: string,
    rego: string,
    description: string | undefined,
    opts: { precondition?: Precondition | undefined; dryRun: boolean },
    ctx: ChangeContext,
  ): Promise<PutResult> {
    checkName(name);
    checkRego(rego);
    const r = await this.changing((snap) => this.attemptPut(snap, name, rego, description, opts, ctx));
    if (!r.dryRun) await this.announce(r.revision);
    return r;
  }

  /**
   * One attempt at a policy write against `snap` (STALE when the live set moved meanwhile). With
   * `promoted`, the shadow module of that sha256 is the text, and it leaves the shadow set in the
   * same transaction (404 when it has left it or been replaced meanwhile).
   */
  private async attemptPut(
    snap: PolicySnapshot,
    name: string,
    rego: string,
    description: string | undefined,
    opts: { precondition?: Precondition | undefined; dryRun: boolean },
    ctx: ChangeContext,
    promoted?: string,
  ): Promise<{ done: PutResult } | typeof STALE> {
    const existing = snap.policies.find((p) => p.name === name);
    const ifVersion = expectedVersion(existing, opts.precondition);
    const modules = [...snap.policies.filter((p) => p.name !== name), { name, rego }];
    const module = await this.sets.compiled(modules);
    const next = await this.sets.prepare(module, dataTree(snap.data), snap.revision + 1, modules, 'live');
    const desc = description ?? existing?.description ?? '';
    if (opts.dryRun) {
      const version = (existing?.version ?? 0) + 1;
      const policy = {
        name,
        description: desc,
        sha256: regoSha256(rego),
        version,
        updated_at: new Date().toISOString(),
      };
      return { done: { policy, created: !existing, revision: snap.revision, dryRun: true } };
    }
    const c = await this.store.commit(
      {
        ...NO_CHANGE,
        expectedRevision: snap.revision,
        ifVersions: ifVersion === undefined ? undefined : { [name]: ifVersion },
        putPolicies: [{ name, rego, description: desc, sha256: regoSha256(rego) }],
        actor: ctx.actor,
        ...(promoted !== undefined ? { promoteShadow: { name, sha256: promoted } } : {}),
      },
      (revision) => [
        changeEvent('policy.put', name, revision, ctx, { sha256: regoSha256(rego), created: !existing }),
        ...(promoted !== undefined
          ? [changeEvent('policy.shadow.promote', name, revision, ctx, { sha256: promoted })]
          : []),
      ],
    );
    if (!c.ok) {
      if ('conflict' in c) throw preconditionFailed(name);
      if ('stale' in c) return STALE;
      if (promoted !== undefined) throw notInShadow(name, 'it was promoted, replaced or dropped meanwhile');
      return notFoundOf(c.absent);
    }
    await this.install(next, c.revision);
    const policy = c.policies[0] as PolicyRecord;
    return {
      done: {
        policy: metaOf(policy),
        created: c.created.includes(name),
        revision: c.revision,
        dryRun: false,
      },
    };
  }

  /** Deletes a policy as a new revision; 400 when the set left would not compile. */
  async delete(
    name: string,
    precondition: Precondition | undefined,
    ctx: ChangeContext,
  ): Promise<{ revision: number }> {
    checkName(name);
    const result = await this.changing(async (snap) => {
      const existing = snap.policies.find((p) => p.name === name);
      if (!existing) throw notFound(`policy ${name} not found`);
      const ifVersion = expectedVersion(existing, precondition);
      const remaining = snap.policies.filter((p) => p.name !== name);
      let module: WebAssembly.Module;
      try {
        module = await this.sets.compiled(remaining);
      } catch (e) {
        if (isKind(e, 'invalid')) {
          throw invalid(`deleting policy ${name} would leave a set that does not compile: ${e.message}`);
        }
        throw e;
      }
      const next = await this.sets.prepare(module, dataTree(snap.data), snap.revision + 1, remaining, 'live');
      const c = await this.store.commit(
        {
          ...NO_CHANGE,
          expectedRevision: snap.revision,
          ifVersions: ifVersion === undefined ? undefined : { [name]: ifVersion },
          deletePolicies: [name],
          actor: ctx.actor,
        },
        (revision) => [changeEvent('policy.delete', name, revision, ctx, {})],
      );
      if (!c.ok) {
        if ('conflict' in c) throw preconditionFailed(name);
        return 'stale' in c ? STALE : notFoundOf(c.absent);
      }
      await this.install(next, c.revision);
      return { done: { revision: c.revision } };
    });
    await this.announce(result.revision);
    return result;
  }

  /** The live data documents' paths (not their values), and the live revision. */
  async listData(): Promise<{ documents: { path: string; updated_at: string }[]; revision: number }> {
    const snap = await this.store.snapshot();
    return {
      documents: snap.data.map((d) => ({ path: d.path, updated_at: d.updated_at })),
      revision: snap.revision,
    };
  }

  /** One live data document with its value; 404 when there is none at the path. */
  async getData(dataPath: string): Promise<DataDocument> {
    checkDataPath(dataPath);
    const doc = (await this.store.snapshot()).data.find((d) => d.path === dataPath);
    if (!doc) throw notFound(`data document ${dataPath} not found`);
    return doc;
  }

  /**
   * Creates or replaces a data document as a new revision, the live policies checked against the
   * new data first; 409 when its path overlaps another document's.
   */
  async putData(
    dataPath: string,
    value: unknown,
    ctx: ChangeContext,
  ): Promise<{ path: string; created: boolean; revision: number; updated_at: string }> {
    checkDataPath(dataPath);
    const result = await this.changing(async (snap) => {
      const clash = snap.data.find((d) => d.path !== dataPath && overlaps(d.path, dataPath));
      if (clash) throw conflict(`data path ${dataPath} overlaps existing document ${clash.path}`);
      const docs = [
        ...snap.data.filter((d) => d.path !== dataPath),
        { path: dataPath, value, updated_at: '' },
      ];
      const prepared = await this.sets.checked(
        await this.withData(snap, dataTree(docs)),
        snap.policies,
        'live',
      );
      const sha256 = dataSha256(value);
      const created = !snap.data.some((d) => d.path === dataPath);
      const c = await this.store.commit(
        {
          ...NO_CHANGE,
          expectedRevision: snap.revision,
          putData: [{ path: dataPath, value, sha256 }],
          actor: ctx.actor,
        },
        // What went live, by content, as policy.put and a bundle's data_sha256 record it.
        (revision) => [changeEvent('data.put', dataPath, revision, ctx, { sha256, created })],
      );
      if (!c.ok) return 'stale' in c ? STALE : notFoundOf(dataPath);
      await this.install(prepared, c.revision);
      return { done: { path: dataPath, created, revision: c.revision, updated_at: c.time } };
    });
    await this.announce(result.revision);
    return result;
  }

  /** Deletes a data document as a new revision, the live policies checked without it first. */
  async deleteData(dataPath: string, ctx: ChangeContext): Promise<{ revision: number }> {
    checkDataPath(dataPath);
    const result = await this.changing(async (snap) => {
      if (!snap.data.some((d) => d.path === dataPath)) throw notFound(`data document ${dataPath} not found`);
      const docs = snap.data.filter((d) => d.path !== dataPath);
      const prepared = await this.sets.checked(
        await this.withData(snap, dataTree(docs)),
        snap.policies,
        'live',
      );
      const c = await this.store.commit(
        { ...NO_CHANGE, expectedRevision: snap.revision, deleteData: [dataPath], actor: ctx.actor },
        (revision) => [changeEvent('data.delete', dataPath, revision, ctx, {})],
      );
      if (!c.ok) return 'stale' in c ? STALE : notFoundOf(dataPath);
      await this.install(prepared, c.revision);
      return { done: { revision: c.revision } };
    });
    await this.announce(result.revision);
    return result;
  }

  /** The shadow set's modules and when it last changed (SPEC §11). */
  async shadow(): Promise<ShadowState> {
    return this.store.shadow();
  }

  /**
   * Puts a candidate module into the shadow set: compiled with the live set like a PUT (400
   * naming policy, row and column), without changing any answer. Every process loads it.
   */
  async putShadow(
    name: string,
    rego: string,
    dryRun: boolean,
    ctx: ChangeContext,
  ): Promise<{ name: string; sha256: string; since: string; created: boolean; dryRun: boolean }> {
    checkName(name);
    checkRego(rego);
    const digest = regoSha256(rego);
    const r = await this.serialized(async () => {
      const [snap, shadow] = await Promise.all([this.store.snapshot(), this.store.shadow()]);
      const next = shadow.policies.filter((p) => p.name !== name);
      next.push({ name, rego, sha256: digest, since: '' });
      const modules = shadowModules(snap.policies, next);
      await this.sets.prepare(await this.sets.compiled(modules), dataTree(snap.data), snap.revision, modules);
      if (dryRun) {
        const created = !shadow.policies.some((p) => p.name === name);
        return { created, since: new Date().toISOString() };
      }
      const stored = await this.store.putShadow({ name, rego, sha256: digest }, [
        changeEvent('policy.shadow.put', name, snap.revision, ctx, { sha256: digest }),
      ]);
      await this.reshadow();
      return stored;
    });
    if (!dryRun) await this.announce(this.requireLive().revision);
    return { name, sha256: digest, since: r.since, created: r.created, dryRun };
  }

  /** Drops a module from the shadow set; 404 when it is not shadowed. */
  async dropShadow(name: string, ctx: ChangeContext): Promise<void> {
    checkName(name);
    await this.serialized(async () => {
      const revision = this.requireLive().revision;
      const dropped = await this.store.dropShadow(name, undefined, [
        changeEvent('policy.shadow.delete', name, revision, ctx, {}),
      ]);
      if (!dropped) throw notInShadow(name);
      await this.reshadow();
    });
    await this.announce(this.requireLive().revision);
  }

  /**
   * Makes a shadow module live (a normal change: compiled, a new revision, audited, `If-Match` on
   * the live policy honoured) and drops it from the shadow set in the same transaction: of
   * concurrent promotions one wins, and one that meets a replaced module changes nothing. 404
   * when the name is not shadowed.
   */
  async promote(
    name: string,
    precondition: Precondition | undefined,
    ctx: ChangeContext,
  ): Promise<{ policy: PolicyMeta; created: boolean; revision: number }> {
    checkName(name);
    const r = await this.changing(async (snap) => {
      const candidate = (await this.store.shadow()).policies.find((p) => p.name === name);
      if (!candidate) throw notInShadow(name);
      return this.attemptPut(
        snap,
        name,
        candidate.rego,
        undefined,
        { precondition, dryRun: false },
        ctx,
        candidate.sha256,
      );
    });
    await this.announce(r.revision);
    return { policy: r.policy, created: r.created, revision: r.revision };
  }

  /**
   * Evaluators for the live set and for a candidate: the live set with each of `policies` put (a
   * string) or removed (null), and each of `data` put or removed (SPEC §11, impact). The candidate
   * is compiled like a change (400 naming policy, row and column) and stored nowhere: nothing
   * changes, not even the compiled-set cache.
   */
  async candidate(
    policies: Record<string, string | null>,
    data: Record<string, unknown>,
  ): Promise<{ live: Evaluator; candidate: Evaluator }> {
    const snap = await this.store.snapshot();
    const { modules: set, data: tree } = candidateSet(snap, policies, data);
    const candidate = await this.sets.prepare(
      await this.sets.compiledWithoutStoring(set),
      tree,
      snap.revision,
      set,
      'isolated',
    );
    const current = this.requireLive();
    const live =
      current.revision === snap.revision
        ? current
        : await this.sets.prepare(
            await this.sets.compiledWithoutStoring(snap.policies),
            dataTree(snap.data),
            snap.revision,
          );
    return { live, candidate };
  }

  /**
   * Applies a bundle (SPEC §11): every policy and data change in it as ONE compile and ONE
   * revision, all or nothing. A bundle that changes nothing makes no revision.
   */
  async bundle(
    b: BundleRequest,
    opts: { expectedRevision?: number | undefined; dryRun: boolean },
    ctx: ChangeContext,
  ): Promise<BundleResult> {
    checkBundle(b);
    const r = await this.changing(async (snap) => {
      if (opts.expectedRevision !== undefined && opts.expectedRevision !== snap.revision) {
        throw precondition(
          `If-Match names revision ${opts.expectedRevision} but the live revision is ${snap.revision}`,
        );
      }
      const { plan, result } = planBundle(snap, b, opts.dryRun);
      if (isEmptyPlan(plan)) return { done: result };
      const next = await this.prepareSet(snap, plan);
      if (opts.dryRun) return { done: result };
      const c = await this.store.commit(
        { ...plan, expectedRevision: snap.revision, actor: ctx.actor, message: b.message },
        (revision) => [
          changeEvent('policy.bundle', 'bundle', revision, ctx, {
            created: result.created,
            updated: result.updated,
            deleted: result.deleted,
            data_put: plan.putData.map((d) => d.path),
            data_deleted: result.data.deleted,
            // What went live, by content: the trail shows which text, not only which names.
            sha256: Object.fromEntries(plan.putPolicies.map((p) => [p.name, p.sha256])),
            data_sha256: Object.fromEntries(plan.putData.map((d) => [d.path, d.sha256])),
            message: b.message,
          }),
        ],
      );
      if (!c.ok) {
        if ('stale' in c) return STALE;
        return notFoundOf('conflict' in c ? c.conflict : c.absent);
      }
      await this.install(next, c.revision);
      return { done: { ...result, revision: c.revision } };
    });
    if (!r.dry_run) await this.announce(r.revision);
    return r;
  }

  /**
   * Makes revision n's whole set (policies with their descriptions, and data) live again as a new
   * revision, compiled, hot-swapped and audited like any change. Refused (conflict) when that set
   * is already live: the same modules, descriptions and data.
   */
  async restore(n: number, ctx: ChangeContext): Promise<{ revision: number }> {
    const target = await this.store.getRevision(n);
    if (!target) throw notFound(`revision ${n} not found`);
    const blobs = await this.store.blobs(
      target.policies.map((p) => p.sha256),
      target.data.map((d) => d.sha256),
    );
    const result = await this.changing(async (snap) => {
      const plan = planRestore(snap, target, blobs);
      if (isEmptyPlan(plan)) {
        throw conflict(`revision ${n}'s policy set is already live (revision ${snap.revision})`);
      }
      const next = await this.prepareSet(snap, plan);
      const c = await this.store.commit(
        { ...plan, expectedRevision: snap.revision, actor: ctx.actor, message: `restore of revision ${n}` },
        (revision) => [
          changeEvent('policy.restore', `revision ${n}`, revision, ctx, {
            restored_revision: n,
            policies_put: plan.putPolicies.map((p) => p.name),
            policies_deleted: plan.deletePolicies,
            data_put: plan.putData.map((d) => d.path),
            data_deleted: plan.deleteData,
            sha256: Object.fromEntries(plan.putPolicies.map((p) => [p.name, p.sha256])),
            data_sha256: Object.fromEntries(plan.putData.map((d) => [d.path, d.sha256])),
          }),
        ],
      );
      if (!c.ok) return 'stale' in c ? STALE : notFoundOf('conflict' in c ? c.conflict : c.absent);
      await this.install(next, c.revision);
      return { done: { revision: c.revision } };
    });
    await this.announce(result.revision);
    return result;
  }

  /**
   * The evaluator for the snapshot with `plan` applied: the whole resulting set compiled as one
   * (400 naming policy, row and column), its data checked for overlaps and its thresholds checked.
   * Nothing is stored.
   */
  private async prepareSet(snap: PolicySnapshot, plan: Plan): Promise<Evaluator> {
    const { modules, docs } = setAfter(snap, plan);
    const module = await this.sets.compiled(modules);
    return this.sets.prepare(module, dataTree(docs), snap.revision + 1, modules, 'live');
  }

  /**
   * Runs a change: `attempt` reads the snapshot it is given, compiles against it and commits on
   * the condition that the live revision is still the snapshot's. When another process changed
   * the set meanwhile, the store answers stale and the change is made again against the new set
   * (so whatever is committed was compiled as a whole). Serialized within this process.
   */
  private changing<T>(attempt: (snap: PolicySnapshot) => Promise<{ done: T } | typeof STALE>): Promise<T> {
    return this.serialized(async () => {
      for (let tries = 1; ; tries++) {
        const r = await attempt(await this.store.snapshot());
        if (r !== STALE) return r.done;
        if (tries >= MAX_CHANGE_ATTEMPTS) {
          throw unavailable('the policy set kept changing under this change; try again');
        }
      }
    });
  }

  /** An evaluator for the snapshot's modules with other data (reusing the live module when it is that set). */
  private async withData(snap: PolicySnapshot, data: Record<string, unknown>): Promise<Evaluator> {
    const live = this.requireLive();
    if (live.revision === snap.revision) return live.withData(data, snap.revision + 1);
    return this.sets.prepare(await this.sets.compiled(snap.policies), data, snap.revision + 1);
  }

  /** Waits until every serving process has loaded `revision` (CompileObserver.changed). */
  private async announce(revision: number): Promise<void> {
    await this.observer.changed?.(revision);
  }

  /** The live evaluator; 503 before start() has loaded a set. */
  private requireLive(): Evaluator {
    if (!this.live) throw unavailable('no policy set is loaded');
    return this.live;
  }

  /** Makes `snap`'s set live here as it is stored (start-up, another process's change). */
  private async load(snap: PolicySnapshot): Promise<void> {
    const module = await this.sets.compiled(snap.policies);
    await this.install(await this.sets.prepare(module, dataTree(snap.data), snap.revision), snap.revision);
  }

  /** Swaps in `e`; if the store assigned another revision than expected, relabels it first. */
  private async install(e: Evaluator, revision: number): Promise<void> {
    const next = e.revision === revision ? e : await e.withData(e.data, revision);
    this.live = next;
    this.observer.revision(next.revision);
    await this.reshadow();
  }

  /**
   * Rebuilds the shadow set — the live set with each shadow module replacing or adding its name —
   * after the live set or the shadow set changed. A shadow set that no longer compiles leaves
   * the live set alone: it is marked broken and every decision counts a shadow error.
   */
  private async reshadow(): Promise<void> {
    if (!this.live) return;
    let snap: PolicySnapshot | undefined;
    await this.shadowSet.rebuild(
      () => this.store.shadow(),
      async (shadow) => {
        snap = await this.store.snapshot();
        const modules = shadowModules(snap.policies, shadow);
        return this.sets.prepare(
          await this.sets.compiled(modules),
          dataTree(snap.data),
          snap.revision,
          modules,
        );
      },
      this.shadowPaired ? (shadow) => this.sets.paired(snap, shadow) : undefined,
    );
  }

  /** Runs `fn` after every change queued before it: compiles and swaps never interleave. */
  private serialized<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }
}

/** A conditional write that lost a race: the policy changed after the precondition was checked. */
function preconditionFailed(name: string): Error {
  return precondition(`policy ${name} has changed: If-Match does not match its current ETag`);
}

/**
 * The version a conditional write must find (0: none), or undefined when it is unconditional. A
 * precondition that does not hold now is refused before anything is compiled or stored.
 */
function expectedVersion(
  existing: PolicyRecord | undefined,
  pre: Precondition | undefined,
): number | undefined {
  if (pre === undefined) return undefined;
  if (!pre.holds(existing === undefined ? undefined : metaOf(existing))) throw precondition(pre.failure);
  return existing?.version ?? 0;
}

/**
 * The audit event of a policy, data or shadow change made by `ctx` (SPEC §11): it names the
 * revision it made live (a shadow change: the live revision it was made over).
 */
function changeEvent(
  kind: string,
  subject: string | undefined,
  revision: number,
  ctx: ChangeContext,
  details: Record<string, unknown>,
): NewAuditEvent {
  return {
    kind,
    actor: ctx.actor,
    trace_id: ctx.traceId,
    request_id: ctx.requestId,
    ...(subject !== undefined ? { resource: subject } : {}),
    outcome: 'success',
    policy_revision: revision,
    details,
  };
}
