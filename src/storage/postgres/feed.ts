import pg from 'pg';
import type { Logger } from '../../observability/logger.js';
import type { Change, ChangeFeed } from '../stores.js';
import { clientConfig } from './pool.js';

/** Reconnection backoff of the LISTEN connection: from 250 ms, doubling, at most 5 s. */
const BACKOFF_MS = [250, 500, 1_000, 2_000, 5_000];

/**
 * LISTEN/NOTIFY on one dedicated connection: stores send `pg_notify('arbiter', …)` inside the
 * transaction of a change, and every process hears it when that transaction commits. The
 * connection reconnects by itself; after any reconnect (when notices may have been missed) it
 * reports `resync`. Services also re-check on a timer, so a lost notice costs a delay, not a miss.
 */
export class PgChangeFeed implements ChangeFeed {
  readonly crossProcess = true;
  private readonly listeners = new Set<(c: Change) => void>();
  private client: pg.Client | undefined;
  private closed = false;
  private attempt = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly url: string,
    private readonly log?: Logger,
  ) {}

  /** Connects the first time (resolves either way: a feed that is down keeps retrying). */
  async start(): Promise<void> {
    await this.connect();
  }

  subscribe(listener: (c: Change) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    await this.client?.end().catch(() => undefined);
  }

  private emit(c: Change): void {
    for (const l of this.listeners) {
      try {
        l(c);
      } catch (err) {
        this.log?.error({ err }, 'change listener failed');
      }
    }
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    const client = new pg.Client(clientConfig(this.url));
    const lost = (err?: Error) => {
      if (this.client !== client) return;
      this.client = undefined;
      client.removeAllListeners();
      client.on('error', () => undefined);
      void client.end().catch(() => undefined);
      if (this.closed) return;
      this.log?.warn(
        { err: err && { message: err.message } },
        'change feed lost its connection; reconnecting',
      );
      this.schedule();
    };
    client.on('error', (err) => lost(err));
    client.on('end', () => lost());
    client.on('notification', (n) => {
      if (n.channel !== 'arbiter' || !n.payload) return;
      try {
        this.emit(JSON.parse(n.payload) as Change);
      } catch {
        this.emit({ topic: 'resync' });
      }
    });
    try {
      this.client = client;
      await client.connect();
      await client.query('LISTEN arbiter');
      if (this.attempt > 0) this.log?.info('change feed reconnected');
      this.attempt = 0;
      // Whatever happened while not listening is unknown: every process re-reads what it caches.
      this.emit({ topic: 'resync' });
    } catch (err) {
      lost(err as Error);
    }
  }

  private schedule(): void {
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)] as number;
    this.attempt++;
    this.timer = setTimeout(() => void this.connect(), delay);
    this.timer.unref();
  }
}
