import { createHash } from 'node:crypto';
import { canonicalJson } from '../common/canonical-json.js';

/**
 * The request digest (SPEC §13): what an approval, a token and an audit event are bound to, so a
 * resource server can check that the call it receives is exactly the call that was approved.
 *
 *   request_digest = base64url( SHA-256( canonical JSON of the call ) )
 *
 * The call, built from the request as received (before any masking):
 *   agents:  {"agent_id", "tenant_id", "action", "resource", "context"}, plus "user_id" when the
 *            agent acts on_behalf_of a user; tenant_id is on_behalf_of.tenant_id, else null
 *   humans:  {"user_id", "tenant_id", "action", "resource": {"type", "id"}, "context"}
 * `context` is {} when the request had none. An AuthZEN decision (SPEC §14) adds "authzen": the
 * evaluation exactly as the policy reads it (input.authzen: {"subject", "action", "resource",
 * "context"}, a batch's defaults applied, context {} when none), so that every property a policy
 * can decide on is bound too; a native request has no such member. Canonical JSON is RFC 8785
 * (JCS) for these values: object keys sorted by UTF-16 code units, no insignificant whitespace,
 * strings and numbers as ECMAScript's JSON.stringify writes them. Any JCS library recomputes it.
 */
export interface DigestedCall {
  agent_id?: string;
  user_id?: string;
  tenant_id: string | null;
  action: string;
  resource: unknown;
  context: Record<string, unknown>;
  /** An AuthZEN decision's evaluation as input.authzen (SPEC §14); absent for a native request. */
  authzen?: Record<string, unknown>;
}

export function requestDigest(call: DigestedCall): string {
  return createHash('sha256').update(canonicalJson(call)).digest('base64url');
}
