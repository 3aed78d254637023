import type { NewAuditEvent } from '../../audit/types.js';
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
import type { LimitUse, QueueItem } from '../../queue/types.js';
import { chargesOf, counterOf } from '../../decisions/limits.js';
import {
  overPendingCap,
  recordedEvent,
  SHADOW_SAMPLES,
  shadowedOf,
  shadowMarksOf,
} from '../../decisions/store.js';
import { decisionFromRow, decisionToRow, queueToRow, type Row } from '../rows.js';
import { GroupCommit } from '../group-commit.js';
import type { PgChain } from './chain.js';
import { one, rows, tx, type Client, type Pool } from './pool.js';

const DECISION_COLUMNS = [
  'request_id',
  'kind',
  'status',
  'key_id',
  'tenant_id',
  'subject',
  'action',
  'resource',
  'message',
  'trace_id',
  'created_at',
  'expires_at',
  'idem_key',
  'body_hash',
  'token_id',
  'request_digest',
  'policy_revision',
  'user_id',
] as const;

export const QUEUE_COLUMNS = [
  'id',
  'status',
  'kind',
  'agent_id',
  'user_id',
  'tenant_id',
  'action',
  'resource',
  'confidence',
  'context',
  'message',
  'trace_id',
  'created_at',
  'expires_at',
  'decided_at',
  'decided_by',
  'note',
  'requested_by',
  'request_digest',
  'policy_revision',
  'on_behalf_of',
  'limits',
] as const;

/** INSERT … SELECT * FROM unnest(…) of many rows in one statement (fixed SQL, values as parameters). */
async function insertMany(
  c: Client,
  table: string,
  columns: readonly string[],
  types: Record<string, string>,
  records: Row[],
): Promise<void> {
  if (records.length === 0) return;
  const arrays = columns.map((col) => records.map((r) => r[col] ?? null));
  const casts = columns.map((col, i) => `$${i + 1}::${types[col] ?? 'text'}[]`);
  await c.query(
    `INSERT INTO ${table} (${columns.join(', ')}) SELECT * FROM unnest(${casts.join(', ')})`,
    arrays,
  );
}

export async function insertQueueItems(c: Client, items: QueueItem[]): Promise<void> {
  await insertMany(
    c,
    'queue_items',
    QUEUE_COLUMNS,
    { confidence: 'float8', policy_revision: 'int8' },
    items.map(queueToRow),
  );
}

/**
 * Adds a batch's shadowed decisions to their generations' tallies (SPEC §11), in the batch's
 * transaction (batches are serialized by the chain head lock).
 */
async function recordShadow(c: Client, recorded: Parameters<typeof shadowMarksOf>[0]): Promise<void> {
  const { counts, samples } = shadowMarksOf(recorded);
  if (counts.length === 0) return;
  await c.query(
    `INSERT INTO shadow_tallies (generation, result, live, shadow, n)
     SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::int8[])
     ON CONFLICT (generation, result, live, shadow) DO UPDATE SET n = shadow_tallies.n + excluded.n`,
    [
      counts.map((x) => x.generation),
      counts.map((x) => x.result),
      counts.map((x) => x.live),
      counts.map((x) => x.shadow),
      counts.map((x) => x.n),
    ],
  );
  if (samples.length === 0) return;
  await c.query(
    `INSERT INTO shadow_samples (generation, request_id, live, shadow)
     SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[])`,
    [
      samples.map((x) => x.generation),
      samples.map((x) => x.request_id),
      samples.map((x) => x.live),
      samples.map((x) => x.shadow),
    ],
  );
  for (const generation of new Set(samples.map((x) => x.generation))) {
    await c.query(
      `DELETE FROM shadow_samples WHERE generation = $1 AND seq <=
       (SELECT seq FROM shadow_samples WHERE generation = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)`,
      [generation, SHADOW_SAMPLES],
    );
  }
}

/**
 * Budget counters in the caller's transaction (which holds the chain head, so no other writer of
 * any process consumes between check and write): all or nothing, the first exhausted one reported,
 * by the rule of chargesOf (the same on SQLite).
 */
export async function tryConsume(c: Client, limits: readonly LimitUse[]): Promise<LimitUse | undefined> {
  if (limits.length === 0) return undefined;
  const current = await rows<{ key: string; window_ms: number; window_start: string; used: number }>(
    c,
    `SELECT key, window_ms, window_start, used FROM limit_counters WHERE (key, window_ms, window_start) IN
     (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]))`,
    [limits.map((l) => l.key), limits.map((l) => l.windowMs), limits.map((l) => l.windowStart)],
  );
  const used = new Map(
    current.map((r) => [
      counterOf({ key: r.key, windowMs: r.window_ms, windowStart: r.window_start }),
      r.used,
    ]),
  );
  const r = chargesOf(limits, (l) => used.get(counterOf(l)) ?? 0);
  if ('exhausted' in r) return r.exhausted;
  for (const l of r.charges) {
    await c.query(
      `INSERT INTO limit_counters (key, window_ms, window_start, "window", max, used) VALUES ($1, $2, $3, $4, $5, $6)
       ON CONFLICT (key, window_ms, window_start) DO UPDATE SET used = limit_counters.used + excluded.used,
         max = excluded.max`,
      [l.key, l.windowMs, l.windowStart, l.window, l.max, l.cost],
    );
  }
  return undefined;
}

