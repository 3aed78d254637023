/**
 * Compiles a policy directory exactly as the service does: the same reader (skips *_test.rego),
 * the same capabilities, the same built-in decision module and entrypoint, the same compiler.
 *
 *   npm run build:rego -- [--dir policies] [--out dist/policy.wasm]
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config.js';
import { CompileError, RegoCompiler } from '../src/policy/compiler.js';
import { readPolicyDir } from '../src/policy/policy-dir.js';

const { values } = parseArgs({
  options: { dir: { type: 'string' }, out: { type: 'string', default: 'dist/policy.wasm' } },
  strict: true,
});
const config = loadConfig();
const dir = path.resolve(values.dir ?? config.policyDir);
const compiler = new RegoCompiler(config.opaBin);
try {
  await compiler.init();
  const { modules, data } = await readPolicyDir(dir);
  const wasm = await compiler.compile(modules);
  await mkdir(path.dirname(path.resolve(values.out)), { recursive: true });
  await writeFile(values.out, wasm);
  console.log(
    `compiled ${modules.length} policies (${modules.map((m) => m.name).join(', ')}) and found ${data.length} data documents in ${dir} → ${values.out} (${wasm.length} bytes)`,
  );
} catch (e) {
  console.error(
    e instanceof CompileError ? `policy set does not compile: ${e.message}` : (e as Error).message,
  );
  process.exitCode = 1;
} finally {
  await compiler.close();
}
