import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { isTokenSafe } from './common/validation.js';

/** Repository root: this file runs as dist/src/config.js. */
export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

export type Role = 'engine' | 'platform' | 'all';
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';

export interface Config {
  readonly host: string;
  readonly enginePort: number;
  readonly platformPort: number;
  readonly dataDir: string;
  readonly adminKey: string | undefined;
  readonly policyDir: string;
  readonly opaBin: string;
  readonly logLevel: LogLevel;
  readonly queueTtlSeconds: number;
  /** Pending approvals one API key may have at once; past it, requires_approval is a deny (0: no cap). */
  readonly queueMaxPendingPerKey: number;
  readonly tokenTtlSeconds: number;
  readonly tokenMaxTtlSeconds: number;
  readonly tokenExchangeWindowSeconds: number;
  readonly issuer: string;
  readonly metricsPublic: boolean;
  readonly maxBodyBytes: number;
  /** The most an authorize request's context, or an ingested event's details, may be as JSON. */
  readonly maxContextBytes: number;
  readonly evalBudgetMs: number;
  /** Whether a shadow set that proved itself on its thread is evaluated on the serving thread (ADR 0010). */
  readonly shadowInline: boolean;
  /** Whether an inline shadow set is evaluated in one pass with the live set where it can be (ADR 0012). */
  readonly shadowPaired: boolean;
  /** One evaluation on the serving thread this long ends the process (0: never; ADR 0011). */
  readonly evalStallSeconds: number;
  readonly dbSync: 'full' | 'normal';
  readonly auditMaskFields: readonly string[];
  readonly workers: number;
  readonly maxLongPolls: number;
  /** Of those, how many one API key may hold at once (default: a tenth of maxLongPolls, at least 1). */
  readonly maxLongPollsPerKey: number;
  /** postgres:// URL of the shared database; undefined: embedded SQLite in dataDir. */
  readonly databaseUrl: string | undefined;
  readonly databasePool: number;
  /** Base URL of the Engine API as reviewers reach it (links in notifications); '' = this listener. */
  readonly publicUrl: string | undefined;
  readonly webhookRetrySeconds: number;
  /** Tenant of an AuthZEN human decision whose subject names none (SPEC §14). */
  readonly authzenDefaultTenant: string;
  /** A connection whose request headers take longer than this is closed (408). */
  readonly httpHeadersTimeoutSeconds: number;
  /** A request (headers and body) that takes longer than this to arrive is closed (408). */
  readonly httpRequestTimeoutSeconds: number;
  /** Open connections per listener (per serving process); more are closed as they arrive. */
  readonly maxConnections: number;
}

/**
 * Every setting: its environment variable, its YAML key (the variable without `ARBITER_`, lower
 * case), its default and how it is parsed. Defaults live here and nowhere else.
 */
