import Router from '@koa/router';
import Koa from 'koa';
import type { KeyService } from '../keys/service.js';
import type { Logger } from '../observability/logger.js';
import type { Metrics } from '../observability/metrics.js';
import type { Api, Ctx, RouteDef, State } from './context.js';
import {
  authMiddleware,
  bodyMiddleware,
  errorMiddleware,
  fallthrough,
  metricsMiddleware,
  requestContext,
} from './middleware.js';

export interface AppDeps {
  keys: KeyService;
  log: Logger;
  metrics: Metrics;
  maxBodyBytes: number;
}

/** Builds the Koa app of one API from the shared route table. */
export function buildApp(api: Api, routes: RouteDef[], deps: AppDeps): Koa<State> {
  const app = new Koa<State>();
  app.silent = true;
  app.proxy = false;
  const router = new Router<State>();
  const mine = routes.filter((r) => r.apis.includes(api));
  for (const r of mine) {
    router.register(
      r.path,
      [r.method],
      [
        authMiddleware(deps.keys, r),
        bodyMiddleware(r.body, deps.maxBodyBytes),
        (ctx) => r.handler(ctx as Ctx),
      ],
    );
  }
  const allowedFor = (path: string): string[] => {
    const methods = new Set<string>();
    for (const layer of router.match(path, 'GET').path) for (const m of layer.methods) methods.add(m);
    return [...methods];
  };
  app.use(requestContext);
  app.use(metricsMiddleware(api, deps.metrics, deps.log));
  app.use(errorMiddleware(deps.log, deps.maxBodyBytes));
  app.use(router.routes());
  app.use(fallthrough((path) => allowedFor(path)));
  return app;
}
