# Example policy for AI agents doing ops, data and finance work.
#
# Input: {"kind": "agent", "agent_id", "action", "resource" (string), "confidence" (0..1),
#         "context" (object), "principal": {"name", "tenant", "agent"}}
# Data (policies/data.json): agents, blocked_resources, destructive_actions, payments,
#         change_freezes.
#
# The built-in module (package authz) combines the rules below into data.authz.decision:
# deny reasons -> confidence < deny_below -> default deny (no allow, no approval reason)
# -> approval reasons or confidence < approval_below -> allow.
#
# Reference requests (the service's integration tests rely on these exact outcomes):
#
#   agent          action  resource      confidence  status             why
#   -------------  ------  ------------  ----------  -----------------  ---------------------------------
#   deploy-bot     read    repo/arbiter  0.95        allow              registered, >= "*" thresholds
#   deploy-bot     deploy  prod/api      0.95        requires_approval  "deploy to production requires approval"
#   deploy-bot     delete  prod/db       0.99        deny               "destructive action delete on production resource prod/db"
#   deploy-bot     read    repo//x       0.95        deny               "resource repo//x has an empty path segment"
#   deploy-bot     read    repo/arbiter  0.3         deny               confidence_below_deny_threshold (0.5)
#   deploy-bot     read    repo/arbiter  0.85        requires_approval  confidence_below_approval_threshold (0.9)
#   unknown-agent  read    repo/arbiter  0.99        deny               no policy allows (not registered)
#
# Rules that would turn an otherwise-denied request into requires_approval (everything under
# require_approval) are guarded by known_agent, so an unregistered agent is always denied.
package authz.agent

# ---------------------------------------------------------------------------------------------
# Confidence thresholds. "*" applies to actions without their own entry.

thresholds["*"] := {"deny_below": 0.5, "approval_below": 0.9}

thresholds["deploy"] := {"deny_below": 0.6, "approval_below": 0.9}

thresholds["delete"] := {"deny_below": 0.8, "approval_below": 0.95}

thresholds["export"] := {"deny_below": 0.7, "approval_below": 0.95}

thresholds["payments.transfer"] := {"deny_below": 0.7, "approval_below": 0.95}

# ---------------------------------------------------------------------------------------------
# Helpers

# agent is the registry entry for the calling agent (undefined for unknown agents).
agent := data.agents[input.agent_id]

known_agent if is_object(agent)

# Patterns are globs. matches(pattern, value, delimiter) answers exactly what
# glob.match(pattern, [delimiter], value) answers, but handles the common forms (a literal,
# "<prefix>/**", "<prefix>.*") with string builtins: glob.match compiles a pattern on every call,
# which costs about 6 µs in WebAssembly against well under 1 µs for startswith. Each clause tests
# the cheap conditions on the value first: wildcard() scans the pattern five times and runs only
# once they hold (all four clauses are evaluated on every call, for every pattern).
matches(pattern, value, _) if {
	pattern == value
	not wildcard(pattern)
}

matches(pattern, value, "/") if {
	endswith(pattern, "/**")
	startswith(value, trim_suffix(pattern, "**"))
	subtree_pattern(pattern)
}

matches(pattern, value, ".") if {
	endswith(pattern, ".*")
	prefix := trim_suffix(pattern, "*")
	startswith(value, prefix)
	not contains(trim_prefix(value, prefix), ".")
	child_pattern(pattern)
}

matches(pattern, value, delimiter) if {
	wildcard(pattern)
	not fast_form(pattern, delimiter)
	glob.match(pattern, [delimiter], value)
}

wildcard(p) if contains(p, "*")

wildcard(p) if contains(p, "?")

wildcard(p) if contains(p, "[")

wildcard(p) if contains(p, "{")

wildcard(p) if contains(p, "\\")

# "a/b/**": everything below a/b/ (the prefix itself has no wildcard).
subtree_pattern(p) if {
	endswith(p, "/**")
	not wildcard(trim_suffix(p, "**"))
}

# "logs.*": exactly one more "."-separated segment below logs.
child_pattern(p) if {
	endswith(p, ".*")
	not wildcard(trim_suffix(p, "*"))
}

fast_form(p, "/") if subtree_pattern(p)

fast_form(p, ".") if child_pattern(p)

# Agent action patterns are globs over "."-separated segments: "logs.*" matches "logs.read".
action_registered if {
	some pattern in agent.actions
	matches(pattern, input.action, ".")
}

