/**
 * The environment of a program Arbiter runs (the OPA CLI): this process's, without Arbiter's own
 * settings (ARBITER_*: the admin key, the database URL and its password, the CLI's ARBITER_KEY)
 * and libpq's PG* variables (PGPASSWORD), none of which such a program needs. Its environment is
 * readable in /proc while it runs, and a crash report or a debugging aid may print it.
 */
export function childEnv(env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) if (!/^(ARBITER_|PG)/.test(k)) out[k] = v;
  return out;
}