const settings = {
  host: { env: 'ARBITER_HOST', def: '127.0.0.1', parse: str },
  enginePort: { env: 'ARBITER_ENGINE_PORT', def: '8080', parse: port },
  platformPort: { env: 'ARBITER_PLATFORM_PORT', def: '8081', parse: port },
  dataDir: { env: 'ARBITER_DATA_DIR', def: './data', parse: dir },
  adminKey: { env: 'ARBITER_ADMIN_KEY', def: '', parse: adminKey },
  policyDir: { env: 'ARBITER_POLICY_DIR', def: './policies', parse: dir },
  opaBin: { env: 'ARBITER_OPA_BIN', def: path.join(repoRoot, '.opa-bin', 'opa'), parse: str },
  logLevel: { env: 'ARBITER_LOG_LEVEL', def: 'info', parse: logLevel },
  queueTtlSeconds: { env: 'ARBITER_QUEUE_TTL_SECONDS', def: '3600', parse: seconds },
  queueMaxPendingPerKey: {
    env: 'ARBITER_QUEUE_MAX_PENDING_PER_KEY',
    def: '1000',
    parse: (raw: string, name: string) => nonNegativeInt(raw, name, MAX_PENDING),
  },
  tokenTtlSeconds: { env: 'ARBITER_TOKEN_TTL_SECONDS', def: '300', parse: seconds },
  tokenMaxTtlSeconds: { env: 'ARBITER_TOKEN_MAX_TTL_SECONDS', def: '3600', parse: seconds },
  tokenExchangeWindowSeconds: {
    env: 'ARBITER_TOKEN_EXCHANGE_WINDOW_SECONDS',
    def: '300',
    parse: seconds,
  },
  issuer: { env: 'ARBITER_ISSUER', def: 'arbiter', parse: str },
  metricsPublic: { env: 'ARBITER_METRICS_PUBLIC', def: 'false', parse: bool },
  maxBodyBytes: { env: 'ARBITER_MAX_BODY_BYTES', def: String(1024 * 1024), parse: positiveInt },
  maxContextBytes: { env: 'ARBITER_MAX_CONTEXT_BYTES', def: '65536', parse: positiveInt },
  evalBudgetMs: { env: 'ARBITER_EVAL_BUDGET_MS', def: '250', parse: positiveInt },
  shadowInline: { env: 'ARBITER_SHADOW_INLINE', def: 'true', parse: bool },
  shadowPaired: { env: 'ARBITER_SHADOW_PAIRED', def: 'true', parse: bool },
  evalStallSeconds: {
    env: 'ARBITER_EVAL_STALL_SECONDS',
    def: '30',
    parse: (raw: string, name: string) => nonNegativeInt(raw, name, MAX_SECONDS),
  },
  dbSync: { env: 'ARBITER_DB_SYNC', def: 'full', parse: dbSync },
  // `list`: a YAML file may give it as a list (joined with commas, as the variable is written).
  auditMaskFields: { env: 'ARBITER_AUDIT_MASK_FIELDS', def: '', parse: maskFields, list: true },
  workers: { env: 'ARBITER_WORKERS', def: '1', parse: workers },
  maxLongPolls: { env: 'ARBITER_MAX_LONG_POLLS', def: '1000', parse: positiveInt },
  // Unset: derived from ARBITER_MAX_LONG_POLLS in loadConfig.
  maxLongPollsPerKey: { env: 'ARBITER_MAX_LONG_POLLS_PER_KEY', def: '', parse: optionalPositiveInt },
  databaseUrl: { env: 'ARBITER_DATABASE_URL', def: '', parse: databaseUrl },
  databasePool: { env: 'ARBITER_DATABASE_POOL', def: '10', parse: positiveInt },
  publicUrl: { env: 'ARBITER_PUBLIC_URL', def: '', parse: publicUrl },
  webhookRetrySeconds: { env: 'ARBITER_WEBHOOK_RETRY_SECONDS', def: '5', parse: seconds },
  authzenDefaultTenant: { env: 'ARBITER_AUTHZEN_DEFAULT_TENANT', def: 'default', parse: tenantId },
  httpHeadersTimeoutSeconds: {
    env: 'ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS',
    def: '10',
    parse: (raw: string, name: string) => positiveInt(raw, name, MAX_TIMEOUT_SECONDS),
  },
  httpRequestTimeoutSeconds: {
    env: 'ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS',
    def: '30',
    parse: (raw: string, name: string) => positiveInt(raw, name, MAX_TIMEOUT_SECONDS),
  },
  maxConnections: { env: 'ARBITER_MAX_CONNECTIONS', def: '4096', parse: positiveInt },
} as const;

/** The environment variable of every setting (the example configuration file lists them all). */
export const SETTING_ENV_NAMES: readonly string[] = Object.values(settings).map((s) => s.env);

type Parser<T> = (raw: string, name: string) => T;

export class ConfigError extends Error {}

function str(raw: string, name: string): string {
  if (raw.trim() === '') throw new ConfigError(`${name} must not be empty`);
  return raw.trim();
}
function dir(raw: string, name: string): string {
  return path.resolve(str(raw, name));
}
function port(raw: string, name: string): number {
  const n = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || n > 65535) {
    throw new ConfigError(`${name} must be a port number between 0 and 65535, got "${raw}"`);
  }
  return n;
}
/**
 * The largest count or millisecond value a setting may take: the longest delay a Node timer
 * keeps (a longer one fires at once), far beyond any sensible limit.
 */
const MAX_INT = 2_147_483_647;
/**
 * The longest a seconds setting may be (ten years): its value becomes a date or a timer, and one
 * beyond what those hold would answer 500 on every request that uses it, not stop the start.
 */
