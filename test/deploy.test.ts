import { expect } from 'chai';
import { DockerfileParser, Env, From, JSONInstruction, ModifiableInstruction } from 'dockerfile-ast';
import { validate } from 'dockerfile-utils';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config.js';
import { onceOnly } from './helpers/backends.js';
import { REPO } from './helpers/harness.js';
import { ServeProcess, sleep } from './helpers/process.js';

// The self-hosting artifacts: Dockerfile, .dockerignore, deploy/arbiter.service and
// deploy/arbiter.env.example. No Docker engine and no running systemd are needed: the Dockerfile is
// linted (dockerfile-utils, the validator of the VS Code Docker language service) and its file
// system steps are replayed on this machine, and the unit is checked with systemd-analyze.

// ---------------------------------------------------------------------------------------------
// The Dockerfile, read with dockerfile-ast.

interface Step {
  keyword: string;
  /** The arguments, flags excluded, line continuations joined. */
  content: string;
  args: string[];
  flags: Record<string, string>;
  /** ENV name/value pairs. */
  env: [string, string][];
  /** The JSON array of an exec-form instruction (ENTRYPOINT, CMD, VOLUME, HEALTHCHECK CMD). */
  json: string[] | undefined;
}

interface Stage {
  name: string | undefined;
  image: string;
  steps: Step[];
}

function readDockerfile(text: string): { args: Record<string, string>; stages: Stage[] } {
  const df = DockerfileParser.parse(text);
  const args: Record<string, string> = {};
  for (const a of df.getInitialARGs()) {
    for (const p of a.getProperties()) args[p.getName()] = p.getValue() ?? '';
  }
  const stages: Stage[] = [];
  for (const i of df.getInstructions()) {
    if (i instanceof From) {
      stages.push({ name: i.getBuildStage() ?? undefined, image: i.getImage() ?? '', steps: [] });
      continue;
    }
    const stage = stages.at(-1);
    if (!stage) continue; // the ARGs before the first FROM
    const content = i.getArgumentsContent() ?? '';
    let json: string[] | undefined;
    if (i instanceof JSONInstruction) json = i.getJSONStrings().map((s) => s.getJSONValue());
    else if (i.getKeyword() === 'HEALTHCHECK' && /^CMD\s+\[/.test(content)) {
      json = JSON.parse(content.replace(/^CMD\s+/, '')) as string[];
    }
    stage.steps.push({
      keyword: i.getKeyword(),
      content,
      args: i.getArguments().map((a) => a.getValue()),
      flags: Object.fromEntries(
        i instanceof ModifiableInstruction ? i.getFlags().map((f) => [f.getName(), f.getValue() ?? '']) : [],
      ),
      env: i instanceof Env ? i.getProperties().map((p) => [p.getName(), p.getValue() ?? '']) : [],
      json,
    });
  }
  return { args, stages };
}

/** `$NAME` and `${NAME}` from `vars` (unknown names become empty, as in Docker). */
function expand(value: string, vars: Record<string, string | undefined>): string {
  return value.replace(
    /\$\{(\w+)\}|\$(\w+)/g,
    (_m, a?: string, b?: string) => vars[(a ?? b) as string] ?? '',
  );
}

/** The .dockerignore patterns as matchers of context-relative paths (no `!` exceptions used). */
function dockerignore(): (rel: string) => boolean {
  const patterns = readFileSync(path.join(REPO, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  expect(
    patterns.filter((p) => p.startsWith('!')),
    'exceptions are not supported here',
  ).to.deep.equal([]);
  const res = patterns.map((p) => {
    const src = p
      .replace(/^\/+|\/+$/g, '')
      .split(/(\*\*\/|\*|\?)/)
      .map((t) =>
        t === '**/'
          ? '(?:.*/)?'
          : t === '*'
            ? '[^/]*'
            : t === '?'
              ? '[^/]'
              : t.replace(/[.+^${}()|[\]\\]/g, '\\$&'),
      )
      .join('');
    return new RegExp(`^${src}$`);
  });
  // A path is ignored when it or one of its parent directories matches.
  return (rel) => {
    const parts = rel.split('/');
    return parts.some((_, k) => res.some((re) => re.test(parts.slice(0, k + 1).join('/'))));
  };
}

/** mkdir -p whose new directories are 0755 whatever the umask, as Docker's WORKDIR and COPY make them. */
function mkdirs(dir: string): void {
  const first = mkdirSync(dir, { recursive: true });
  if (first === undefined) return;
  for (let d = dir; ; d = path.dirname(d)) {
    chmodSync(d, 0o755);
    if (d === first) break;
  }
}

/** Takes group and other permissions away, as a checkout made under umask 077 has them. */
function ownerOnly(p: string): void {
  const s = statSync(p);
  chmodSync(p, s.mode & 0o700);
  if (s.isDirectory()) for (const e of readdirSync(p)) ownerOnly(path.join(p, e));
}

/**
 * Docker's COPY of `sources` to `dest`: a directory's contents, or a file (into a directory if
 * `dest` ends in /). Modes are kept, as Docker keeps them; `context` copies from the build context
 * honour .dockerignore and are made owner-only, the worst case a checkout can hand Docker.
 */
function dockerCopy(sources: string[], dest: string, context?: (src: string) => boolean): void {
  for (const src of sources) {
    expect(src, 'wildcards are not replayed').to.not.match(/[*?[]/);
    let copied: string;
    if (statSync(src).isDirectory()) {
      mkdirs(dest);
      cpSync(src, dest, { recursive: true, verbatimSymlinks: true, filter: context });
      copied = dest;
    } else {
      copied = dest.endsWith('/') || sources.length > 1 ? path.join(dest, path.basename(src)) : dest;
      mkdirs(path.dirname(copied));
      cpSync(src, copied);
    }
    if (context) {
      const entries = statSync(src).isDirectory()
        ? readdirSync(src).map((e) => path.join(copied, e))
        : [copied];
      for (const e of entries.filter((e) => existsSync(e))) ownerOnly(e);
    }
  }
}

/** Every file under `dir` with its size and modification time, to see whether anything wrote there. */
function snapshot(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => !e.isDirectory())
    .map((e) => {
      const full = path.join(e.parentPath, e.name);
      const s = statSync(full, { throwIfNoEntry: false });
      return `${path.relative(dir, full)} ${s?.size ?? '-'} ${s?.mtimeMs ?? '-'}`;
    })
    .sort();
}

/** A child environment without this shell's ARBITER_* settings. */
function cleanEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith('ARBITER_') && v !== undefined) env[k] = v;
  }
  return env;
}

