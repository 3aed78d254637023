// Install step for the OPA compiler (run by `npm ci` / `npm install` as postinstall).
// OPA is not on npm, and this project downloads no prebuilt binaries: it builds OPA's own CLI from
// the Go module pinned in tools/opa/go.mod. ARBITER_OPA_BIN skips the build and uses that binary.
// Why: docs/adr/0001-opa-compiler-from-source.md.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { builtOpaPath, repoRoot } from './opa-path.mjs';

const toolDir = path.join(repoRoot, 'tools', 'opa');
const pinned = /github\.com\/open-policy-agent\/opa v(\S+)/.exec(
  readFileSync(path.join(toolDir, 'go.mod'), 'utf8'),
)?.[1];

function versionOf(bin) {
  const r = spawnSync(bin, ['version'], { encoding: 'utf8' });
  if (r.status !== 0) return undefined;
  return /^Version:\s*(\S+)/m.exec(r.stdout)?.[1];
}

function fail(message) {
  console.error(`arbiter: ${message}`);
  process.exit(1);
}

if (process.env.ARBITER_OPA_BIN) {
  const v = versionOf(process.env.ARBITER_OPA_BIN);
  if (!v) fail(`ARBITER_OPA_BIN=${process.env.ARBITER_OPA_BIN} does not run as 'opa version'.`);
  console.log(`arbiter: using OPA ${v} from ARBITER_OPA_BIN (${process.env.ARBITER_OPA_BIN})`);
  process.exit(0);
}

if (existsSync(builtOpaPath) && versionOf(builtOpaPath) === pinned) {
  console.log(`arbiter: OPA ${pinned} already built at ${builtOpaPath}`);
  process.exit(0);
}

const goCandidates = ['go', '/usr/local/go/bin/go', path.join(process.env.HOME ?? '', 'go', 'bin', 'go')];
const go = goCandidates.find((g) => spawnSync(g, ['version'], { encoding: 'utf8' }).status === 0);
if (!go) {
  fail(
    'the OPA compiler is needed and Go was not found to build it.\n' +
      `  Either install Go >= 1.26 (https://go.dev/dl/, or your distribution's golang package) and run \`npm ci\` again,\n` +
      `  or point ARBITER_OPA_BIN at an existing opa v1.x binary (e.g. ARBITER_OPA_BIN=/usr/local/bin/opa npm ci).`,
  );
}

console.log(`arbiter: building OPA ${pinned} from source with ${go} (first time takes a few minutes)…`);
mkdirSync(path.dirname(builtOpaPath), { recursive: true });
try {
  execFileSync(go, ['build', '-trimpath', '-o', builtOpaPath, '.'], {
    cwd: toolDir,
    stdio: 'inherit',
    env: { ...process.env, CGO_ENABLED: process.env.CGO_ENABLED ?? '0' },
  });
} catch {
  fail(
    `'go build' of OPA ${pinned} failed (see above). The module proxy must be reachable, or set ARBITER_OPA_BIN.`,
  );
}
const built = versionOf(builtOpaPath);
if (built !== pinned) fail(`built OPA reports version ${built}, expected ${pinned}`);
console.log(`arbiter: OPA ${built} built at ${builtOpaPath}`);
