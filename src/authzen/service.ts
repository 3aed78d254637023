import { AppError, invalid, tooLarge } from '../errors.js';
import { newId } from '../ids.js';
import { jsonBytes, tooSmallToExceed } from '../common/json-size.js';
import { compileSchema, NO_DOT_SEGMENTS, TOKEN_SAFE, type JsonSchema } from '../common/validation.js';
import { checkAdmits } from '../keys/binding.js';
import type { Principal } from '../keys/types.js';
import type { DecisionBody, DecisionResult, DecisionService, FlowIds } from '../decisions/service.js';

/**
 * OpenID AuthZEN Authorization API 1.0 (SPEC §14) over the ordinary decision path: each AuthZEN
 * evaluation becomes one agent or human decision — validated, evaluated, recorded and audited
 * like any other — with the AuthZEN request itself as `input.authzen`. Knows nothing of HTTP.
 */

/** Most evaluations one batch may carry; more is a 400. */
export const MAX_EVALUATIONS = 100;

export const SEMANTICS = ['execute_all', 'deny_on_first_deny', 'permit_on_first_permit'] as const;
export type Semantic = (typeof SEMANTICS)[number];

const name = { type: 'string', minLength: 1, maxLength: 256, pattern: TOKEN_SAFE };
const properties = { type: 'object', description: 'any attributes; the policy reads them in input.authzen' };

/**
 * Subject and resource: `type` and `id`, optional `properties`. Other members are kept and passed
 * to the policy verbatim (earlier drafts put attributes such as `ownerID` directly on them).
 */
const subjectSchema: JsonSchema = {
  type: 'object',
  required: ['type', 'id'],
  properties: { type: name, id: name, properties },
};
const resourceSchema: JsonSchema = {
  type: 'object',
  required: ['type', 'id'],
  properties: {
    type: { ...name, ...NO_DOT_SEGMENTS },
    id: { type: 'string', minLength: 1, maxLength: 1024, pattern: TOKEN_SAFE, ...NO_DOT_SEGMENTS },
    properties,
  },
};
const actionSchema: JsonSchema = {
  type: 'object',
  required: ['name'],
  properties: { name, properties },
};
const contextSchema: JsonSchema = { type: 'object' };

/** The 4-tuple of an evaluation: each member of a single request, each default of a batch. */
const TUPLE = {
  subject: subjectSchema,
  action: actionSchema,
  resource: resourceSchema,
  context: contextSchema,
};

/** Body of POST /access/v1/evaluation. */
export const evaluationRequestSchema: JsonSchema = {
  type: 'object',
  required: ['subject', 'action', 'resource'],
  additionalProperties: false,
  properties: TUPLE,
};

/**
 * Body of POST /access/v1/evaluations: top-level members are defaults for every item. Without
 * `evaluations`, or with none, it is a single evaluation (AuthZEN 1.0 §7.1).
 */
export const evaluationsRequestSchema: JsonSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    ...TUPLE,
    evaluations: {
      type: 'array',
      maxItems: MAX_EVALUATIONS,
      items: {
        type: 'object',
        additionalProperties: false,
        properties: TUPLE,
      },
    },
    options: {
      type: 'object',
      properties: { evaluations_semantic: { type: 'string', enum: [...SEMANTICS] } },
    },
  },
};

interface Entity {
  type: string;
  id: string;
  properties?: Record<string, unknown>;
  [member: string]: unknown;
}

/** One AuthZEN access evaluation request (the 4-tuple). */
export interface Evaluation {
  subject: Entity;
  action: { name: string; properties?: Record<string, unknown>; [member: string]: unknown };
  resource: Entity;
  context?: Record<string, unknown>;
}

interface Evaluations extends Partial<Evaluation> {
  evaluations?: Partial<Evaluation>[];
  options?: { evaluations_semantic?: Semantic; [option: string]: unknown };
}

/** One evaluation's outcome: a recorded decision, or (in a batch) the error that stopped it. */
export type Outcome = { decision: DecisionBody; replayed: boolean } | { error: AppError };

