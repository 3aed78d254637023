#!/usr/bin/env node
import { parseArgsOnce } from './cli/args.js';
import { prepareStorage, startArbiter } from './app.js';
import { openStores } from './storage/index.js';
import { isWorker, runPrimary } from './cluster.js';
import {
  anchorOf,
  AuditService,
  parseAnchorCount,
  parseAnchorHead,
  type ChainAnchor,
} from './audit/service.js';
import { ConfigError, loadConfig, type Role } from './config.js';
import { AppError } from './errors.js';
import { KeyService } from './keys/service.js';
import { createLogger } from './observability/logger.js';
import { VERSION } from './version.js';
import { POLICY_USAGE, policyCommand } from './cli/policy.js';

const USAGE = `usage:
  arbiter --version
  arbiter serve [--role engine|platform|all] [--workers N|auto]
  arbiter keys create --name NAME --scopes s1,s2 [--tenant T] [--agent A]
  arbiter keys list
  arbiter keys revoke NAME
  arbiter audit verify [--head H --count N]
${POLICY_USAGE}

Configuration comes from ARBITER_* environment variables and an optional YAML file named by
ARBITER_CONFIG (see README.md). The policy commands talk to the Platform API at --url or
ARBITER_URL with the key from --key or ARBITER_KEY; exit 0 ok, 1 refused or failed, 2 usage or
connection error.`;

class UsageError extends Error {}

async function serve(args: string[]): Promise<void> {
  const { values } = parseArgsOnce({
    args,
    options: { role: { type: 'string', default: 'all' }, workers: { type: 'string' } },
    strict: true,
  });
  const role = values.role as string;
  if (role !== 'engine' && role !== 'platform' && role !== 'all') {
    throw new UsageError(`--role must be engine, platform or all, got ${role}`);
  }
  const env =
    values.workers === undefined ? process.env : { ...process.env, ARBITER_WORKERS: values.workers };
  const config = loadConfig(env);
  const log = createLogger(config.logLevel);
  if (!isWorker() && config.workers > 1) {
    // Primary: prepare storage once, then fork the serving processes and supervise them.
    await prepareStorage(config, log);
    const primary = await runPrimary(config.workers, log);
    onSignal(log, () => primary.stop());
    return;
  }
  const running = await startArbiter(config, role as Role, log);
  onSignal(log, () => running.close());
}

/** Graceful shutdown on SIGTERM/SIGINT: stop accepting, finish in-flight requests, close storage. */
function onSignal(log: ReturnType<typeof createLogger>, close: () => Promise<void>): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'shutting down: finishing in-flight requests');
    close().then(
      () => {
        log.info('stopped');
        process.exit(0);
      },
      (err: unknown) => {
        log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

async function keys(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  const config = loadConfig();
  const stores = await openStores(config);
  const service = new KeyService(stores.keys, config.adminKey);
  const actor = `cli:${process.env.USER ?? 'unknown'}`;
  try {
    if (sub === 'create') {
      const { values } = parseArgsOnce({
        args: rest,
        options: {
          name: { type: 'string' },
          scopes: { type: 'string' },
          tenant: { type: 'string' },
          agent: { type: 'string' },
        },
        strict: true,
      });
      if (!values.name) throw new UsageError('keys create needs --name');
      if (!values.scopes) throw new UsageError('keys create needs --scopes (comma-separated)');
      const { key, record } = await service.create(
        {
          name: values.name,
          scopes: values.scopes.split(',').map((s) => s.trim()),
          tenant: values.tenant,
          agent: values.agent,
        },
        actor,
      );
      // The only time the key is shown: it is stored as a hash.
      console.log(
        JSON.stringify({
          name: record.name,
          key,
          scopes: record.scopes,
          tenant: record.tenant,
          agent: record.agent,
        }),
      );
    } else if (sub === 'list') {
      parseArgsOnce({ args: rest, options: {}, strict: true });
      for (const k of await service.list()) {
        const { hash: _hash, ...shown } = k;
        console.log(JSON.stringify(shown));
      }
    } else if (sub === 'revoke') {
      const { positionals } = parseArgsOnce({
        args: rest,
        options: {},
        allowPositionals: true,
        strict: true,
      });
      if (positionals.length !== 1) throw new UsageError('keys revoke needs exactly one key name');
      const r = await service.revoke(positionals[0] as string, actor);
      console.log(
        JSON.stringify({ name: r.key.name, revoked_at: r.key.revoked_at, tokens_revoked: r.tokensRevoked }),
      );
    } else {
      throw new UsageError(`unknown keys command ${sub ?? '(none)'}`);
    }
  } finally {
    await stores.close();
  }
}

/** Walks the audit hash chain of the configured database; exit 1 when it is broken. */
async function audit(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  if (sub !== 'verify') throw new UsageError(`unknown audit command ${sub ?? '(none)'}`);
  const { values } = parseArgsOnce({
    args: rest,
    options: { head: { type: 'string' }, count: { type: 'string' } },
    strict: true,
  });
  // An anchor saved from an earlier verify: malformed, or one part without the other, is a usage error.
  let anchor: ChainAnchor | undefined;
  try {
    anchor = anchorOf(
      values.head === undefined ? undefined : parseAnchorHead(values.head),
      values.count === undefined ? undefined : parseAnchorCount(values.count),
    );
  } catch (e) {
    throw new UsageError(`audit verify: ${(e as Error).message}`);
  }
  const config = loadConfig();
  const stores = await openStores(config);
  try {
    const r = await new AuditService(stores.audit, (d) => d, config.maxContextBytes).verify(anchor);
    console.log(JSON.stringify(r));
    if (!r.ok) process.exitCode = 1;
  } finally {
    await stores.close();
  }
}

async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (cmd === '--version' || cmd === '-v' || cmd === 'version') {
    console.log(`arbiter ${VERSION}`);
    return;
  }
  // `arbiter <command> --help` (anywhere after the command) prints the usage and changes nothing.
  if (rest.includes('--help') || rest.includes('-h')) {
    console.log(USAGE);
    return;
  }
  if (cmd === 'audit') return audit(rest);
  if (cmd === 'serve') return serve(rest);
  if (cmd === 'keys') return keys(rest);
  if (cmd === 'policy') {
    process.exitCode = await policyCommand(
      rest,
      (line) => console.log(line),
      (line) => console.error(line),
    );
    return;
  }
  if (cmd === undefined || cmd === 'help' || cmd === '--help' || cmd === '-h') {
    console.log(USAGE);
    return;
  }
  throw new UsageError(`unknown command ${cmd}`);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (err instanceof UsageError) {
    console.error(`arbiter: ${err.message}\n\n${USAGE}`);
    process.exit(2);
  }
  if (err instanceof ConfigError) {
    console.error(`arbiter: invalid configuration: ${err.message}`);
    process.exit(2);
  }
  if (
    err instanceof AppError ||
    (err instanceof TypeError && (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS'))
  ) {
    console.error(`arbiter: ${(err as Error).message}`);
    process.exit(1);
  }
  console.error(`arbiter: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
