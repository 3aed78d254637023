/**
 * Go-faithful replacements for the builtins @open-policy-agent/opa-wasm implements in JavaScript
 * (sprintf, regex.split, yaml.*). OPA computes these in Go; the SDK's JS versions answer
 * differently on ordinary inputs (sprintf("%v", [{…}]) is "[object Object]", a duplicate YAML key
 * makes yaml.unmarshal undefined, …), so a policy's answer differed from `opa eval` / `opa test`.
 *
 * Each function here either computes exactly what OPA v1.22 computes or throws, which fails the
 * evaluation closed (the decision is a deny carrying `error`). Where the value the host receives
 * cannot tell what OPA would have seen (a set arrives as a JSON array; an integer beyond 2^53 has
 * already lost digits), it throws rather than guess. See docs/decisions.md.
 */
import { createRequire } from 'node:module';
import path from 'node:path';
import { goRegexSplit } from './regex.js';
import { goSprintf } from './sprintf.js';
import { goYaml } from './yaml.js';

// ---------------------------------------------------------------------------------------------
// Installing them. opa.js dispatches `builtinFuncs[name] || customBuiltins[name]`, where
// builtinFuncs is the very object ./builtins/index.js exports (a plain CommonJS object): the
// SDK's JS builtins win over anything passed to loadPolicy. So we replace its entries in place.

export const GO_BUILTINS: Record<string, (...args: unknown[]) => unknown> = {
  sprintf: goSprintf as (...args: unknown[]) => unknown,
  'regex.split': goRegexSplit as (...args: unknown[]) => unknown,
  ...(goYaml as Record<string, (...args: unknown[]) => unknown>),
};

let installed = false;

/**
 * Replaces the SDK's JS builtins with GO_BUILTINS in the object opa.js dispatches through, and
 * checks that it is that object (the module opa.js required), so that a future SDK layout change
 * fails loudly here instead of silently running the JS versions again.
 */
export function installGoBuiltins(): void {
  if (installed) return;
  const req = createRequire(import.meta.url);
  const entry = req.resolve('@open-policy-agent/opa-wasm'); // …/src/index.cjs ("exports" hides the rest)
  const dir = path.dirname(entry);
  const opaPath = path.join(dir, 'opa.js');
  const builtinsPath = path.join(dir, 'builtins', 'index.js');
  const pkgReq = createRequire(opaPath);
  pkgReq(opaPath); // the same module instance the ESM entry imports (CommonJS cache)
  const table = pkgReq(builtinsPath) as Record<string, unknown>;
  const opaModule = req.cache[opaPath];
  const child = opaModule?.children.find((m) => m.filename === builtinsPath);
  if (!child || child.exports !== table) {
    throw new Error('@open-policy-agent/opa-wasm: cannot find the builtins table opa.js dispatches through');
  }
  for (const name of Object.keys(GO_BUILTINS)) {
    if (!(name in table)) throw new Error(`@open-policy-agent/opa-wasm no longer implements ${name} itself`);
  }
  for (const name of Object.keys(table)) {
    // json.is_valid: compiled natively to wasm (capabilities.ts), so the JS entry is not reached.
    if (!(name in GO_BUILTINS) && name !== 'json.is_valid')
      throw new Error(`@open-policy-agent/opa-wasm implements ${name}, which Arbiter has not reviewed`);
  }
  Object.assign(table, GO_BUILTINS);
  installed = true;
}
