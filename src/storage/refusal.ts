import type { CommitOutcome } from '../policy/types.js';

/** Thrown inside a policy change's transaction to roll it back with an outcome that is not a failure. */
class Refused {
  constructor(readonly outcome: CommitOutcome) {}
}

/** Refuses the change being committed: rolls its transaction back; `outcome` is what commit answers. */
export function refuse(outcome: CommitOutcome): never {
  throw new Refused(outcome);
}

/**
 * Runs a policy change's transaction (both stores' `commit`): a refusal inside it has rolled it
 * back and becomes the outcome; any other error propagates.
 */
export async function refusable(
  transaction: () => CommitOutcome | Promise<CommitOutcome>,
): Promise<CommitOutcome> {
  try {
    return await transaction();
  } catch (e) {
    if (e instanceof Refused) return e.outcome;
    throw e;
  }
}