const dockerfileText = readFileSync(path.join(REPO, 'Dockerfile'), 'utf8');
const { args: initialArgs, stages } = readDockerfile(dockerfileText);
const final = stages.at(-1) as Stage;
const finalSteps = (keyword: string) => final.steps.filter((s) => s.keyword === keyword);
const finalEnv = Object.fromEntries(finalSteps('ENV').flatMap((s) => s.env));

// The Dockerfile, the systemd unit and the env example (the image runs the embedded SQLite
// default): nothing here depends on the test backend, so once (on the SQLite run).
onceOnly('Dockerfile', () => {
  it('passes the dockerfile-utils validator, which does report a broken variant', () => {
    expect(validate(dockerfileText)).to.deep.equal([]);
    const broken = dockerfileText
      .replace('COPY --from=build', 'COPY --form=build')
      .replace('--interval=30s', '--interval=30');
    expect(validate(broken)).to.have.length(2);
  });

  it('builds on the official Node 20 bookworm-slim image and copies --from earlier stages only', () => {
    const image = (s: Stage) => expand(s.image, initialArgs);
    expect(image(final)).to.equal('node:20-bookworm-slim');
    const build = stages.find((s) => s.name === 'build');
    expect(build && image(build)).to.equal('node:20-bookworm-slim');
    stages.forEach((stage, k) => {
      for (const step of stage.steps.filter((s) => s.flags.from !== undefined)) {
        const earlier = stages.slice(0, k).map((s) => s.name);
        expect(earlier, `COPY --from=${step.flags.from} in stage ${stage.name}`).to.include(step.flags.from);
      }
    });
  });

  it('runs the final stage as a fixed non-root UID that owns the data volume', () => {
    const user = finalSteps('USER').at(-1)?.content ?? '';
    expect(user, 'USER uid:gid, numeric so that runAsNonRoot can check it').to.match(/^\d+:\d+$/);
    const [uid, gid] = user.split(':').map(Number);
    expect(uid).to.be.greaterThan(0);
    expect(gid).to.be.greaterThan(0);
    const volumes = finalSteps('VOLUME').flatMap((s) => s.json ?? s.args);
    const setup = finalSteps('RUN')
      .map((s) => s.content)
      .join('\n');
    expect(setup).to.include(`--uid ${uid}`);
    expect(setup).to.include(`--gid ${gid}`);
    for (const v of volumes) expect(setup).to.include(`chown ${uid}:${gid} ${v}`);
  });

  it('stores state in the VOLUME, listens on the EXPOSEd ports on every interface', () => {
    const config = loadConfig(finalEnv);
    expect(finalSteps('VOLUME').flatMap((s) => s.json ?? s.args)).to.deep.equal([config.dataDir]);
    const exposed = finalSteps('EXPOSE').flatMap((s) => s.args);
    expect(exposed).to.have.members([String(config.enginePort), String(config.platformPort)]);
    expect(config.host).to.equal('0.0.0.0');
  });

  it('declares a HEALTHCHECK on /healthz and an exec-form ENTRYPOINT that is node under tini', () => {
    const hc = finalSteps('HEALTHCHECK');
    expect(hc).to.have.length(1);
    expect(hc[0]?.json?.[0]).to.equal('node');
    expect(hc[0]?.json?.join(' ')).to.include('/healthz');
    for (const flag of ['interval', 'timeout', 'start-period']) {
      expect(hc[0]?.flags[flag], flag).to.match(/^\d+s$/);
    }
    expect(finalSteps('ENTRYPOINT').at(-1)?.json).to.deep.equal([
      '/usr/bin/tini',
      '--',
      'node',
      'dist/src/main.js',
    ]);
    // tini comes from the stage's own apt-get (not replayed below: system set-up).
    expect(
      finalSteps('RUN')
        .map((s) => s.content)
        .join('\n'),
    ).to.match(/apt-get install [^\n]*\btini\b/);
    expect(finalSteps('CMD').at(-1)?.json).to.deep.equal(['serve']);
  });

  it('keeps local installs, build output and state out of the build context, but nothing it copies', () => {
    const ignored = dockerignore();
    for (const local of ['node_modules', '.opa-bin', 'dist', 'data', '.git', 'bench/results']) {
      expect(ignored(local), local).to.equal(true);
    }
    for (const stage of stages) {
      for (const step of stage.steps.filter((s) => s.keyword === 'COPY' && s.flags.from === undefined)) {
        for (const src of step.args.slice(0, -1)) {
          expect(ignored(src.replace(/\/+$/, '')), `COPY ${src}`).to.equal(false);
          expect(existsSync(path.join(REPO, src)), `COPY ${src}`).to.equal(true);
        }
      }
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The image, replayed without Docker. Each stage gets a directory standing for its file system
// root. The build stage's COPY steps are done as written (honouring .dockerignore, and leaving the
// copies readable by their owner only, as a checkout made under umask 077 would); `npm ci`, which
// needs the registries and Go, is stood in for by this checkout's own install (node_modules and the
// OPA binary it built); every RUN after it (the TypeScript build, `npm prune`, chmod) runs as written.
// The RUNs before it (apt-get) and the final stage's (user creation) are system set-up and are
// not replayed. The final stage's COPY steps are then done as written, and the service is started
// with the ENTRYPOINT + CMD, the stage's ENV and WORKDIR, as the USER (when this test runs as root),
// on ports 0 and with the VOLUME in the replayed root.

onceOnly('Dockerfile image, replayed without Docker', () => {
  let tmp = '';
  let buildRoot = '';
  let runtimeRoot = '';
  let workdir = '';
  let dataDir = '';
  let runAs: { uid?: number; gid?: number } = {};
  let env: Record<string, string> = {};
  let proc: ServeProcess | undefined;

  const inRoot = (root: string, p: string) => path.join(root, p);

  before(function () {
    this.timeout(300_000);
    tmp = mkdtempSync(path.join(os.tmpdir(), 'arbiter-image-'));
    chmodSync(tmp, 0o755);
    const ignored = dockerignore();
    const fromContext = (p: string) => !ignored(path.relative(REPO, p).split(path.sep).join('/'));
    const build = stages.find((s) => s.name === 'build') as Stage;
    buildRoot = path.join(tmp, 'build');
    runtimeRoot = path.join(tmp, 'runtime');

    // Build stage.
    let cwd = '/';
    let installed = false;
    const buildEnv: Record<string, string> = cleanEnv();
    for (const step of build.steps) {
      if (step.keyword === 'WORKDIR') {
        cwd = path.posix.resolve(cwd, step.content);
        mkdirs(inRoot(buildRoot, cwd));
      } else if (step.keyword === 'ENV') {
        for (const [k, v] of step.env) buildEnv[k] = expand(v, buildEnv);
      } else if (step.keyword === 'COPY') {
        // The Go toolchain image; this machine's Go is not needed either (npm ci is stood in for).
        if (step.flags.from === 'go') continue;
        expect(step.flags.from, 'the build stage copies from the context or the go stage').to.equal(
          undefined,
        );
        const sources = step.args.slice(0, -1).map((s) => path.join(REPO, s));
        const dest = step.args.at(-1) as string;
        const target = path.posix.resolve(cwd, dest) + (dest.endsWith('/') ? '/' : '');
        dockerCopy(sources, inRoot(buildRoot, target), fromContext);
      } else if (step.keyword === 'RUN') {
        if (/\bnpm ci\b/.test(step.content)) {
          expect(
            step.content,
            'the install step is replaced by copying, so it must do nothing else',
          ).to.equal('npm ci');
          const app = inRoot(buildRoot, cwd);
          cpSync(path.join(REPO, 'node_modules'), path.join(app, 'node_modules'), {
            recursive: true,
            verbatimSymlinks: true,
          });
          mkdirs(path.join(app, '.opa-bin'));
          cpSync(path.join(REPO, '.opa-bin', 'opa'), path.join(app, '.opa-bin', 'opa'));
          installed = true;
        } else if (installed) {
          const r = spawnSync('sh', ['-c', step.content], {
            cwd: inRoot(buildRoot, cwd),
            env: buildEnv,
            encoding: 'utf8',
            timeout: 240_000,
          });
          expect(r.status, `RUN ${step.content}\n${r.stdout}\n${r.stderr}`).to.equal(0);
        }
      }
    }
    expect(installed, 'the build stage runs npm ci').to.equal(true);

    // Final stage.
    cwd = '/';
    env = cleanEnv();
    for (const step of final.steps) {
      if (step.keyword === 'WORKDIR') {
        cwd = path.posix.resolve(cwd, step.content);
        mkdirs(inRoot(runtimeRoot, cwd));
      } else if (step.keyword === 'ENV') {
        for (const [k, v] of step.env) env[k] = expand(v, env);
      } else if (step.keyword === 'COPY') {
        expect(step.flags.from, 'the final stage copies from the build stage or the context').to.be.oneOf([
          undefined,
          'build',
        ]);
        const sources = step.args
          .slice(0, -1)
          .map((s) => (step.flags.from === 'build' ? inRoot(buildRoot, s) : path.join(REPO, s)));
        const dest = step.args.at(-1) as string;
        const target = path.posix.resolve(cwd, dest) + (dest.endsWith('/') ? '/' : '');
        dockerCopy(sources, inRoot(runtimeRoot, target), step.flags.from ? undefined : fromContext);
      }
    }
    workdir = inRoot(runtimeRoot, cwd);
    const volume = finalSteps('VOLUME').flatMap((s) => s.json ?? s.args)[0] as string;
    dataDir = inRoot(runtimeRoot, volume);
    mkdirs(path.dirname(dataDir));
    mkdirSync(dataDir, { mode: 0o700 });
    if (process.getuid?.() === 0) {
      const [uid, gid] = (finalSteps('USER').at(-1)?.content ?? '').split(':').map(Number);
      runAs = { uid, gid };
      chownSync(dataDir, uid as number, gid as number);
    }
    Object.assign(env, {
      ARBITER_ENGINE_PORT: '0',
      ARBITER_PLATFORM_PORT: '0',
      ARBITER_DATA_DIR: dataDir,
      HOME: dataDir,
    });
  });

  after(async () => {
    await proc?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** The HEALTHCHECK command as Docker runs it: exec form, the container's env, the --timeout. */
  function healthcheck(enginePort: number): { status: number | null; output: string } {
    const hc = finalSteps('HEALTHCHECK')[0] as Step;
    const [cmd, ...rest] = hc.json as string[];
    expect(cmd).to.equal('node');
    const r = spawnSync(process.execPath, rest, {
      env: { ...env, ARBITER_ENGINE_PORT: String(enginePort) },
      ...runAs,
      encoding: 'utf8',
      timeout: Number(/^(\d+)s$/.exec(hc.flags.timeout ?? '')?.[1] ?? 30) * 1000,
    });
    return { status: r.status, output: r.stdout + r.stderr };
  }

  it('starts from ENTRYPOINT + CMD with only what the final stage copies, answers the HEALTHCHECK and stops cleanly on SIGTERM', async function () {
    this.timeout(120_000);
    const argv = [
      ...(finalSteps('ENTRYPOINT').at(-1)?.json ?? []),
      ...(finalSteps('CMD').at(-1)?.json ?? []),
    ];
    // As in the container: tini (installed on this machine as in the image) runs node from PATH.
    expect(argv.slice(0, 3)).to.deep.equal(['/usr/bin/tini', '--', 'node']);
    const before = snapshot(workdir);
    proc = new ServeProcess([], env, { file: argv[0], argv: argv.slice(1), cwd: workdir, ...runAs });
    const loaded = await proc.waitFor((r) => r.msg === 'policy set loaded');
    // The example policies were found relative to WORKDIR, in the image.
    expect(loaded.policyDir).to.equal(path.join(workdir, 'policies'));
    expect(loaded.seeded).to.equal(true);
    const engine = await proc.waitFor((r) => r.api === 'engine' && typeof r.port === 'number');
    expect(engine.url).to.match(/^http:\/\/0\.0\.0\.0:/);
    const port = engine.port as number;

    const ok = healthcheck(port);
    expect(ok.status, ok.output).to.equal(0);

    const code = await Promise.race([proc.stop(), sleep(10_000).then(() => 'still running')]);
    expect(code, proc.lines.join('\n')).to.equal(0);
    expect(proc.records.some((r) => r.msg === 'stopped')).to.equal(true);
    proc = undefined;

    // The image's application files stay read-only in use (there they belong to root).
    expect(snapshot(workdir)).to.deep.equal(before);
    expect(readdirSync(dataDir)).to.include('arbiter.db');
    // And the health check can fail: nothing answers any more.
    const down = healthcheck(port);
    expect(down.status).to.not.equal(0);
  });
});

// ---------------------------------------------------------------------------------------------
// deploy/arbiter.service, checked with systemd-analyze (verify; security --offline).

type Unit = Record<string, [string, string][]>;

function parseUnit(text: string): Unit {
  const unit: Unit = {};
  let section = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const header = /^\[(.+)\]$/.exec(line);
    if (header) {
      section = header[1] as string;
      unit[section] ??= [];
      continue;
    }
    const eq = line.indexOf('=');
    unit[section]?.push([line.slice(0, eq).trim(), line.slice(eq + 1).trim()]);
  }
  return unit;
}

const unitText = readFileSync(path.join(REPO, 'deploy', 'arbiter.service'), 'utf8');
const unit = parseUnit(unitText);
const service = (key: string) => (unit.Service ?? []).filter(([k]) => k === key).map(([, v]) => v);
const analyze = spawnSync('systemd-analyze', ['--version'], { encoding: 'utf8' }).status === 0;

/** Runs systemd-analyze on `text` saved as arbiter.service in a temporary directory. */
function systemdAnalyze(text: string, args: string[]): { status: number | null; output: string } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'arbiter-unit-'));
  try {
    const file = path.join(dir, 'arbiter.service');
    writeFileSync(file, text);
    const r = spawnSync('systemd-analyze', [...args, file], { cwd: dir, encoding: 'utf8', timeout: 30_000 });
    return { status: r.status, output: r.stdout + r.stderr };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The unit as it would be installed from this checkout: this node, this directory. */
const installedHere = (text: string) =>
  text.replace(/^ExecStart=node /m, `ExecStart=${process.execPath} `).replaceAll('/opt/arbiter', REPO);

/** At most this exposure (×10) in `systemd-analyze security`: what the unit scores (1.4), with slack. */
const EXPOSURE_THRESHOLD = 15;

onceOnly('deploy/arbiter.service', () => {
  it('passes systemd-analyze verify without a complaint, which does report misspellings', function () {
    if (!analyze) this.skip(); // systemd-analyze is not installed here
    const r = systemdAnalyze(installedHere(unitText), ['verify', '--man=no']);
    expect(r.status, r.output).to.equal(0);
    expect(
      r.output.split('\n').filter((l) => l.includes('arbiter.service')),
      r.output,
    ).to.deep.equal([]);
    const broken = systemdAnalyze(
      installedHere(unitText)
        .replace(/^ProtectSystem=/m, 'ProtectSytem=')
        .replace(/^\[Install\]/m, '[Instal]'),
      ['verify', '--man=no'],
    );
    expect(broken.output).to.match(/Unknown key 'ProtectSytem'/);
    expect(broken.output).to.match(/Unknown section 'Instal'/);
  });

  it(`scores an exposure of at most ${EXPOSURE_THRESHOLD / 10} in systemd-analyze security --offline, which an unhardened unit does not`, function () {
    if (!analyze) this.skip();
    const args = ['security', '--offline=true', `--threshold=${EXPOSURE_THRESHOLD}`];
    const r = systemdAnalyze(installedHere(unitText), args);
    expect(r.status, r.output).to.equal(0);
    const score = Number(/Overall exposure level for arbiter\.service: ([\d.]+)/.exec(r.output)?.[1]);
    expect(score).to.be.at.most(EXPOSURE_THRESHOLD / 10);
    const bare = `[Service]\nUser=arbiter\nExecStart=${process.execPath} ${REPO}/dist/src/main.js serve\n`;
    expect(systemdAnalyze(bare, args).status).to.not.equal(0);
  });

  it('runs the built entry point as an unprivileged user from the directory it names', () => {
    const [user] = service('User');
    expect(user).to.be.a('string').and.not.be.oneOf(['root', '0']);
    const [workdir] = service('WorkingDirectory');
    const exec = /^node (\/\S+)\/(dist\/src\/main\.js) serve$/.exec(service('ExecStart')[0] ?? '');
    expect(exec, 'ExecStart=node <WorkingDirectory>/dist/src/main.js serve').to.not.equal(null);
    expect(exec?.[1]).to.equal(workdir);
    expect(existsSync(path.join(REPO, exec?.[2] as string)), 'npm run build produces it').to.equal(true);
  });

  it('keeps state in its StateDirectory, which is the ARBITER_DATA_DIR it sets', () => {
    const [state] = service('StateDirectory');
    expect(service('Environment')).to.include(`ARBITER_DATA_DIR=/var/lib/${state}`);
    expect(service('ProtectSystem')).to.deep.equal(['strict']);
    // The compiler works in os.tmpdir(): a private, writable /tmp.
    expect(service('PrivateTmp')).to.deep.equal(['yes']);
  });

  it('stops with SIGTERM and waits longer than the service gives in-flight requests', () => {
    const grace = /SHUTDOWN_GRACE_MS = ([\d_]+);/.exec(
      readFileSync(path.join(REPO, 'src', 'app.ts'), 'utf8'),
    );
    const graceSeconds = Number((grace?.[1] ?? '').replace(/_/g, '')) / 1000;
    expect(graceSeconds).to.be.greaterThan(0);
    expect(service('KillSignal')).to.deep.equal(['SIGTERM']);
    const [timeout] = service('TimeoutStopSec');
    expect(timeout).to.match(/^\d+s?$/);
    expect(parseInt(timeout as string, 10)).to.be.greaterThan(graceSeconds);
  });

  it('leaves MemoryDenyWriteExecute unset (V8 and WebAssembly need W+X) and allows only IP and Unix sockets', () => {
    expect(service('MemoryDenyWriteExecute')).to.deep.equal([]);
    expect(service('RestrictAddressFamilies')).to.deep.equal(['AF_INET AF_INET6 AF_UNIX']);
    expect(service('NoNewPrivileges')).to.deep.equal(['yes']);
  });
});

onceOnly('deploy/arbiter.env.example', () => {
  it('names only settings the service knows, with values that load as a valid configuration', () => {
    const known = new Set(
      [
        ...readFileSync(path.join(REPO, 'src', 'config.ts'), 'utf8').matchAll(/env: '(ARBITER_[A-Z_]+)'/g),
      ].map((m) => m[1]),
    );
    const lines = readFileSync(path.join(REPO, 'deploy', 'arbiter.env.example'), 'utf8').split('\n');
    const assignments = lines
      .map((l) => /^#?(ARBITER_[A-Z0-9_]+)=(.*)$/.exec(l))
      .filter((m): m is RegExpExecArray => m !== null);
    expect(assignments.length).to.be.greaterThan(5);
    const env: Record<string, string> = {};
    for (const [, name, value] of assignments) {
      expect(known, `${name} is a setting in src/config.ts`).to.include(name);
      expect(value, `${name}: no quotes or spaces (systemd and docker --env-file read it alike)`).to.match(
        /^[^"'\s]*$/,
      );
      env[name as string] = value as string;
    }
    expect(() => loadConfig(env)).to.not.throw();
  });
});
