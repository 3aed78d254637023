// Where the OPA CLI lives: ARBITER_OPA_BIN when set, else the binary the install step builds
// from tools/opa. Shared by the install step, the `opa` wrapper and (mirrored) src/config.ts.
import { fileURLToPath } from 'node:url';
import path from 'node:path';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const builtOpaPath = path.join(repoRoot, '.opa-bin', 'opa');

export function opaPath() {
  return process.env.ARBITER_OPA_BIN || builtOpaPath;
}
