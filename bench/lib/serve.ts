// The real service on a data directory a benchmark filled through the stores: `arbiter serve` on
// free ports, resolved once its Platform API logs that it is listening.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { POLICY_DIR, REPO } from './targets.js';

export async function serveDataDir(
  dataDir: string,
  adminKey: string,
): Promise<{ platform: string; stop: () => void }> {
  const child = spawn(process.execPath, [path.join(REPO, 'dist', 'src', 'main.js'), 'serve'], {
    env: {
      ...process.env,
      ARBITER_DATA_DIR: dataDir,
      ARBITER_ENGINE_PORT: '0',
      ARBITER_PLATFORM_PORT: '0',
      ARBITER_ADMIN_KEY: adminKey,
      ARBITER_LOG_LEVEL: 'info',
      ARBITER_POLICY_DIR: POLICY_DIR,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const platform = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const rec = JSON.parse(line) as { api?: string; url?: string };
        if (rec.api === 'platform' && rec.url) resolve(rec.url);
      } catch {
        /* not a log record */
      }
    });
    child.once('exit', (code) => reject(new Error(`arbiter exited with ${code}`)));
  });
  return { platform, stop: () => child.kill('SIGTERM') };
}
