# Tests for the built-in decision module (package authz). Every user rule is replaced with `with`,
# so these pass both alone (opa test src/policy/rego/) and next to the example policies.
package authz_test

agent_req(action, confidence) := {
	"kind": "agent",
	"agent_id": "test-agent",
	"action": action,
	"resource": "res/1",
	"confidence": confidence,
	"context": {},
	"principal": {"name": "p", "tenant": "t", "agent": "test-agent"},
}

human_req(action) := {
	"kind": "human",
	"tenant_id": "t",
	"user_id": "u",
	"action": action,
	"resource": {"type": "doc", "id": "1"},
	"context": {},
	"principal": {"name": "u", "tenant": "t"},
}

# NOTE: no helper functions wrap `with` here. OPA 1.22's IR compiler (opa build -t wasm/plan)
# rejects calls to any function whose body uses `with` ("function ... used as reference, not
# called"), even though opa check/test accept them, and opa build includes *_test.rego files.

# ---------------------------------------------------------------------------------------------
# precedence: deny rules -> deny_below -> default deny -> approval -> approval_below -> allow

test_allow if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d == {"status": "allow", "message": "allowed", "reasons": [], "limits": []}
}

test_deny_reasons_sorted_and_joined if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as {"zeta", "alpha"}
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d == {"status": "deny", "message": "alpha; zeta", "reasons": ["alpha", "zeta"], "limits": []}
}

test_deny_rule_beats_everything if {
	d := data.authz.decision with input as agent_req("read", 0.1)
		with data.authz.agent.deny as {"no"}
		with data.authz.agent.require_approval as {"approve me"}
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "deny"
	d.reasons == ["no"]
}

test_deny_threshold_beats_approval_and_allow if {
	d := data.authz.decision with input as agent_req("read", 0.2)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as {"approve me"}
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "deny"
	d.reasons == ["confidence_below_deny_threshold"]
	d.message == "confidence 0.2 is below the deny threshold 0.5 for action read"
}

test_default_deny_without_allow_or_approval if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as false
		with data.authz.agent.thresholds as {}
	d == {"status": "deny", "message": "no policy allows read on this resource", "reasons": [], "limits": []}
}

test_allow_must_be_boolean_true if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.thresholds as {}
		with data.authz.agent.allow as "yes" # only the boolean true counts
	d.status == "deny"
}

test_approval_reason_without_allow_requires_approval if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as {"b", "a"}
		with data.authz.agent.allow as false
		with data.authz.agent.thresholds as {}
	d == {"status": "requires_approval", "message": "a; b", "reasons": ["a", "b"], "limits": []}
}

