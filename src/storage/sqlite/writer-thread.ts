/**
 * The decision writer thread: its own connection to the database, committing the batches the
 * serving thread sends. The event loop keeps parsing and evaluating requests while a batch is
 * fsynced here, and WAL checkpoints run here too, off the serving thread.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { AppError } from '../../errors.js';
import { openDatabase } from './db.js';
import { AuditWriter } from './audit.js';
import { DecisionWriter, type RecordArgs } from './decisions.js';
import { threadCpuSeconds } from '../../observability/thread-cpu.js';

const { dataDir, sync } = workerData as { dataDir: string; sync: 'full' | 'normal' };
// The serving thread has migrated already; this connection only writes decisions.
const db = openDatabase(dataDir, sync, { migrate: false });
const writer = new DecisionWriter(db, new AuditWriter(db, () => undefined));

parentPort?.on('message', (m: { id: number; batch: RecordArgs[] } | { close: true } | { cpu: number }) => {
  if ('close' in m) {
    db.close();
    parentPort?.close();
    return;
  }
  if ('cpu' in m) {
    parentPort?.postMessage({ cpu: m.cpu, seconds: threadCpuSeconds() });
    return;
  }
  try {
    parentPort?.postMessage({ id: m.id, outcomes: writer.recordBatch(m.batch) });
  } catch (e) {
    // The kind and the driver's code cross too: a refusal stays `unavailable`, a busy file SQLITE_BUSY.
    const { kind, code } = e as { kind?: unknown; code?: unknown };
    parentPort?.postMessage({
      id: m.id,
      error: e instanceof Error ? e.message : String(e),
      ...(e instanceof AppError ? { kind } : {}),
      ...(typeof code === 'string' ? { code } : {}),
    });
  }
});
