import { readFileSync } from 'node:fs';
import path from 'node:path';
import { repoRoot } from './config.js';

/** The package version, read once from package.json (shown by --version and the OpenAPI document). */
export const VERSION = (
  JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')) as { version: string }
).version;
