import type { AuditStore } from '../audit/store.js';
import type { AuditEvent } from '../audit/types.js';
import { withLimits } from '../decisions/limits.js';
import { decisionAgent, type DecisionStore } from '../decisions/store.js';
import { compileSchema, type JsonSchema } from '../common/validation.js';
import { busy, conflict, invalid, notFound } from '../errors.js';
import { admitsSubject, isBound, narrowToBinding } from '../keys/binding.js';
import type { Principal } from '../keys/types.js';
import type { Explainer, FiredRule } from './explain.js';
import type { PolicyDecision } from './evaluator.js';
import type { PolicyHistory } from './history.js';
import type { RecordedInput } from './types.js';
import type { PolicyService } from './service.js';
import { EvaluationThread, THREAD_FAILURE } from './eval-thread.js';

export const IMPACT_MAX_LIMIT = 100_000;
export const IMPACT_DEFAULT_LIMIT = 10_000;
export const IMPACT_MAX_SAMPLES = 50;
/**
 * Inputs sent to the evaluation threads at once: large enough that messages cost little, small
 * enough that a chunk of sound evaluations never approaches the thread's time allowance (the
 * thread answers a message as one, so its last input waits for all the others). Bounded by size
 * too, measured by the decisions' stored text (which holds the input, and costs nothing to
 * measure): however large the recorded inputs, a chunk is about 1 MiB at most (always at least
 * one input), so each evaluation still has its allowance.
 */
const CHUNK = 64;
const CHUNK_LENGTH = 1024 * 1024;
/**
 * Decisions read from the audit trail per query while replaying: at most PAGE, and about
 * PAGE_LENGTH of stored text (the next page is sized by the largest decision of the last one; the
 * first holds CHUNK, until that is known), so that large recorded inputs never load thousands at once.
 */
const PAGE = 2_000;
const PAGE_LENGTH = 16 * 1024 * 1024;

export const impactRequestSchema: JsonSchema = {
  type: 'object',
  required: ['policies'],
  additionalProperties: false,
  properties: {
    policies: {
      type: 'object',
      description: 'policy name → candidate Rego, or null to remove the policy',
      additionalProperties: { type: ['string', 'null'] },
    },
    data: {
      type: 'object',
      description: 'data path → candidate value, or null to remove the document',
    },
    since: {
      type: 'string',
      format: 'date-time',
      description: 'replay only decisions at or after this time',
    },
    limit: {
      type: 'integer',
      minimum: 1,
      maximum: IMPACT_MAX_LIMIT,
      description: `the most recent decisions to replay (default ${IMPACT_DEFAULT_LIMIT})`,
    },
  },
};

interface ImpactRequest {
  policies: Record<string, string | null>;
  data?: Record<string, unknown>;
  since?: string;
  limit?: number;
}
const validateImpact = compileSchema<ImpactRequest>(impactRequestSchema);

export interface ImpactSample {
  request_id: string | null;
  time: string;
  before: string;
  after: string;
  /** The candidate's evaluation error, when it failed on this decision. */
  error?: string;
}

export interface ImpactReport {
  replayed: number;
  /** Recorded decisions without a stored policy input (recorded before inputs were kept). */
  skipped: number;
  changed: number;
  changes: Record<string, number>;
  /**
   * Replayed decisions the candidate answered with an evaluation error (a conflict, a builtin's
   * error): each is a deny, counted in `changes` too when the live answer was not a deny, but
   * rarely what a change means to do.
   */
  errors: number;
  samples: ImpactSample[];
}

export interface ShadowReport {
  policies: { name: string; sha256: string; since: string }[];
  /** When the shadow set last changed: the counts start here (null: it never changed). */
  since: string | null;
  decisions: number;
  agree: number;
  disagree: number;
  errors: number;
  changes: Record<string, number>;
  samples: { request_id: string | null; live: string; shadow: string }[];
}

export interface ExplainReport {
  request_id: string;
  revision: number;
  recorded: { status: string };
  replayed: { status: string };
  fired: FiredRule[];
}

/**
 * Before and after a change (SPEC §11): the impact of a candidate set on recorded decisions, and
 * OPA's explanation of one recorded decision. Reads the audit trail and policy history; changes
 * nothing.
 */
export class LifecycleService {
  private replaying = false;

  constructor(
    private readonly policies: PolicyService,
    private readonly history: PolicyHistory,
    private readonly audit: AuditStore,
    private readonly decisions: Pick<DecisionStore, 'shadowTally' | 'get'>,
    private readonly explainer: Explainer,
  ) {}

