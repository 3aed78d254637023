import { createHash } from 'node:crypto';
import { canonicalJson } from '../audit/chain.js';
import type { NewAuditEvent } from '../audit/types.js';
import { AppError, badRequest, forbidden } from '../errors.js';
import { compileSchema } from '../http/validation.js';
import type { Principal } from '../keys/types.js';
import type { DecisionStatus, PolicyDecision } from '../policy/evaluator.js';
import type { PolicyService } from '../policy/service.js';
import type { QueueItem } from '../queue/types.js';
import { agentRequestSchema, humanRequestSchema, type AgentRequest, type HumanRequest } from './schemas.js';
import type { DecisionRecord, DecisionStore, RecordOutcome } from './store.js';

export interface FlowIds {
  requestId: string;
  traceId: string;
}

export interface DecisionBody {
  status: DecisionStatus;
  request_id: string;
  trace_id: string;
  message?: string;
  expires_at?: string;
}

export interface DecisionResult {
  httpStatus: 200 | 202 | 403;
  body: DecisionBody;
  /** True when this answers a retry with the first response (Idempotency-Key). */
  replayed?: boolean;
}

/** An Idempotency-Key is honoured for 24 hours (SPEC §5). */
export const IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000;

export interface DecisionObserver {
  decided(kind: 'agent' | 'human', outcome: DecisionStatus, evalSeconds: number): void;
}

const HTTP_STATUS = { allow: 200, requires_approval: 202, deny: 403 } as const;

const validateAgent = compileSchema<AgentRequest>(agentRequestSchema);
const validateHuman = compileSchema<HumanRequest>(humanRequestSchema);

/**
 * Agent and human authorization: validate, evaluate the live policy set (in-process, no spawn,
 * no network, no compile), record the decision (and queue item) durably, then answer.
 */
export class DecisionService {
  constructor(
    private readonly policies: PolicyService,
    private readonly store: DecisionStore,
    private readonly queueTtlSeconds: number,
    private readonly mask: (doc: Record<string, unknown>) => Record<string, unknown>,
    private readonly observer: DecisionObserver,
  ) {}

  async authorizeAgent(
    body: unknown,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
  ): Promise<DecisionResult> {
    const req = validateAgent(body);
    if (principal.agent !== null && principal.agent !== req.agent_id) {
      throw forbidden(`API key is bound to agent ${principal.agent} and cannot authorize as ${req.agent_id}`);
    }
    const context = req.context ?? {};
    const input = {
      kind: 'agent',
      agent_id: req.agent_id,
      action: req.action,
      resource: req.resource,
      confidence: req.confidence,
      context,
      principal: principalInput(principal),
    };
    return this.decide('agent', req, input, principal, ids, idemKey, {
      agent_id: req.agent_id,
      user_id: null,
      tenant_id: principal.tenant,
      action: req.action,
      resource: req.resource,
      confidence: req.confidence,
      context,
    });
  }

  async authorizeHuman(
    body: unknown,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
  ): Promise<DecisionResult> {
    const req = validateHuman(body);
    if (principal.agent !== null) {
      throw forbidden(`API key is bound to agent ${principal.agent} and cannot authorize human users`);
    }
    if (principal.tenant !== null && principal.tenant !== req.tenant_id) {
      throw forbidden(
        `API key is bound to tenant ${principal.tenant} and cannot authorize in ${req.tenant_id}`,
      );
    }
    const context = req.context ?? {};
    const input = {
      kind: 'human',
      tenant_id: req.tenant_id,
      user_id: req.user_id,
      action: req.action,
      resource: { type: req.resource.type, id: req.resource.id },
      context,
      principal: principalInput(principal),
    };
    return this.decide('human', req, input, principal, ids, idemKey, {
      agent_id: null,
      user_id: req.user_id,
      tenant_id: req.tenant_id,
      action: req.action,
      resource: input.resource,
      confidence: null,
      context,
    });
  }

