/**
 * The builtins a policy may call. OPA's wasm target implements some natively; the rest become
 * imports that the host must provide at evaluation time. We admit exactly the natively compiled
 * ones, the ones @open-policy-agent/opa-wasm implements in JS (which Arbiter replaces with its own:
 * src/policy/go-builtins/), and the ones Arbiter implements (src/policy/host-builtins.ts).
 * Anything else (http.send, net.lookup_ip_addr, crypto.*, …) is
 * refused by the compiler at PUT time, never discovered at decision time.
 */

/** Compiled natively into the wasm module (OPA internal/compiler/wasm builtinsFunctions, v1.22). */
export const WASM_NATIVE_BUILTINS = [
  'eq', 'assign', 'plus', 'minus', 'mul', 'div', 'abs', 'round', 'ceil', 'floor', 'rem',
  'array.concat', 'array.flatten', 'array.reverse', 'array.slice', 'and', 'or', 'intersection', 'union',
  'is_number', 'is_string', 'is_boolean', 'is_array', 'is_set', 'is_object', 'is_null', 'type_name',
  'bits.or', 'bits.and', 'bits.negate', 'bits.xor', 'bits.lsh', 'bits.rsh',
  'count', 'sum', 'product', 'max', 'min', 'sort', 'all', 'any',
  'base64.is_valid', 'base64.decode', 'base64.encode', 'base64url.encode', 'base64url.decode',
  'net.cidr_contains', 'net.cidr_overlap', 'net.cidr_intersects',
  'equal', 'gt', 'gte', 'lt', 'lte', 'neq', 'glob.match',
  'json.marshal', 'json.unmarshal', 'json.is_valid', 'json.remove', 'json.filter',
  'object.filter', 'object.get', 'object.keys', 'object.remove', 'object.union', 'object.union_n',
  'concat', 'format_int', 'indexof', 'substring', 'lower', 'upper', 'contains', 'startswith', 'endswith',
  'strings.reverse', 'split', 'replace', 'strings.replace_n',
  'trim', 'trim_left', 'trim_prefix', 'trim_right', 'trim_suffix', 'trim_space',
  'internal.template_string', 'internal.member_2', 'internal.member_3',
  'numbers.range', 'to_number', 'walk', 'graph.reachable',
  'regex.is_valid', 'regex.match', 're_match', 'regex.find_all_string_submatch_n',
] as const; // prettier-ignore

/**
 * Implemented in JavaScript by @open-policy-agent/opa-wasm itself, and replaced there by Arbiter's
 * Go-faithful versions (go-builtins/), which fail closed where they cannot be exact.
 */
export const SDK_BUILTINS = ['sprintf', 'regex.split', 'yaml.unmarshal', 'yaml.is_valid'] as const;

/** Implemented by Arbiter as host functions (see host-builtins.ts). */
export const HOST_BUILTINS = [
  'time.now_ns',
  'time.parse_rfc3339_ns',
  'time.parse_duration_ns',
  'time.date',
  'time.clock',
  'time.weekday',
  'time.add_date',
] as const;

export const ALLOWED_BUILTINS: ReadonlySet<string> = new Set([
  ...WASM_NATIVE_BUILTINS,
  ...SDK_BUILTINS,
  ...HOST_BUILTINS,
]);

interface Capabilities {
  builtins: { name: string }[];
  [k: string]: unknown;
}

/** Restricts OPA's own capabilities document (`opa capabilities --current`) to ALLOWED_BUILTINS. */
export function restrictCapabilities(current: Capabilities): Capabilities {
  return { ...current, builtins: current.builtins.filter((b) => ALLOWED_BUILTINS.has(b.name)) };
}
