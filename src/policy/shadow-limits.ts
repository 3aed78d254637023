/**
 * When a shadow set moves beside the live set and back (shadow-runner.ts; docs/adr/0010). A leaf
 * module, so that the metrics can name the limit without loading the policy runtime.
 */

/**
 * A new shadow set is evaluated inline once this many decisions in a row were answered by its
 * thread, each evaluated within INLINE_MAX_MS there (doubled each time it is sent back, up to
 * MAX_PROVING_DECISIONS).
 */
export const PROVING_DECISIONS = 1_000;
export const MAX_PROVING_DECISIONS = 64_000;
/**
 * The longest a shadow evaluation may take on the serving thread (ms): a slower one, there or
 * on the thread while proving, sends the set back to its thread or restarts the count. Wall time,
 * so a pause of the machine can do either; neither changes an answer.
 */
export const INLINE_MAX_MS = 5;

/**
 * A shadow set whose thread did not answer a decision in time is not evaluated for this long
 * (ms), doubling each time it times out again, up to MAX_SKIP_MS (shadow-runner.ts).
 */
export const SKIP_MS = 1_000;
export const MAX_SKIP_MS = 60_000;

/**
 * The first this many answers of a shadow set's paired module (paired.ts) are checked against
 * the live and the shadow set evaluated on their own (shadow-runner.ts).
 */
export const PAIR_CHECKED_DECISIONS = 1_000;
/** After those, one paired answer in this many is checked too, for as long as the pair is used. */
export const PAIR_SAMPLED_EVERY = 1_000;
