package authz.delegation_test

# Tests of the example delegation rules in delegation.rego, through data.authz.decision: the
# stricter of the agent's and the user's outcome, both reasons kept, and the per-user budget.

obo(user, action, resource) := {
	"kind": "agent",
	"agent_id": "deploy-bot",
	"action": action,
	"resource": resource,
	"confidence": 0.99,
	"context": {},
	"principal": {"name": "ci", "tenant": "acme", "agent": "deploy-bot"},
	"on_behalf_of": {"tenant_id": "acme", "user_id": user},
}

test_admin_user_read_allowed_and_charged if {
	d := data.authz.decision with input as obo("alice", "read", "repo/arbiter")
	d.status == "allow"
	d.limits == [{"key": `delegated:["acme","alice"]`, "window": "1h", "max": 1000}]
}

test_user_without_the_right_denies_what_the_agent_may_do if {
	d := data.authz.decision with input as obo("bob", "deploy", "prod/api")
	d.status == "deny"
	d.message == "on behalf of bob: no policy allows deploy on this resource; deploy to production requires approval"

	# A default deny has no reason of its own: only the agent's is listed.
	d.reasons == ["deploy to production requires approval"]
}

test_never_delegated_action_denied_even_for_an_admin if {
	d := data.authz.decision with input as obo("alice", "delete", "repo/old")
	d.status == "deny"
	d.reasons == ["on behalf of alice: agent deploy-bot may not delete on behalf of a user"]
}

test_user_of_another_tenant_has_no_roles_here if {
	d := data.authz.decision with input as obo("dave", "read", "repo/arbiter")
	d.status == "deny"
}

test_the_same_user_acting_directly_is_not_limited if {
	d := data.authz.decision with input as {
		"kind": "human", "tenant_id": "acme", "user_id": "alice", "action": "delete",
		"resource": {"type": "repo", "id": "old"}, "context": {}, "principal": {"name": "alice", "tenant": "acme"},
	}
	d.status == "allow"
	d.limits == []
}

test_delegated_call_without_its_budget_in_data_denied_not_unmetered if {
	d := data.authz.decision with input as obo("alice", "read", "repo/arbiter")
		with data.delegation as {"never_delegated": ["delete"]}
	d.status == "deny"
	d.reasons == ["on behalf of alice: delegated calls have no hourly budget: data.delegation.calls_per_user_per_hour must be a number"]
}
