import { isUtf8 } from 'node:buffer';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import YAML from 'yaml';
import type { Module } from './compiler.js';
import { checkDataPath, POLICY_NAME } from './documents.js';

/** A policy directory as read: its policies, its data documents, and the file of each document. */
export interface PolicyDir {
  modules: (Module & { description: string; file: string })[];
  data: { path: string; value: unknown }[];
  /** Data document path → the file (relative to the directory) that defines it. */
  dataFiles: Map<string, string>;
}

/** The copy of the built-in module a policy directory may hold at its root (never a policy). */
export const BUNDLED_BUILTIN = 'authz.rego';

/**
 * Reads an OPA-bundle-style directory: every `*.rego` except `*_test.rego` becomes a policy named
 * by its relative path (`a/b.rego` → `a.b`); `data.json` / `data.yaml` become data documents at
 * their directory's path (top-level keys of the root one each become a document).
 *
 * Refused, naming the files: a symbolic link or any other entry that is neither a regular file nor
 * a directory (a link was skipped here but followed by `opa test` and a copy, so one command saw
 * a policy another did not, and `push --prune` deleted it); two files that are the same policy
 * (`lib/helpers.rego`, `lib.helpers.rego`); two files that define the same data document or
 * documents one inside the other (one would silently win); a number JSON cannot hold (`1e400`,
 * YAML's `.inf` and `.nan`: JSON.stringify sends them as null). The directory itself may be a link.
 */
export async function readPolicyDir(dir: string): Promise<PolicyDir> {
  const modules: (Module & { description: string; file: string })[] = [];
  const data: { path: string; value: unknown }[] = [];
  const dataFiles = new Map<string, string>();
  const policyFiles = new Map<string, string>();
  let entries;
  try {
    entries = await readdir(dir, { recursive: true, withFileTypes: true });
  } catch (e) {
    throw new Error(`cannot read policy directory ${dir}: ${(e as Error).message}`, { cause: e });
  }
  for (const ent of entries.sort((a, b) =>
    path.join(a.parentPath, a.name).localeCompare(path.join(b.parentPath, b.name)),
  )) {
    const full = path.join(ent.parentPath, ent.name);
    if (ent.isSymbolicLink()) {
      throw new Error(
        `${full}: a symbolic link; a policy directory must hold only regular files and directories`,
      );
    }
    if (ent.isDirectory()) continue;
    if (!ent.isFile()) {
      throw new Error(
        `${full}: not a regular file; a policy directory must hold only regular files and directories`,
      );
    }
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
      const other = policyFiles.get(name);
      if (other !== undefined) {
        throw new Error(`${path.join(dir, other)} and ${full} are both the policy ${name}: rename one`);
      }
      policyFiles.set(name, rel);
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
      const docs: [string, unknown][] = [];
      if (at === '.') {
        if (typeof value !== 'object' || value === null || Array.isArray(value)) {
          throw new Error(`${full}: the root data document must be an object`);
        }
        docs.push(...Object.entries(value));
      } else {
        docs.push([at, value]);
      }
      for (const [p, v] of docs) {
        checkFinite(v, full, p);
        const other = dataFiles.get(p);
        if (other !== undefined) {
          throw new Error(`${path.join(dir, other)} and ${full} both define the data document ${p}`);
        }
        dataFiles.set(p, rel);
        data.push({ path: p, value: v });
      }
    }
  }
  for (const d of data) checkDataPath(d.path);
  // A document inside another (root data.json's `rbac` and rbac/extra/data.json): both would
  // define data.rbac.extra, and one would silently win.
  for (const d of data) {
    const segs = d.path.split('/');
    for (let n = 1; n < segs.length; n++) {
      const outer = segs.slice(0, n).join('/');
      const other = dataFiles.get(outer);
      if (other !== undefined) {
        throw new Error(
          `${path.join(dir, other)} (data document ${outer}) and ${path.join(dir, dataFiles.get(d.path) as string)} ` +
            `(data document ${d.path}) overlap: ${d.path} would be defined twice`,
        );
      }
    }
  }
  return { modules, data, dataFiles };
}

/**
 * Refuses a number JSON cannot hold anywhere in a data document (`1e400` parses to Infinity, YAML
 * has `.inf` and `.nan`): JSON.stringify would send it as null. `doc` is the document's path.
 */
function checkFinite(value: unknown, file: string, doc: string): void {
  const todo: [unknown, string][] = [[value, '']];
  for (let item = todo.pop(); item !== undefined; item = todo.pop()) {
    const [v, at] = item;
    if (typeof v === 'number' && !Number.isFinite(v)) {
      throw new Error(
        `${file}: data document ${doc}${at === '' ? '' : ` at ${at}`} holds ${String(v)}, ` +
          'which JSON cannot hold (it would be sent as null)',
      );
    }
    if (Array.isArray(v)) v.forEach((x, i) => todo.push([x, `${at}[${i}]`]));
    else if (typeof v === 'object' && v !== null) {
      for (const [k, x] of Object.entries(v)) todo.push([x, `${at}.${k}`]);
    }
  }
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
