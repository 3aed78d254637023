package authz.agent_test

import data.authz.agent

# req builds an agent request for deploy-bot with the given overrides. object.union merges
# recursively, so an override can add context keys but not remove them.
req(overrides) := object.union(
	{
		"kind": "agent",
		"agent_id": "deploy-bot",
		"action": "read",
		"resource": "repo/arbiter",
		"confidence": 0.99,
		"context": {},
		"principal": {"name": "ci", "tenant": "acme", "agent": "deploy-bot"},
	},
	overrides,
)

finance(overrides) := req(object.union(
	{
		"agent_id": "finance-bot",
		"action": "payments.transfer",
		"resource": "accounts/operating",
		"context": {"amount": 500, "payee": "vendors/paper-co"},
	},
	overrides,
))

# NOTE: no helper functions wrap `with` here. OPA 1.22's IR compiler (opa build -t wasm/plan)
# rejects calls to any function whose body uses `with` ("function ... used as reference, not
# called"), even though opa check/test accept them, and opa build includes *_test.rego files.

# 2025-01-01T12:00:00Z and 2025-02-01T12:00:00Z in ns since the epoch.
in_freeze_ns := 1735732800000000000

after_freeze_ns := 1738411200000000000

freezes := [{"name": "year-end", "start": "2024-12-20T00:00:00Z", "end": "2025-01-03T00:00:00Z"}]

# ---------------------------------------------------------------------------------------------
# Reference requests (listed in agent.rego; the service's integration tests rely on them)

test_example_read_allowed if {
	d := data.authz.decision with input as req({"confidence": 0.95})
	d.status == "allow"
	d.reasons == []
}

test_example_deploy_prod_requires_approval if {
	d := data.authz.decision with input as req({"action": "deploy", "resource": "prod/api", "confidence": 0.95})
	d.status == "requires_approval"
	d.reasons == ["deploy to production requires approval"]
}

test_example_delete_prod_denied if {
	d := data.authz.decision with input as req({"action": "delete", "resource": "prod/db", "confidence": 0.99})
	d.status == "deny"
	d.reasons == ["destructive action delete on production resource prod/db"]
}

test_example_low_confidence_denied if {
	d := data.authz.decision with input as req({"confidence": 0.3})
	d.status == "deny"
	d.reasons == ["confidence_below_deny_threshold"]
}

test_example_medium_confidence_requires_approval if {
	d := data.authz.decision with input as req({"confidence": 0.85})
	d.status == "requires_approval"
	d.reasons == ["confidence_below_approval_threshold"]
}

test_example_unknown_agent_denied if {
	d := data.authz.decision with input as req({"agent_id": "unknown-agent", "confidence": 0.99})
	d.status == "deny"
	d.reasons == []
	d.message == "no policy allows read on this resource"
}

# ---------------------------------------------------------------------------------------------
# allow / registration

test_allow_registered_action_and_resource if {
	agent.allow with input as req({})
}

test_allow_action_glob if {
	agent.allow with input as req({"action": "logs.read", "resource": "staging/api"})
	data.authz.decision.status == "allow" with input as req({"action": "logs.read", "resource": "staging/api"})
}

test_action_glob_does_not_cross_segments if {
	not agent.allow with input as req({"action": "logs.read.all"})
}

test_resource_glob_spans_segments if {
	agent.allow with input as req({"resource": "repo/arbiter/src/main.ts"})
}

test_no_allow_for_unknown_agent if {
	not agent.allow with input as req({"agent_id": "unknown-agent"})
	not agent.known_agent with input as req({"agent_id": "unknown-agent"})
}

test_unknown_agent_never_gets_approval_reasons if {
	# even for requests that would need approval for a registered agent
	count(agent.require_approval) == 0 with input as req({"agent_id": "ghost", "action": "deploy", "resource": "prod/api"})
	data.authz.decision.status == "deny" with input as req({"agent_id": "ghost", "action": "deploy", "resource": "prod/api"})
}

test_unregistered_action_requires_approval if {
	not agent.allow with input as req({"action": "restart"})
	agent.require_approval == {"agent deploy-bot is not registered for action restart"} with input as req({"action": "restart"})
	data.authz.decision.status == "requires_approval" with input as req({"action": "restart"})
}

test_resource_outside_scope_requires_approval if {
	not agent.allow with input as req({"resource": "ledger/2024"})
	agent.require_approval == {"resource ledger/2024 is outside the registered scope of agent deploy-bot"} with input as req({"resource": "ledger/2024"})
	data.authz.decision.status == "requires_approval" with input as req({"resource": "ledger/2024"})
}

test_agent_without_resource_list_is_unscoped if {
	agent.allow with input as req({"agent_id": "shell-bot", "resource": "anything/at/all"})
		with data.agents as {"shell-bot": {"actions": ["read"]}}
}

