# The small agent policy of the benchmark's "small" scenario (issue 13): four allowed actions,
# one deny rule, one approval rule and one threshold, in what most users start with. It gives the
# benchmark's four request kinds (bench/lib/load.ts) the same answers as the example policies.
package authz.agent

thresholds["*"] := {"deny_below": 0.5, "approval_below": 0.9}

allowed_actions := {"read", "list", "deploy", "delete"}

allow if input.action in allowed_actions

deny contains msg if {
	input.action == "delete"
	startswith(input.resource, "prod/")
	msg := sprintf("destructive action delete on production resource %s", [input.resource])
}

require_approval contains "deploy to production requires approval" if {
	input.action == "deploy"
	startswith(input.resource, "prod/")
}