  /**
   * Replays the most recent recorded decision inputs against the live set and the candidate set
   * and counts the decisions whose status differs. One replay at a time per process (429 else).
   * A bound key replays only its tenant's (and agent's) decisions: recorded inputs are audit data,
   * and a candidate written to ask about another tenant's input must find none to ask about.
   */
  async impact(principal: Principal, body: unknown): Promise<ImpactReport> {
    const req = validateImpact(body);
    const bound = narrowToBinding(principal, {});
    if (this.replaying) throw busy('an impact replay is already running; try again when it is done');
    this.replaying = true;
    try {
      const sets = await this.policies.candidate(req.policies, req.data ?? {});
      // Both sets are evaluated on threads of their own, never on the serving thread: a candidate
      // is untested code, and one whose evaluation never ends must not stall decisions. A thread
      // that fails or times out stops the replay (400), naming the decision.
      const live = new EvaluationThread();
      const candidate = new EvaluationThread();
      live.load(sets.live.threadSet);
      candidate.load(sets.candidate.threadSet);
      try {
        const limit = req.limit ?? IMPACT_DEFAULT_LIMIT;
        const report: ImpactReport = {
          replayed: 0,
          skipped: 0,
          changed: 0,
          changes: {},
          errors: 0,
          samples: [],
        };
        let before: { seq: number; time?: string } | undefined;
        let read = 0;
        let pageSize = CHUNK;
        while (read < limit) {
          const page = await this.audit.query({
            kind: 'decision',
            ...bound,
            // The instant, not the text: the trail compares ISO 8601 UTC strings.
            ...(req.since !== undefined ? { since: new Date(req.since).toISOString() } : {}),
            ...(before ? { before } : {}),
            limit: Math.min(pageSize, limit - read),
          });
          if (page.length === 0) break;
          read += page.length;
          const largest = Math.max(1, ...page.map((r) => r.length));
          pageSize = Math.max(1, Math.min(PAGE, Math.floor(PAGE_LENGTH / largest)));
          const replayable: Replayable[] = [];
          for (const { event, length } of page) {
            const input = recordedInput(event);
            if (input) replayable.push({ event, input, length });
            else report.skipped++;
          }
          for (const chunk of chunks(replayable)) {
            const [was, now] = await Promise.all(
              [live, candidate].map((t) => Promise.all(chunk.map((x) => t.evaluate(x.input)))),
            );
            chunk.forEach(({ event }, j) => {
              const w = replayed(was?.[j], event, 'live').status;
              const after = replayed(now?.[j], event, 'candidate');
              const n = after.status;
              const error = after.error;
              report.replayed++;
              if (error !== undefined) report.errors++;
              if (w === n) return;
              report.changed++;
              const key = `${w}→${n}`;
              report.changes[key] = (report.changes[key] ?? 0) + 1;
              if (report.samples.length < IMPACT_MAX_SAMPLES) {
                report.samples.push({
                  request_id: event.request_id,
                  time: event.time,
                  before: w,
                  after: n,
                  ...(error !== undefined ? { error } : {}),
                });
              }
            });
          }
          const last = page[page.length - 1] as { seq: number; event: AuditEvent };
          before = { seq: last.seq, time: last.event.time };
        }
        return report;
      } finally {
        await Promise.all([live.close(), candidate.close()]);
      }
    } finally {
      this.replaying = false;
    }
  }

  /**
   * The shadow set and, from its generation's tally (kept in each decision's transaction, by
   * every process), how often its answer agreed with the live one, what the disagreements were,
   * and the latest 20 of them. Reads a few rows, never the trail. The counts are over every
   * decision (the shadow set is global configuration, like the policies); a bound key sees only
   * the samples of its own tenant's (and agent's) decisions among those 20.
   */
  async shadowReport(principal: Principal): Promise<ShadowReport> {
    const state = await this.policies.shadow();
    const report: ShadowReport = {
      policies: state.policies.map(({ name, sha256, since }) => ({ name, sha256, since })),
      since: state.changed_at,
      decisions: 0,
      agree: 0,
      disagree: 0,
      errors: 0,
      changes: {},
      samples: [],
    };
    if (state.changed_at === null) return report;
    const tally = await this.decisions.shadowTally(state.generation);
    for (const c of tally.counts) {
      report.decisions += c.n;
      if (c.result === 'agree') report.agree += c.n;
      else if (c.result === 'error') report.errors += c.n;
      else {
        report.disagree += c.n;
        const key = `${c.live}→${c.shadow}`;
        report.changes[key] = (report.changes[key] ?? 0) + c.n;
      }
    }
    report.samples = await this.visibleSamples(principal, tally.samples);
    return report;
  }

