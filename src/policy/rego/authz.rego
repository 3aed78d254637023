# Arbiter's built-in decision module. The package name `authz` is reserved: user modules cannot
# declare it. The engine evaluates exactly one entrypoint, data.authz.decision, per request.
#
# User modules in `package authz.agent` / `package authz.human` contribute:
#   deny contains reason if ...              any reason -> deny
#   require_approval contains reason if ...  any reason -> requires_approval (unless denied)
#   allow if ...                              needed for allow
#   thresholds[action] := {"deny_below": x, "approval_below": y}   (agents; "*" is the default)
#
#   limits contains {"key": k, "window": "1h", "max": n, "cost": c}   budgets the engine enforces
#
# An agent acting on_behalf_of a user is also decided as that user (the human rules, with the
# agent's action and its resource split into {type, id}), and the stricter outcome wins:
# deny > requires_approval > allow, with both sides' reasons.
#
# Precedence: deny rules -> malformed thresholds (deny) -> confidence below deny_below -> no allow and no approval rule
# (default deny) -> approval rules or confidence below approval_below -> allow. Any branch that
# cannot be evaluated (odd input types) falls through to a final deny, never to allow.
package authz

default_thresholds := {"deny_below": 0.5, "approval_below": 0.9}

deny_reasons contains reason_text(r) if {
	input.kind == "agent"
	some r in data.authz.agent.deny
}

deny_reasons contains reason_text(r) if {
	input.kind == "human"
	some r in data.authz.human.deny
}

approval_reasons contains reason_text(r) if {
	input.kind == "agent"
	some r in data.authz.agent.require_approval
}

approval_reasons contains reason_text(r) if {
	input.kind == "human"
	some r in data.authz.human.require_approval
}

# A deny or require_approval rule whose value is a single value rather than a set (from data or
# input, which the type checker cannot see: `deny := data.freeze.message if …`) is one reason:
# iterating a string yields nothing, and a defined deny rule must never silently vanish. `false`
# is no reason (the boolean idiom `default deny := false`).
deny_reasons contains reason_text(d) if {
	input.kind == "agent"
	d := data.authz.agent.deny
	scalar_reason(d)
}

deny_reasons contains reason_text(d) if {
	input.kind == "human"
	d := data.authz.human.deny
	scalar_reason(d)
}

approval_reasons contains reason_text(a) if {
	input.kind == "agent"
	a := data.authz.agent.require_approval
	scalar_reason(a)
}

approval_reasons contains reason_text(a) if {
	input.kind == "human"
	a := data.authz.human.require_approval
	scalar_reason(a)
}

scalar_reason(x) if {
	not collection(x)
	x != false
}

collection(x) if is_set(x)

collection(x) if is_array(x)

collection(x) if is_object(x)

allowed if {
	input.kind == "agent"
	data.authz.agent.allow == true
}

allowed if {
	input.kind == "human"
	data.authz.human.allow == true
}

# Reasons are meant to be strings; anything else is rendered as JSON rather than dropped, so a
# malformed reason can never make a deny rule silently vanish.
reason_text(r) := r if is_string(r)

reason_text(r) := json.marshal(r) if not is_string(r)

# Thresholds are checked, not trusted: an entry that is not an object, a value that is not a
# number in [0, 1], an unknown key (a typo such as "deny_bellow" would silently drop a gate), or a
# deny_below above approval_below is an error. Arbiter refuses a policy or data change that makes
# threshold_errors non-empty; a decision that still meets one (its action's entry or "*") is a
# deny, never a fall back to looser defaults.
threshold_keys := {"deny_below", "approval_below"}

threshold_errors contains "thresholds must be an object of action -> {deny_below, approval_below}" if {
	not is_object(data.authz.agent.thresholds)
}

threshold_errors contains msg if {
	some action, entry in data.authz.agent.thresholds
	some msg in threshold_entry_errors(action, entry)
}

