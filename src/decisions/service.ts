import { createHash } from 'node:crypto';
import { canonicalJson } from '../common/canonical-json.js';
import { eventUserId, type NewAuditEvent } from '../audit/types.js';
import { maskedValues, withoutValues } from '../audit/mask.js';
import { type AppError, tooLarge, unavailable, unprocessable } from '../errors.js';
import { jsonBytesOver } from '../common/json-size.js';
import { checkAdmits } from '../keys/binding.js';
import { compileSchema } from '../common/validation.js';
import type { Principal } from '../keys/types.js';
import { failClosed, type DecisionStatus, type PolicyDecision } from '../policy/evaluator.js';
import type { PolicyService } from '../policy/service.js';
import type { LimitDeclaration, LimitUse, QueueItem } from '../queue/types.js';
import { requestDigest } from './digest.js';
import { agentInput, humanInput } from './policy-input.js';
import { chargeAt, fromMicro, withLimits } from './limits.js';
import { agentRequestSchema, humanRequestSchema, type AgentRequest, type HumanRequest } from './schemas.js';
import type { DecisionRecord, DecisionStore, DecisionToRecord, LimitCharge, RecordOutcome } from './store.js';

export interface FlowIds {
  requestId: string;
  traceId: string;
  /**
   * The size of the JSON text the request came in, when known: a request too small to hold a
   * context over the limit spares measuring it.
   */
  receivedBytes?: number | undefined;
}

export interface DecisionBody {
  status: DecisionStatus;
  request_id: string;
  trace_id: string;
  message?: string;
  expires_at?: string;
  request_digest?: string;
}

/** A decision as answered: the HTTP edge picks the status from `decision.status`. */
export interface DecisionResult {
  decision: DecisionBody;
  /** True when this answers a retry with the first response (Idempotency-Key). */
  replayed: boolean;
}

/** An Idempotency-Key is honoured for 24 hours (SPEC §5). */
export const IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000;

export interface DecisionObserver {
  decided(kind: 'agent' | 'human', outcome: DecisionStatus, evalSeconds: number): void;
  /** The shadow set's verdict on one decision (SPEC §11), when a shadow set is active. */
  shadowed?(result: 'agree' | 'disagree' | 'error'): void;
  /** A requires_approval recorded as a deny by the pending-approval cap (ADR 0013). */
  capped?(kind: 'agent' | 'human'): void;
}

/** What a decision is about, as queued, recorded and audited. */
type Subject = Pick<
  QueueItem,
  'agent_id' | 'user_id' | 'tenant_id' | 'action' | 'resource' | 'confidence' | 'context'
> & { on_behalf_of: { tenant_id: string; user_id: string } | null };

/** An Idempotency-Key with the hash of the body it was first sent with. */
interface Idempotency {
  key: string;
  hash: string;
  /** Records older than this are not replayed. */
  since: string;
}

/** The policy's answer, the budgets it declared, and what it cost. */
interface Evaluation {
  decision: PolicyDecision;
  limits: LimitDeclaration[];
  revision: number | null;
  latencyNs: number;
}

/**
 * One request as it is recorded, whatever its answer (the live one, or the deny of an exhausted
 * budget): the subject and policy input masked, the evaluation, the caller, the time.
 */
interface Deciding {
  kind: 'agent' | 'human';
  /** Its context masked. */
  subject: Subject;
  /** The policy input, masked. */
  input: Record<string, unknown>;
  evaluation: Evaluation;
  principal: Principal;
  ids: FlowIds;
  now: Date;
  call: Call;
  idem: Idempotency | undefined;
  shadow: ShadowOutcome | undefined;
}

/** What one request adds to its decision beyond the subject: its digest and extra input. */
interface Call {
  digest: string;
  /** AuthZEN requests carry themselves verbatim as input.authzen (SPEC §14). */
  extras: DecisionExtras;
}

/** Input a caller other than the plain authorize routes adds (AuthZEN). */
export interface DecisionExtras {
  authzen?: Record<string, unknown>;
  /**
   * The tenant an AuthZEN agent subject claims (`subject.properties.tenant_id`), already held to
   * the key's binding: the decision's tenant when it acts for no user, so that the tenant's
   * reviewers see its queue item (a native agent request has no such field: the key's tenant).
   */
  tenant?: string;
  /**
   * The caller has held this request to the size limit already (an AuthZEN batch checks every
   * evaluation before it decides any): it is not measured again. Unset, it is measured here.
   */
  sizeChecked?: boolean;
}