test_approval_reasons_beat_approval_threshold if {
	d := data.authz.decision with input as agent_req("read", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as {"check"}
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.reasons == ["check"]
}

test_approval_threshold if {
	d := data.authz.decision with input as agent_req("read", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "requires_approval"
	d.reasons == ["confidence_below_approval_threshold"]
	d.message == "confidence 0.6 is below the approval threshold 0.9 for action read"
}

test_default_deny_beats_approval_threshold if {
	d := data.authz.decision with input as agent_req("read", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as false
		with data.authz.agent.thresholds as {}
	d.status == "deny"
	d.reasons == []
}

# ---------------------------------------------------------------------------------------------
# thresholds

test_default_thresholds if {
	data.authz.default_thresholds == {"deny_below": 0.5, "approval_below": 0.9}
	data.authz.decision.status == "deny" with input as agent_req("read", 0.49)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}

	# the boundary is inclusive: confidence == deny_below is not denied
	data.authz.decision.status == "requires_approval" with input as agent_req("read", 0.5)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	data.authz.decision.status == "requires_approval" with input as agent_req("read", 0.89)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	data.authz.decision.status == "allow" with input as agent_req("read", 0.9)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
}

thresholds := {
	"*": {"deny_below": 0.2, "approval_below": 0.4},
	"transfer": {"deny_below": 0.7, "approval_below": 0.95},
}

test_per_action_threshold if {
	data.authz.decision.status == "deny" with input as agent_req("transfer", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	data.authz.decision.status == "requires_approval" with input as agent_req("transfer", 0.9)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	data.authz.decision.status == "allow" with input as agent_req("transfer", 0.95)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	d := data.authz.decision with input as agent_req("transfer", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	d.message == "confidence 0.6 is below the deny threshold 0.7 for action transfer"
}

test_star_threshold_for_other_actions if {
	data.authz.decision.status == "deny" with input as agent_req("read", 0.1)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	data.authz.decision.status == "requires_approval" with input as agent_req("read", 0.3)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
	data.authz.decision.status == "allow" with input as agent_req("read", 0.6)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as thresholds
}

test_partial_thresholds_fall_back_per_key if {
	# the action sets only deny_below; approval_below comes from "*", then from the defaults
	th := {"read": {"deny_below": 0.1}, "*": {"approval_below": 0.3}}
	data.authz.decision.status == "requires_approval" with input as agent_req("read", 0.2)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as th
	data.authz.decision.status == "allow" with input as agent_req("read", 0.35)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as th
	th2 := {"read": {"deny_below": 0.1}}
	data.authz.decision.status == "requires_approval" with input as agent_req("read", 0.35)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as th2
}

# A mistyped stricter gate must not become the looser default: deny, naming both problems.
test_non_numeric_threshold_denies if {
	th := {"read": {"deny_below": "0.99", "approval_below": null}, "*": {"deny_below": 0.3}}
	d := data.authz.decision with input as agent_req("read", 0.4)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as th
	d.status == "deny"
	d.reasons == ["invalid_threshold"]
	contains(d.message, `thresholds["read"].deny_below must be a number between 0 and 1, got "0.99"`)
	contains(d.message, `thresholds["read"].approval_below must be a number between 0 and 1, got null`)
}

# ---------------------------------------------------------------------------------------------
# reasons

test_non_string_reasons_rendered_as_json if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as {{"code": 7}, 42, "plain"}
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "deny"
	d.reasons == ["42", "plain", `{"code":7}`]
}

test_non_string_approval_reasons_rendered_as_json if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as {["a", 1]}
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "requires_approval"
	d.reasons == [`["a",1]`]
}

# ---------------------------------------------------------------------------------------------
# humans and kinds

test_human_allow if {
	data.authz.decision.status == "allow" with input as human_req("read")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
}

test_human_deny if {
	d := data.authz.decision with input as human_req("read")
		with data.authz.human.deny as {"nope"}
		with data.authz.human.require_approval as {"maybe"}
		with data.authz.human.allow as true
	d.status == "deny"
	d.reasons == ["nope"]
}

test_human_approval if {
	data.authz.decision.reasons == ["maybe"] with input as human_req("read")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as {"maybe"}
		with data.authz.human.allow as true
}

test_human_default_deny if {
	d := data.authz.decision with input as human_req("write")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as false
	d.message == "no policy allows write on this resource"
}

test_humans_ignore_confidence if {
	inp := object.union(human_req("read"), {"confidence": 0})
	data.authz.decision.status == "allow" with input as inp
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
	d := data.authz.decision with input as inp
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
		with data.authz.agent.thresholds as {"*": {"deny_below": 1, "approval_below": 1}}
	d.status == "allow"
}

test_agent_rules_do_not_apply_to_humans if {
	d := data.authz.decision with input as human_req("read")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
		with data.authz.agent.deny as {"agent deny"}
		with data.authz.agent.require_approval as {"agent approval"}
	d.status == "allow"
}

test_human_rules_do_not_apply_to_agents if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as {"human deny"}
		with data.authz.human.require_approval as {"human approval"}
	d.status == "allow"
}

test_unknown_kind_denied if {
	inp := object.union(agent_req("read", 0.99), {"kind": "robot"})
	d := data.authz.decision with input as inp
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as {"x"}
		with data.authz.agent.allow as true
		with data.authz.human.allow as true
		with data.authz.human.require_approval as {"x"}
	d.status == "deny"
}

# Malformed thresholds fail closed: deny, never the looser defaults.
test_string_threshold_denies if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "x", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {"x": {"deny_below": "0.99"}}
	d.status == "deny"
	d.reasons == ["invalid_threshold"]
	contains(d.message, `thresholds["x"].deny_below must be a number between 0 and 1, got "0.99"`)
}

test_star_threshold_out_of_range_denies if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "x", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {"*": {"deny_below": 0.5, "approval_below": 1.5}}
	d.status == "deny"
	d.reasons == ["invalid_threshold"]
}

test_inverted_threshold_denies if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "x", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {"x": {"deny_below": 0.9, "approval_below": 0.5}}
	d.status == "deny"
	contains(d.message, "deny_below 0.9 exceeds approval_below 0.5")
}

test_unknown_threshold_key_denies if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "x", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {"x": {"deny_bellow": 0.9}}
	d.status == "deny"
	contains(d.message, `unknown key "deny_bellow"`)
}

test_non_object_thresholds_deny if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "x", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as 7
	d.status == "deny"
	d.reasons == ["invalid_threshold"]
}

test_malformed_entry_of_another_action_does_not_deny_this_one if {
	d := data.authz.decision with input as {"kind": "agent", "agent_id": "a", "action": "read", "resource": "r", "confidence": 0.95}
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {"x": {"deny_below": "0.99"}}
	d.status == "allow"
}

test_threshold_errors_lists_every_problem if {
	errs := data.authz.threshold_errors with data.authz.agent.thresholds as {
		"a": {"deny_below": "0.9"},
		"b": {"deny_below": 0.9, "approval_below": 0.2},
		"c": 3,
		"d": {"deny_below": 0.2, "approval_below": 0.8},
	}
	count(errs) == 3
}

test_valid_thresholds_have_no_errors if {
	count(data.authz.threshold_errors) == 0 with data.authz.agent.thresholds as {"*": {"deny_below": 0.5, "approval_below": 0.9}, "x": {"approval_below": 0.99}}
}

