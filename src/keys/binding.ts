import { forbidden } from '../errors.js';
import type { Principal } from './types.js';

/**
 * SPEC §2: a key bound to a tenant acts only within that tenant; a key bound to an agent acts
 * only as that agent. Every service asks this file, so the rule and its 403 are written once.
 */
export type Binding = 'tenant' | 'agent';

const boundValue = (p: Principal, b: Binding): string | null => (b === 'tenant' ? p.tenant : p.agent);

/** Whether the key may touch something of this tenant or agent (null: of none). */
export function admits(principal: Principal, binding: Binding, value: string | null): boolean {
  const bound = boundValue(principal, binding);
  return bound === null || value === bound;
}

/** Whether the key is bound to a tenant or an agent at all. */
export function isBound(principal: Principal): boolean {
  return principal.tenant !== null || principal.agent !== null;
}

/** Whether the key is bound to exactly this tenant or agent. */
export function boundTo(principal: Principal, binding: Binding, value: string | null): boolean {
  const bound = boundValue(principal, binding);
  return bound !== null && value === bound;
}

/**
 * 403 unless the key admits `value`: "API key is bound to tenant acme", followed by `refusal`
 * when the caller says what the key therefore cannot do.
 */
export function checkAdmits(
  principal: Principal,
  binding: Binding,
  value: string | null,
  refusal?: string,
): void {
  if (admits(principal, binding, value)) return;
  const base = `API key is bound to ${binding} ${boundValue(principal, binding)}`;
  throw forbidden(refusal === undefined ? base : `${base} and ${refusal}`);
}

/** What a binding is checked against: the tenant and agent an item, token or event belongs to. */
export interface BoundSubject {
  tenant_id: string | null;
  agent_id: string | null;
}

/** Whether the key admits both the tenant and the agent of `subject` (see `admits`). */
export function admitsSubject(principal: Principal, subject: BoundSubject): boolean {
  return admits(principal, 'tenant', subject.tenant_id) && admits(principal, 'agent', subject.agent_id);
}

/** 403 when an item lies outside the key's tenant or agent binding (tenant checked first). */
export function checkBinding(principal: Principal, subject: BoundSubject, refusal?: string): void {
  checkAdmits(principal, 'tenant', subject.tenant_id, refusal);
  checkAdmits(principal, 'agent', subject.agent_id, refusal);
}

/**
 * 403 for any bound key: for what spans every tenant and agent (webhooks, which receive every
 * tenant's events; the signing keys, which sign every tenant's tokens; the audit chain's head;
 * budget counters). `refusal` says what the key therefore cannot do.
 */
export function checkUnbound(principal: Principal, refusal: string): void {
  checkBinding(principal, { tenant_id: null, agent_id: null }, refusal);
}

/**
 * The value a filter or a written field may take for a bound key: its binding, whatever was
 * asked; an unbound key gets what it asked. Asking a bound key for another value is 403; not
 * asking (undefined) is no violation.
 */
export function narrow(
  principal: Principal,
  binding: Binding,
  asked: string | undefined,
): string | undefined {
  if (asked !== undefined) checkAdmits(principal, binding, asked);
  return boundValue(principal, binding) ?? asked;
}

/** The tenant and agent a list may cover: each narrowed to the key's binding (see `narrow`). */
export function narrowToBinding(
  principal: Principal,
  asked: { tenant_id?: string | undefined; agent_id?: string | undefined },
): { tenant_id: string | undefined; agent_id: string | undefined } {
  return {
    tenant_id: narrow(principal, 'tenant', asked.tenant_id),
    agent_id: narrow(principal, 'agent', asked.agent_id),
  };
}
