// Builds the reviewer console (console/) into dist/console: one script and one style sheet with
// content-hashed names, the page that loads them, and the icon. Run by `npm run build`.
// No inline script or style anywhere (the console is served under default-src 'self').
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const src = path.join(root, 'console');
const out = path.join(root, 'dist', 'console');

// Old hashed files must not linger: the server serves whatever is in this directory.
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const result = await build({
  entryPoints: { app: path.join(src, 'src', 'main.tsx') },
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2022', 'chrome111', 'firefox111', 'safari16.4'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: out,
  entryNames: '[name]-[hash]',
  metafile: true,
  legalComments: 'eof',
  logLevel: 'warning',
  absWorkingDir: root,
});

const outputs = Object.keys(result.metafile.outputs).map((p) => path.basename(p));
const script = outputs.find((f) => f.endsWith('.js'));
const style = outputs.find((f) => f.endsWith('.css'));
if (!script || !style) throw new Error(`console build produced ${outputs.join(', ')}`);

const page = readFileSync(path.join(src, 'index.html'), 'utf8')
  .replace('{{script}}', script)
  .replace('{{style}}', style);
if (page.includes('{{')) throw new Error('console/index.html has a placeholder the build does not fill');
writeFileSync(path.join(out, 'index.html'), page);
copyFileSync(path.join(src, 'favicon.svg'), path.join(out, 'favicon.svg'));
