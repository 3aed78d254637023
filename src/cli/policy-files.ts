import { randomBytes } from 'node:crypto';
import { lstat, mkdir, open, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { BUNDLED_BUILTIN } from '../policy/policy-dir.js';
import { Refused } from './policy-errors.js';

/** How `arbiter policy pull` writes DIR: never outside it, never through a link. */

export const isPolicyOrDataFile = (rel: string) =>
  (rel.endsWith('.rego') && !rel.endsWith('_test.rego') && rel !== BUNDLED_BUILTIN) ||
  /(^|\/)data\.(json|ya?ml)$/.test(rel);

/** lstat, or undefined when nothing is there. */
export async function lstatOrNone(p: string) {
  try {
    return await lstat(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

/**
 * Refuses when `rel` (a file pull writes, relative to DIR) or a directory on its way inside DIR
 * is a symbolic link, or not what pull would make there (a regular file, directories).
 */
export async function checkTarget(dir: string, rel: string): Promise<void> {
  const segs = rel.split('/');
  for (let i = 1; i <= segs.length; i++) {
    const at = path.join(dir, ...segs.slice(0, i));
    const st = await lstatOrNone(at);
    if (!st) return;
    const file = i === segs.length;
    if (st.isSymbolicLink()) {
      throw new Refused(
        `${at} is a symbolic link: pull writes only inside ${dir} and never through a link; remove it first`,
      );
    }
    if (file ? !st.isFile() : !st.isDirectory()) {
      throw new Refused(
        `${at} is not a ${file ? 'regular file' : 'directory'}, and pull would write ${rel} there; remove it first`,
      );
    }
  }
}

/**
 * Writes `text` to DIR/rel without following links: each directory on the way is made (or found)
 * and must be a real directory; the text goes to a new file (O_CREAT|O_EXCL, which never follows
 * a link) in the same directory, renamed over the target (which replaces a link there, never
 * writes through it).
 */
export async function writeInside(dir: string, rel: string, text: string): Promise<void> {
  const segs = rel.split('/');
  let at = dir;
  for (const s of segs.slice(0, -1)) {
    at = path.join(at, s);
    await mkdir(at).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
    const st = await lstat(at);
    if (st.isSymbolicLink() || !st.isDirectory())
      throw new Refused(`${at} is not a directory pull made; nothing more was written`);
  }
  const name = segs[segs.length - 1] as string;
  const tmp = path.join(at, `.${name}.${randomBytes(6).toString('hex')}.arbiter-pull`);
  const fh = await open(tmp, 'wx');
  try {
    try {
      await fh.writeFile(text);
    } finally {
      await fh.close();
    }
    await rename(tmp, path.join(at, name));
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
}
