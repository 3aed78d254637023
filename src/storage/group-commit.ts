/**
 * Group commit: requests that arrive while a batch is being committed form the next batch, one
 * transaction (and one fsync, one chain-head lock) for all of them. Each caller's promise settles
 * only after its own batch has committed, so "written before the response" holds. A lone request
 * at low load waits for no timer: it is committed on the next turn of the event loop.
 *
 * An item may be submitted before its contents are complete (a promise of them): it takes its
 * place in the order of submission at once, and its batch is committed once every item of the
 * batch is complete. So work that an item's contents wait for (a decision's shadow evaluation)
 * runs while the batch before it commits, instead of before the item joins the queue. An item
 * whose promise rejects fails alone, and so does one still incomplete after `completionLimitMs`
 * (whatever it waits for has its own timeout; this one only guarantees that no item can hold
 * the queue for good). A batch waits for its slowest item: committing only its complete front
 * would make the rest wait for a whole commit more, and items that wait on one evaluation
 * thread complete in order anyway.
 *
 * If a batch fails, its items are committed one by one, so that an item that cannot be recorded
 * fails alone and the others are still answered.
 */
export class GroupCommit<A, R> {
  private pending: Submitted<A | Promise<A>, R>[] = [];
  private inFlight = false;

  constructor(
    private readonly commit: (batch: A[]) => Promise<R[]>,
    /** Told each committed batch's size and how long its commit took (for the metrics). */
    private readonly onBatch?: (size: number, seconds: number) => void,
    private readonly completionLimitMs = COMPLETION_LIMIT_MS,
  ) {}

  submit(arg: A | Promise<A>): Promise<R> {
    // Its failure is this item's (see completed()), not an unhandled rejection while it waits.
    if (arg instanceof Promise) arg.catch(() => undefined);
    return new Promise((resolve, reject) => {
      this.pending.push({ arg, resolve, reject });
      // Let every request parsed in this event-loop turn join the batch.
      if (this.pending.length === 1 && !this.inFlight) setImmediate(() => void this.flush());
    });
  }

  private async flush(): Promise<void> {
    if (this.inFlight || this.pending.length === 0) return;
    const batch = this.pending;
    this.pending = [];
    this.inFlight = true;
    try {
      await this.commitIsolated(
        batch.some((b) => b.arg instanceof Promise)
          ? await completed(batch, this.completionLimitMs)
          : (batch as Submitted<A, R>[]),
      );
    } finally {
      this.inFlight = false;
      if (this.pending.length > 0) void this.flush();
    }
  }

  private async commitIsolated(batch: Submitted<A, R>[]): Promise<void> {
    if (batch.length === 0) return;
    try {
      const started = process.hrtime.bigint();
      const results = await this.commit(batch.map((b) => b.arg));
      this.onBatch?.(batch.length, Number(process.hrtime.bigint() - started) / 1e9);
      batch.forEach((b, i) => b.resolve(results[i] as R));
    } catch (e) {
      if (batch.length === 1) {
        batch[0]?.reject(e);
        return;
      }
      for (const b of batch) await this.commitIsolated([b]);
    }
  }
}

interface Submitted<A, R> {
  arg: A;
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
}

/** How long a batch waits for an item's contents before that item fails (see GroupCommit). */
export const COMPLETION_LIMIT_MS = 60_000;

/**
 * The batch's items with their contents complete; an item whose contents failed, or were not
 * complete within `limitMs`, is rejected.
 */
async function completed<A, R>(
  batch: Submitted<A | Promise<A>, R>[],
  limitMs: number,
): Promise<Submitted<A, R>[]> {
  const outcomes: (PromiseSettledResult<A> | undefined)[] = batch.map(() => undefined);
  const all = Promise.all(
    batch.map((b, i) =>
      Promise.resolve(b.arg).then(
        (value) => void (outcomes[i] = { status: 'fulfilled', value }),
        (reason: unknown) => void (outcomes[i] = { status: 'rejected', reason }),
      ),
    ),
  );
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([all, new Promise<void>((resolve) => (timer = setTimeout(resolve, limitMs)))]);
  clearTimeout(timer);
  const ready: Submitted<A, R>[] = [];
  batch.forEach((b, i) => {
    const o = outcomes[i];
    if (o === undefined) b.reject(new Error(`not complete within ${limitMs} ms`));
    else if (o.status === 'fulfilled') ready.push({ ...b, arg: o.value });
    else b.reject(o.reason);
  });
  return ready;
}