const validateOne = compileSchema<Evaluation>(evaluationRequestSchema);
const validateMany = compileSchema<Evaluations>(evaluationsRequestSchema);

export class AuthzenService {
  constructor(
    private readonly decisions: DecisionService,
    private readonly defaultTenant: string,
    /**
     * The most bytes a batch may be with its defaults applied to every item (the body limit):
     * each item is recorded whole, so a default context of 0.9 MB copied into 100 items would
     * otherwise write 100 times the request to the audit trail.
     */
    private readonly maxExpandedBytes: number,
  ) {}

  /** One evaluation; any error (bad input, binding, storage) is the caller's to answer. */
  async evaluate(body: unknown, principal: Principal, ids: FlowIds, idemKey?: string) {
    return this.decide(validateOne(body), principal, ids, idemKey);
  }

  /**
   * A batch: the whole payload is checked first (so a malformed batch records nothing); then each
   * item, with the top-level defaults, is decided in order under the chosen semantic. An item
   * that fails is an error outcome, never an allow. A request without `evaluations`, or with an
   * empty array, is a single evaluation of its top-level members, answered as one (AuthZEN 1.0
   * §7.1: "behaves in a backwards-compatible manner with the (single) Access Evaluation API").
   */
  async evaluateAll(
    body: unknown,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
  ): Promise<{ single: DecisionResult } | { batch: Outcome[] }> {
    const req = validateMany(body);
    if (req.evaluations === undefined || req.evaluations.length === 0) {
      return { single: await this.decide(completeSingle(req), principal, ids, idemKey) };
    }
    const traceId = ids.traceId;
    const items = req.evaluations.map((item, i) => completeItem(req, item, i));
    await this.checkSizes(items, principal, ids.receivedBytes, idemKey);
    const semantic: Semantic = req.options?.evaluations_semantic ?? 'execute_all';
    const out: Outcome[] = [];
    for (const [i, item] of items.entries()) {
      let outcome: Outcome;
      try {
        // A retried batch replays item by item: each item has a key of its own.
        const key = idemKey === undefined ? undefined : `${idemKey}#${i}`;
        outcome = await this.decide(
          item,
          principal,
          { requestId: newId(), traceId, receivedBytes: ids.receivedBytes },
          key,
          true,
        );
      } catch (e) {
        if (!(e instanceof AppError)) throw e;
        outcome = { error: e };
      }
      out.push(outcome);
      const permitted = 'decision' in outcome && outcome.decision.status === 'allow';
      if (semantic === 'deny_on_first_deny' && !permitted) break;
      if (semantic === 'permit_on_first_permit' && permitted) break;
    }
    return { batch: out };
  }

  /**
   * Holds a batch to its limits before any of its evaluations is decided, so that one too large
   * refuses the whole batch: each evaluation (defaults applied) to the size limit whole, as a single
   * evaluation is, and all of them together to the body limit. Each is measured at most once, and
   * not at all when the body is too small to hold one over either limit. Item by item, stopping
   * once past the limit: never the whole expansion in memory at once. An evaluation over the limit
   * whose Idempotency-Key already has a recorded decision is let through: it is answered from the
   * record (as a single request is), not refused by a limit that came after it.
   */
  private async checkSizes(
    items: Evaluation[],
    principal: Principal,
    receivedBytes: number | undefined,
    idemKey: string | undefined,
  ): Promise<void> {
    const eachFits = tooSmallToExceed(receivedBytes, this.decisions.sizeLimit);
    if (eachFits && tooSmallToExceed(receivedBytes, this.maxExpandedBytes, items.length)) return;
    let expanded = 0;
    for (const [i, item] of items.entries()) {
      const bytes = jsonBytes(asInput(item));
      expanded += bytes;
      if (expanded > this.maxExpandedBytes) {
        throw tooLarge(
          `the batch with its defaults applied to each of its ${items.length} evaluations is more than ` +
            `the ${this.maxExpandedBytes}-byte body limit (each evaluation is recorded whole): ` +
            'send fewer evaluations, or a smaller shared context',
        );
      }
      if (bytes <= this.decisions.sizeLimit) continue;
      if (idemKey !== undefined && (await this.decisions.isRecorded(principal, `${idemKey}#${i}`))) continue;
      throw this.decisions.tooLarge(
        `evaluations[${i}] (subject, action, resource and context together, defaults applied)`,
        bytes,
      );
    }
  }

