import { isKind } from '../errors.js';
import { asStorageFailure } from './failure.js';

/**
 * Group commit: requests that arrive while a batch is being committed form the next batch, one
 * transaction (and one fsync, one chain-head lock) for all of them. Each caller's promise settles
 * only after its own batch has committed, so "written before the response" holds. A lone request
 * at low load waits for no timer: it is committed on the next turn of the event loop.
 *
 * If a batch fails, its items are committed one by one, so that an item that cannot be recorded
 * fails alone and the others are still answered — unless the database itself cannot serve now
 * (asStorageFailure: unreachable, timed out, locked): then every item of the batch fails at once
 * with that error, rather than each waiting its own connection timeout in turn behind the others.
 */
export class GroupCommit<A, R> {
  private pending: { arg: A; resolve: (r: R) => void; reject: (e: unknown) => void }[] = [];
  private inFlight = false;

  constructor(
    private readonly commit: (batch: A[]) => Promise<R[]>,
    /** Told each committed batch's size and how long its commit took (for the metrics). */
    private readonly onBatch?: (size: number, seconds: number) => void,
  ) {}

  submit(arg: A): Promise<R> {
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
      await this.commitIsolated(batch);
    } finally {
      this.inFlight = false;
      if (this.pending.length > 0) void this.flush();
    }
  }

  private async commitIsolated(batch: typeof this.pending): Promise<void> {
    try {
      const started = process.hrtime.bigint();
      const results = await this.commit(batch.map((b) => b.arg));
      this.onBatch?.(batch.length, Number(process.hrtime.bigint() - started) / 1e9);
      batch.forEach((b, i) => b.resolve(results[i] as R));
    } catch (e) {
      const failure = asStorageFailure(e);
      if (batch.length === 1 || isKind(failure, 'unavailable')) {
        for (const b of batch) b.reject(failure);
        return;
      }
      for (const b of batch) await this.commitIsolated([b]);
    }
  }
}