/** How a 413 names an AuthZEN evaluation held to the size limit whole. */
const AUTHZEN_EVALUATION = 'the evaluation (subject, action, resource and context together)';

const validateAgent = compileSchema<AgentRequest>(agentRequestSchema);
const validateHuman = compileSchema<HumanRequest>(humanRequestSchema);

/**
 * Agent and human authorization: validate, evaluate the live policy set (in-process, no spawn,
 * no network, no compile), record the decision (with its queue item and its budgets) durably,
 * then answer.
 */
export class DecisionService {
  constructor(
    private readonly policies: PolicyService,
    private readonly store: DecisionStore,
    private readonly queueTtlSeconds: number,
    private readonly mask: (doc: Record<string, unknown>) => Record<string, unknown>,
    private readonly observer: DecisionObserver,
    /** The most a request's context may be as JSON (UTF-8 bytes; ARBITER_MAX_CONTEXT_BYTES). */
    private readonly maxContextBytes: number,
    /** Pending approvals one key may have at once (ARBITER_QUEUE_MAX_PENDING_PER_KEY; 0: no cap). */
    private readonly maxPendingPerKey: number,
  ) {}

  /**
   * Refuses (413) what a caller sent free-form when it is larger than the limit as JSON: it is
   * stored twice (the queue item and the audit event), listed to reviewers and evaluated on the
   * serving thread, so a body-sized one would make every one of those cost a megabyte. `what`
   * names it in the error. Checked before anything is recorded.
   */
  private checkSize(what: string, value: unknown, receivedBytes: number | undefined): void {
    const bytes = jsonBytesOver(value, this.maxContextBytes, receivedBytes);
    if (bytes !== undefined) throw this.tooLarge(what, bytes);
  }

  /** The 413 for `what`, `bytes` long as JSON, over the limit. */
  tooLarge(what: string, bytes: number): AppError {
    return tooLarge(
      `${what} is ${bytes} bytes as JSON, more than the ${this.maxContextBytes}-byte limit (ARBITER_MAX_CONTEXT_BYTES)`,
    );
  }

  /** The most what a caller sends free-form may be as JSON (ARBITER_MAX_CONTEXT_BYTES). */
  get sizeLimit(): number {
    return this.maxContextBytes;
  }

  /**
   * Whether `idemKey` already has a recorded decision of this key's, within the window: a retry
   * of it is answered from the record (or refused as a different body), never held to limits
   * that came after it.
   */
  async isRecorded(principal: Principal, idemKey: string): Promise<boolean> {
    return (
      (await this.store.findByIdempotencyKey(principal.keyId, idemKey, idempotencySince())) !== undefined
    );
  }

  async authorizeAgent(
    body: unknown,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
    extras: DecisionExtras = {},
  ): Promise<DecisionResult> {
    const req = validateAgent(body);
    checkAdmits(principal, 'agent', req.agent_id, `cannot authorize as ${req.agent_id}`);
    const obo = req.on_behalf_of;
    if (obo) {
      checkAdmits(principal, 'tenant', obo.tenant_id, `cannot act on behalf of users of ${obo.tenant_id}`);
    }
    const context = req.context ?? {};
    const digest = requestDigest({
      agent_id: req.agent_id,
      ...(obo ? { user_id: obo.user_id } : {}),
      tenant_id: obo?.tenant_id ?? null,
      action: req.action,
      resource: req.resource,
      context,
      ...boundAuthzen(extras),
    });
    return this.decide('agent', req, agentInput(req, principal, extras.authzen), principal, ids, idemKey, {
      subject: {
        agent_id: req.agent_id,
        user_id: null,
        tenant_id: obo?.tenant_id ?? extras.tenant ?? principal.tenant,
        action: req.action,
        resource: req.resource,
        confidence: req.confidence,
        context,
        on_behalf_of: obo ? { tenant_id: obo.tenant_id, user_id: obo.user_id } : null,
      },
      call: { digest, extras },
    });
  }

