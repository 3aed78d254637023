import { TEST_BACKEND } from './postgres.js';

/**
 * Which mocha run registers which suite. `npm test` runs the whole suite twice: once on SQLite
 * (the default) and once with ARBITER_TEST_BACKEND=postgres, where every `Arbiter.start()` gets a
 * PostgreSQL database of its own. Every top-level `describe` in test/*.test.ts goes through one of
 * these, and each file says why it chose what it chose.
 *
 * Suites that are not registered on a run are simply absent from it: never `describe.skip`, since
 * CI forbids pending tests.
 */

export { TEST_BACKEND };

type Suite = (this: Mocha.Suite) => void;

/** Storage is involved: the same promises hold on every backend, so the suite runs on each. */
export function onEveryBackend(title: string, fn: Suite): void {
  describe(title, fn);
}

/**
 * The suite does not touch storage at all (config parsing, the Dockerfile, signals, the OpenAPI
 * document, the console in a browser, `opa` on its own): a second run would test nothing new, so
 * it is registered once, on the SQLite run, to keep the total time down.
 */
export function onceOnly(title: string, fn: Suite): void {
  if (TEST_BACKEND === 'sqlite') describe(title, fn);
}

/**
 * The suite is about SQLite itself (it edits, locks or breaks the database file behind the
 * service): it runs on the SQLite run only, and says so in its title. Where the promise it checks
 * is backend-independent, an `onPostgresOnly` suite next to it checks the same on PostgreSQL.
 */
export function onSqliteOnly(title: string, fn: Suite): void {
  if (TEST_BACKEND === 'sqlite') describe(`${title} (SQLite)`, fn);
}

/** The PostgreSQL counterpart of an `onSqliteOnly` suite (it reaches into PostgreSQL directly). */
export function onPostgresOnly(title: string, fn: Suite): void {
  if (TEST_BACKEND === 'postgres') describe(`${title} (PostgreSQL)`, fn);
}