# Resource patterns are globs over "/"-separated segments: "repo/**" matches "repo/a/b".
# An agent without a "resources" list is not restricted by resource.
resource_in_scope if {
	known_agent
	object.get(agent, "resources", null) == null
}

resource_in_scope if {
	some pattern in agent.resources
	matches(pattern, input.resource, "/")
}

production if matches("prod/**", input.resource, "/")

destructive if input.action in data.destructive_actions

pii if matches("pii/**", input.resource, "/")

amount := input.context.amount

# in_change_freeze is true while the current time falls inside a data.change_freezes window, e.g.
#   "change_freezes": [{"name": "year-end", "start": "2025-12-19T00:00:00Z", "end": "2026-01-05T00:00:00Z"}]
# The list ships empty so that no request calls time.now_ns / time.parse_rfc3339_ns (which the
# wasm host has to supply) unless freezes are configured. `some window` must stay first.
in_change_freeze if {
	some window in data.change_freezes
	now := time.now_ns()
	time.parse_rfc3339_ns(window.start) <= now
	now < time.parse_rfc3339_ns(window.end)
}

emergency if input.context.emergency == true

# str renders any value for a reason string. concat on a non-string is an error, which would make
# the whole reason (and so the deny) silently undefined; json.marshal never fails.
str(x) := x if is_string(x)

str(x) := json.marshal(x) if not is_string(x)

# ---------------------------------------------------------------------------------------------
# allow: the agent is registered for this action and the resource is in its scope.

allow if {
	action_registered
	resource_in_scope
}

# ---------------------------------------------------------------------------------------------
# deny

deny contains concat("", ["destructive action ", str(input.action), " on production resource ", str(input.resource)]) if {
	destructive
	production
}

deny contains concat("", ["resource ", str(input.resource), " is blocked"]) if {
	some pattern in data.blocked_resources
	matches(pattern, input.resource, "/")
}

# An empty segment ("repo//legacy-billing", "repo/legacy-billing/", "/prod/db") is not the path a
# resource server that collapses slashes acts on, so it would slip past the literal and prefix
# patterns above (prod//secrets/x is not under prod/secrets/**). The API already refuses "." and
# ".." segments; empty ones are legitimate elsewhere (URLs, object keys), so this policy refuses them.
deny contains concat("", ["resource ", str(input.resource), " has an empty path segment"]) if empty_segment

empty_segment if contains(input.resource, "//")

empty_segment if startswith(input.resource, "/")

empty_segment if endswith(input.resource, "/")

# Exfiltration guard: no agent may bulk-export personal data.
deny contains concat("", ["export of PII resource ", str(input.resource), " is not permitted"]) if {
	input.action == "export"
	pii
}

# Agents may read their own policies but never change them.
deny contains "agents may not modify authorization policy" if {
	matches("policies/**", input.resource, "/")
	not input.action in {"read", "list"}
}

deny contains "production deploys are frozen" if {
	input.action == "deploy"
	production
	in_change_freeze
	not emergency
}

deny contains "payments.transfer requires a positive numeric context.amount" if {
	input.action == "payments.transfer"
	not valid_amount
}

deny contains concat("", ["transfer of ", str(amount), " exceeds the hard limit of ", str(data.payments.hard_limit)]) if {
	input.action == "payments.transfer"
	valid_amount
	amount > data.payments.hard_limit
}

deny contains concat("", ["payee ", str(input.context.payee), " is blocked"]) if {
	input.action == "payments.transfer"
	input.context.payee in data.payments.blocked_vendors
}

valid_amount if {
	is_number(amount)
	amount > 0
}

# ---------------------------------------------------------------------------------------------
# require_approval (all guarded by known_agent; see the header)

require_approval contains concat("", ["agent ", str(input.agent_id), " is not registered for action ", str(input.action)]) if {
	known_agent
	not action_registered
}

require_approval contains concat("", ["resource ", str(input.resource), " is outside the registered scope of agent ", str(input.agent_id)]) if {
	known_agent
	not resource_in_scope
}

require_approval contains "deploy to production requires approval" if {
	known_agent
	input.action == "deploy"
	production
}

require_approval contains "emergency deploy during a change freeze requires approval" if {
	known_agent
	input.action == "deploy"
	production
	in_change_freeze
	emergency
}

require_approval contains concat("", ["transfer of ", str(amount), " exceeds the approval limit of ", str(data.payments.approval_limit)]) if {
	known_agent
	input.action == "payments.transfer"
	valid_amount
	amount > data.payments.approval_limit
}

require_approval contains "access to PII requires approval" if {
	known_agent
	pii
	input.action != "export"
}