/**
 * How many pending, unexpired approvals each requesting key of the batch's capped items has (up to
 * its cap), in the caller's transaction (which holds the chain head, so no other writer adds one
 * meanwhile). Expiry is taken at the batch's earliest item: an item expiring within the batch's
 * own milliseconds still counts, which can only cap sooner.
 */
async function pendingOfKeys(c: Client, batch: readonly DecisionToRecord[]): Promise<Map<string, number>> {
  const caps = new Map<string, number>();
  let now: string | undefined;
  for (const r of batch) {
    if (!r.item || r.pendingCap === undefined) continue;
    caps.set(r.item.requested_by, Math.max(caps.get(r.item.requested_by) ?? 0, r.pendingCap));
    if (now === undefined || r.item.created_at < now) now = r.item.created_at;
  }
  if (now === undefined) return new Map();
  const found = await rows<{ key: string; n: number }>(
    c,
    `SELECT k.key, (SELECT count(*)::int FROM (SELECT 1 FROM queue_items q WHERE q.requested_by = k.key
       AND q.status = 'pending' AND q.expires_at > $3 LIMIT k.max) s) AS n
     FROM unnest($1::text[], $2::int[]) AS k(key, max)`,
    [[...caps.keys()], [...caps.values()], now],
  );
  return new Map(found.map((r) => [r.key, r.n]));
}

/**
 * Decisions on PostgreSQL: each batch (group commit) is one transaction that locks the chain head
 * first, so batches from every process are serialized, and idempotency and budgets are resolved
 * exactly, in order.
 */
