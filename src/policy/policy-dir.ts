import { isUtf8 } from 'node:buffer';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import YAML from 'yaml';
import type { Module } from './compiler.js';
import { holdsExactly, inexactNumberIn, inexactNumberMessage } from '../common/validation.js';
import { scanJson } from '../common/json-scan.js';
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
 * YAML's `.inf` and `.nan`: JSON.stringify sends them as null); YAML beyond the 1.2 core schema
 * (see parseYaml). The directory itself may be a link.
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
    // A policy or data file but for the case of its name (`agent.Rego`, `Data.json`: a
    // case-insensitive file system makes them easily) would be skipped, as OPA skips it, and
    // `push --prune` would delete what it holds live.
    const base = path.posix.basename(rel);
    if (
      (/\.rego$/i.test(base) && !base.endsWith('.rego')) ||
      (/^data\.(json|ya?ml)$/i.test(base) && !/^data\.(json|ya?ml)$/.test(base))
    ) {
      throw new Error(
        `${full}: named like a ${/\.rego$/i.test(base) ? 'policy' : 'data'} file but not in lower case, so it would be ` +
          `skipped (only NAME.rego, data.json and data.yaml are read): rename it`,
      );
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
      // A byte order mark (some editors write one) is not part of the document: JSON.parse
      // would refuse it with an invisible character in the message.
      const text = (await readUtf8(full)).replace(/^\uFEFF/, '');
      let value: unknown;
      try {
        value = rel.endsWith('.json') ? JSON.parse(text) : parseYaml(text, full);
        const repeated = rel.endsWith('.json') ? repeatedKeyIn(text) : undefined;
        if (repeated) {
          throw new DataFileError(
            `${full}:${repeated.line}: the key ${repeated.key} is repeated in one object${repeated.at ? ` (at ${repeated.at})` : ''}: ` +
              'JSON.parse keeps the last one silently, so what is pushed is not what a reader sees first; remove one',
          );
        }
        const inexact = rel.endsWith('.json') ? inexactNumberIn(text) : undefined;
        if (inexact) {
          const { at, literal, read } = inexact;
          throw new DataFileError(
            inexactNumberMessage(`${full}: ${at} holds`, literal, read, 'write it as a string'),
          );
        }
      } catch (e) {
        if (e instanceof DataFileError) throw e;
        throw new Error(`${full}:${syntaxErrorAt(e as Error, text)}`, { cause: e });
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
        checkJson(v, full, p);
        const other = dataFiles.get(p);
        if (other !== undefined) {
          throw new Error(`${path.join(dir, other)} and ${full} both define the data document ${p}`);
        }
        dataFiles.set(p, rel);
        data.push({ path: p, value: v });
      }
    }
  }
  for (const d of data) {
    try {
      checkDataPath(d.path);
    } catch (e) {
      throw new Error(`${path.join(dir, dataFiles.get(d.path) as string)}: ${(e as Error).message}`, {
        cause: e,
      });
    }
  }
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
 * A parse error of a data file as `row:col: message` on one line (as check reports the Rego's),
 * when the parser says where: JSON.parse's `at position N`, the YAML parser's line and column
 * (without the code frame it appends). Otherwise ` message`.
 */
function syntaxErrorAt(e: Error, text: string): string {
  const yaml = e instanceof YAML.YAMLError ? e.linePos?.[0] : undefined;
  if (yaml) {
    const message = e.message.replace(/ at line \d+, column \d+:[\s\S]*$/, '');
    return `${yaml.line}:${yaml.col}: ${message}`;
  }
  const at = /(?: in JSON)? at position (\d+)/.exec(e.message);
  if (at) {
    const before = text.slice(0, Number(at[1]));
    const row = before.split('\n').length;
    const col = before.length - before.lastIndexOf('\n');
    return `${row}:${col}: ${e.message.replace(at[0], '')}`;
  }
  return ` ${e.message.replace(/\s*\n\s*/g, ' ')}`;
}

/** A refusal that already names its file (and line). */
class DataFileError extends Error {}

/** The tags of the YAML 1.2 core schema: the only ones a data.yaml may use. */
const CORE_TAGS = new Set(
  ['str', 'int', 'float', 'bool', 'null', 'map', 'seq'].map((t) => `tag:yaml.org,2002:${t}`),
);

/**
 * A data.yaml read as YAML 1.2 (core schema), exactly as check, diff and push send it. Refused,
 * naming the file and line, is what other YAML readers (OPA's loader, YAML 1.1) read otherwise:
 * a merge key (`<<: *anchor`, which would be pushed as a literal `<<` key) and any tag outside
 * the core schema (`!!set`, `!!omap`, `!!binary`, `!custom`). Errors of the parser are refused
 * too: a duplicate key, more than one document, an alias bomb (more than 100 alias expansions).
 */
function parseYaml(text: string, file: string): unknown {
  const lines = new YAML.LineCounter();
  const doc = YAML.parseDocument(text, {
    version: '1.2',
    schema: 'core',
    merge: false,
    uniqueKeys: true,
    lineCounter: lines,
  });
  const first = doc.errors[0];
  // The parser's own error: it says where (line and column), which check reports.
  if (first) throw first;
  const at = (node: { range?: [number, number, number] | null }) =>
    `${file}:${node.range ? lines.linePos(node.range[0]).line : 1}`;
  YAML.visit(doc, {
    Pair(_key, pair) {
      if (YAML.isScalar(pair.key) && pair.key.type === 'PLAIN' && pair.key.value === '<<') {
        throw new DataFileError(
          `${at(pair.key)}: a merge key (<<) is not accepted: data.yaml is read as YAML 1.2, where it is ` +
            "a plain key, while OPA's loader (YAML 1.1) merges it; write the keys out",
        );
      }
    },
    Node(_key, node) {
      if (node.tag !== undefined && !CORE_TAGS.has(node.tag)) {
        throw new DataFileError(
          `${at(node)}: the tag ${node.tag.replace(/^tag:yaml\.org,2002:/, '!!')} is not accepted: data.yaml is read as YAML 1.2 with the core ` +
            'schema (strings, numbers, booleans, null, maps and lists)',
        );
      }
      // (In Node, not Scalar: a Scalar visitor would replace this one for scalars.) A number a
      // double cannot hold exactly would be pushed rounded, where OPA reads it exactly.
      if (!YAML.isScalar(node) || typeof node.value !== 'number' || !Number.isFinite(node.value)) return;
      if (node.source !== undefined && !yamlNumberExact(node.source, node.value)) {
        throw new DataFileError(
          inexactNumberMessage(
            `${at(node)}: the line holds`,
            node.source,
            String(node.value),
            'quote it to make it a string',
          ),
        );
      }
    },
  });
  return doc.toJS({ maxAliasCount: 100 });
}

/** Whether a YAML 1.2 core-schema number (`0x1F`, `0o17`, `+.5`, `1.`, `1e3`) is exactly `value`. */
function yamlNumberExact(source: string, value: number): boolean {
  const text = source.trim();
  const based = /^([-+]?)0([xo])([0-9a-fA-F]+)$/.exec(text);
  if (based) {
    const [, sign = '', base = 'x', digits = ''] = based;
    const n = BigInt(`0${base}${digits}`) * (sign === '-' ? -1n : 1n);
    // Exact as a double, and written back as the same integer (2^60 is pushed as 1152921504606847000).
    return Number.isInteger(value) && n === BigInt(value) && holdsExactly(n.toString(), value);
  }
  const decimal = text
    .replace(/^\+/, '')
    .replace(/^(-?)\./, '$10.')
    .replace(/\.(?=[eE]|$)/, '');
  return holdsExactly(decimal, value);
}

/**
 * Refuses anything but plain JSON anywhere in a data document: a number JSON cannot hold (`1e400`
 * parses to Infinity, YAML has `.inf` and `.nan`: JSON.stringify would send it as null), and any
 * value that is not a string, finite number, boolean, null, plain object or array (a Map, Set,
 * Uint8Array or Date would be sent as `{}` or another shape). `doc` is the document's path.
 */
function checkJson(value: unknown, file: string, doc: string): void {
  const todo: [unknown, string][] = [[value, '']];
  const where = (at: string) => `${file}: data document ${doc}${at === '' ? '' : ` at ${at}`}`;
  for (let item = todo.pop(); item !== undefined; item = todo.pop()) {
    const [v, at] = item;
    if (typeof v === 'number' && !Number.isFinite(v)) {
      throw new Error(`${where(at)} holds ${String(v)}, which JSON cannot hold (it would be sent as null)`);
    }
    if (Array.isArray(v)) v.forEach((x, i) => todo.push([x, `${at}[${i}]`]));
    else if (typeof v === 'object' && v !== null) {
      const proto = Object.getPrototypeOf(v) as unknown;
      if (proto !== Object.prototype && proto !== null) {
        throw new Error(
          `${where(at)} holds a ${(v as object).constructor?.name ?? 'value'}, which is not plain JSON`,
        );
      }
      for (const [k, x] of Object.entries(v)) todo.push([x, `${at}.${k}`]);
    } else if (!['string', 'number', 'boolean'].includes(typeof v) && v !== null) {
      throw new Error(`${where(at)} holds a ${typeof v}, which is not plain JSON`);
    }
  }
}

/**
 * The first key repeated within one object of a JSON text (valid JSON: JSON.parse accepted it),
 * with its line and the dotted path of the object: JSON.parse keeps the last silently, where a
 * data.yaml with a repeated key is refused.
 */
function repeatedKeyIn(text: string): { key: string; line: number; at: string } | undefined {
  const keys = new Map<number, Set<string>>();
  return scanJson(text, {
    key: (key, offset, place, object) => {
      const seen = keys.get(object) ?? new Set<string>();
      keys.set(object, seen);
      if (!seen.has(key)) {
        seen.add(key);
        return undefined;
      }
      return { key: JSON.stringify(key), line: place.lineAt(offset), at: place.parentPath() };
    },
  });
}

/**
 * The package a Rego text declares: its first line that is not blank or a comment. Lines end in
 * LF or CRLF (a Windows checkout): `.` in the comment pattern does not match a CR.
 */
function packageOf(rego: string): string | undefined {
  for (const line of rego.split(/\r?\n/)) {
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
