import { isUtf8 } from 'node:buffer';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import YAML from 'yaml';
import type { Module } from './compiler.js';
import { checkDataPath, POLICY_NAME } from './documents.js';

/** The copy of the built-in module a policy directory may hold at its root (never a policy). */
export const BUNDLED_BUILTIN = 'authz.rego';

/**
 * Reads an OPA-bundle-style directory: every `*.rego` except `*_test.rego` becomes a policy named
 * by its relative path (`a/b.rego` → `a.b`); `data.json` / `data.yaml` become data documents at
 * their directory's path (top-level keys of the root one each become a document).
 */
export async function readPolicyDir(dir: string): Promise<{
  modules: (Module & { description: string; file: string })[];
  data: { path: string; value: unknown }[];
}> {
  const modules: (Module & { description: string; file: string })[] = [];
  const data: { path: string; value: unknown }[] = [];
  let entries;
  try {
    entries = await readdir(dir, { recursive: true, withFileTypes: true });
  } catch (e) {
    throw new Error(`cannot read policy directory ${dir}: ${(e as Error).message}`, { cause: e });
  }
  for (const ent of entries.sort((a, b) =>
    path.join(a.parentPath, a.name).localeCompare(path.join(b.parentPath, b.name)),
  )) {
    if (!ent.isFile()) continue;
    const full = path.join(ent.parentPath, ent.name);
    const rel = path.relative(dir, full).split(path.sep).join('/');
    // The root authz.rego is the copy of the built-in module that makes the directory a complete
    // OPA bundle for stock opa; the service always uses its own built-in module instead. A file
    // there of another package is someone's rules, which would never be pushed: refused.
    if (rel === BUNDLED_BUILTIN) {
      const declared = packageOf(await readUtf8(full));
      if (declared !== 'authz') {
        throw new Error(
          `${full}: the root ${BUNDLED_BUILTIN} is kept for a copy of the built-in decision module ` +
            `(package authz) and never pushed, but this one declares package ${declared ?? '(none)'}: ` +
            'give it another file name',
        );
      }
      continue;
    }
    if (rel.endsWith('.rego') && !rel.endsWith('_test.rego')) {
      const name = rel.slice(0, -'.rego'.length).replace(/\//g, '.');
      if (!POLICY_NAME.test(name)) throw new Error(`${full}: ${name} is not a valid policy name`);
      modules.push({
        name,
        rego: await readUtf8(full),
        description: `seeded from ${rel}`,
        file: rel,
      });
    } else if (/(^|\/)data\.(json|ya?ml)$/.test(rel)) {
      const text = await readUtf8(full);
      let value: unknown;
      try {
        value = rel.endsWith('.json') ? JSON.parse(text) : YAML.parse(text);
      } catch (e) {
        throw new Error(`${full}: ${(e as Error).message}`, { cause: e });
      }
      const at = path.posix.dirname(rel);
      if (at === '.') {
        if (typeof value !== 'object' || value === null || Array.isArray(value)) {
          throw new Error(`${full}: the root data document must be an object`);
        }
        for (const [k, v] of Object.entries(value)) data.push({ path: k, value: v });
      } else {
        data.push({ path: at, value });
      }
    }
  }
  for (const d of data) checkDataPath(d.path);
  return { modules, data };
}

/** The package a Rego text declares: its first line that is not blank or a comment. */
function packageOf(rego: string): string | undefined {
  for (const line of rego.split('\n')) {
    const code = line.replace(/#.*$/, '').trim();
    if (code === '') continue;
    return /^package\s+(\S+)$/.exec(code)?.[1];
  }
  return undefined;
}

/**
 * A file's text, refused when it is not UTF-8: decoding would put U+FFFD in place of the bad
 * bytes, and the policy then stored (and its sha256) would not be the file in the directory.
 */
async function readUtf8(file: string): Promise<string> {
  const bytes = await readFile(file);
  if (!isUtf8(bytes)) throw new Error(`${file}: not valid UTF-8`);
  return bytes.toString('utf8');
}