  async authorizeHuman(
    body: unknown,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
    extras: DecisionExtras = {},
  ): Promise<DecisionResult> {
    const req = validateHuman(body);
    checkAdmits(principal, 'agent', null, 'cannot authorize human users');
    checkAdmits(principal, 'tenant', req.tenant_id, `cannot authorize in ${req.tenant_id}`);
    const resource = { type: req.resource.type, id: req.resource.id };
    const context = req.context ?? {};
    const digest = requestDigest({
      user_id: req.user_id,
      tenant_id: req.tenant_id,
      action: req.action,
      resource,
      context,
      ...boundAuthzen(extras),
    });
    return this.decide('human', req, humanInput(req, principal, extras.authzen), principal, ids, idemKey, {
      subject: {
        agent_id: null,
        user_id: req.user_id,
        tenant_id: req.tenant_id,
        action: req.action,
        resource,
        confidence: null,
        context,
        on_behalf_of: null,
      },
      call: { digest, extras },
    });
  }

  /**
   * Replays an earlier answer to the same Idempotency-Key, or evaluates, records (decision, queue
   * item, budgets and audit event in one transaction) and answers. Nothing is answered unrecorded.
   */
  private async decide(
    kind: 'agent' | 'human',
    req: AgentRequest | HumanRequest,
    input: Record<string, unknown>,
    principal: Principal,
    ids: FlowIds,
    idemKey: string | undefined,
    { subject, call }: { subject: Subject; call: Call },
  ): Promise<DecisionResult> {
    // An AuthZEN request is the same request only if its input.authzen is the same too.
    const idem = idempotency(
      kind,
      call.extras.authzen ? { req, authzen: call.extras.authzen } : req,
      idemKey,
    );
    if (idem) {
      const prior = await this.store.findByIdempotencyKey(principal.keyId, idem.key, idem.since);
      if (prior) return replay(prior, idem.hash);
    }
    // After the replay: a retry of a request recorded before the limit (or under a higher one)
    // gets its recorded answer.
    if (!call.extras.sizeChecked) this.checkRequestSize(req, call.extras, ids.receivedBytes);
    const { evaluation, live, shadow, maskedInput } = await this.judge(input);
    const d: Deciding = {
      kind,
      subject: { ...subject, context: this.maskContext(subject.context) },
      input: maskedInput,
      evaluation,
      principal,
      ids,
      now: new Date(),
      call,
      idem,
      shadow,
    };
    const chosen = this.recordsOf(d, live);
    const common: Pick<DecisionToRecord, 'idemSince' | 'shadow'> = {
      idemSince: idem?.since ?? idempotencySince(),
      shadow: shadow ? { generation: shadow.generation, live: shadow.live } : undefined,
    };
    let outcome: RecordOutcome;
    let capped = false;
    try {
      outcome = await this.store.record({
        ...chosen,
        ...common,
        charge: this.chargeOf(d),
        pendingCap: chosen.item && this.maxPendingPerKey > 0 ? this.maxPendingPerKey : undefined,
      });
      if ('capped' in outcome) {
        // The key had its most pending approvals and nothing was recorded: its deny is, now. Built
        // only here, so that every other requires_approval does not carry a deny it will not use.
        // A retry that raced it and was recorded first is replayed, like any retry.
        capped = true;
        const denial = this.recordsOf(d, queueFullDenial(this.maxPendingPerKey));
        outcome = await this.store.record({ ...denial, ...common });
        if ('capped' in outcome) throw new Error('a deny was capped');
      }
    } catch (e) {
      // Fail closed: an unrecorded decision is never answered, least of all with allow. The cause
      // goes to the log only (errorMiddleware), so an operator sees why.
      throw unavailable('decision could not be recorded in the audit trail; try again', e);
    }
    if ('replay' in outcome) return replay(outcome.replay, idem?.hash ?? '');
    this.observer.decided(kind, outcome.decision.status, evaluation.latencyNs / 1e9);
    if (shadow) this.observer.shadowed?.(shadow.result);
    if (capped) this.observer.capped?.(kind);
    return { decision: answer(outcome.decision), replayed: false };
  }

  /** Refuses (413) a request whose free-form part is over the size limit, before it is evaluated. */
  private checkRequestSize(
    req: AgentRequest | HumanRequest,
    extras: DecisionExtras,
    receivedBytes: number | undefined,
  ): void {
    if (extras.authzen) {
      // The whole evaluation reaches the policy and the audit event (input.authzen), not only
      // its context: its subject, action and resource may carry any properties.
      this.checkSize(AUTHZEN_EVALUATION, extras.authzen, receivedBytes);
    } else {
      // The other members of an agent or a human request are bounded by their schemas.
      this.checkSize('context', req.context, receivedBytes);
    }
  }

