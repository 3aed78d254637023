# syntax=docker/dockerfile:1
#
# Arbiter in a container. Build: docker build -t arbiter .   Run: README.md, "Self-hosting".
#
# Stage "build" installs the dependencies (npm ci, whose postinstall builds the pinned OPA CLI from
# tools/opa with Go, and compiles better-sqlite3 from source), compiles the TypeScript and prunes
# the dev dependencies. The final stage is node:20-bookworm-slim plus what the service reads at
# run time, owned by root and run as an unprivileged user.

ARG NODE_VERSION=20
# tools/opa/go.mod needs Go >= 1.26.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS go

FROM node:${NODE_VERSION}-bookworm-slim AS build
# A C++ toolchain and Python for node-gyp (better-sqlite3); CA certificates for the Go module proxy.
# Unpinned on purpose: whatever bookworm ships; only this build stage uses them.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=go /usr/local/go /usr/local/go
# npm_config_nodedir: the headers the image already has (/usr/local/include/node), not a download.
# npm_config_build_from_source: no prebuilt better-sqlite3 binary is downloaded, as in CI.
ENV PATH=/usr/local/go/bin:$PATH \
    CGO_ENABLED=0 \
    npm_config_nodedir=/usr/local \
    npm_config_build_from_source=better-sqlite3
WORKDIR /app
# Only what `npm ci` and its postinstall read, so this layer (and the OPA build) is reused until
# the dependencies or the pinned OPA change.
COPY package.json package-lock.json ./
COPY scripts/ ./scripts/
COPY tools/opa/ ./tools/opa/
RUN --mount=type=cache,target=/root/.npm \
    --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    npm ci
COPY tsconfig.json ./
COPY src/ ./src/
COPY console/ ./console/
COPY policies/ ./policies/
# The postinstall does not run again on prune (--ignore-scripts makes sure); .opa-bin/ is not under
# node_modules, so the built OPA is kept. COPY keeps the modes files had in the checkout (0600
# under umask 077), and the final stage runs as another user: make what it takes world-readable.
RUN npm run build \
    && npm prune --omit=dev --ignore-scripts \
    && chmod -R a+rX package.json node_modules .opa-bin dist/src dist/console src/policy/rego policies

FROM node:${NODE_VERSION}-bookworm-slim AS runtime
# tini runs as PID 1 in front of node (ENTRYPOINT below).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
# A fixed UID/GID, so a bind-mounted data directory can be prepared with chown 10001:10001.
RUN groupadd --system --gid 10001 arbiter \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/arbiter --no-create-home \
       --shell /usr/sbin/nologin arbiter \
    && mkdir -p /var/lib/arbiter \
    && chown 10001:10001 /var/lib/arbiter \
    && chmod 0700 /var/lib/arbiter
# The service resolves package.json, the built-in Rego module and .opa-bin/opa relative to the
# directory above dist/ (src/config.ts repoRoot), and ./policies relative to the working directory.
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules/ ./node_modules/
COPY --from=build /app/.opa-bin/opa ./.opa-bin/opa
COPY --from=build /app/dist/src/ ./dist/src/
COPY --from=build /app/dist/console/ ./dist/console/
COPY --from=build /app/src/policy/rego/authz.rego ./src/policy/rego/authz.rego
COPY --from=build /app/policies/ ./policies/
ENV NODE_ENV=production \
    ARBITER_HOST=0.0.0.0 \
    ARBITER_DATA_DIR=/var/lib/arbiter
USER 10001:10001
VOLUME ["/var/lib/arbiter"]
EXPOSE 8080 8081
# Slim images have no curl: node asks the Engine API's /healthz (it reads ARBITER_ENGINE_PORT).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.ARBITER_ENGINE_PORT || 8080) + '/healthz', { signal: AbortSignal.timeout(4000) }).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# tini is PID 1: it passes `docker stop`'s SIGTERM to node, which handles SIGTERM and SIGINT itself
# (finish in-flight requests for up to 30 s, close the database; give it `--stop-timeout 35`), and
# exits with node's status. Node is not PID 1, so the stall watchdog (ARBITER_EVAL_STALL_SECONDS,
# docs/adr/0011) can end a process stuck in one evaluation: the kernel ignores the SIGKILL a PID 1
# sends itself. tini also reaps any orphan; node waits for its own children (the OPA compiler,
# --workers).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "node", "dist/src/main.js"]
CMD ["serve"]
