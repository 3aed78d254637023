# Example rules for agents acting on behalf of users (SPEC §13): copy and adapt.
#
# An agent request may carry "on_behalf_of": {"tenant_id", "user_id"}. The built-in module then
# also decides the request as that user, with these human rules and this input:
#   {"kind": "human", "tenant_id", "user_id" (from on_behalf_of), "action" (as sent),
#    "resource": {"type", "id"} (the agent's resource split at its first "/"), "context",
#    "principal", "agent_id" (the agent acting)}
# and answers the stricter of the agent's and the user's outcome (deny > requires_approval >
# allow), with both sides' reasons. So an agent never does more than its user may; the rules
# below let a user's delegates do less still. `input.agent_id` is present only under delegation.
#
# Data (policies/data.json): delegation.never_delegated, delegation.calls_per_user_per_hour.
#
#   agent       on behalf of  action  resource      outcome
#   ----------  ------------  ------  ------------  ------------------------------------------
#   deploy-bot  acme/alice    read    repo/arbiter  allow (alice is an admin); budget charged
#   deploy-bot  acme/bob      deploy  prod/api      deny (bob, a viewer, may not deploy)
#   deploy-bot  acme/alice    delete  repo/old      deny (delete is never delegated)
package authz.human

delegated if is_string(input.agent_id)

# Some actions only a person may take, whatever their roles.
deny contains concat("", ["agent ", input.agent_id, " may not ", input.action, " on behalf of a user"]) if {
	delegated
	input.action in data.delegation.never_delegated
}

# Without the number, the limit below would not be declared and delegated calls would go
# unmetered: refuse them instead.
deny contains "delegated calls have no hourly budget: data.delegation.calls_per_user_per_hour must be a number" if {
	delegated
	not hourly_budget
}

# A rule, not `not is_number(…)` inline: OPA takes an undefined argument out of the `not`, which
# would make the line undefined (no deny) exactly when the number is missing.
hourly_budget if is_number(data.delegation.calls_per_user_per_hour)

# Each user's agents together make at most so many calls an hour on the user's behalf. The two ids
# are written as a JSON array: either may hold ":".
limits contains {
	"key": concat(":", ["delegated", json.marshal([input.tenant_id, input.user_id])]),
	"window": "1h",
	"max": data.delegation.calls_per_user_per_hour,
} if {
	delegated
}