  /**
   * The live answer to `input` and, when a shadow set is active, the shadow set's beside it; a
   * failed evaluation's texts with the masked fields' values taken out, as they are recorded
   * and answered; and `input` masked, as it is recorded.
   */
  private async judge(input: Record<string, unknown>): Promise<{
    evaluation: Evaluation;
    live: PolicyDecision;
    shadow: ShadowOutcome | undefined;
    maskedInput: Record<string, unknown>;
  }> {
    // A proven shadow set paired with the live set answers in the same pass (ADR 0012).
    const generation = this.policies.shadowSet.generation;
    const { evaluation, pairedShadow } = this.evaluate(input);
    // The live answer is fixed; the shadow (if any) is evaluated on its thread, or here once
    // proven. Without a shadow set, or with a proven one, nothing is awaited: no extra turn.
    const shadowing = pairedShadow
      ? shadowOutcome(pairedShadow, evaluation.decision, generation)
      : this.shadow(input, evaluation.decision);
    const answered = shadowing instanceof Promise ? await shadowing : shadowing;
    // Mask paths name fields of the policy input as well (e.g. authzen.subject.properties.ssn).
    const maskedInput = this.mask(input);
    // A failed evaluation's text is Arbiter's, and a builtin's error quotes its operand
    // (`time.parse_rfc3339_ns: cannot parse "…"`), a masked field's value included: the text
    // recorded and answered holds MASK in its place.
    const hidden =
      evaluation.decision.error !== undefined || answered?.result === 'error'
        ? maskedValues(input, maskedInput)
        : [];
    const live = hidden.length > 0 ? withoutValuesIn(evaluation.decision, hidden) : evaluation.decision;
    const shadow =
      answered && hidden.length > 0
        ? { ...answered, message: withoutValues(answered.message, hidden) }
        : answered;
    return { evaluation, live, shadow, maskedInput };
  }

  /**
   * What an allow consumes of its budgets, with its audit event (the store charges them in the
   * same transaction): each limit with the deny recorded instead should it be exhausted. Nothing
   * for any other answer, or an allow without budgets.
   */
  private chargeOf(d: Deciding): LimitCharge | undefined {
    const { decision, limits } = d.evaluation;
    if (decision.status !== 'allow' || limits.length === 0) return undefined;
    const charged = chargeAt(limits, d.now.getTime());
    return { limits: charged, denials: charged.map((l) => this.recordsOf(d, exhaustedDenial(l))) };
  }

  /** The decision record, audit event and (for requires_approval) queue item of `decision`. */
  private recordsOf(
    d: Deciding,
    decision: PolicyDecision,
  ): { decision: DecisionRecord; event: NewAuditEvent; item: QueueItem | undefined } {
    const item = decision.status === 'requires_approval' ? this.queueItem(d, decision) : undefined;
    return { decision: decisionRecord(d, decision, item), event: decisionEvent(d, decision, item), item };
  }

  /**
   * The live policy set's answer and budgets; with no set loaded, a fail-closed deny. When the
   * shadow set is paired with the live set (ADR 0012), one pass answers both: the live answer is
   * the live rules' own, and the shadow set's comes with it (`pairedShadow`).
   */
  private evaluate(input: Record<string, unknown>): {
    evaluation: Evaluation;
    pairedShadow: PolicyDecision | undefined;
  } {
    const evaluator = this.policies.evaluator;
    const started = process.hrtime.bigint();
    const paired = evaluator ? this.policies.shadowSet.pair(input, evaluator) : undefined;
    const answered: PolicyDecision = paired
      ? paired.live
      : evaluator
        ? evaluator.evaluate(input)
        : {
            status: 'deny',
            message: 'no policy set is loaded',
            reasons: ['evaluation_error'],
            error: 'no policy set',
          };
    const latencyNs = Number(process.hrtime.bigint() - started);
    // A malformed budget is a policy fault: fail closed, naming it, never allow unlimited.
    const { decision, limits } = withLimits(answered);
    return {
      evaluation: { decision, limits, revision: evaluator?.revision ?? null, latencyNs },
      pairedShadow: paired?.shadow,
    };
  }

