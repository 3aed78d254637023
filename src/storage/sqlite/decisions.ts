import type { Statement } from 'better-sqlite3';
import type { AuditEvent, NewAuditEvent } from '../../audit/types.js';
import type {
  DecisionRecord,
  DecisionStore,
  DecisionToRecord,
  LimitCounter,
  LimitStore,
  RecordOutcome,
  ShadowCount,
  ShadowSample,
  ShadowTally,
} from '../../decisions/store.js';
import { chargesOf } from '../../decisions/limits.js';
import {
  overPendingCap,
  recordedEvent,
  SHADOW_SAMPLES,
  shadowedOf,
  shadowMarksOf,
} from '../../decisions/store.js';
import type { LimitUse } from '../../queue/types.js';
import { GroupCommit } from '../group-commit.js';
import { decisionFromRow, decisionToRow, queueToRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

/** What one decision of a batch is, as it crosses to the writer thread (plain data). */
export type RecordArgs = DecisionToRecord;

/**
 * Budget counters: check and consume within the caller's IMMEDIATE transaction, so no other
 * writer (thread or process) can consume between the check and the write. All or nothing: the
 * first exhausted limit is reported and nothing is consumed (chargesOf, the same on PostgreSQL).
 */
export class LimitWriter {
  private readonly used: Statement;
  private readonly consume: Statement;
  constructor(db: Db) {
    this.used = db
      .prepare('SELECT used FROM limit_counters WHERE key = ? AND window_ms = ? AND window_start = ?')
      .pluck();
    this.consume = db.prepare(
      `INSERT INTO limit_counters (key, window_ms, window_start, window, max, used)
       VALUES (@key, @windowMs, @windowStart, @window, @max, @cost)
       ON CONFLICT (key, window_ms, window_start) DO UPDATE SET used = used + excluded.used, max = excluded.max`,
    );
  }

  /** Consumes every limit, or none and returns the first that cannot take its cost (chargesOf). */
  tryConsume(limits: readonly LimitUse[]): LimitUse | undefined {
    const r = chargesOf(
      limits,
      (l) => (this.used.get(l.key, l.windowMs, l.windowStart) as number | undefined) ?? 0,
    );
    if ('exhausted' in r) return r.exhausted;
    for (const c of r.charges) this.consume.run(c);
    return undefined;
  }
}

/**
 * Writes batches of decisions: each decision row, its queue item, its budgets and its audit event,
 * all decisions of a batch in one IMMEDIATE transaction (one fsync). Idempotency and budgets are
 * resolved inside the transaction, in order, so two retries in one batch replay correctly and N
 * requests against a budget of M allow exactly min(N, M). Synchronous; used in-process or from
 * the writer thread.
 */
export class DecisionWriter {
  private readonly insertQueue: Statement;
  private readonly insertDecision: Statement;
  private readonly byIdem: Statement;
  private readonly clearIdem: Statement;
  private readonly limits: LimitWriter;
  private readonly pendingOfKey: Statement;
  private readonly tally: Statement;
  private readonly sample: Statement;
  private readonly pruneSamples: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.tally = db.prepare(`INSERT INTO shadow_tallies (generation, result, live, shadow, n)
      VALUES (@generation, @result, @live, @shadow, @n)
      ON CONFLICT (generation, result, live, shadow) DO UPDATE SET n = n + excluded.n`);
    this.sample = db.prepare(`INSERT INTO shadow_samples (generation, request_id, live, shadow)
      VALUES (@generation, @request_id, @live, @shadow)`);
    this.pruneSamples = db.prepare(`DELETE FROM shadow_samples WHERE generation = @generation AND seq <=
      (SELECT seq FROM shadow_samples WHERE generation = @generation ORDER BY seq DESC LIMIT 1 OFFSET @keep)`);
    this.insertQueue =
      db.prepare(`INSERT INTO queue_items (id, status, kind, agent_id, user_id, tenant_id, action,
      resource, confidence, context, message, trace_id, created_at, expires_at, decided_at, decided_by, note,
      requested_by, request_digest, policy_revision, on_behalf_of, limits) VALUES (@id, @status, @kind, @agent_id,
      @user_id, @tenant_id, @action, @resource, @confidence, @context, @message, @trace_id, @created_at,
      @expires_at, @decided_at, @decided_by, @note, @requested_by, @request_digest, @policy_revision,
      @on_behalf_of, @limits)`);
    this.insertDecision =
      db.prepare(`INSERT INTO decisions (request_id, kind, status, key_id, tenant_id, subject,
      action, resource, message, trace_id, created_at, expires_at, idem_key, body_hash, token_id, request_digest,
      policy_revision, user_id) VALUES (@request_id, @kind, @status, @key_id, @tenant_id, @subject, @action,
      @resource, @message, @trace_id, @created_at, @expires_at, @idem_key, @body_hash, @token_id, @request_digest,
      @policy_revision, @user_id)`);
    this.byIdem = db.prepare('SELECT * FROM decisions WHERE key_id = ? AND idem_key = ?');
    this.clearIdem = db.prepare('UPDATE decisions SET idem_key = NULL WHERE key_id = ? AND idem_key = ?');
    this.limits = new LimitWriter(db);
    // Up to the cap only: the partial index holds a key's pending items in expiry order.
    this.pendingOfKey = db
      .prepare(
        `SELECT count(*) FROM (SELECT 1 FROM queue_items WHERE requested_by = ? AND status = 'pending'
         AND expires_at > ? LIMIT ?)`,
      )
      .pluck();
  }

  recordBatch(batch: RecordArgs[]): RecordOutcome[] {
    return this.db
      .transaction(() => {
        // Rows first (idempotency replays within the batch see earlier rows), then every audit
        // event of the batch in one append: one chain-head read and one head update per batch.
        const rows = batch.map((r) => this.recordRow(r));
        const events = this.writer.appendInTx(rows.flatMap((x) => ('event' in x ? [x.event] : [])));
        const shadowed = shadowedOf(batch, rows);
        if (shadowed.length > 0) this.recordShadow(shadowed);
        let next = 0;
        return rows.map((x): RecordOutcome =>
          !('event' in x)
            ? x
            : {
                recorded: recordedEvent(events[next++] as AuditEvent),
                decision: x.decision,
                ...(x.exhausted ? { exhausted: x.exhausted } : {}),
              },
        );
      })
      .immediate();
  }

  /** Adds the batch's shadowed decisions to their generations' tallies (SPEC §11). */
  private recordShadow(recorded: Parameters<typeof shadowMarksOf>[0]): void {
    const { counts, samples } = shadowMarksOf(recorded);
    for (const c of counts) this.tally.run(c);
    for (const x of samples) this.sample.run(x);
    for (const generation of new Set(samples.map((x) => x.generation))) {
      this.pruneSamples.run({ generation, keep: SHADOW_SAMPLES });
    }
  }

  /** Writes the decision (and queue item), consuming its budgets; or finds the one to replay. */
  private recordRow(
    r: RecordArgs,
  ):
    | { replay: DecisionRecord }
    | { capped: true }
    | { decision: DecisionRecord; event: NewAuditEvent; exhausted?: LimitUse } {
    const { decision } = r;
    if (decision.idem_key !== null) {
      const prior = this.byIdem.get(decision.key_id, decision.idem_key) as Row | undefined;
      if (prior && (prior.created_at as string) >= r.idemSince) return { replay: decisionFromRow(prior) };
      // An expired key may be used again: the old decision keeps its row but loses the key.
      if (prior) this.clearIdem.run(decision.key_id, decision.idem_key);
    }
    let chosen = { decision, event: r.event, item: r.item };
    let exhausted: LimitUse | undefined;
    if (r.charge && r.charge.limits.length > 0) {
      exhausted = this.limits.tryConsume(r.charge.limits);
      if (exhausted) {
        const denial = r.charge.denials[r.charge.limits.indexOf(exhausted)];
        if (!denial) throw new Error('a limit was charged without its denial');
        chosen = { ...denial, item: undefined };
      }
    }
    // The key's pending items, this batch's earlier ones included (inserted above in order). Over
    // the cap, nothing is written: the caller records the deny next.
    const cap = r.pendingCap;
    if (chosen.item && cap !== undefined) {
      const pending = this.pendingOfKey.get(chosen.item.requested_by, chosen.item.created_at, cap) as number;
      if (overPendingCap(cap, pending)) return { capped: true };
    }
    this.insertDecision.run(decisionToRow(chosen.decision));
    if (chosen.item) this.insertQueue.run(queueToRow(chosen.item));
    return { decision: chosen.decision, event: chosen.event, ...(exhausted ? { exhausted } : {}) };
  }
}

