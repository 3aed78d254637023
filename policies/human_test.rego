package authz.human_test

import data.authz.human

req(user, action, type) := {
	"kind": "human",
	"tenant_id": "acme",
	"user_id": user,
	"action": action,
	"resource": {"type": type, "id": "p1"},
	"context": {},
	"principal": {"name": user, "tenant": "acme"},
}

# NOTE: no helper functions wrap `with` here. OPA 1.22's IR compiler (opa build -t wasm/plan)
# rejects calls to any function whose body uses `with` ("function ... used as reference, not
# called"), even though opa check/test accept them, and opa build includes *_test.rego files.

# ---------------------------------------------------------------------------------------------
# Reference requests (listed in human.rego; the service's integration tests rely on them)

test_example_admin_delete_project_allowed if {
	d := data.authz.decision with input as req("alice", "delete", "project")
	d.status == "allow"
	d.reasons == []
}

test_example_viewer_read_project_allowed if {
	data.authz.decision.status == "allow" with input as req("bob", "read", "project")
}

test_example_viewer_delete_project_denied if {
	d := data.authz.decision with input as req("bob", "delete", "project")
	d.status == "deny"
	d.reasons == []
	d.message == "no policy allows delete on this resource"
}

test_example_editor_delete_project_requires_approval if {
	d := data.authz.decision with input as req("carol", "delete", "project")
	d.status == "requires_approval"
	d.reasons == ["deleting a project requires admin approval"]
}

# ---------------------------------------------------------------------------------------------
# RBAC

test_user_roles_are_tenant_scoped if {
	human.user_roles == {"viewer"} with input as req("bob", "read", "project")
	human.user_roles == {"editor"} with input as object.union(req("bob", "read", "project"), {"tenant_id": "globex"})
}

test_binding_in_other_tenant_does_not_grant if {
	# dave is an admin in globex only
	not human.allow with input as req("dave", "read", "project")
	data.authz.decision.status == "deny" with input as req("dave", "read", "project")
}

test_unknown_user_denied if {
	not human.allow with input as req("zed", "read", "project")
	data.authz.decision.status == "deny" with input as req("zed", "read", "project")
}

test_admin_wildcards if {
	human.allow with input as req("alice", "frobnicate", "anything")
}

test_type_wildcard if {
	human.allow with input as req("bob", "read", "invoice")
	human.allow with input as req("bob", "list", "document")
}

test_action_wildcard if {
	human.allow with input as req("carol", "archive", "document")
	not human.allow with input as req("carol", "archive", "project")
}

test_exact_grant if {
	human.allow with input as req("carol", "update", "project")
	not human.allow with input as req("carol", "update", "invoice")
	not human.allow with input as req("bob", "update", "project")
}

test_multiple_roles_combine if {
	human.allow with input as req("erin", "read", "project")
	human.allow with input as req("erin", "pay", "invoice")
	not human.allow with input as req("erin", "pay", "project")
}

test_roles_come_from_data if {
	human.allow with input as req("bob", "delete", "project")
		with data.rbac.roles.viewer as [{"action": "delete", "type": "project"}]
}

test_missing_resource_type_not_allowed if {
	not human.allow with input as {"kind": "human", "tenant_id": "acme", "user_id": "bob", "action": "read", "resource": {"id": "p1"}}
}

test_humans_ignore_confidence if {
	inp := object.union(req("bob", "read", "project"), {"confidence": 0.01})
	d := data.authz.decision with input as inp
	d.status == "allow"
}

# ---------------------------------------------------------------------------------------------
# deny rules

test_cross_tenant_denied if {
	inp := object.union(req("alice", "read", "project"), {"context": {"resource_tenant": "globex"}})
	human.deny == {"cross-tenant access: tenant acme cannot act on resources of tenant globex"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "deny"
	d.reasons == ["cross-tenant access: tenant acme cannot act on resources of tenant globex"]
}

test_same_tenant_not_denied if {
	inp := object.union(req("alice", "read", "project"), {"context": {"resource_tenant": "acme"}})
	count(human.deny) == 0 with input as inp
}

test_cross_tenant_non_string_tenant_denied if {
	inp := object.union(req("alice", "read", "project"), {"context": {"resource_tenant": null}})
	human.deny == {"cross-tenant access: tenant acme cannot act on resources of tenant null"} with input as inp
}

test_suspended_user_denied if {
	human.allow with input as req("mallory", "read", "project")
	human.deny == {"user mallory is suspended in tenant acme"} with input as req("mallory", "read", "project")
	data.authz.decision.status == "deny" with input as req("mallory", "read", "project")
}

# ---------------------------------------------------------------------------------------------
# require_approval

test_non_admin_project_delete_requires_approval if {
	human.require_approval == {"deleting a project requires admin approval"} with input as req("carol", "delete", "project")
}

test_admin_project_delete_needs_no_approval if {
	count(human.require_approval) == 0 with input as req("alice", "delete", "project")
}

test_approval_rule_does_not_rescue_denied_delete if {
	# bob has no role granting delete, so the approval rule must not fire
	count(human.require_approval) == 0 with input as req("bob", "delete", "project")
}

test_delete_of_other_types_needs_no_approval if {
	count(human.require_approval) == 0 with input as req("carol", "delete", "document")
	data.authz.decision.status == "allow" with input as req("carol", "delete", "document")
}

test_large_invoice_payment_requires_approval if {
	inp := object.union(req("erin", "pay", "invoice"), {"context": {"amount": 9000}})
	human.require_approval == {"paying an invoice over 5000 requires approval"} with input as inp
	d := data.authz.decision with input as inp
	d.status == "requires_approval"
}

test_small_invoice_payment_allowed if {
	inp := object.union(req("erin", "pay", "invoice"), {"context": {"amount": 100}})
	d := data.authz.decision with input as inp
	d.status == "allow"
}
