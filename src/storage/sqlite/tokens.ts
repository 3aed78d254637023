import type { Statement } from 'better-sqlite3';
import type { NewAuditEvent } from '../../audit/types.js';
import type { SigningKeyRecord, TokenRecord, TokenStore } from '../../tokens/types.js';
import { tokenFromRow, tokenToRow, type Row } from '../rows.js';
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

export class SqliteTokenStore implements TokenStore {
  private readonly byId: Statement;
  private readonly revokedStmt: Statement;
  private readonly insertStmt: Statement;
  private readonly keyRevoked: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM tokens WHERE id = ?');
    this.revokedStmt = db.prepare('SELECT revoked_at FROM tokens WHERE id = ?');
    // The admin principal has no row: never revoked.
    this.keyRevoked = db.prepare('SELECT 1 FROM api_keys WHERE name = ? AND revoked_at IS NOT NULL').pluck();
    this.insertStmt =
      db.prepare(`INSERT INTO tokens (id, request_id, subject, scopes, audience, tenant_id, issued_at,
      expires_at, revoked_at, minted_by, trace_id, request_digest, policy_revision) VALUES (@id, @request_id, @subject,
      @scopes, @audience, @tenant_id, @issued_at, @expires_at, @revoked_at, @minted_by, @trace_id, @request_digest,
      @policy_revision)`);
  }

  async signingKey(create: () => Promise<SigningKeyRecord>): Promise<SigningKeyRecord> {
    const existing = this.db.prepare('SELECT * FROM signing_keys ORDER BY created_at LIMIT 1').get() as
      SigningKeyRecord | undefined;
    if (existing) return existing;
    const fresh = await create();
    return this.db
      .transaction(() => {
        // Another process may have won the race: the first key stored is the key.
        const won = this.db.prepare('SELECT * FROM signing_keys ORDER BY created_at LIMIT 1').get() as
          SigningKeyRecord | undefined;
        if (won) return won;
        this.db
          .prepare(
            'INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at) VALUES (@kid, @private_jwk, @public_jwk, @created_at)',
          )
          .run(fresh);
        return fresh;
      })
      .immediate();
  }

  async exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | 'key_revoked'> {
    return this.db
      .transaction(() => {
        if (this.keyRevoked.get(token.minted_by)) return 'key_revoked' as const;
        const changed = this.db
          .prepare('UPDATE decisions SET token_id = ? WHERE request_id = ? AND token_id IS NULL')
          .run(token.id, requestId).changes;
        if (changed !== 1) return 'already' as const;
        this.insertStmt.run(tokenToRow(token));
        this.writer.appendInTx([event]);
        return 'ok' as const;
      })
      .immediate();
  }

  async insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | 'key_revoked'> {
    return this.db
      .transaction(() => {
        if (this.keyRevoked.get(token.minted_by)) return 'key_revoked' as const;
        this.insertStmt.run(tokenToRow(token));
        this.writer.appendInTx([event]);
        return 'ok' as const;
      })
      .immediate();
  }

  async get(id: string): Promise<TokenRecord | undefined> {
    const r = this.byId.get(id) as Row | undefined;
    return r && tokenFromRow(r);
  }

  async revoke(
    id: string,
    at: string,
    event: (t: TokenRecord) => NewAuditEvent,
  ): Promise<TokenRecord | undefined> {
    return this.db
      .transaction(() => {
        const r = this.byId.get(id) as Row | undefined;
        if (!r) return undefined;
        const t = tokenFromRow(r);
        if (t.revoked_at !== null) return t;
        this.db.prepare('UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL').run(at, id);
        const revoked = { ...t, revoked_at: at };
        this.writer.appendInTx([event(revoked)]);
        return revoked;
      })
      .immediate();
  }

  async revokedAt(id: string): Promise<string | null | undefined> {
    const r = this.revokedStmt.get(id) as { revoked_at: string | null } | undefined;
    return r === undefined ? undefined : r.revoked_at;
  }
}
