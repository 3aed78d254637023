import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { notFound } from '../errors.js';

/**
 * The reviewer console's files (built by `npm run build` into dist/console), read once into
 * memory. Requests name a file, never a path: a name that is not one of these files is a 404,
 * so `..`, slashes and encodings of them have nothing to reach.
 */
export interface ConsoleFile {
  body: Buffer;
  type: string;
  etag: string;
  /** Content-hashed names never change content: cache them for a year. */
  immutable: boolean;
}

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.map': 'application/json; charset=utf-8',
};

/** A file name the console may serve: no directories, no leading dot, a known type. */
const NAME = /^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$/;
/** esbuild's `[name]-[hash]` entry names: the hash is 8 base32 characters. */
const HASHED = /-[A-Z0-9]{8}\.(js|css|map)$/;

/**
 * Security headers of every console response (errors included). The page loads only its own
 * scripts, styles and images and talks only to its own origin; it may not be framed.
 */
export const CONSOLE_HEADERS: Readonly<Record<string, string>> = {
  'Content-Security-Policy':
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'",
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

export class ConsoleAssets {
  private constructor(private readonly files: ReadonlyMap<string, ConsoleFile>) {}

  /** Reads every file of `dir` (flat); a missing directory gives a console that answers 404. */
  static load(dir: string): ConsoleAssets {
    const files = new Map<string, ConsoleFile>();
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return new ConsoleAssets(files);
    }
    for (const name of names) {
      const type = TYPES[path.extname(name)];
      const full = path.join(dir, name);
      if (!NAME.test(name) || type === undefined || !statSync(full).isFile()) continue;
      const body = readFileSync(full);
      const etag = `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"`;
      files.set(name, { body, type, etag, immutable: HASHED.test(name) });
    }
    return new ConsoleAssets(files);
  }

  /** The console page itself. */
  index(): ConsoleFile {
    const f = this.files.get('index.html');
    if (!f) throw notFound('the console is not built: run npm run build');
    return f;
  }

  /** One file by name; anything else, including the page under another name, is a 404. */
  asset(name: string): ConsoleFile {
    const f = name === 'index.html' ? undefined : this.files.get(name);
    if (!f) throw notFound(`no console file ${name.slice(0, 128)}`);
    return f;
  }
}