const MAX_SECONDS = 10 * 365 * 24 * 3600;
/** The highest pending-approval cap: far past what a reviewer can read, well within a count. */
const MAX_PENDING = 1_000_000;
/** The longest an HTTP timeout may be: Node holds it in milliseconds in a timer (about 24 days). */
const MAX_TIMEOUT_SECONDS = Math.floor(MAX_INT / 1000);
function positiveInt(raw: string, name: string, max = MAX_INT): number {
  const n = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || n < 1 || n > max) {
    throw new ConfigError(`${name} must be a positive integer up to ${max}, got "${raw}"`);
  }
  return n;
}
/** A positive integer, or undefined when empty (a default that another setting derives). */
function optionalPositiveInt(raw: string, name: string): number | undefined {
  return raw.trim() === '' ? undefined : positiveInt(raw, name);
}
function nonNegativeInt(raw: string, name: string, max = MAX_INT): number {
  const n = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || n > max) {
    throw new ConfigError(`${name} must be 0 or a positive integer up to ${max}, got "${raw}"`);
  }
  return n;
}
function seconds(raw: string, name: string): number {
  return positiveInt(raw, name, MAX_SECONDS);
}
function workers(raw: string, name: string): number {
  if (raw.trim() === 'auto') return os.availableParallelism();
  return positiveInt(raw, name);
}
function bool(raw: string, name: string): boolean {
  const v = raw.trim().toLowerCase();
  if (v === 'true' || v === '1') return true;
  if (v === 'false' || v === '0') return false;
  throw new ConfigError(`${name} must be true or false, got "${raw}"`);
}
/** The README's example admin key: accepted, with a warning at start (src/app.ts). */
export const EXAMPLE_ADMIN_KEY = 'dev-admin-key-change-me';

function adminKey(raw: string, name: string): string | undefined {
  if (raw === '') return undefined;
  if (raw.length < 16) throw new ConfigError(`${name} must be at least 16 characters`);
  // It is sent as `Authorization: Bearer <key>`: whitespace cannot be in the token, and Node reads
  // header bytes as latin1, so a non-ASCII key would start fine and never authenticate. The key
  // itself is never echoed.
  if (!/^[\x21-\x7e]+$/.test(raw)) {
    throw new ConfigError(
      `${name} must be printable ASCII without whitespace (it is sent in an Authorization header)`,
    );
  }
  return raw;
}
function databaseUrl(raw: string, name: string): string | undefined {
  const v = raw.trim();
  if (v === '') return undefined;
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    throw new ConfigError(`${name} must be a postgres:// or postgresql:// URL`);
  }
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') {
    throw new ConfigError(`${name} must be a postgres:// or postgresql:// URL, got ${url.protocol}//…`);
  }
  return v;
}
/**
 * The public base URL is published without authentication (AuthZEN metadata, Slack links): a
 * user:password in it would be published too, and a query or fragment would break every URL
 * built on it. None of these errors echo the value, which may hold a password.
 */
function publicUrl(raw: string, name: string): string | undefined {
  const v = raw.trim();
  if (v === '') return undefined;
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    throw new ConfigError(`${name} must be an http:// or https:// URL`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ConfigError(`${name} must be an http:// or https:// URL, got ${url.protocol}//…`);
  }
  if (url.username !== '' || url.password !== '' || /^[a-z]+:\/\/[^/?#]*@/i.test(v)) {
    throw new ConfigError(
      `${name} must not contain a user name or password: it is published unauthenticated`,
    );
  }
  if (v.includes('?') || v.includes('#')) {
    throw new ConfigError(`${name} must be a base URL without a query or fragment`);
  }
  return v.replace(/\/+$/, '');
}
function tenantId(raw: string, name: string): string {
  const v = str(raw, name);
  if (v.length > 256 || !isTokenSafe(v)) {
    throw new ConfigError(
      `${name} must be a tenant id: at most 256 characters, no whitespace, control or invisible characters`,
    );
  }
  return v;
}
function logLevel(raw: string, name: string): LogLevel {
  const levels = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];
  if (!levels.includes(raw))
    throw new ConfigError(`${name} must be one of ${levels.join(', ')}, got "${raw}"`);
  return raw as LogLevel;
}
function dbSync(raw: string, name: string): 'full' | 'normal' {
  if (raw !== 'full' && raw !== 'normal')
    throw new ConfigError(`${name} must be full or normal, got "${raw}"`);
  return raw;
}
/**
 * A YAML value as the text a setting parses: a scalar as it is; a list only for a list setting,
 * of scalars (joined as the environment would give it). A mapping, or a list where one value is
 * meant, is refused rather than turned into "[object Object]" or "1,2".
 */