test_non_string_values_render_in_reasons if {
	agent.require_approval == {`agent deploy-bot is not registered for action ["read"]`} with input as req({"action": ["read"]})
}

# ---------------------------------------------------------------------------------------------
# deny rules

test_destructive_action_on_prod_denied if {
	agent.deny == {"destructive action purge on production resource prod/cache"} with input as req({"action": "purge", "resource": "prod/cache"})
}

test_destructive_action_outside_prod_allowed if {
	count(agent.deny) == 0 with input as req({"action": "delete", "resource": "staging/db"})
	data.authz.decision.status == "allow" with input as req({"action": "delete", "resource": "staging/db"})
}

test_prod_glob_needs_prod_prefix_segment if {
	count(agent.deny) == 0 with input as req({"action": "delete", "resource": "repo/prod-notes"})
	count(agent.deny) == 0 with input as req({"action": "delete", "resource": "production/db"})
}

test_blocked_resource_denied if {
	agent.deny == {"resource repo/legacy-billing is blocked"} with input as req({"resource": "repo/legacy-billing"})
	agent.deny == {"resource prod/secrets/db/password is blocked"} with input as req({"resource": "prod/secrets/db/password"})
}

test_empty_segment_denied if {
	agent.deny == {"resource repo//legacy-billing has an empty path segment"} with input as req({"resource": "repo//legacy-billing"})
	agent.deny == {"resource repo/legacy-billing/ has an empty path segment"} with input as req({"resource": "repo/legacy-billing/"})
	agent.deny == {"resource prod//secrets/x has an empty path segment"} with input as req({"resource": "prod//secrets/x"})
	"resource /prod/db has an empty path segment" in agent.deny with input as req({"resource": "/prod/db"})
	count(agent.deny) == 0 with input as req({"resource": "repo/a.b/.hidden"})
}

test_blocked_resources_come_from_data if {
	agent.deny == {"resource repo/arbiter is blocked"} with input as req({}) with data.blocked_resources as ["repo/*"]
	count(agent.deny) == 0 with input as req({"resource": "repo/legacy-billing"}) with data.blocked_resources as []
}

test_blocked_resource_denied_even_with_full_confidence if {
	d := data.authz.decision with input as req({"resource": "repo/legacy-billing", "confidence": 1})
	d.status == "deny"
}

