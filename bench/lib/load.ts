// The load: one request mix, sent identically to every target by autocannon, with every
// response's status (and, for OPA, its decision) checked against what the mix expects.
import autocannon from 'autocannon';

export type Kind = 'allow' | 'deny' | 'deny_low_confidence' | 'approval';
export type Status = 'allow' | 'deny' | 'requires_approval';

export interface AgentRequest {
  agent_id: string;
  action: string;
  resource: string;
  confidence: number;
}

/** The request kinds and what the example policies answer (see policies/agent.rego). */
export const KINDS: Record<Kind, { body: AgentRequest; status: Status; http: number }> = {
  allow: {
    body: { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.95 },
    status: 'allow',
    http: 200,
  },
  deny: {
    body: { agent_id: 'deploy-bot', action: 'delete', resource: 'prod/db', confidence: 0.99 },
    status: 'deny',
    http: 403,
  },
  deny_low_confidence: {
    body: { agent_id: 'deploy-bot', action: 'read', resource: 'repo/arbiter', confidence: 0.3 },
    status: 'deny',
    http: 403,
  },
  approval: {
    body: { agent_id: 'deploy-bot', action: 'deploy', resource: 'prod/api', confidence: 0.95 },
    status: 'requires_approval',
    http: 202,
  },
};

/**
 * One cycle of 20 requests: 14 allow (70%), 2 + 2 deny (20%), 2 approval (10%), spread out so
 * that every stretch of the sequence is close to the overall mix. Every connection walks it in
 * this order, for every target.
 */
export const MIX: Kind[] = [
  'allow', 'allow', 'deny', 'allow', 'allow', 'approval', 'allow', 'allow', 'deny_low_confidence', 'allow',
  'allow', 'allow', 'deny', 'allow', 'allow', 'approval', 'allow', 'allow', 'deny_low_confidence', 'allow',
]; // prettier-ignore

/** What the policies see for a request: the same document Arbiter builds (kind, principal...). */
export function policyInput(kind: Kind, principalName = 'bench'): Record<string, unknown> {
  return {
    kind: 'agent',
    ...KINDS[kind].body,
    context: {},
    principal: { name: principalName, tenant: null, agent: null },
  };
}

/** How one target is addressed and how its answers are checked. */
export interface TargetSpec {
  name: string;
  url: string;
  path: string;
  headers: Record<string, string>;
  body(kind: Kind): string;
  /** Statuses that are part of the protocol (anything else is an error in itself). */
  expectedStatuses: ReadonlySet<number>;
  /** True when the response is the right answer for this kind of request. */
  correct(kind: Kind, status: number, body: string): boolean;
}

export function arbiterSpec(url: string, key: string): TargetSpec {
  return {
    name: 'arbiter',
    url,
    path: '/v1/agent/authorize',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: (k) => JSON.stringify(KINDS[k].body),
    expectedStatuses: new Set([200, 202, 403]),
    correct: (k, status) => status === KINDS[k].http,
  };
}

export function opaSpec(url: string): TargetSpec {
  const needle = Object.fromEntries(
    Object.entries(KINDS).map(([k, v]) => [k, `"status":"${v.status}"`]),
  ) as Record<Kind, string>;
  return {
    name: 'opa',
    url,
    path: '/v1/data/authz/decision',
    headers: { 'content-type': 'application/json' },
    body: (k) => JSON.stringify({ input: policyInput(k) }),
    expectedStatuses: new Set([200]),
    correct: (k, status, body) => status === 200 && body.includes(needle[k]),
  };
}

export function nodeHttpSpec(url: string): TargetSpec {
  return {
    name: 'node_http',
    url,
    path: '/',
    headers: { 'content-type': 'application/json' },
    body: (k) => JSON.stringify(KINDS[k].body),
    expectedStatuses: new Set([200]),
    correct: (_k, status) => status === 200,
  };
}

export interface Latency {
  p50: number;
  p90: number;
  p99: number;
  p99_9: number;
  max: number;
  mean: number;
}