  /** The samples a key may see: all of them, or for a bound key those of its tenant and agent. */
  private async visibleSamples<S extends { request_id: string }>(
    principal: Principal,
    samples: S[],
  ): Promise<S[]> {
    if (!isBound(principal)) return samples;
    const decisions = await Promise.all(samples.map((s) => this.decisions.get(s.request_id)));
    return samples.filter((_, i) => {
      const d = decisions[i];
      return (
        d !== undefined && admitsSubject(principal, { tenant_id: d.tenant_id, agent_id: decisionAgent(d) })
      );
    });
  }

  /**
   * Re-evaluates a recorded decision's input against the set of the revision it was made under,
   * with OPA's explanation. 404 when there is no such decision; 409 when it cannot be replayed
   * (no recorded input, no revision, or a revision that history does not hold). A bound key sees
   * only its tenant's and agent's decisions (404 for any other, as for an unknown id: a 403 would
   * confirm that the id exists).
   */
  async explain(principal: Principal, requestId: string): Promise<ExplainReport> {
    const events = await this.audit.byRequest(requestId, 0, 100);
    const event = events.find((e) => e.event.kind === 'decision')?.event;
    if (!event || !admitsSubject(principal, event)) {
      throw notFound(`decision ${requestId} not found`);
    }
    const revision = event.policy_revision;
    if (revision === null) {
      throw conflict(`decision ${requestId} was made with no policy set loaded: there is nothing to explain`);
    }
    const input = recordedInput(event);
    if (!input) {
      throw conflict(`decision ${requestId} was recorded without its policy input: it cannot be replayed`);
    }
    const set = await this.history.revisionSet(revision);
    if (!set) {
      throw conflict(
        `decision ${requestId} was made under revision ${revision}, which policy history does not hold: it cannot be replayed`,
      );
    }
    const r = await this.explainer.explain(set.modules, set.data, input);
    // As the engine answers it: malformed limits make the rules' answer the fail-closed deny.
    const status =
      r.status === 'error'
        ? r.status
        : withLimits({ status: r.status, message: '', reasons: [], limits: r.limits }).decision.status;
    return {
      request_id: requestId,
      revision,
      recorded: { status: event.outcome ?? 'unknown' },
      replayed: { status },
      fired: r.fired,
    };
  }
}

/** A recorded decision to replay, with the length of its stored text (see CHUNK). */
interface Replayable {
  event: AuditEvent;
  input: Record<string, unknown>;
  length: number;
}

/** `replayable` in order, in chunks of at most CHUNK inputs and about CHUNK_LENGTH (at least one input). */
function* chunks<T extends { length: number }>(replayable: T[]): Generator<T[]> {
  let chunk: T[] = [];
  let length = 0;
  for (const r of replayable) {
    if (chunk.length > 0 && (chunk.length === CHUNK || length + r.length > CHUNK_LENGTH)) {
      yield chunk;
      chunk = [];
      length = 0;
    }
    chunk.push(r);
    length += r.length;
  }
  if (chunk.length > 0) yield chunk;
}

/**
 * A replayed decision as the engine would answer it (malformed limits are its fail-closed deny,
 * with the error); a thread that could not evaluate stops the replay with a 400 naming the decision.
 */
function replayed(
  d: PolicyDecision | undefined,
  event: AuditEvent,
  set: 'live' | 'candidate',
): PolicyDecision {
  if (!d || d.reasons[0] === THREAD_FAILURE) {
    throw invalid(
      `impact replay stopped: the ${set} set could not evaluate decision ${event.request_id}: ${d?.message ?? 'no answer'}`,
    );
  }
  return withLimits(d).decision;
}

/** The policy inputs of the `n` most recent decision events, newest first (those that recorded one). */
export async function recentRecordedInputs(audit: AuditStore, n: number): Promise<RecordedInput[]> {
  return (await audit.query({ kind: 'decision', limit: n })).flatMap(({ event }) => {
    const input = recordedInput(event);
    const failed = typeof event.details.error === 'string';
    return input && event.request_id ? [{ requestId: event.request_id, input, failed }] : [];
  });
}

/** The policy input a decision event recorded (details.input plus details.context), if any. */
export function recordedInput(event: AuditEvent): Record<string, unknown> | undefined {
  const input = event.details.input;
  if (typeof input !== 'object' || input === null || Array.isArray(input)) return undefined;
  const context = event.details.context;
  return { ...(input as Record<string, unknown>), context: context ?? {} };
}