# ---------------------------------------------------------------------------------------------
# on_behalf_of: the stricter of the agent's and the user's outcome, with both reasons

obo_req(action, resource, user) := {
	"kind": "agent",
	"agent_id": "test-agent",
	"action": action,
	"resource": resource,
	"confidence": 0.99,
	"context": {},
	"principal": {"name": "p", "tenant": "t", "agent": "test-agent"},
	"on_behalf_of": {"tenant_id": "t", "user_id": user},
}

test_obo_both_allow_is_allow if {
	d := data.authz.decision with input as obo_req("read", "doc/1", "alice")
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
	d.status == "allow"
	d.reasons == []
}

test_obo_user_denied_denies_an_allowed_agent if {
	d := data.authz.decision with input as obo_req("delete", "doc/1", "bob")
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as {"bob may not delete"}
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
	d.status == "deny"
	d.message == "on behalf of bob: bob may not delete"
	d.reasons == ["on behalf of bob: bob may not delete"]
}

test_obo_user_without_allow_is_default_deny if {
	d := data.authz.decision with input as obo_req("read", "doc/1", "mallory")
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as false
	d.status == "deny"
	contains(d.message, "on behalf of mallory: no policy allows read")
}

test_obo_deny_beats_approval_and_keeps_both_reasons if {
	d := data.authz.decision with input as obo_req("deploy", "prod/api", "carol")
		with data.authz.agent.deny as {"agent frozen"}
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as {"carol needs a second pair of eyes"}
		with data.authz.human.allow as true
	d.status == "deny"
	d.reasons == ["agent frozen", "on behalf of carol: carol needs a second pair of eyes"]
	d.message == "agent frozen; on behalf of carol: carol needs a second pair of eyes"
}

test_obo_user_approval_beats_agent_allow if {
	d := data.authz.decision with input as obo_req("deploy", "prod/api", "carol")
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as {"needs review"}
		with data.authz.human.allow as true
	d.status == "requires_approval"
	d.reasons == ["on behalf of carol: needs review"]
}

test_obo_agent_denial_stands_when_user_allowed if {
	d := data.authz.decision with input as obo_req("read", "doc/1", "alice")
		with data.authz.agent.deny as {"agent may not read"}
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
	d.status == "deny"
	d.reasons == ["agent may not read"]
}

test_split_resource if {
	data.authz.split_resource("doc/1/2") == {"type": "doc", "id": "1/2"}
	data.authz.split_resource("plain") == {"type": "", "id": "plain"}
	data.authz.split_resource("/x") == {"type": "", "id": "x"}
}

test_limits_listed_for_the_subject_kind if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.agent.limits as {{"key": "calls", "window": "1h", "max": 3}}
		with data.authz.human.limits as {{"key": "human-only", "window": "1h", "max": 1}}
	d.limits == [{"key": "calls", "window": "1h", "max": 3}]
}

# ---------------------------------------------------------------------------------------------
# a deny, require_approval or limits rule whose value is one value (from data or input, which the
# type checker cannot see) never vanishes: it is one reason, or one (malformed) limit

test_scalar_deny_is_one_reason if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as "change freeze until Monday"
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "deny"
	d.reasons == ["change freeze until Monday"]
}

test_scalar_deny_of_any_type_denies if {
	every v in [0, 1.5, true, null, ""] {
		d := data.authz.decision with input as agent_req("read", 0.99)
			with data.authz.agent.deny as v
			with data.authz.agent.require_approval as set()
			with data.authz.agent.allow as true
			with data.authz.agent.thresholds as {}
		d.status == "deny"
	}
}

test_scalar_human_deny_is_one_reason if {
	d := data.authz.decision with input as human_req("read")
		with data.authz.human.deny as "frozen"
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
	d.status == "deny"
	d.reasons == ["frozen"]
}

test_scalar_require_approval_is_one_reason if {
	d := data.authz.decision with input as agent_req("deploy", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as "deploys need a human"
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "requires_approval"
	d.reasons == ["deploys need a human"]
}

test_scalar_human_require_approval_is_one_reason if {
	d := data.authz.decision with input as human_req("delete")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as "needs a second person"
		with data.authz.human.allow as true
	d.status == "requires_approval"
	d.reasons == ["needs a second person"]
}

test_scalar_limits_is_one_limit if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as set()
		with data.authz.agent.require_approval as set()
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
		with data.authz.agent.limits as "x"
	d.limits == ["x"]
}

test_scalar_human_limits_is_one_limit if {
	d := data.authz.decision with input as human_req("read")
		with data.authz.human.deny as set()
		with data.authz.human.require_approval as set()
		with data.authz.human.allow as true
		with data.authz.human.limits as 5
	d.limits == [5]
}

test_false_deny_is_no_reason if {
	d := data.authz.decision with input as agent_req("read", 0.99)
		with data.authz.agent.deny as false
		with data.authz.agent.require_approval as false
		with data.authz.agent.allow as true
		with data.authz.agent.thresholds as {}
	d.status == "allow"
}
