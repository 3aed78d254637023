import { makeMasker } from './audit/mask.js';
import { AuditService } from './audit/service.js';
import { AuthzenService } from './authzen/service.js';
import type { Config } from './config.js';
import { BudgetService } from './decisions/budgets.js';
import { DecisionService, type DecisionObserver } from './decisions/service.js';
import { KeyService } from './keys/service.js';
import type { Logger } from './observability/logger.js';
import type { Metrics } from './observability/metrics.js';
import type { RegoCompiler } from './policy/compiler.js';
import { Explainer } from './policy/explain.js';
import { PolicyHistory } from './policy/history.js';
import { LifecycleService, recentRecordedInputs } from './policy/lifecycle.js';
import { PolicyService } from './policy/service.js';
import { QueueService } from './queue/service.js';
import type { Stores } from './storage/stores.js';
import { TokenService } from './tokens/service.js';
import { SigningKeyService } from './tokens/signing-keys.js';
import { WebhookService } from './webhooks/service.js';

/** What each decision adds to the metrics (none without them). */
export function decisionMetrics(m: Metrics | undefined): DecisionObserver {
  return {
    decided: (kind, outcome, seconds) => {
      m?.decisions.inc({ kind, outcome });
      m?.evaluation.observe(seconds);
    },
    shadowed: (result) => m?.shadowDecisions.inc({ result }),
    capped: (kind) => m?.queueCapped.inc({ kind }),
  };
}

export interface ServiceOptions {
  /** Observations go to these metrics; without them (the primary's preparation) nowhere. */
  metrics?: Metrics;
  /** Called after this process changed the policy set (the cluster relay). */
  policyChanged?: (revision: number) => Promise<void>;
  /** Called after this process rotated the signing key (the cluster relay). */
  signingKeysRotated?: () => Promise<void>;
  /** The base URL that links in notifications point at. */
  publicUrl: () => string;
  log: Logger;
}

export type Services = ReturnType<typeof buildServices>;

/**
 * Every service of the domain, built once from the stores: no HTTP, no listening, no timers. The
 * primary that prepares storage and a serving process build the same services; only what they
 * observe into (metrics) and start differs.
 */
export function buildServices(config: Config, stores: Stores, compiler: RegoCompiler, o: ServiceOptions) {
  const m = o.metrics;
  const masker = makeMasker(config.auditMaskFields);
  const keys = new KeyService(stores.keys, config.adminKey);
  const policies = new PolicyService(
    stores.policies,
    compiler,
    config.evalBudgetMs,
    {
      compiled: (ok, seconds) => {
        m?.compiles.inc({ result: ok ? 'success' : 'failure' });
        m?.compileDuration.observe(seconds);
      },
      revision: (r) => m?.revision.set(r),
      shadowInline: (inline) => m?.shadowInline.set(inline ? 1 : 0),
      shadowSentBack: () => m?.shadowSentBack.inc(),
      shadowSlowKept: () => m?.shadowSlowKept.inc(),
      shadowPaired: (paired) => m?.shadowPaired.set(paired ? 1 : 0),
      shadowPairDiffered: (detail) => {
        m?.shadowPairDiffered.inc();
        o.log.error(
          { detail },
          'a paired shadow answer differed from the two sets evaluated on their own; the pair is no longer used for this shadow set',
        );
      },
      shadowUnpaired: (why) =>
        o.log.info({ why }, 'the shadow set is evaluated on its own, not paired with the live set'),
      changed: (revision) => o.policyChanged?.(revision) ?? Promise.resolve(),
    },
    { inline: config.shadowInline, paired: config.shadowPaired },
    // A set about to go live is first run on the latest recorded decision inputs (off the
    // serving thread): one that would not finish on them is refused.
    (n) => recentRecordedInputs(stores.audit, n),
  );
  const history = new PolicyHistory(stores.policies);
  const decisions = new DecisionService(
    policies,
    stores.decisions,
    config.queueTtlSeconds,
    masker,
    decisionMetrics(m),
    config.maxContextBytes,
    config.queueMaxPendingPerKey,
  );
  const audit = new AuditService(stores.audit, masker, config.maxContextBytes);
  const queue = new QueueService(
    stores.queue,
    { transitioned: (to) => m?.queueTransitions.inc({ status: to }) },
    {
      maxLongPolls: config.maxLongPolls,
      maxLongPollsPerKey: config.maxLongPollsPerKey,
      trail: (id, only, q) => audit.requestTrail(id, only, q),
      notified: stores.changes.crossProcess,
      keyLive: (p) => keys.isLive(p),
    },
  );
  const signingKeys = new SigningKeyService(stores.tokens, {
    rotated: () => o.signingKeysRotated?.() ?? Promise.resolve(),
    tokensRevoked: (n) => m?.tokensRevoked.inc(n),
  });
  const tokens = new TokenService(
    stores.tokens,
    stores.decisions,
    queue,
    {
      issuer: config.issuer,
      defaultTtlSeconds: config.tokenTtlSeconds,
      maxTtlSeconds: config.tokenMaxTtlSeconds,
      exchangeWindowSeconds: config.tokenExchangeWindowSeconds,
    },
    { minted: () => m?.tokensMinted.inc(), revoked: () => m?.tokensRevoked.inc() },
    signingKeys,
  );
  const webhooks = new WebhookService(
    stores.webhooks,
    { publicUrl: o.publicUrl, retryBaseMs: config.webhookRetrySeconds * 1000 },
    { attempted: (result) => m?.webhookDeliveries.inc({ result }) },
    o.log,
  );
  return {
    keys,
    policies,
    history,
    decisions,
    authzen: new AuthzenService(decisions, config.authzenDefaultTenant, config.maxBodyBytes),
    audit,
    queue,
    tokens,
    signingKeys,
    webhooks,
    lifecycle: new LifecycleService(
      policies,
      history,
      stores.audit,
      stores.decisions,
      new Explainer(config.opaBin, o.log),
    ),
    budgets: new BudgetService(stores.limits),
  };
}
