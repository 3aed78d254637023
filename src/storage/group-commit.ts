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
 * whose promise rejects fails alone.
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
        batch.some((b) => b.arg instanceof Promise) ? await completed(batch) : (batch as Submitted<A, R>[]),
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

/** The batch's items with their contents complete; an item whose contents failed is rejected. */
async function completed<A, R>(batch: Submitted<A | Promise<A>, R>[]): Promise<Submitted<A, R>[]> {
  const args = await Promise.allSettled(batch.map((b) => b.arg));
  const ready: Submitted<A, R>[] = [];
  args.forEach((a, i) => {
    const b = batch[i] as Submitted<A | Promise<A>, R>;
    if (a.status === 'fulfilled') ready.push({ ...b, arg: a.value });
    else b.reject(a.reason);
  });
  return ready;
}