  /**
   * The shadow set's answer beside the live one (SPEC §11), computed after the live answer is
   * fixed and never changing it; undefined when no shadow set is active. A set still proving
   * itself is evaluated on the shadow thread: the request is posted before this returns (so a
   * decision made after a shadow change is answered by the new set), and a thread failure or
   * timeout answers an error decision. A proven set answers at once (shadow-runner.ts).
   */
  private shadow(
    input: Record<string, unknown>,
    live: PolicyDecision,
  ): Promise<ShadowOutcome> | ShadowOutcome | undefined {
    const set = this.policies.shadowSet;
    const evaluator = set.evaluator;
    const generation = set.generation;
    if (!evaluator) {
      const failure = set.failure;
      return failure === undefined ? undefined : shadowOutcome(failClosed(failure), live, generation);
    }
    const answered = evaluator.evaluate(input);
    return answered instanceof Promise
      ? answered.then((d) => shadowOutcome(d, live, generation))
      : shadowOutcome(answered, live, generation);
  }

  private maskContext(context: Record<string, unknown>): Record<string, unknown> {
    return this.mask({ context }).context as Record<string, unknown>;
  }

  /** The pending item a requires_approval answer puts in the review queue (id = request id). */
  private queueItem(
    { kind, subject: { on_behalf_of, ...subject }, evaluation, principal, ids, now, call }: Deciding,
    decision: PolicyDecision,
  ): QueueItem {
    return {
      id: ids.requestId,
      status: 'pending',
      kind,
      ...subject,
      message: decision.message,
      trace_id: ids.traceId,
      created_at: now.toISOString(),
      expires_at: new Date(now.getTime() + this.queueTtlSeconds * 1000).toISOString(),
      decided_at: null,
      decided_by: null,
      note: null,
      requested_by: principal.keyId,
      request_digest: call.digest,
      policy_revision: evaluation.revision,
      on_behalf_of,
      // Budgets are consumed when the request is approved (SPEC §13).
      limits: evaluation.limits.length > 0 ? evaluation.limits : null,
    };
  }
}

/** The shadow set's outcome for one decision. */
interface ShadowOutcome {
  result: 'agree' | 'disagree' | 'error';
  status: DecisionStatus;
  message: string;
  /** The shadow generation that answered (its tally counts this decision). */
  generation: number;
  /** The live answer `result` compared the shadow's with (the tally's `live`). */
  live: DecisionStatus;
}

/** The shadow set's answer `d` compared with the live answer (an error when it gave none). */
function shadowOutcome(answered: PolicyDecision, live: PolicyDecision, generation: number): ShadowOutcome {
  // The shadow set's answer as the engine would give it live: malformed limits are its fail-closed
  // deny, an error (as the live answer is), not the policy's allow.
  const d = withLimits(answered).decision;
  return {
    result: d.error ? 'error' : d.status === live.status ? 'agree' : 'disagree',
    status: d.status,
    message: d.message,
    generation,
    live: live.status,
  };
}

/** A failed evaluation's decision with `values` (masked fields' values) taken out of its text. */
function withoutValuesIn(d: PolicyDecision, values: readonly string[]): PolicyDecision {
  return {
    ...d,
    message: withoutValues(d.message, values),
    reasons: d.reasons.map((r) => withoutValues(r, values)),
    ...(d.error !== undefined ? { error: withoutValues(d.error, values) } : {}),
  };
}

/** The deny recorded instead of an allow when budget `l` cannot take its cost. */
function exhaustedDenial(l: LimitUse): PolicyDecision {
  return {
    status: 'deny',
    message:
      `budget exhausted: limit ${JSON.stringify(l.key)} allows ${fromMicro(l.max)} per ${l.window} ` +
      `(window from ${l.windowStart})`,
    reasons: ['limit_exhausted'],
  };
}

/**
 * The deny recorded instead of a requires_approval when its key has `max` approvals pending, or
 * more (a cap lowered since, or another process's higher one): the stores count up to `max` only.
 */
function queueFullDenial(max: number): PolicyDecision {
  return {
    status: 'deny',
    message:
      `review queue full for this API key: it has reached its cap of ${max} pending approvals ` +
      '(ARBITER_QUEUE_MAX_PENDING_PER_KEY); ask again once reviewers have decided some or they ' +
      'expire (a retry under the same Idempotency-Key replays this deny)',
    reasons: ['pending_approvals_exhausted'],
  };
}