  private async decide(
    kind: 'agent' | 'human',
    req: AgentRequest | HumanRequest,
    input: Record<string, unknown>,
    principal: Principal,
    ids: FlowIds,
    idemKey: string | undefined,
    subject: Pick<
      QueueItem,
      'agent_id' | 'user_id' | 'tenant_id' | 'action' | 'resource' | 'confidence' | 'context'
    >,
  ): Promise<DecisionResult> {
    const key = checkIdempotencyKey(idemKey);
    const idem = key === undefined ? undefined : { key, hash: bodyHash(kind, req) };
    const idemSince = new Date(Date.now() - IDEMPOTENCY_WINDOW_MS).toISOString();
    if (idem) {
      const prior = await this.store.findByIdempotencyKey(principal.keyId, idem.key, idemSince);
      if (prior) return replay(prior, idem.hash);
    }
    const evaluator = this.policies.evaluator;
    const started = process.hrtime.bigint();
    const decision: PolicyDecision = evaluator
      ? evaluator.evaluate(input)
      : {
          status: 'deny',
          message: 'no policy set is loaded',
          reasons: ['evaluation_error'],
          error: 'no policy set',
        };
    const latencyNs = Number(process.hrtime.bigint() - started);

    const now = new Date();
    const at = now.toISOString();
    const context = this.mask({ context: subject.context }).context as Record<string, unknown>;
    let item: QueueItem | undefined;
    if (decision.status === 'requires_approval') {
      item = {
        id: ids.requestId,
        status: 'pending',
        kind,
        ...subject,
        context,
        message: decision.message,
        trace_id: ids.traceId,
        created_at: at,
        expires_at: new Date(now.getTime() + this.queueTtlSeconds * 1000).toISOString(),
        decided_at: null,
        decided_by: null,
        note: null,
        requested_by: principal.keyId,
      };
    }
    const event: NewAuditEvent = {
      kind: 'decision',
      time: at,
      trace_id: ids.traceId,
      request_id: ids.requestId,
      actor: principal.name,
      agent_id: subject.agent_id,
      user_id: subject.user_id,
      tenant_id: subject.tenant_id,
      action: subject.action,
      resource: subject.resource,
      outcome: decision.status,
      message: decision.message,
      confidence: subject.confidence,
      policy_revision: evaluator?.revision ?? null,
      latency_us: Math.round(latencyNs / 1000),
      details: {
        subject_kind: kind,
        reasons: decision.reasons,
        context,
        ...(decision.error ? { error: decision.error } : {}),
      },
    };
    const record: DecisionRecord = {
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
      created_at: at,
      expires_at: item?.expires_at ?? null,
      idem_key: idem?.key ?? null,
      body_hash: idem?.hash ?? null,
      token_id: null,
    };
    let outcome: RecordOutcome;
    try {
      outcome = await this.store.record(record, event, item, idemSince);
    } catch {
      // Fail closed: an unrecorded decision is never answered, least of all with allow.
      throw new AppError(503, 'decision could not be recorded in the audit trail; try again');
    }
    if ('replay' in outcome) return replay(outcome.replay, idem?.hash ?? '');
    this.observer.decided(kind, decision.status, latencyNs / 1e9);
    return render(record);
  }
}

/** The response for a stored decision: the first answer, or its replay. */
function render(d: DecisionRecord): DecisionResult {
  const body: DecisionBody = { status: d.status, request_id: d.request_id, trace_id: d.trace_id };
  if (d.message !== null) body.message = d.message;
  if (d.expires_at !== null) body.expires_at = d.expires_at;
  return { httpStatus: HTTP_STATUS[d.status], body };
}

function replay(prior: DecisionRecord, hash: string): DecisionResult {
  if (prior.body_hash !== hash) {
    throw new AppError(422, 'Idempotency-Key was already used with a different request body');
  }
  return { ...render(prior), replayed: true };
}

/** Keys are opaque to us; bounded so they cannot be used to bloat the store. */
function checkIdempotencyKey(k: string | undefined): string | undefined {
  if (k === undefined) return undefined;
  if (!/^[\x21-\x7e]{1,255}$/.test(k)) {
    throw badRequest('Idempotency-Key must be 1 to 255 visible ASCII characters');
  }
  return k;
}

function bodyHash(kind: string, req: unknown): string {
  return createHash('sha256').update(kind).update('\n').update(canonicalJson(req)).digest('hex');
}

function principalInput(p: Principal) {
  return { name: p.name, tenant: p.tenant, agent: p.agent };
}
