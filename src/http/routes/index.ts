import type { AuditService } from '../../audit/service.js';
import type { AuthzenService } from '../../authzen/service.js';
import type { Config } from '../../config.js';
import type { DecisionService } from '../../decisions/service.js';
import type { LifecycleService } from '../../policy/lifecycle.js';
import type { Metrics } from '../../observability/metrics.js';
import type { PolicyService } from '../../policy/service.js';
import type { PolicyHistory } from '../../policy/history.js';
import type { QueueService } from '../../queue/service.js';
import type { TokenService } from '../../tokens/service.js';
import type { SigningKeyService } from '../../tokens/signing-keys.js';
import type { ConsoleAssets } from '../console.js';
import type { RouteDef } from '../context.js';
import { auditRoutes } from './audit.js';
import { authzenRoutes } from './authzen.js';
import { decisionRoutes } from './decisions.js';
import { lifecycleRoutes, replayRoutes } from './lifecycle.js';
import { limitRoutes } from './limits.js';
import { policyRoutes } from './policies.js';
import { queueRoutes } from './queue.js';
import { systemRoutes } from './system.js';
import { signingKeyRoutes } from './signing-keys.js';
import { tokenRoutes } from './tokens.js';
import { webhookRoutes } from './webhooks.js';
import type { WebhookService } from '../../webhooks/service.js';
import type { BudgetService } from '../../decisions/budgets.js';

export interface RouteDeps {
  config: Config;
  version: string;
  /** Prometheus text: this process's registry, or the sum over all workers. */
  metricsText: () => Promise<string>;
  audit: AuditService;
  decisions: DecisionService;
  authzen: AuthzenService;
  queue: QueueService;
  tokens: TokenService;
  signingKeys: SigningKeyService;
  policies: PolicyService;
  history: PolicyHistory;
  metrics: Metrics;
  health: () => Promise<{ ok: boolean; revision: number | null; error?: string }>;
  /** The reviewer console's built files (served on the Engine API). */
  console: ConsoleAssets;
  webhooks: WebhookService;
  /** Impact replay and explanation (SPEC §11). */
  lifecycle: LifecycleService;
  budgets: BudgetService;
}

/**
 * Every route of both APIs, one file per domain: the scope each needs, its body, its query
 * parameters, its answers and its handler. Handlers only translate HTTP ↔ service calls; the
 * rules live in the services. Within a file, order matters where two paths overlap (the router
 * tries routes in this order).
 */
export function routeTable(d: RouteDeps): RouteDef[] {
  const routes: RouteDef[] = [
    ...systemRoutes(d, () => routes),
    ...decisionRoutes(d),
    ...queueRoutes(d),
    ...tokenRoutes(d),
    ...signingKeyRoutes(d.signingKeys),
    ...auditRoutes(d),
    ...policyRoutes(d),
    ...lifecycleRoutes(d),
    ...webhookRoutes(d.webhooks),
    ...replayRoutes(d.lifecycle, d.policies),
    ...authzenRoutes(d),
    ...limitRoutes(d.budgets),
  ];
  return routes;
}