  /**
   * Maps the 4-tuple to an agent or a human decision and takes it through DecisionService, which
   * holds the whole evaluation to the size limit unless `sizeChecked` (a batch's, by checkSizes).
   */
  private async decide(
    ev: Evaluation,
    principal: Principal,
    ids: FlowIds,
    idemKey?: string,
    sizeChecked = false,
  ) {
    const authzen = asInput(ev);
    const context = authzen.context;
    if (ev.subject.type === 'agent') {
      const confidence = ev.subject.properties?.confidence ?? context.confidence;
      if (confidence === undefined) {
        throw invalid(
          'subject of type agent needs a confidence: subject.properties.confidence or context.confidence',
        );
      }
      if (typeof confidence !== 'number') throw invalid('confidence must be a number between 0.0 and 1.0');
      // A tenant the subject claims reaches the policy (input.authzen): a bound key may only
      // claim its own, as for a human subject.
      const claimed = ev.subject.properties?.tenant_id;
      if (claimed !== undefined) {
        if (typeof claimed !== 'string') throw invalid('subject.properties.tenant_id must be a string');
        checkAdmits(principal, 'tenant', claimed, `cannot act in tenant ${claimed}`);
      }
      const request = {
        agent_id: ev.subject.id,
        action: ev.action.name,
        resource: `${ev.resource.type}/${ev.resource.id}`,
        confidence,
        context,
      };
      return this.decisions.authorizeAgent(request, principal, ids, idemKey, {
        authzen,
        sizeChecked,
        ...(claimed !== undefined ? { tenant: claimed } : {}),
      });
    }
    const tenant = ev.subject.properties?.tenant_id ?? this.defaultTenant;
    if (typeof tenant !== 'string') throw invalid('subject.properties.tenant_id must be a string');
    const request = {
      tenant_id: tenant,
      user_id: ev.subject.id,
      action: ev.action.name,
      resource: { type: ev.resource.type, id: ev.resource.id },
      context,
    };
    return this.decisions.authorizeHuman(request, principal, ids, idemKey, { authzen, sizeChecked });
  }
}

/** An evaluation as the policy reads it (input.authzen) and the audit event records it. */
const asInput = (ev: Evaluation) => ({
  subject: ev.subject,
  action: ev.action,
  resource: ev.resource,
  context: ev.context ?? {},
});

/** The top-level 4-tuple of a request with no evaluations; an incomplete one is a 400. */
const completeSingle = (req: Evaluations): Evaluation =>
  complete(
    req,
    {},
    (part) => `a request without evaluations is a single evaluation (AuthZEN 1.0 §7.1): ${part} is missing`,
  );

/** Item `i` of a batch with the top-level defaults filled in; a 4-tuple still incomplete is a 400. */
const completeItem = (defaults: Evaluations, item: Partial<Evaluation>, i: number): Evaluation =>
  complete(
    defaults,
    item,
    (part) => `evaluations[${i}] has no ${part}, and the request gives no default ${part}`,
  );

/** `item` with `defaults` filled in; a 4-tuple still incomplete is a 400 saying `missing(part)`. */
function complete(
  defaults: Evaluations,
  item: Partial<Evaluation>,
  missing: (part: 'subject' | 'action' | 'resource') => string,
): Evaluation {
  const merged = {
    subject: item.subject ?? defaults.subject,
    action: item.action ?? defaults.action,
    resource: item.resource ?? defaults.resource,
    context: item.context ?? defaults.context,
  };
  for (const part of ['subject', 'action', 'resource'] as const) {
    if (merged[part] === undefined) {
      throw invalid(missing(part));
    }
  }
  return merged as Evaluation;
}