threshold_problems contains msg if {
	input.kind == "agent"
	not is_object(data.authz.agent.thresholds)
	msg := "thresholds must be an object of action -> {deny_below, approval_below}"
}

threshold_problems contains msg if {
	input.kind == "agent"
	some action in [input.action, "*"]
	entry := data.authz.agent.thresholds[action]
	some msg in threshold_entry_errors(action, entry)
}

threshold_entry_errors(action, entry) := errors if {
	is_object(entry)
	errors := ({msg |
		some k, _ in entry
		not k in threshold_keys
		msg := concat("", [
			"thresholds[", json.marshal(action), "] has unknown key ", json.marshal(k),
			" (known: approval_below, deny_below)",
		])
	} | {msg |
		some k in threshold_keys
		v := entry[k]
		not is_fraction(v)
		msg := concat("", [
			"thresholds[", json.marshal(action), "].", k,
			" must be a number between 0 and 1, got ", json.marshal(v),
		])
	}) | {msg |
		is_fraction(entry.deny_below)
		is_fraction(entry.approval_below)
		entry.deny_below > entry.approval_below
		msg := concat("", [
			"thresholds[", json.marshal(action), "]: deny_below ", json.marshal(entry.deny_below),
			" exceeds approval_below ", json.marshal(entry.approval_below),
		])
	}
} else := {concat("", [
	"thresholds[", json.marshal(action), "] must be an object {deny_below, approval_below}, got ",
	json.marshal(entry),
])}

is_fraction(v) if {
	is_number(v)
	v >= 0
	v <= 1
}

# threshold(key) is the agent's threshold for input.action: the action's own entry, else the "*"
# entry, else the built-in default. A non-numeric value is ignored in favour of the next level.
threshold(key) := v if {
	v := data.authz.agent.thresholds[input.action][key]
	is_number(v)
} else := v if {
	v := data.authz.agent.thresholds["*"][key]
	is_number(v)
} else := default_thresholds[key]

below(key) if {
	input.kind == "agent"
	input.confidence < threshold(key)
}

# A confidence that is missing or not a number counts as below every threshold: fail closed.
below(_) if {
	input.kind == "agent"
	not is_number(object.get(input, "confidence", null))
}

sorted_list(s) := sort([r | some r in s])

confidence_text := t if {
	t := json.marshal(object.get(input, "confidence", null))
} else := "(missing)"

# The outcome for the subject in the input alone (an agent, or a human).
base_decision := {
	"status": "deny",
	"message": concat("; ", sorted_list(deny_reasons)),
	"reasons": sorted_list(deny_reasons),
} if {
	count(deny_reasons) > 0
} else := {
	"status": "deny",
	"message": concat("", ["invalid confidence thresholds: ", concat("; ", sorted_list(threshold_problems))]),
	"reasons": ["invalid_threshold"],
} if {
	count(threshold_problems) > 0
} else := {
	"status": "deny",
	"message": concat("", [
		"confidence ", confidence_text,
		" is below the deny threshold ", json.marshal(threshold("deny_below")),
		" for action ", reason_text(input.action),
	]),
	"reasons": ["confidence_below_deny_threshold"],
} if {
	below("deny_below")
} else := {
	"status": "deny",
	"message": concat("", ["no policy allows ", reason_text(input.action), " on this resource"]),
	"reasons": [],
} if {
	not allowed
	count(approval_reasons) == 0
} else := {
	"status": "requires_approval",
	"message": concat("; ", sorted_list(approval_reasons)),
	"reasons": sorted_list(approval_reasons),
} if {
	count(approval_reasons) > 0
} else := {
	"status": "requires_approval",
	"message": concat("", [
		"confidence ", confidence_text,
		" is below the approval threshold ", json.marshal(threshold("approval_below")),
		" for action ", reason_text(input.action),
	]),
	"reasons": ["confidence_below_approval_threshold"],
} if {
	below("approval_below")
} else := {
	"status": "allow",
	"message": "allowed",
	"reasons": [],
} if {
	# Re-checks every earlier condition, so a branch that failed to evaluate cannot end in allow.
	allowed
	count(deny_reasons) == 0
	count(threshold_problems) == 0
	count(approval_reasons) == 0
	not below("deny_below")
	not below("approval_below")
} else := {
	# Reached only if a branch above could not be evaluated: never allow by accident.
	"status": "deny",
	"message": "policy evaluation failed: no decision branch applied",
	"reasons": ["evaluation_error"],
}