function fileValue(v: unknown, name: string, isList: boolean): string {
  if (Array.isArray(v)) {
    if (!isList) throw new ConfigError(`${name} must be a single value, got a list`);
    if (v.some((x) => typeof x === 'object' && x !== null)) {
      throw new ConfigError(`${name} must be a list of names, got a list holding a list or a mapping`);
    }
    return v.join(',');
  }
  if (typeof v === 'object') throw new ConfigError(`${name} must be a single value, got a mapping`);
  return String(v);
}

/**
 * A file value the YAML core schema reads as null (empty, `~`, `null`): the setting is not set
 * there. (The failsafe schema the file is read with keeps them as text.)
 */
function unsetIfNull(v: unknown): unknown {
  return typeof v === 'string' && /^(|~|null|Null|NULL)$/.test(v) ? null : v;
}

/** Variables named ARBITER_* that are read by something other than the service's settings. */
const OTHER_ARBITER_VARIABLES = new Set(['ARBITER_CONFIG', 'ARBITER_URL', 'ARBITER_KEY']);

/**
 * ARBITER_* variables in `env` that name no setting (a typo such as ARBITER_ENGIN_PORT, which
 * would otherwise be ignored without a word): the service warns of them at start. Variables of
 * the test and bench tooling (ARBITER_TEST_*, ARBITER_FUZZ_*, ARBITER_BENCH_*) are not settings
 * and not reported.
 */
export function unknownVariables(env: NodeJS.ProcessEnv = process.env): string[] {
  const known = new Set(Object.values(settings).map((s) => s.env as string));
  return Object.keys(env)
    .filter(
      (k) =>
        k.startsWith('ARBITER_') &&
        !known.has(k) &&
        !OTHER_ARBITER_VARIABLES.has(k) &&
        !/^ARBITER_(TEST|FUZZ|BENCH)_/.test(k),
    )
    .sort();
}

/**
 * Mask paths that cannot do what they say, refused so that no operator believes a field masked:
 * - the policy input's fields a decision records in the clear besides its stored input (the audit
 *   event's own fields, the review queue, tokens' scopes, webhook messages): the top-level fields
 *   of `agentInput`/`humanInput` (src/decisions/policy-input.ts), and the AuthZEN subject's, resource's
 *   and action's `id`, `type` and `name`, and the subject properties read as `confidence` and
 *   `tenant_id` (src/authzen/service.ts);
 * - `context` whole, which the queue item keeps as an object;
 * - `authzen.context…`: an AuthZEN request's context is the decision's context, stored as the
 *   masked `context` (docs/decisions.md), so `context.<field>` masks it and this would mask nothing.
 */
const UNMASKABLE =
  /^(?:kind|agent_id|action|resource|confidence|principal|tenant_id|user_id|on_behalf_of|request_digest)(?:\.|$)|^context$|^authzen(?:\.(?:subject|resource|action)(?:\.(?:id|type|name))?)?$|^authzen\.context(?:\.|$)|^authzen\.subject\.properties(?:\.(?:confidence|tenant_id))?$|^authzen\.(?:resource|action)\.properties$/;

/** ARBITER_AUDIT_MASK_FIELDS: dotted paths, none of them empty in part or UNMASKABLE. */
function maskFields(raw: string, name: string): string[] {
  const fields = raw
    .split(',')
    .map((f) => f.trim())
    .filter((f) => f !== '');
  for (const f of fields) {
    if (f.split('.').some((seg) => seg === '')) {
      throw new ConfigError(`${name}: "${f}" is not a dotted path (e.g. context.ssn)`);
    }
    if (UNMASKABLE.test(f)) {
      throw new ConfigError(
        `${name}: "${f}" cannot be masked: a decision records it in the clear beyond its stored input ` +
          "(the audit event's own fields, the review queue, tokens, webhooks). Mask fields under " +
          "context (context.<field>, which covers an AuthZEN request's context too) or an AuthZEN " +
          "request's properties (authzen.subject.properties.<field>, …)",
      );
    }
  }
  return fields;
}

type Settings = typeof settings;
type Parsed = { [K in keyof Settings]: ReturnType<Settings[K]['parse']> };