export class PgDecisionStore implements DecisionStore {
  private readonly group: GroupCommit<DecisionToRecord, RecordOutcome>;
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
    onBatch?: (size: number, seconds: number) => void,
  ) {
    this.group = new GroupCommit((batch) => tx(this.pool, (c) => this.recordBatch(c, batch)), onBatch);
  }

  record(r: DecisionToRecord): Promise<RecordOutcome> {
    return this.group.submit(r);
  }

  async shadowTally(generation: number): Promise<ShadowTally> {
    const [counts, samples] = await Promise.all([
      rows<Omit<ShadowCount, 'n'> & { n: string | number }>(
        this.pool,
        'SELECT result, live, shadow, n FROM shadow_tallies WHERE generation = $1',
        [generation],
      ),
      rows<ShadowSample>(
        this.pool,
        'SELECT request_id, live, shadow FROM shadow_samples WHERE generation = $1 ORDER BY seq DESC LIMIT $2',
        [generation, SHADOW_SAMPLES],
      ),
    ]);
    return { counts: counts.map((c) => ({ ...c, n: Number(c.n) })), samples };
  }

  private async recordBatch(c: Client, batch: DecisionToRecord[]): Promise<RecordOutcome[]> {
    const head = await this.chain.lockHead(c);
    const keyed = batch.filter((r) => r.decision.idem_key !== null).map((r) => r.decision);
    const prior = new Map<string, DecisionRecord>();
    if (keyed.length > 0) {
      const found = await rows<Row>(
        c,
        `SELECT * FROM decisions WHERE (key_id, idem_key) IN
         (SELECT * FROM unnest($1::text[], $2::text[]))`,
        [keyed.map((d) => d.key_id), keyed.map((d) => d.idem_key)],
      );
      for (const r of found) prior.set(`${String(r.key_id)}\n${String(r.idem_key)}`, decisionFromRow(r));
    }
    const pending = await pendingOfKeys(c, batch);
    type Chosen = { decision: DecisionRecord; event: NewAuditEvent; exhausted?: LimitUse };
    const chosen: ({ replay: DecisionRecord } | { capped: true } | Chosen)[] = [];
    const decisions: DecisionRecord[] = [];
    const items: QueueItem[] = [];
    const expiredKeys: DecisionRecord[] = [];
    for (const r of batch) {
      const { decision } = r;
      if (decision.idem_key !== null) {
        const k = `${decision.key_id}\n${decision.idem_key}`;
        const p = prior.get(k);
        if (p && p.created_at >= r.idemSince) {
          chosen.push({ replay: p });
          continue;
        }
        // An expired key may be used again: the old decision keeps its row but loses the key.
        if (p) expiredKeys.push(p);
      }
      let pick: Chosen & { item?: QueueItem | undefined } = { decision, event: r.event, item: r.item };
      if (r.charge && r.charge.limits.length > 0) {
        const exhausted = await tryConsume(c, r.charge.limits);
        if (exhausted) {
          const denial = r.charge.denials[r.charge.limits.indexOf(exhausted)];
          if (!denial) throw new Error('a limit was charged without its denial');
          pick = { ...denial, exhausted };
        }
      }
      // The key's pending items: those stored, and this batch's earlier ones (inserted below). Over
      // the cap, nothing is written: the caller records the deny next.
      const cap = r.pendingCap;
      if (pick.item && cap !== undefined) {
        const n = pending.get(pick.item.requested_by) ?? 0;
        if (overPendingCap(cap, n)) {
          chosen.push({ capped: true });
          continue;
        }
        pending.set(pick.item.requested_by, n + 1);
      }
      // A retry later in this batch replays the decision actually recorded (a budget's deny, not
      // the allow it replaced).
      if (decision.idem_key !== null) prior.set(`${decision.key_id}\n${decision.idem_key}`, pick.decision);
      decisions.push(pick.decision);
      if (pick.item) items.push(pick.item);
      chosen.push({
        decision: pick.decision,
        event: pick.event,
        ...(pick.exhausted ? { exhausted: pick.exhausted } : {}),
      });
    }
    if (expiredKeys.length > 0) {
      await c.query(
        `UPDATE decisions SET idem_key = NULL WHERE (key_id, idem_key) IN
         (SELECT * FROM unnest($1::text[], $2::text[]))`,
        [expiredKeys.map((d) => d.key_id), expiredKeys.map((d) => d.idem_key)],
      );
    }
    await insertMany(
      c,
      'decisions',
      DECISION_COLUMNS,
      { policy_revision: 'int8' },
      decisions.map(decisionToRow),
    );
    await insertQueueItems(c, items);
    const { events } = await this.chain.appendAfter(
      c,
      head,
      chosen.flatMap((x) => ('event' in x ? [x.event] : [])),
    );
    const shadowed = shadowedOf(batch, chosen);
    if (shadowed.length > 0) await recordShadow(c, shadowed);
    let next = 0;
    return chosen.map((x): RecordOutcome =>
      !('event' in x)
        ? x
        : {
            recorded: recordedEvent(events[next++]!),
            decision: x.decision,
            ...(x.exhausted ? { exhausted: x.exhausted } : {}),
          },
    );
  }

  async findByIdempotencyKey(keyId: string, idemKey: string, since: string) {
    const r = await one<Row>(this.pool, 'SELECT * FROM decisions WHERE key_id = $1 AND idem_key = $2', [
      keyId,
      idemKey,
    ]);
    return r && (r.created_at as string) >= since ? decisionFromRow(r) : undefined;
  }

  async get(requestId: string) {
    const r = await one<Row>(this.pool, 'SELECT * FROM decisions WHERE request_id = $1', [requestId]);
    return r && decisionFromRow(r);
  }
}

export class PgLimitStore implements LimitStore {
  constructor(private readonly pool: Pool) {}

  async latest(key: string | undefined): Promise<LimitCounter[]> {
    return rows<LimitCounter>(
      this.pool,
      `SELECT DISTINCT ON (key, window_ms) key, "window", window_ms AS "windowMs", window_start AS "windowStart",
         used, max
       FROM limit_counters WHERE ($1::text IS NULL OR key = $1)
       ORDER BY key, window_ms, window_start DESC`,
      [key ?? null],
    );
  }

  async counterKeys(
    after: string | null,
    limit: number,
  ): Promise<{ first: string; last: string; windowLengths: number[] } | undefined> {
    const keys = await rows<{ key: string }>(
      this.pool,
      'SELECT DISTINCT key FROM limit_counters WHERE $1::text IS NULL OR key > $1 ORDER BY key LIMIT $2',
      [after, limit],
    );
    if (keys.length === 0) return undefined;
    const range = { first: keys[0]!.key, last: keys[keys.length - 1]!.key };
    const lengths = await rows<{ window_ms: number | string }>(
      this.pool,
      'SELECT DISTINCT window_ms FROM limit_counters WHERE key >= $1 AND key <= $2',
      [range.first, range.last],
    );
    return { ...range, windowLengths: lengths.map((x) => Number(x.window_ms)) };
  }

  async pruneSuperseded(
    range: { first: string; last: string },
    windowMs: number,
    since: string,
  ): Promise<number> {
    const r = await this.pool.query(
      `DELETE FROM limit_counters c
       WHERE c.key >= $1 AND c.key <= $2 AND c.window_ms = $3 AND EXISTS (
         SELECT 1 FROM limit_counters n
         WHERE n.key = c.key AND n.window_ms = c.window_ms AND n.window_start > c.window_start
           AND n.window_start < $4)`,
      [range.first, range.last, windowMs, since],
    );
    return r.rowCount ?? 0;
  }
}