# ---------------------------------------------------------------------------------------------
# Delegation: an agent acting on behalf of a user never does more than that user may.

delegated if {
	input.kind == "agent"
	is_object(input.on_behalf_of)
}

# The agent's request as the delegating user's own: the human rules see the user, the action as
# sent, and the resource split at its first "/" (no "/": type "").
delegated_input := {
	"kind": "human",
	"tenant_id": input.on_behalf_of.tenant_id,
	"user_id": input.on_behalf_of.user_id,
	"action": input.action,
	"resource": split_resource(input.resource),
	"context": object.get(input, "context", {}),
	"principal": object.get(input, "principal", {}),
	"agent_id": input.agent_id,
}

split_resource(r) := {"type": substring(r, 0, i), "id": substring(r, i + 1, -1)} if {
	i := indexof(r, "/")
	i >= 0
} else := {"type": "", "id": r}

rank := {"allow": 0, "requires_approval": 1, "deny": 2}

delegated_user_text := concat("", ["on behalf of ", reason_text(input.on_behalf_of.user_id)])

# Both sides' reasons are kept; the user's are marked as the user's.
delegated_decision := {
	"status": status,
	"message": message,
	"reasons": array.concat(agent.reasons, [concat(": ", [delegated_user_text, r]) | some r in user.reasons]),
} if {
	agent := base_decision
	user := base_decision with input as delegated_input
	status := [s | some s, n in rank; n == max({rank[agent.status], rank[user.status]})][0]
	agent_part := [agent.message | agent.status != "allow"]
	user_part := [concat(": ", [delegated_user_text, user.message]) | user.status != "allow"]
	message := joined_or_allowed(stricter_first(rank[user.status] > rank[agent.status], agent_part, user_part))
}

# The side whose outcome won is named first: a deny for the user does not read as "requires approval; …".
stricter_first(user_won, agent_part, user_part) := array.concat(user_part, agent_part) if {
	user_won
} else := array.concat(agent_part, user_part)

joined_or_allowed(parts) := concat("; ", parts) if {
	count(parts) > 0
} else := "allowed"

# Budgets the policies declare for this request (the engine checks and consumes them).
decision_limits contains l if {
	input.kind == "agent"
	some l in data.authz.agent.limits
}

decision_limits contains l if {
	input.kind == "human"
	some l in data.authz.human.limits
}

decision_limits contains l if {
	delegated
	some l in data.authz.human.limits with input as delegated_input
}

# `limits` as a single value is one (malformed) limit, which the engine refuses with a deny,
# rather than a budget silently not enforced.
decision_limits contains l if {
	input.kind == "agent"
	l := data.authz.agent.limits
	not collection(l)
}

decision_limits contains l if {
	input.kind == "human"
	l := data.authz.human.limits
	not collection(l)
}

decision_limits contains l if {
	delegated
	l := data.authz.human.limits with input as delegated_input
	not collection(l)
}

outcome := delegated_decision if delegated

else := base_decision

decision := object.union(outcome, {"limits": [l | some l in decision_limits]}) if {
	is_object(outcome)
} else := {
	# Reached only if the outcome could not be evaluated: never allow by accident.
	"status": "deny",
	"message": "policy evaluation failed: no decision could be made",
	"reasons": ["evaluation_error"],
	"limits": [],
}
