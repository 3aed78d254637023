package authz.budgets_test

# Tests of the example budgets in budgets.rego, through data.authz.decision (what the engine
# evaluates): the limits a decision declares, and the deny for an unpriced payment. That the
# engine then charges them exactly is tested over HTTP (test/governance.test.ts).

pay(amount) := {
	"kind": "agent",
	"agent_id": "finance-bot",
	"action": "invoices.pay",
	"resource": "invoices/i-1",
	"confidence": 0.95,
	"context": {"amount": amount},
	"principal": {"name": "finance", "tenant": null, "agent": "finance-bot"},
}

test_payment_declares_count_and_spend_budgets if {
	d := data.authz.decision with input as pay(1200)
	d.status == "allow"
	{l | some l in d.limits} == {
		{"key": "agent:finance-bot:invoices.pay", "window": "24h", "max": 50},
		{"key": "agent:finance-bot:invoices.usd", "window": "24h", "max": 20000, "cost": 1200},
	}
}

# A key bound to a tenant spends that tenant's budget: two tenants' finance-bot are two agents.
test_budgets_are_per_tenant if {
	d := data.authz.decision with input as object.union(pay(1200), {"principal": {"name": "acme-finance", "tenant": "acme", "agent": "finance-bot"}})
	d.status == "allow"
	{l.key | some l in d.limits} == {`agent:["acme","finance-bot"]:invoices.pay`, `agent:["acme","finance-bot"]:invoices.usd`}
}

# Ids holding ":" cannot make two tenants' agents share a budget.
test_budget_keys_keep_ids_apart if {
	one := data.authz.decision with input as object.union(pay(10), {"agent_id": "b:agent:c", "principal": {"name": "x", "tenant": "a"}})
	two := data.authz.decision with input as object.union(pay(10), {"agent_id": "c", "principal": {"name": "y", "tenant": "a:agent:b"}})
	{l.key | some l in one.limits} & {l.key | some l in two.limits} == set()
}

test_budgets_follow_data if {
	d := data.authz.decision with input as pay(10)
		with data.budgets as {"invoice_payments_per_day": 3, "invoice_spend_per_day": 99.5}
	{l.max | some l in d.limits} == {3, 99.5}
}

test_unpriced_payment_denied_not_unmetered if {
	some amount in [0, -5, "1200", null]
	d := data.authz.decision with input as pay(amount)
	d.status == "deny"
	d.reasons == ["invoices.pay requires a positive numeric context.amount"]
}

test_other_actions_declare_no_budget if {
	d := data.authz.decision with input as object.union(pay(10), {"action": "invoices.read"})
	d.limits == []
}

# Each budget on its own: `every`, so that a deny for only one of them fails the test.
test_payment_without_its_budget_in_data_denied_not_unmetered if {
	every name in ["invoice_payments_per_day", "invoice_spend_per_day"] {
		d := data.authz.decision with input as pay(10)
			with data.budgets as object.remove({"invoice_payments_per_day": 3, "invoice_spend_per_day": 99.5}, [name])
		d.status == "deny"
		d.reasons == [concat("", ["invoices.pay has no daily budget: data.budgets.", name, " must be a number"])]
	}
}
