# Example budgets for agents (SPEC §13): copy and adapt.
#
# A policy declares limits; the engine enforces them. Each limit is an object
#   {"key": k, "window": w, "max": n, "cost": c}
# key     a string naming the counter: decisions that name the same key share it
# window  a Go-style duration ("90s", "15m", "24h"): fixed windows aligned to the Unix epoch
# max     what one window may consume in all
# cost    what this decision consumes (default 1; numbers with up to 6 decimals are exact)
#
# After the policy answers allow, the engine charges every limit in the transaction that records
# the decision, or answers deny (403) naming the exhausted key, window and max; a deny consumes
# nothing, a requires_approval consumes when it is approved. A malformed limit (bad window, a
# negative or non-numeric max or cost) makes the decision a deny: budgets fail closed. A limit
# whose object is undefined (a max read from data that is not there) is not declared at all, so
# the engine cannot refuse it: deny the action when its budget is missing, as below.
#
# Data (policies/data.json): budgets.invoice_payments_per_day, budgets.invoice_spend_per_day.
#
#   key's tenant  agent        action        context.amount  budgets charged
#   ------------  -----------  ------------  --------------  ----------------------------------------
#   (unbound)     finance-bot  invoices.pay  1200            agent:finance-bot:invoices.pay (1),
#                                                            agent:finance-bot:invoices.usd (1200)
#   acme          finance-bot  invoices.pay  1200            agent:["acme","finance-bot"]:invoices.pay,
#                                                            agent:["acme","finance-bot"]:invoices.usd
#   (any)         finance-bot  invoices.pay  (missing)       none: denied, an unpriced payment
#
# Budgets are per tenant: agent ids are each tenant's own names, so acme's finance-bot and
# globex's are two agents with two budgets. A key bound to a tenant counts in that tenant's
# counters; without the tenant in the key, one tenant could spend another's budget (and learn
# from the refusal that it had). Agent keys should be bound to their tenant.
package authz.agent

# How many invoices an agent may pay per day, whatever the amounts.
limits contains {
	"key": concat(":", [budget_holder, "invoices.pay"]),
	"window": "24h",
	"max": data.budgets.invoice_payments_per_day,
} if {
	input.action == "invoices.pay"
}

# How much an agent may pay per day: each payment costs its amount.
limits contains {
	"key": concat(":", [budget_holder, "invoices.usd"]),
	"window": "24h",
	"max": data.budgets.invoice_spend_per_day,
	"cost": input.context.amount,
} if {
	input.action == "invoices.pay"
	priced_invoice
}

# Whose budget a decision spends: the agent, within the tenant of the key that asks. The two ids
# are written as a JSON array, not joined with ":", since either may hold ":" (tenant "a" with
# agent "b:agent:c" must not meet tenant "a:agent:b" with agent "c").
budget_holder := concat(":", ["agent", json.marshal([input.principal.tenant, input.agent_id])]) if {
	is_string(input.principal.tenant)
} else := concat(":", ["agent", input.agent_id])

# Without a price the spend budget above would not apply: refuse rather than pay unmetered.
deny contains "invoices.pay requires a positive numeric context.amount" if {
	input.action == "invoices.pay"
	not priced_invoice
}

# A budget whose maximum is missing from data (a deleted document, a renamed key) is no limit at
# all: the object above is undefined and the engine never sees it. Refuse instead of paying
# unmetered.
deny contains concat("", ["invoices.pay has no daily budget: data.budgets.", name, " must be a number"]) if {
	input.action == "invoices.pay"
	some name in ["invoice_payments_per_day", "invoice_spend_per_day"]
	not daily_budget(name)
}

# A rule, not `not is_number(data.budgets[name])`: OPA takes an undefined argument out of the
# `not`, which would make that line undefined (no deny) exactly when the budget is missing.
daily_budget(name) if is_number(data.budgets[name])

priced_invoice if {
	is_number(input.context.amount)
	input.context.amount > 0
}
