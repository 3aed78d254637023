/**
 * The policy input of an agent or a human request (SPEC §4): what the policy set reads as `input`,
 * and what a decision's audit event stores (masked) so that it can be explained and replayed. An
 * AuthZEN request adds itself verbatim as `authzen` (SPEC §14). Its top-level fields are recorded
 * in the clear elsewhere too, so no mask path may name them (config.ts).
 */
import type { Principal } from '../keys/types.js';
import type { AgentRequest, HumanRequest } from './schemas.js';

/** The policy input of an agent request (SPEC §4). */
export function agentInput(
  req: AgentRequest,
  p: Principal,
  authzen: Record<string, unknown> | undefined,
): Record<string, unknown> {
  return {
    kind: 'agent',
    agent_id: req.agent_id,
    action: req.action,
    resource: req.resource,
    confidence: req.confidence,
    context: req.context ?? {},
    principal: principalInput(p),
    ...(req.on_behalf_of ? { on_behalf_of: { ...req.on_behalf_of } } : {}),
    ...(authzen ? { authzen } : {}),
  };
}

/** The policy input of a human request (SPEC §4). */
export function humanInput(
  req: HumanRequest,
  p: Principal,
  authzen: Record<string, unknown> | undefined,
): Record<string, unknown> {
  return {
    kind: 'human',
    tenant_id: req.tenant_id,
    user_id: req.user_id,
    action: req.action,
    resource: { type: req.resource.type, id: req.resource.id },
    context: req.context ?? {},
    principal: principalInput(p),
    ...(authzen ? { authzen } : {}),
  };
}

/** `principal` in the policy input: the calling key, never its secret. */
function principalInput(p: Principal) {
  return { name: p.name, tenant: p.tenant, agent: p.agent };
}
