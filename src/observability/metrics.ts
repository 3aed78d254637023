import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { INLINE_MAX_MS } from '../policy/shadow-limits.js';

/**
 * One registry per process. Label values are bounded: route templates (never raw paths or ids),
 * methods, status codes, decision kinds and outcomes.
 */
export function createMetrics() {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  // prom-client names these gauges *_total, which Prometheus reserves for counters (promtool
  // rejects them); the same information is in nodejs_active_* without the suffix below.
  for (const name of ['handles', 'requests', 'resources']) {
    registry.removeSingleMetric(`nodejs_active_${name}_total`);
  }
  const latencyBuckets = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
  ];
  const m = {
    registry,
    httpRequests: new Counter({
      name: 'arbiter_http_requests_total',
      help: 'HTTP requests answered, by API, route template, method and status code.',
      labelNames: ['api', 'route', 'method', 'status'] as const,
      registers: [registry],
    }),
    httpDuration: new Histogram({
      name: 'arbiter_http_request_duration_seconds',
      help: 'HTTP request latency, by API, route template, method and status code.',
      labelNames: ['api', 'route', 'method', 'status'] as const,
      buckets: latencyBuckets,
      registers: [registry],
    }),
    decisions: new Counter({
      name: 'arbiter_decisions_total',
      help: 'Authorization decisions, by subject kind (agent, human) and outcome.',
      labelNames: ['kind', 'outcome'] as const,
      registers: [registry],
    }),
    shadowDecisions: new Counter({
      name: 'arbiter_shadow_decisions_total',
      help: 'Decisions also evaluated against the shadow set, by result (agree, disagree, error).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    shadowInline: new Gauge({
      name: 'arbiter_shadow_inline',
      help: 'Processes evaluating the shadow set beside the live set, on the serving thread (it proved itself on its own thread first); 0 while it is evaluated on its own thread, or there is none.',
      aggregator: 'sum',
      registers: [registry],
    }),
    shadowPaired: new Gauge({
      name: 'arbiter_shadow_paired',
      help: 'Processes evaluating their proven shadow set in one pass with the live set, sharing the rules it does not change (ADR 0012); 0 while the shadow set is evaluated on its own, or there is none.',
      aggregator: 'sum',
      registers: [registry],
    }),
    shadowPairDiffered: new Counter({
      name: 'arbiter_shadow_pair_differed_total',
      help: 'Times a paired answer differed from the live and shadow sets evaluated on their own while it was being checked; each time the pair was dropped for that shadow set.',
      registers: [registry],
    }),
    shadowSentBack: new Counter({
      name: 'arbiter_shadow_sent_back_total',
      help: `Times a proven shadow set was sent back to its own thread because an evaluation beside the live set took longer than ${INLINE_MAX_MS} ms and its own thread confirmed it (slow there too, no answer in time, or a second slow evaluation before it answered).`,
      registers: [registry],
    }),
    shadowSlowKept: new Counter({
      name: 'arbiter_shadow_slow_kept_total',
      help: `Times an evaluation of the shadow set beside the live set took longer than ${INLINE_MAX_MS} ms, but its own thread evaluated the same input within ${INLINE_MAX_MS} ms (a pause of the machine, not the set): the set stayed beside the live set.`,
      registers: [registry],
    }),
    evaluation: new Histogram({
      name: 'arbiter_policy_evaluation_duration_seconds',
      help: 'In-process policy evaluation latency.',
      buckets: [0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025, 0.1],
      registers: [registry],
    }),
    compiles: new Counter({
      name: 'arbiter_policy_compiles_total',
      help: 'Policy set compilations, by result (success, failure).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    compileDuration: new Histogram({
      name: 'arbiter_policy_compile_duration_seconds',
      help: 'Policy set compilation latency (opa check + build).',
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    }),
    revision: new Gauge({
      name: 'arbiter_policy_revision',
      help: 'Revision of the policy set and data being evaluated (the lowest across workers).',
      aggregator: 'min',
      registers: [registry],
    }),
    queueTransitions: new Counter({
      name: 'arbiter_queue_transitions_total',
      help: 'Human-review queue transitions out of pending, by new status.',
      labelNames: ['status'] as const,
      registers: [registry],
    }),
    queueCapped: new Counter({
      name: 'arbiter_queue_capped_total',
      help: 'requires_approval answers recorded as denies because the key had its most pending approvals (ARBITER_QUEUE_MAX_PENDING_PER_KEY), by subject kind.',
      labelNames: ['kind'] as const,
      registers: [registry],
    }),
    tokensMinted: new Counter({
      name: 'arbiter_tokens_minted_total',
      help: 'Scoped tokens minted.',
      registers: [registry],
    }),
    tokensRevoked: new Counter({
      name: 'arbiter_tokens_revoked_total',
      help: 'Scoped tokens revoked.',
      registers: [registry],
    }),
    webhookDeliveries: new Counter({
      name: 'arbiter_webhook_deliveries_total',
      help: 'Webhook delivery attempts, by result (delivered, retry, failed: given up after 24 h).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    decisionBatchSize: new Histogram({
      name: 'arbiter_decision_batch_size',
      help: 'Decisions committed together in one transaction (group commit).',
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
      registers: [registry],
    }),
    decisionCommit: new Histogram({
      name: 'arbiter_decision_commit_seconds',
      help: 'Time to commit one batch of decisions, as the serving thread waits for it.',
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers: [registry],
    }),
    auditEvents: new Counter({
      name: 'arbiter_audit_events_total',
      help: 'Audit events written by this process, by kind.',
      labelNames: ['kind'] as const,
      registers: [registry],
    }),
  };
  // Every series that a fresh process can already name starts at 0, so rates work from the start.
  for (const kind of ['agent', 'human']) {
    for (const outcome of ['allow', 'requires_approval', 'deny']) m.decisions.inc({ kind, outcome }, 0);
  }
  for (const result of ['success', 'failure']) m.compiles.inc({ result }, 0);
  for (const status of ['approved', 'denied', 'expired']) m.queueTransitions.inc({ status }, 0);
  for (const kind of ['agent', 'human']) m.queueCapped.inc({ kind }, 0);
  for (const result of ['delivered', 'retry', 'failed']) m.webhookDeliveries.inc({ result }, 0);
  return m;
}