test_export_of_pii_denied if {
	inp := req({"agent_id": "data-bot", "action": "export", "resource": "pii/customers"})
	agent.deny == {"export of PII resource pii/customers is not permitted"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "deny"
}

test_export_of_aggregates_allowed if {
	inp := req({"agent_id": "data-bot", "action": "export", "resource": "reports/q3"})
	d := data.authz.decision with input as inp
	d.status == "allow"
}

test_policy_modification_denied if {
	agent.deny == {"agents may not modify authorization policy"} with input as req({"action": "update", "resource": "policies/agent.rego"})
	count(agent.deny) == 0 with input as req({"action": "read", "resource": "policies/agent.rego"})
}

test_deploy_during_change_freeze_denied if {
	inp := req({"action": "deploy", "resource": "prod/api"})
	agent.deny == {"production deploys are frozen"} with input as inp
		with data.change_freezes as freezes
		with time.now_ns as in_freeze_ns
	d := data.authz.decision with input as inp
		with data.change_freezes as freezes
		with time.now_ns as in_freeze_ns
	d.status == "deny"
}

test_deploy_after_change_freeze_not_denied if {
	inp := req({"action": "deploy", "resource": "prod/api"})
	count(agent.deny) == 0 with input as inp
		with data.change_freezes as freezes
		with time.now_ns as after_freeze_ns
}

test_change_freeze_only_affects_prod if {
	count(agent.deny) == 0 with input as req({"action": "deploy", "resource": "staging/api"})
		with data.change_freezes as freezes
		with time.now_ns as in_freeze_ns
}

test_emergency_deploy_during_freeze_requires_approval if {
	inp := req({"action": "deploy", "resource": "prod/api", "context": {"emergency": true}})
	count(agent.deny) == 0 with input as inp
		with data.change_freezes as freezes
		with time.now_ns as in_freeze_ns
	agent.require_approval == {
		"deploy to production requires approval",
		"emergency deploy during a change freeze requires approval",
	} with input as inp
		with data.change_freezes as freezes
		with time.now_ns as in_freeze_ns
}

# ---------------------------------------------------------------------------------------------
# payments

test_small_transfer_allowed if {
	d := data.authz.decision with input as finance({"confidence": 0.99})
	d.status == "allow"
}

test_transfer_over_approval_limit_requires_approval if {
	inp := finance({"context": {"amount": 20000}})
	agent.require_approval == {"transfer of 20000 exceeds the approval limit of 10000"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "requires_approval"
}

test_transfer_at_approval_limit_allowed if {
	count(agent.require_approval) == 0 with input as finance({"context": {"amount": 10000}})
}

test_approval_limit_comes_from_data if {
	count(agent.require_approval) == 1 with input as finance({"context": {"amount": 600}})
		with data.payments.approval_limit as 100
}

test_transfer_over_hard_limit_denied if {
	inp := finance({"context": {"amount": 300000.5}})
	agent.deny == {"transfer of 300000.5 exceeds the hard limit of 250000"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "deny"
}

test_transfer_without_numeric_amount_denied if {
	reason := "payments.transfer requires a positive numeric context.amount"
	agent.deny == {reason} with input as req({"agent_id": "finance-bot", "action": "payments.transfer", "resource": "accounts/operating"})
	agent.deny == {reason} with input as finance({"context": {"amount": "100"}})
	agent.deny == {reason} with input as finance({"context": {"amount": -5}})
	agent.deny == {reason} with input as finance({"context": {"amount": 0}})
}

test_transfer_to_blocked_payee_denied if {
	agent.deny == {"payee vendors/sanctioned-co is blocked"} with input as finance({"context": {"amount": 10, "payee": "vendors/sanctioned-co"}})
}

# ---------------------------------------------------------------------------------------------
# PII access

test_pii_read_requires_approval if {
	inp := req({"agent_id": "data-bot", "action": "query", "resource": "pii/customers"})
	agent.require_approval == {"access to PII requires approval"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "requires_approval"
}

# ---------------------------------------------------------------------------------------------
# thresholds

test_default_thresholds if {
	agent.thresholds["*"] == {"deny_below": 0.5, "approval_below": 0.9}
	data.authz.decision.status == "requires_approval" with input as req({"confidence": 0.5})
	data.authz.decision.status == "deny" with input as req({"confidence": 0.49})
	data.authz.decision.status == "allow" with input as req({"confidence": 0.9})
}

test_transfer_thresholds if {
	agent.thresholds["payments.transfer"] == {"deny_below": 0.7, "approval_below": 0.95}
	d1 := data.authz.decision with input as finance({"confidence": 0.6})
	d1.reasons == ["confidence_below_deny_threshold"]
	d1.message == "confidence 0.6 is below the deny threshold 0.7 for action payments.transfer"
	d2 := data.authz.decision with input as finance({"confidence": 0.9})
	d2.reasons == ["confidence_below_approval_threshold"]
	d3 := data.authz.decision with input as finance({"confidence": 0.95})
	d3.status == "allow"
}

test_delete_thresholds if {
	data.authz.decision.status == "deny" with input as req({"action": "delete", "resource": "staging/db", "confidence": 0.75})
	data.authz.decision.status == "requires_approval" with input as req({"action": "delete", "resource": "staging/db", "confidence": 0.9})
}

test_deploy_thresholds if {
	data.authz.decision.status == "deny" with input as req({"action": "deploy", "resource": "staging/api", "confidence": 0.55})
	data.authz.decision.status == "requires_approval" with input as req({"action": "deploy", "resource": "staging/api", "confidence": 0.6})
	data.authz.decision.status == "allow" with input as req({"action": "deploy", "resource": "staging/api", "confidence": 0.9})
}

test_deny_rules_beat_high_confidence_and_approvals if {
	# deploy to a blocked prod path: both an approval and a deny reason; deny wins
	d := data.authz.decision with input as req({"action": "deploy", "resource": "prod/secrets/vault", "confidence": 1})
	d.status == "deny"
	d.reasons == ["resource prod/secrets/vault is blocked"]
}

# matches() must answer exactly what glob.match answers; it only takes a cheaper route.
glob_cases := [
	["repo/**", "repo/a", "/"],
	["repo/**", "repo/a/b/c", "/"],
	["repo/**", "repo", "/"],
	["repo/**", "repo/", "/"],
	["repo/**", "repox/a", "/"],
	["repo/**", "other/repo/a", "/"],
	["logs.*", "logs.read", "."],
	["logs.*", "logs.read.all", "."],
	["logs.*", "logs.", "."],
	["logs.*", "logs", "."],
	["read", "read", "."],
	["read", "reads", "."],
	["read", "rea", "."],
	["repo/legacy-billing", "repo/legacy-billing", "/"],
	["repo/legacy-billing", "repo/legacy-billing/x", "/"],
	["prod/*/db", "prod/eu/db", "/"],
	["prod/*/db", "prod/eu/x/db", "/"],
	["invoices.*", "invoices.pay", "."],
	["a/b/**", "a/b/c", "/"],
	["a/*/**", "a/x/y", "/"],
]

matches_bool(p, v, d) if data.authz.agent.matches(p, v, d)

matches_bool(p, v, d) := false if not data.authz.agent.matches(p, v, d)

test_matches_agrees_with_glob_match if {
	every c in glob_cases {
		matches_bool(c[0], c[1], c[2]) == glob.match(c[0], [c[2]], c[1])
	}
}
