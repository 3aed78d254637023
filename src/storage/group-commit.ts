/**
 * Group commit: requests that arrive while a batch is being committed form the next batch, one
 * transaction (and one fsync, one chain-head lock) for all of them. Each caller's promise settles
 * only after its own batch has committed, so "written before the response" holds. A lone request
 * at low load waits for no timer: it is committed on the next turn of the event loop.
 *
 * An item may be submitted before its contents are complete (a promise of them): it takes its
 * place in the order of submission at once. A batch is the complete front of the queue, in
 * order: when the first item is not complete yet, the batch waits for it (and takes whatever has
 * completed behind it meanwhile), and items still incomplete behind a complete front wait for
 * the next batch. So work that an item's contents wait for (a decision's shadow evaluation) runs
 * while the batch ahead of it commits, and the writer never waits for the newest items while
 * older ones are ready. An item whose promise rejects fails alone, and so does one still
 * incomplete `completionLimitMs` after it was submitted (whatever it waits for has a timeout of
 * its own; this one only guarantees that no item can hold the queue for good).
 *
 * If a batch fails, its items are committed one by one, so that an item that cannot be recorded
 * fails alone and the others are still answered.
 */
export class GroupCommit<A, R> {
  private pending: Queued<A, R>[] = [];
  private inFlight = false;

  constructor(
    private readonly commit: (batch: A[]) => Promise<R[]>,
    /** Told each committed batch's size and how long its commit took (for the metrics). */
    private readonly onBatch?: (size: number, seconds: number) => void,
    private readonly completionLimitMs = COMPLETION_LIMIT_MS,
  ) {}

  submit(arg: A | Promise<A>): Promise<R> {
    return new Promise((resolve, reject) => {
      const q: Queued<A, R> = { state: 'ready', value: arg as A, since: 0, resolve, reject };
      if (arg instanceof Promise) {
        q.state = 'waiting';
        q.since = performance.now();
        // Settles the item's state; its failure is the item's, never an unhandled rejection.
        q.settled = arg.then(
          (value: A) => {
            if (q.state === 'waiting') Object.assign(q, { state: 'ready', value });
          },
          (e: unknown) => {
            if (q.state === 'waiting') Object.assign(q, { state: 'failed', failure: e });
          },
        );
      }
      this.pending.push(q);
      // Let every request parsed in this event-loop turn join the batch.
      if (this.pending.length === 1 && !this.inFlight) setImmediate(() => void this.flush());
    });
  }

  private async flush(): Promise<void> {
    if (this.inFlight || this.pending.length === 0) return;
    this.inFlight = true;
    try {
      const head = this.pending[0] as Queued<A, R>;
      if (head.state === 'waiting') await this.completion(head);
      let n = 0;
      while (n < this.pending.length && this.pending[n]?.state !== 'waiting') n++;
      const batch: Queued<A, R>[] = [];
      for (const q of this.pending.splice(0, n)) {
        if (q.state === 'failed') q.reject(q.failure);
        else batch.push(q);
      }
      await this.commitIsolated(batch);
    } finally {
      this.inFlight = false;
      if (this.pending.length > 0) void this.flush();
    }
  }

  /** Waits for `q` to complete; past the limit (from its submission) it fails. */
  private async completion(q: Queued<A, R>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const left = Math.max(0, q.since + this.completionLimitMs - performance.now());
    await Promise.race([q.settled, new Promise<void>((resolve) => (timer = setTimeout(resolve, left)))]);
    clearTimeout(timer);
    if (q.state === 'waiting') {
      Object.assign(q, {
        state: 'failed',
        failure: new Error(`not complete within ${this.completionLimitMs} ms`),
      });
    }
  }

  private async commitIsolated(batch: Queued<A, R>[]): Promise<void> {
    if (batch.length === 0) return;
    try {
      const started = process.hrtime.bigint();
      const results = await this.commit(batch.map((b) => b.value));
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

/** How long an item may wait for its contents, from its submission (see GroupCommit). */
export const COMPLETION_LIMIT_MS = 60_000;

/** An item in the queue: complete (`value`), still waiting for its contents, or failed. */
interface Queued<A, R> {
  state: 'ready' | 'waiting' | 'failed';
  value: A;
  failure?: unknown;
  /** When it was submitted (performance.now()), for an item submitted incomplete. */
  since: number;
  /** Settles once its contents are complete or failed (an item submitted incomplete). */
  settled?: Promise<void>;
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
}