/**
 * Reads the configuration once: environment variables win over the optional YAML file named by
 * ARBITER_CONFIG, which wins over the defaults. Fails fast with a ConfigError naming the setting.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  let file: Record<string, unknown> = {};
  if (env.ARBITER_CONFIG) {
    let text: string;
    try {
      text = readFileSync(env.ARBITER_CONFIG, 'utf8');
    } catch (e) {
      throw new ConfigError(`ARBITER_CONFIG: cannot read ${env.ARBITER_CONFIG}: ${(e as Error).message}`);
    }
    let doc: unknown;
    try {
      // Every scalar as the text written in the file (the failsafe schema), as an environment
      // variable would give it: `admin_key: 1234567890123456789` or `authzen_default_tenant: 00123`
      // must not reach the setting as a rounded or shortened number. Each setting parses its text.
      // logLevel 'error': errors throw, warnings are not printed (they quote the line).
      doc = YAML.parse(text, { schema: 'failsafe', logLevel: 'error' });
    } catch (e) {
      throw new ConfigError(`ARBITER_CONFIG: ${env.ARBITER_CONFIG} is not valid YAML${whereInYaml(e)}`);
    }
    if (doc !== null && doc !== undefined && (typeof doc !== 'object' || Array.isArray(doc))) {
      throw new ConfigError(`ARBITER_CONFIG: ${env.ARBITER_CONFIG} must be a YAML mapping`);
    }
    file = (doc ?? {}) as Record<string, unknown>;
    const known = new Set(Object.values(settings).map((s) => yamlKey(s.env)));
    for (const k of Object.keys(file)) {
      if (!known.has(k)) throw new ConfigError(`ARBITER_CONFIG: unknown setting "${k}"`);
    }
  }
  const out: Partial<Record<keyof Settings, unknown>> = {};
  /** Settings left at their default (neither the environment nor the file set them). */
  const defaulted = new Set<keyof Settings>();
  for (const [key, s] of Object.entries(settings) as [keyof Settings, Settings[keyof Settings]][]) {
    const fromFile = unsetIfNull(file[yamlKey(s.env)]);
    let raw: string;
    let name: string = s.env;
    if (env[s.env] !== undefined) {
      raw = env[s.env] as string;
    } else if (fromFile !== undefined && fromFile !== null) {
      name = `${yamlKey(s.env)} (in ${env.ARBITER_CONFIG})`;
      raw = fileValue(fromFile, name, 'list' in s && s.list);
    } else {
      raw = s.def;
      defaulted.add(key);
    }
    out[key] = (s.parse as Parser<unknown>)(raw, name);
  }
  const c = out as Parsed;
  if (c.tokenTtlSeconds > c.tokenMaxTtlSeconds) {
    throw new ConfigError('ARBITER_TOKEN_TTL_SECONDS must not exceed ARBITER_TOKEN_MAX_TTL_SECONDS');
  }
  // An evaluation within its budget must never be taken for a stuck one: the stall limit is at
  // least the budget plus 1 s (the evaluation threads' margin). A default below that follows a
  // long budget; a setting below it is refused.
  const stallFloor = Math.ceil((c.evalBudgetMs + 1000) / 1000);
  if (c.evalStallSeconds > 0 && c.evalStallSeconds < stallFloor && !defaulted.has('evalStallSeconds')) {
    throw new ConfigError(
      `ARBITER_EVAL_STALL_SECONDS must be 0 (off) or at least ARBITER_EVAL_BUDGET_MS plus 1 s (${stallFloor})`,
    );
  }
  if (c.httpHeadersTimeoutSeconds > c.httpRequestTimeoutSeconds) {
    throw new ConfigError(
      'ARBITER_HTTP_HEADERS_TIMEOUT_SECONDS must not exceed ARBITER_HTTP_REQUEST_TIMEOUT_SECONDS',
    );
  }
  const evalStallSeconds = c.evalStallSeconds > 0 ? Math.max(c.evalStallSeconds, stallFloor) : 0;
  return Object.freeze({
    ...c,
    evalStallSeconds,
    // One key may hold a tenth of the long-polls by default: no single client starves the rest.
    maxLongPollsPerKey: c.maxLongPollsPerKey ?? Math.max(1, Math.floor(c.maxLongPolls / 10)),
    auditMaskFields: Object.freeze([...c.auditMaskFields]),
  }) as Config;
}

/**
 * Where a YAML error is: its code, line and column. Never its message, which quotes the line
 * (or part of it), and the file holds `admin_key` and `database_url`.
 */
function whereInYaml(e: unknown): string {
  if (!(e instanceof YAML.YAMLError)) return '';
  const at = e.linePos?.[0];
  return ` (${e.code}${at ? ` at line ${at.line}, column ${at.col}` : ''}); the line is not shown, as it may hold a secret`;
}

function yamlKey(envName: string): string {
  return envName.replace(/^ARBITER_/, '').toLowerCase();
}
