import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type { ApiKeyRecord, KeyStore } from '../../keys/types.js';
import { keyFromRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

export class SqliteKeyStore implements KeyStore {
  private readonly byId: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM api_keys WHERE id = ?');
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
    const r = this.byId.get(id) as Row | undefined;
    return r && keyFromRow(r);
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

  async revoke(name: string, at: string, event: NewAuditEvent): Promise<ApiKeyRecord | undefined> {
    return this.db
      .transaction(() => {
        const r = this.db.prepare('SELECT * FROM api_keys WHERE name = ?').get(name) as Row | undefined;
        if (!r) return undefined;
        if (r.revoked_at === null) {
          this.db.prepare('UPDATE api_keys SET revoked_at = ? WHERE name = ?').run(at, name);
          this.writer.appendInTx([event]);
          r.revoked_at = at;
        }
        return keyFromRow(r);
      })
      .immediate();
  }
}