export interface LoadResult {
  target: string;
  round: number | null;
  connections: number;
  durationS: number;
  requests: number;
  rps: number;
  /** Milliseconds, from every response (200, 202 and 403 alike); null when not recorded. */
  latencyMs: Latency | null;
  errors: {
    total: number;
    /** Connection errors and timeouts, as autocannon counts them. */
    connection: number;
    timeouts: number;
    /** Statuses outside the target's protocol (for Arbiter: not 200/202/403). */
    unexpectedStatus: number;
    /** An expected status, but not the right answer for the request sent. */
    wrongAnswer: number;
  };
  /** Connection error codes (ECONNRESET, timeouts…) as reported by autocannon. */
  errorCodes: Record<string, number>;
  statusCodes: Record<string, number>;
  byKind: Record<Kind, { sent: number; wrong: number }>;
}

export interface LoadOptions {
  connections: number;
  /** Seconds; ignored when `amount` is set. */
  duration?: number;
  /** Stop after exactly this many responses. */
  amount?: number;
  /** Fixed rate: requests per second over all connections (autocannon's overallRate). */
  rate?: number;
  recordLatency?: boolean;
  round?: number | null;
  onProgress?: (responses: number) => void;
}

/** Drives `spec` with autocannon and checks every answer. */
export async function runLoad(spec: TargetSpec, o: LoadOptions): Promise<LoadResult> {
  const byKind = Object.fromEntries(Object.keys(KINDS).map((k) => [k, { sent: 0, wrong: 0 }])) as Record<
    Kind,
    { sent: number; wrong: number }
  >;
  const statusCodes: Record<string, number> = {};
  let unexpected = 0;
  let wrong = 0;
  const requests: autocannon.Request[] = MIX.map((kind) => ({
    method: 'POST',
    path: spec.path,
    headers: spec.headers,
    body: spec.body(kind),
    onResponse: (status: number, body: string) => {
      const c = byKind[kind];
      c.sent++;
      statusCodes[status] = (statusCodes[status] ?? 0) + 1;
      if (!spec.expectedStatuses.has(status)) unexpected++;
      else if (!spec.correct(kind, status, body)) {
        wrong++;
        c.wrong++;
      }
    },
  }));
  let lat = new Float64Array(o.recordLatency === false ? 0 : 1 << 18);
  let n = 0;
  let responses = 0;
  const started = process.hrtime.bigint();
  let instance!: autocannon.Instance;
  const done = new Promise<autocannon.Result>((resolve, reject) => {
    instance = autocannon(
      {
        url: spec.url,
        connections: o.connections,
        ...(o.amount !== undefined ? { amount: o.amount } : { duration: o.duration ?? 10 }),
        ...(o.rate !== undefined ? { overallRate: o.rate } : {}),
        requests,
        timeout: 10,
      },
      (err: unknown, result) =>
        err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(result),
    );
  });
  const errorCodes: Record<string, number> = {};
  instance.on('reqError', (e: unknown) => {
    const err = e as { code?: string; message?: string };
    const k = err.code ?? err.message ?? 'error';
    errorCodes[k] = (errorCodes[k] ?? 0) + 1;
  });
  instance.on('response', (_client, _status, _bytes, ms: number) => {
    responses++;
    if (o.recordLatency === false) return;
    if (n === lat.length) {
      const bigger = new Float64Array(lat.length * 2);
      bigger.set(lat);
      lat = bigger;
    }
    lat[n++] = ms;
  });
  const progress = o.onProgress ? setInterval(() => o.onProgress?.(responses), 5_000).unref() : undefined;
  const result = await done;
  if (progress) clearInterval(progress);
  const elapsedS = Number(process.hrtime.bigint() - started) / 1e9;
  const durationS = result.duration > 0 ? result.duration : elapsedS;
  return {
    target: spec.name,
    round: o.round ?? null,
    connections: o.connections,
    durationS: round(durationS, 3),
    requests: responses,
    rps: round(responses / durationS, 1),
    latencyMs: n > 0 ? latencyOf(lat.subarray(0, n)) : null,
    errors: {
      total: result.errors + unexpected + wrong,
      connection: result.errors,
      timeouts: result.timeouts,
      unexpectedStatus: unexpected,
      wrongAnswer: wrong,
    },
    errorCodes,
    statusCodes,
    byKind,
  };
}

export function latencyOf(values: Float64Array): Latency {
  const s = Float64Array.from(values).sort();
  const at = (q: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] as number;
  let sum = 0;
  for (const v of s) sum += v;
  return {
    p50: round(at(0.5), 3),
    p90: round(at(0.9), 3),
    p99: round(at(0.99), 3),
    p99_9: round(at(0.999), 3),
    max: round(s[s.length - 1] ?? 0, 3),
    mean: round(sum / s.length, 3),
  };
}

export function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