/** What is kept of the decision: enough to replay it and to exchange it for a token. */
function decisionRecord(
  { kind, subject, evaluation, principal, ids, now, idem, call }: Deciding,
  decision: PolicyDecision,
  item: QueueItem | undefined,
): DecisionRecord {
  return {
    request_id: ids.requestId,
    kind,
    status: decision.status,
    key_id: principal.keyId,
    tenant_id: subject.tenant_id,
    subject: (kind === 'agent' ? subject.agent_id : subject.user_id) as string,
    action: subject.action,
    resource: subject.resource,
    message: decision.status === 'allow' ? null : decision.message,
    trace_id: ids.traceId,
    created_at: now.toISOString(),
    expires_at: item?.expires_at ?? null,
    idem_key: idem?.key ?? null,
    body_hash: idem?.hash ?? null,
    token_id: null,
    request_digest: call.digest,
    policy_revision: evaluation.revision,
    user_id: eventUserId(subject),
  };
}

/**
 * The decision's audit event: who asked what, the outcome and the policy's reasons, the call's
 * digest, and the policy input (masked; `context` under details.context) so that the decision
 * can be explained and replayed against a candidate set.
 */
function decisionEvent(
  {
    kind,
    subject,
    input,
    evaluation: { revision, latencyNs, limits },
    principal,
    ids,
    now,
    call,
    shadow,
  }: Deciding,
  decision: PolicyDecision,
  item: QueueItem | undefined,
): NewAuditEvent {
  const { context: _context, ...inputWithoutContext } = input;
  // input.authzen repeats the context (SPEC §14): store it masked, as details.context is.
  if (inputWithoutContext.authzen) {
    inputWithoutContext.authzen = { ...(inputWithoutContext.authzen as object), context: subject.context };
  }
  return {
    kind: 'decision',
    time: now.toISOString(),
    trace_id: ids.traceId,
    request_id: ids.requestId,
    actor: principal.name,
    agent_id: subject.agent_id,
    user_id: eventUserId(subject),
    tenant_id: subject.tenant_id,
    action: subject.action,
    resource: subject.resource,
    outcome: decision.status,
    message: decision.message,
    confidence: subject.confidence,
    policy_revision: revision,
    latency_us: Math.round(latencyNs / 1000),
    details: {
      subject_kind: kind,
      reasons: decision.reasons,
      context: subject.context,
      input: inputWithoutContext,
      request_digest: call.digest,
      ...(subject.on_behalf_of ? { on_behalf_of: subject.on_behalf_of } : {}),
      ...(limits.length > 0
        ? { limits: limits.map((l) => ({ ...l, max: fromMicro(l.max), cost: fromMicro(l.cost) })) }
        : {}),
      ...(item ? { expires_at: item.expires_at } : {}),
      ...(shadow ? { shadow_result: shadow.result } : {}),
      ...(shadow && shadow.result !== 'agree'
        ? { shadow: { status: shadow.status, message: shadow.message } }
        : {}),
      ...(decision.error ? { error: decision.error } : {}),
    },
  };
}

/** The answer for a stored decision: the first answer, or its replay. */
function answer(d: DecisionRecord): DecisionBody {
  const body: DecisionBody = {
    status: d.status,
    request_id: d.request_id,
    trace_id: d.trace_id,
  };
  if (d.message !== null) body.message = d.message;
  if (d.expires_at !== null) body.expires_at = d.expires_at;
  if (d.request_digest) body.request_digest = d.request_digest;
  return body;
}

function replay(prior: DecisionRecord, hash: string): DecisionResult {
  if (prior.body_hash !== hash) {
    throw unprocessable('Idempotency-Key was already used with a different request body');
  }
  return { decision: answer(prior), replayed: true };
}

const idempotencySince = () => new Date(Date.now() - IDEMPOTENCY_WINDOW_MS).toISOString();

/** The Idempotency-Key (its format checked at the edge) and the hash of this body. */
function idempotency(kind: string, req: unknown, key: string | undefined): Idempotency | undefined {
  return key === undefined ? undefined : { key, hash: bodyHash(kind, req), since: idempotencySince() };
}

function bodyHash(kind: string, req: unknown): string {
  return createHash('sha256').update(kind).update('\n').update(canonicalJson(req)).digest('hex');
}

/**
 * What an AuthZEN request adds to its digested call: the evaluation as the policy reads it, so a
 * property that decides the answer also binds the approval and the token. Nothing for a native
 * request, whose digest stays that of SPEC §13.
 */
const boundAuthzen = (extras: DecisionExtras) => (extras.authzen ? { authzen: extras.authzen } : {});
