# Arbiter's built-in decision module. The package name `authz` is reserved: user modules cannot
# declare it. The engine evaluates exactly one entrypoint, data.authz.decision, per request.
#
# User modules in `package authz.agent` / `package authz.human` contribute:
#   deny contains reason if ...              any reason -> deny
#   require_approval contains reason if ...  any reason -> requires_approval (unless denied)
#   allow if ...                              needed for allow
#   thresholds[action] := {"deny_below": x, "approval_below": y}   (agents; "*" is the default)
#
# Precedence: deny rules -> confidence below deny_below -> no allow and no approval rule
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

decision := {
	"status": "deny",
	"message": concat("; ", sorted_list(deny_reasons)),
	"reasons": sorted_list(deny_reasons),
} if {
	count(deny_reasons) > 0
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
	count(approval_reasons) == 0
	not below("deny_below")
	not below("approval_below")
} else := {
	# Reached only if a branch above could not be evaluated: never allow by accident.
	"status": "deny",
	"message": "policy evaluation failed: no decision branch applied",
	"reasons": ["evaluation_error"],
}
