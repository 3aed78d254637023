# Example policy for human users: tenant-scoped RBAC driven by data.rbac.
#
# Input: {"kind": "human", "tenant_id", "user_id", "action", "resource": {"type", "id"},
#         "context" (object), "principal"}
# Data:  data.rbac.role_bindings[tenant_id][user_id] = [role, ...]
#        data.rbac.roles[role] = [{"action": a, "type": t}, ...]   ("*" matches anything)
#        data.rbac.suspended[tenant_id] = [user_id, ...]
#
# Reference requests (tenant acme; resource {"type": "project", "id": "p1"}):
#
#   user   roles   action  status             why
#   -----  ------  ------  -----------------  ----------------------------------------
#   alice  admin   delete  allow              admin grants * on *
#   bob    viewer  read    allow              viewer grants read on *
#   bob    viewer  delete  deny               no role grants delete (default deny)
#   carol  editor  delete  requires_approval  editor grants delete, but not an admin
package authz.human

# Roles bound to the user in the request's tenant. Bindings in other tenants do not count.
user_roles contains role if {
	some role in data.rbac.role_bindings[input.tenant_id][input.user_id]
}

is_admin if "admin" in user_roles

matches(pattern, _) if pattern == "*"

matches(pattern, value) if pattern == value

# str renders any value for a reason string (concat on a non-string would make the reason vanish).
str(x) := x if is_string(x)

str(x) := json.marshal(x) if not is_string(x)

# grants(role) is true when the role grants input.action on input.resource.type.
grants(role) if {
	some permission in data.rbac.roles[role]
	matches(permission.action, input.action)
	matches(permission.type, input.resource.type)
}

allow if {
	some role in user_roles
	grants(role)
}

# ---------------------------------------------------------------------------------------------
# deny

deny contains concat("", ["cross-tenant access: tenant ", str(input.tenant_id), " cannot act on resources of tenant ", str(input.context.resource_tenant)]) if {
	"resource_tenant" in object.keys(input.context)
	input.context.resource_tenant != input.tenant_id
}

deny contains concat("", ["user ", str(input.user_id), " is suspended in tenant ", str(input.tenant_id)]) if {
	input.user_id in data.rbac.suspended[input.tenant_id]
}

# ---------------------------------------------------------------------------------------------
# require_approval (only for requests some role already allows, so they never turn a default
# deny into an approvable request)

require_approval contains "deleting a project requires admin approval" if {
	input.action == "delete"
	input.resource.type == "project"
	allow
	not is_admin
}

require_approval contains concat("", ["paying an invoice over ", str(data.rbac.invoice_approval_limit), " requires approval"]) if {
	input.action == "pay"
	input.resource.type == "invoice"
	allow
	is_number(input.context.amount)
	input.context.amount > data.rbac.invoice_approval_limit
}
