import { Worker } from 'node:worker_threads';
import { AppError, type ErrorKind } from '../../errors.js';
import type { RecordOutcome } from '../../decisions/store.js';
import type { BatchCommitter, RecordArgs } from './decisions.js';

/**
 * Commits decision batches on the writer thread (writer-thread.ts). A batch settles when the
 * thread reports its commit; if the thread fails, every batch it held is rejected (the requests
 * answer 503) and a new thread is started for the next batch.
 */
export function threadCommitter(
  dataDir: string,
  sync: 'full' | 'normal',
  onCommitted: (outcomes: RecordOutcome[]) => void,
): BatchCommitter {
  let worker: Worker | undefined;
  let nextId = 0;
  const waiting = new Map<number, { resolve: (o: RecordOutcome[]) => void; reject: (e: Error) => void }>();
  const cpuAsks = new Map<number, (seconds: number | undefined) => void>();

  const failAll = (err: Error) => {
    for (const w of waiting.values()) w.reject(err);
    waiting.clear();
    worker = undefined;
  };

  const start = (): Worker => {
    const w = new Worker(new URL('./writer-thread.js', import.meta.url), { workerData: { dataDir, sync } });
    w.on(
      'message',
      (
        m:
          | { id: number; outcomes?: RecordOutcome[]; error?: string; kind?: ErrorKind; code?: string }
          | { cpu: number; seconds?: number },
      ) => {
        if ('cpu' in m) {
          cpuAsks.get(m.cpu)?.(m.seconds);
          cpuAsks.delete(m.cpu);
          return;
        }
        const entry = waiting.get(m.id);
        if (!entry) return;
        waiting.delete(m.id);
        if (m.outcomes) {
          onCommitted(m.outcomes);
          entry.resolve(m.outcomes);
        } else {
          entry.reject(threadError(m));
        }
      },
    );
    w.on('error', (err) => failAll(err));
    w.on('exit', (code) => {
      if (worker === w) failAll(new Error(`decision writer thread exited with code ${code}`));
    });
    return w;
  };

  // Started now, not on the first decision: its connection opens before anything can contend.
  worker = start();
  return {
    commit(batch: RecordArgs[]): Promise<RecordOutcome[]> {
      worker ??= start();
      const id = nextId++;
      const w = worker;
      return new Promise((resolve, reject) => {
        waiting.set(id, { resolve, reject });
        w.postMessage({ id, batch });
      });
    },
    /** The writer thread's CPU seconds so far (for the metric), if it can tell. */
    cpuSeconds(): Promise<number | undefined> {
      const w = worker;
      if (!w) return Promise.resolve(undefined);
      const id = nextId++;
      return new Promise((resolve) => {
        const timer = setTimeout(() => {
          cpuAsks.delete(id);
          resolve(undefined);
        }, 1_000);
        cpuAsks.set(id, (s) => {
          clearTimeout(timer);
          resolve(s);
        });
        w.postMessage({ cpu: id });
      });
    },
    async close(): Promise<void> {
      const w = worker;
      worker = undefined;
      if (!w) return;
      await new Promise<void>((resolve) => {
        w.once('exit', () => resolve());
        w.postMessage({ close: true });
      });
    },
  };
}

/** The writer thread's error as it was thrown there: an AppError of its kind, or the driver's code. */
function threadError(m: { error?: string; kind?: ErrorKind; code?: string }): Error {
  const message = m.error ?? 'decision batch failed';
  if (m.kind !== undefined) return new AppError(m.kind, message);
  return m.code === undefined ? new Error(message) : Object.assign(new Error(message), { code: m.code });
}