/** Commits batches of decisions, in this thread or another; settles after the commit. */
export interface BatchCommitter {
  commit(batch: RecordArgs[]): Promise<RecordOutcome[]>;
  /** CPU seconds of the thread that commits, when it is a thread of its own. */
  cpuSeconds?(): Promise<number | undefined>;
  close(): Promise<void>;
}

/** Commits on the calling thread (the event loop waits for each fsync). */
export function inProcessCommitter(writer: DecisionWriter): BatchCommitter {
  return {
    commit: async (batch) => writer.recordBatch(batch),
    close: async () => undefined,
  };
}

/**
 * Decisions: recorded through group commit (src/storage/group-commit.ts) by `committer`, on this
 * connection or the writer thread's; read on this connection.
 */
export class SqliteDecisionStore implements DecisionStore {
  private readonly group: GroupCommit<RecordArgs, RecordOutcome>;
  private readonly byIdem: Statement;
  private readonly byId: Statement;
  private readonly tallies: Statement;
  private readonly samples: Statement;
  constructor(
    db: Db,
    private readonly committer: BatchCommitter,
    onBatch?: (size: number, seconds: number) => void,
  ) {
    this.group = new GroupCommit((batch) => this.committer.commit(batch), onBatch);
    this.byIdem = db.prepare('SELECT * FROM decisions WHERE key_id = ? AND idem_key = ?');
    this.byId = db.prepare('SELECT * FROM decisions WHERE request_id = ?');
    this.tallies = db.prepare('SELECT result, live, shadow, n FROM shadow_tallies WHERE generation = ?');
    this.samples = db.prepare(
      'SELECT request_id, live, shadow FROM shadow_samples WHERE generation = ? ORDER BY seq DESC LIMIT ?',
    );
  }

