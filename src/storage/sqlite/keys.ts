import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type { ApiKeyRecord, KeyRevokeEvents, KeyStore } from '../../keys/types.js';
import { keyFromRow, tokenFromRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

/** Keys remembered at most; past it the cache starts again (a cache, never a limit on keys). */
const KEY_CACHE_MAX = 10_000;

/**
 * API keys. Lookups by id (every authenticated request) are cached for as long as nothing has
 * been committed to the database since they were read: SQLite's `PRAGMA data_version` changes
 * whenever any other connection (the writer thread, the CLI, another process) commits, and this
 * connection's own key changes clear the cache as they commit. A revocation is therefore seen by
 * the very next request, from any process; the cost is one pragma per request instead of a row
 * read and decode (docs/performance.md).
 */
export class SqliteKeyStore implements KeyStore {
  private readonly byId: Statement;
  private readonly dataVersion: Statement;
  private readonly cache = new Map<string, ApiKeyRecord>();
  private cachedAt: unknown = undefined;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM api_keys WHERE id = ?');
    this.dataVersion = db.prepare('PRAGMA data_version').pluck();
  }

  async create(rec: ApiKeyRecord, event: NewAuditEvent): Promise<'ok' | 'exists'> {
    return this.db
      .transaction(() => {
        if (this.db.prepare('SELECT 1 FROM api_keys WHERE name = ?').get(rec.name)) return 'exists' as const;
        this.db
          .prepare(
            `INSERT INTO api_keys (id, name, hash, scopes, tenant, agent, created_at, revoked_at)
             VALUES (@id, @name, @hash, @scopes, @tenant, @agent, @created_at, @revoked_at)`,
          )
          .run({ ...rec, scopes: JSON.stringify(rec.scopes) });
        this.writer.appendInTx([event]);
        return 'ok' as const;
      })
      .immediate();
  }

  async findById(id: string): Promise<ApiKeyRecord | undefined> {
    const version = this.dataVersion.get();
    if (version !== this.cachedAt || this.cache.size >= KEY_CACHE_MAX) {
      this.cache.clear();
      this.cachedAt = version;
    }
    const hit = this.cache.get(id);
    if (hit) return hit;
    const r = this.byId.get(id) as Row | undefined;
    if (!r) return undefined;
    const rec = Object.freeze(keyFromRow(r));
    this.cache.set(id, rec);
    return rec;
  }

  async findByName(name: string): Promise<ApiKeyRecord | undefined> {
    const r = this.db.prepare('SELECT * FROM api_keys WHERE name = ?').get(name) as Row | undefined;
    return r && keyFromRow(r);
  }

  async list(): Promise<ApiKeyRecord[]> {
    return (this.db.prepare('SELECT * FROM api_keys ORDER BY created_at, name').all() as Row[]).map(
      keyFromRow,
    );
  }

  async revoke(
    name: string,
    at: string,
    events: KeyRevokeEvents,
  ): Promise<{ key: ApiKeyRecord; tokensRevoked: number } | undefined> {
    // This connection's own commit does not change its data_version: forget every cached key,
    // whether or not the transaction commits (synchronous: no request runs in between).
    try {
      return this.revokeInTx(name, at, events);
    } finally {
      this.cache.clear();
    }
  }

  private revokeInTx(
    name: string,
    at: string,
    events: KeyRevokeEvents,
  ): { key: ApiKeyRecord; tokensRevoked: number } | undefined {
    return this.db
      .transaction(() => {
        const r = this.db.prepare('SELECT * FROM api_keys WHERE name = ?').get(name) as Row | undefined;
        if (!r) return undefined;
        let tokensRevoked = 0;
        if (r.revoked_at === null) {
          this.db.prepare('UPDATE api_keys SET revoked_at = ? WHERE name = ?').run(at, name);
          const tokens = (
            this.db
              .prepare(
                `UPDATE tokens SET revoked_at = ? WHERE minted_by = ? AND expires_at > ? AND revoked_at IS NULL
                 RETURNING *`,
              )
              .all(at, name, at) as Row[]
          ).map(tokenFromRow);
          tokensRevoked = tokens.length;
          this.writer.appendInTx([...tokens.map(events.token), events.key(tokensRevoked, keyFromRow(r))]);
          r.revoked_at = at;
        }
        return { key: keyFromRow(r), tokensRevoked };
      })
      .immediate();
  }
}
