import type { NewAuditEvent } from '../../audit/types.js';
import type { ApiKeyRecord, KeyRevokeEvents, KeyStore } from '../../keys/types.js';
import { keyFromRow, tokenFromRow, type Row } from '../rows.js';
import { notify, type PgChain } from './chain.js';
import { one, rows, tx, type Pool } from './pool.js';

export class PgKeyStore implements KeyStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  async create(rec: ApiKeyRecord, event: NewAuditEvent): Promise<'ok' | 'exists'> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      // Under the head lock, key changes are serialized: a taken name is seen, not raced.
      if (await one(c, 'SELECT 1 FROM api_keys WHERE name = $1', [rec.name])) return 'exists' as const;
      await c.query(
        `INSERT INTO api_keys (id, name, hash, scopes, tenant, agent, created_at, revoked_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
        [
          rec.id,
          rec.name,
          rec.hash,
          JSON.stringify(rec.scopes),
          rec.tenant,
          rec.agent,
          rec.created_at,
          rec.revoked_at,
        ],
      );
      await this.chain.appendAfter(c, head, [event]);
      return 'ok' as const;
    });
  }

  async findById(id: string): Promise<ApiKeyRecord | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM api_keys WHERE id = $1', [id]);
    return r && keyFromRow(r);
  }

  async findByName(name: string): Promise<ApiKeyRecord | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM api_keys WHERE name = $1', [name]);
    return r && keyFromRow(r);
  }

  async list(): Promise<ApiKeyRecord[]> {
    return (await rows<Row>(this.pool, 'SELECT * FROM api_keys ORDER BY created_at, name')).map(keyFromRow);
  }

  async revoke(
    name: string,
    at: string,
    events: KeyRevokeEvents,
  ): Promise<{ key: ApiKeyRecord; tokensRevoked: number } | undefined> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const r = await one<Row>(c, 'SELECT * FROM api_keys WHERE name = $1', [name]);
      if (!r) return undefined;
      let tokensRevoked = 0;
      if (r.revoked_at === null) {
        await c.query('UPDATE api_keys SET revoked_at = $1 WHERE name = $2', [at, name]);
        const tokens = (
          await rows<Row>(
            c,
            `UPDATE tokens SET revoked_at = $1 WHERE minted_by = $2 AND expires_at > $1 AND revoked_at IS NULL
             RETURNING *`,
            [at, name],
          )
        ).map(tokenFromRow);
        tokensRevoked = tokens.length;
        await this.chain.appendAfter(c, head, [
          ...tokens.map(events.token),
          events.key(tokensRevoked, keyFromRow(r)),
        ]);
        await notify(c, { topic: 'keys' });
        r.revoked_at = at;
      }
      return { key: keyFromRow(r), tokensRevoked };
    });
  }
}
