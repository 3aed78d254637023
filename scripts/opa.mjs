// Runs the project's OPA CLI with the given arguments (e.g. `node scripts/opa.mjs test policies/`).
import { spawnSync } from 'node:child_process';
import { opaPath } from './opa-path.mjs';

const r = spawnSync(opaPath(), process.argv.slice(2), { stdio: 'inherit' });
if (r.error) {
  console.error(`arbiter: cannot run OPA at ${opaPath()}: ${r.error.message}. Run \`npm ci\` first.`);
  process.exit(1);
}
process.exit(r.status ?? 1);
