import type { NewAuditEvent } from '../../audit/types.js';
import type { SigningKeyRecord, TokenRecord, TokenStore } from '../../tokens/types.js';
import { tokenFromRow, tokenToRow, type Row } from '../rows.js';
import type { PgChain } from './chain.js';
import { one, tx, type Client, type Pool } from './pool.js';

/** Any fixed number: the advisory lock under which the first process creates the signing key. */
const SIGNING_KEY_LOCK = 7_106_652_482;

const TOKEN_COLUMNS = [
  'id',
  'request_id',
  'subject',
  'scopes',
  'audience',
  'tenant_id',
  'issued_at',
  'expires_at',
  'revoked_at',
  'minted_by',
  'trace_id',
  'request_digest',
  'policy_revision',
] as const;

async function insertToken(c: Client, t: TokenRecord): Promise<void> {
  const row = tokenToRow(t);
  await c.query(
    `INSERT INTO tokens (${TOKEN_COLUMNS.join(', ')}) VALUES (${TOKEN_COLUMNS.map((_, i) => `$${i + 1}`).join(', ')})`,
    TOKEN_COLUMNS.map((k) => row[k] ?? null),
  );
}

export class PgTokenStore implements TokenStore {
  constructor(
    private readonly pool: Pool,
    private readonly chain: PgChain,
  ) {}

  async signingKey(create: () => Promise<SigningKeyRecord>): Promise<SigningKeyRecord> {
    const first = () =>
      one<SigningKeyRecord>(this.pool, 'SELECT * FROM signing_keys ORDER BY created_at, kid LIMIT 1');
    const existing = await first();
    if (existing) return existing;
    const fresh = await create();
    // Processes starting together take turns: the first key stored is every process's key.
    return tx(this.pool, async (c) => {
      await c.query('SELECT pg_advisory_xact_lock($1)', [SIGNING_KEY_LOCK]);
      const won = await one<SigningKeyRecord>(
        c,
        'SELECT * FROM signing_keys ORDER BY created_at, kid LIMIT 1',
      );
      if (won) return won;
      await c.query(
        'INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at) VALUES ($1, $2, $3, $4)',
        [fresh.kid, fresh.private_jwk, fresh.public_jwk, fresh.created_at],
      );
      return fresh;
    });
  }

  async exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | 'key_revoked'> {
    return tx(this.pool, async (c) => {
      // After the chain head: a key revocation (which holds it too) has committed or waits.
      const head = await this.chain.lockHead(c);
      if (await keyRevoked(c, token.minted_by)) return 'key_revoked' as const;
      const changed = await c.query(
        'UPDATE decisions SET token_id = $1 WHERE request_id = $2 AND token_id IS NULL',
        [token.id, requestId],
      );
      if (changed.rowCount !== 1) return 'already' as const;
      await insertToken(c, token);
      await this.chain.appendAfter(c, head, [event]);
      return 'ok' as const;
    });
  }

  async insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | 'key_revoked'> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      if (await keyRevoked(c, token.minted_by)) return 'key_revoked' as const;
      await insertToken(c, token);
      await this.chain.appendAfter(c, head, [event]);
      return 'ok' as const;
    });
  }

  async get(id: string): Promise<TokenRecord | undefined> {
    const r = await one<Row>(this.pool, 'SELECT * FROM tokens WHERE id = $1', [id]);
    return r && tokenFromRow(r);
  }

  async revoke(
    id: string,
    at: string,
    event: (t: TokenRecord) => NewAuditEvent,
  ): Promise<TokenRecord | undefined> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const r = await one<Row>(c, 'SELECT * FROM tokens WHERE id = $1', [id]);
      if (!r) return undefined;
      const t = tokenFromRow(r);
      if (t.revoked_at !== null) return t;
      await c.query('UPDATE tokens SET revoked_at = $1 WHERE id = $2', [at, id]);
      const revoked = { ...t, revoked_at: at };
      await this.chain.appendAfter(c, head, [event(revoked)]);
      return revoked;
    });
  }

  async revokedAt(id: string): Promise<string | null | undefined> {
    const r = await one<{ revoked_at: string | null }>(
      this.pool,
      'SELECT revoked_at FROM tokens WHERE id = $1',
      [id],
    );
    return r === undefined ? undefined : r.revoked_at;
  }
}

/** Whether the API key of this name is revoked (the admin principal has no row: never). */
async function keyRevoked(c: Client, name: string): Promise<boolean> {
  const r = await c.query('SELECT 1 FROM api_keys WHERE name = $1 AND revoked_at IS NOT NULL', [name]);
  return (r.rowCount ?? 0) > 0;
}