/**
 * Registers a gauge whose value is read when /metrics is scraped (e.g. queue depth). A read that
 * fails (storage unreachable) makes the value NaN, "unknown", for that scrape: it must not fail
 * the scrape, which would hide every other metric (the 503s counted meanwhile among them) just
 * when storage is down, nor repeat a stale value, nor say 0.
 */
export function gaugeFrom(metrics: Metrics, name: string, help: string, read: () => Promise<number>): void {
  new Gauge({
    name,
    help,
    // Every worker reads the same shared value: report it once, not summed.
    aggregator: 'first',
    registers: [metrics.registry],
    async collect() {
      let value: number;
      try {
        value = await read();
      } catch {
        value = Number.NaN;
      }
      this.set(value);
    },
  });
}

/**
 * `arbiter_thread_cpu_seconds{thread}`: CPU used so far by the serving thread and the decision
 * writer thread (Linux). A thread that cannot tell is left out. Summed over workers.
 */
export function threadCpuGauge(
  metrics: Metrics,
  read: () => Promise<Record<'serving' | 'writer', number | undefined>>,
): void {
  new Gauge({
    name: 'arbiter_thread_cpu_seconds',
    help: "CPU seconds used so far by this process's serving thread and its decision writer thread.",
    labelNames: ['thread'] as const,
    aggregator: 'sum',
    registers: [metrics.registry],
    async collect() {
      const values = await read();
      for (const [thread, v] of Object.entries(values)) if (v !== undefined) this.set({ thread }, v);
    },
  });
}

export type Metrics = ReturnType<typeof createMetrics>;
