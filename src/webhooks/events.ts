import type { AuditEvent } from '../audit/types.js';
import type { DeliveryRecord, WebhookEventType } from './types.js';

/**
 * Which changes notify webhooks, and with what: a pure function of the audit events a
 * transaction appends. Both storage backends call it inside that same transaction (the
 * transactional outbox), so a change and the deliveries it causes commit or roll back together.
 */
export interface OutboxMessage {
  type: WebhookEventType;
  time: string;
  data: Record<string, unknown>;
}

/** Audit kinds that change the live policy set (a shadow module changes no answer). */
export const POLICY_CHANGE_KINDS: ReadonlySet<string> = new Set([
  'policy.put',
  'policy.delete',
  'policy.seed',
  'policy.bundle',
  'policy.restore',
  'policy.promote',
  'data.put',
  'data.delete',
]);

const QUEUE_KINDS: Record<string, WebhookEventType> = {
  'queue.approve': 'queue.approved',
  'queue.deny': 'queue.denied',
  'queue.expire': 'queue.expired',
};

export function outboxMessages(events: readonly AuditEvent[]): OutboxMessage[] {
  const out: OutboxMessage[] = [];
  for (const e of events) {
    // Most events notify nothing (every allow and deny): nothing is built for them.
    if (!(e.kind === 'decision' && e.outcome === 'requires_approval') && !QUEUE_KINDS[e.kind]) {
      if (POLICY_CHANGE_KINDS.has(e.kind)) out.push(policyChanged(e));
      continue;
    }
    const subject = {
      id: e.request_id,
      kind: e.details.subject_kind ?? null,
      agent_id: e.agent_id,
      user_id: e.user_id,
      tenant_id: e.tenant_id,
      action: e.action,
      resource: e.resource,
      trace_id: e.trace_id,
    };
    if (e.kind === 'decision' && e.outcome === 'requires_approval') {
      out.push({
        type: 'queue.pending',
        time: e.time,
        data: {
          ...subject,
          confidence: e.confidence,
          message: e.message,
          reasons: e.details.reasons ?? [],
          expires_at: e.details.expires_at ?? null,
          policy_revision: e.policy_revision,
        },
      });
    } else if (QUEUE_KINDS[e.kind]) {
      const type = QUEUE_KINDS[e.kind] as WebhookEventType;
      out.push({
        type,
        time: e.time,
        data: {
          ...subject,
          status: type.slice('queue.'.length),
          decided_by: type === 'queue.expired' ? null : e.actor,
          note: type === 'queue.expired' ? null : e.message,
          decided_at: e.time,
        },
      });
    }
  }
  return out;
}

function policyChanged(e: AuditEvent): OutboxMessage {
  return {
    type: 'policy.changed',
    time: e.time,
    data: {
      revision: e.policy_revision,
      change: e.kind,
      name: e.resource,
      actor: e.actor,
      message: e.message,
    },
  };
}

/** The deliveries a set of messages makes: one per message per webhook subscribed to its type. */
export function deliveriesFor(
  messages: readonly OutboxMessage[],
  hooks: readonly { name: string; events: readonly string[] }[],
  newId: () => string,
): DeliveryRecord[] {
  const out: DeliveryRecord[] = [];
  for (const m of messages) {
    for (const h of hooks) {
      if (!h.events.includes(m.type)) continue;
      const id = newId();
      out.push({
        id,
        webhook: h.name,
        type: m.type,
        payload: JSON.stringify({ id, type: m.type, time: m.time, data: m.data }),
        status: 'pending',
        attempts: 0,
        next_attempt_at: m.time,
        last_status: null,
        last_error: null,
        created_at: m.time,
        delivered_at: null,
      });
    }
  }
  return out;
}