  async shadowTally(generation: number): Promise<ShadowTally> {
    return {
      counts: this.tallies.all(generation) as ShadowCount[],
      samples: this.samples.all(generation, SHADOW_SAMPLES) as ShadowSample[],
    };
  }

  record(r: DecisionToRecord): Promise<RecordOutcome> {
    return this.group.submit(r);
  }

  async findByIdempotencyKey(
    keyId: string,
    idemKey: string,
    since: string,
  ): Promise<DecisionRecord | undefined> {
    const r = this.byIdem.get(keyId, idemKey) as Row | undefined;
    return r && (r.created_at as string) >= since ? decisionFromRow(r) : undefined;
  }

  async get(requestId: string): Promise<DecisionRecord | undefined> {
    const r = this.byId.get(requestId) as Row | undefined;
    return r && decisionFromRow(r);
  }
}

export class SqliteLimitStore implements LimitStore {
  constructor(private readonly db: Db) {}

  async latest(key: string | undefined): Promise<LimitCounter[]> {
    const rows = this.db
      .prepare(
        `SELECT c.key, c.window, c.window_ms AS windowMs, c.window_start AS windowStart, c.used, c.max
         FROM limit_counters c
         WHERE (@key IS NULL OR c.key = @key) AND c.window_start = (SELECT max(window_start) FROM limit_counters
           WHERE key = c.key AND window_ms = c.window_ms)
         ORDER BY c.key, c.window_ms`,
      )
      .all({ key: key ?? null }) as LimitCounter[];
    return rows;
  }

  async counterKeys(
    after: string | null,
    limit: number,
  ): Promise<{ first: string; last: string; windowLengths: number[] } | undefined> {
    const keys = this.db
      .prepare(
        'SELECT DISTINCT key FROM limit_counters WHERE @after IS NULL OR key > @after ORDER BY key LIMIT @limit',
      )
      .pluck()
      .all({ after, limit }) as string[];
    if (keys.length === 0) return undefined;
    const range = { first: keys[0] as string, last: keys[keys.length - 1] as string };
    const windowLengths = this.db
      .prepare('SELECT DISTINCT window_ms FROM limit_counters WHERE key >= @first AND key <= @last')
      .pluck()
      .all(range) as number[];
    return { ...range, windowLengths };
  }

  async pruneSuperseded(
    range: { first: string; last: string },
    windowMs: number,
    since: string,
  ): Promise<number> {
    // A range of the primary key: a short write transaction.
    return this.db
      .prepare(
        `DELETE FROM limit_counters AS c
         WHERE c.key >= @first AND c.key <= @last AND c.window_ms = @windowMs AND EXISTS (
           SELECT 1 FROM limit_counters n
           WHERE n.key = c.key AND n.window_ms = c.window_ms AND n.window_start > c.window_start
             AND n.window_start < @since)`,
      )
      .run({ first: range.first, last: range.last, windowMs, since }).changes;
  }
}
