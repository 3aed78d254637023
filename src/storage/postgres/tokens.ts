import type { NewAuditEvent } from '../../audit/types.js';
import type {
  MintRefusal,
  RotationOutcome,
  RotationPlan,
  SigningKeyRecord,
  TokenRecord,
  TokenState,
  TokenStore,
} from '../../tokens/types.js';
import { tokenFromRow, tokenToRow, type Row } from '../rows.js';
import { notify, type PgChain } from './chain.js';
import { one, rows, tx, type Client, type Pool } from './pool.js';

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
  'signing_kid',
  'agent_id',
  'user_id',
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

  async ensureSigningKey(create: () => Promise<SigningKeyRecord>): Promise<void> {
    if (await one(this.pool, 'SELECT 1 FROM signing_keys LIMIT 1')) return;
    const fresh = await create();
    // Processes starting together take turns: the first key stored is every process's key.
    await tx(this.pool, async (c) => {
      await c.query('SELECT pg_advisory_xact_lock($1)', [SIGNING_KEY_LOCK]);
      if (await one(c, 'SELECT 1 FROM signing_keys LIMIT 1')) return;
      await insertKey(c, fresh);
    });
  }

  async signingKeys(): Promise<SigningKeyRecord[]> {
    return rows<SigningKeyRecord>(this.pool, 'SELECT * FROM signing_keys ORDER BY created_at DESC, kid DESC');
  }

  async rotateSigningKey(fresh: SigningKeyRecord, plan: RotationPlan): Promise<RotationOutcome | undefined> {
    return tx(this.pool, async (c) => {
      // After the chain head: a mint (which holds it too) has committed under the old key, or
      // waits and then finds its key retired.
      const head = await this.chain.lockHead(c);
      const previous = await one<SigningKeyRecord>(
        c,
        'SELECT * FROM signing_keys WHERE retired_at IS NULL ORDER BY created_at DESC LIMIT 1',
      );
      if (!previous) return undefined;
      const at = fresh.created_at;
      const oldest = await one<{ kid: string }>(
        c,
        'SELECT kid FROM signing_keys ORDER BY created_at, kid LIMIT 1',
      );
      // Tokens minted before signing_kid existed were signed by the oldest key.
      const signedBy = `(signing_kid = $1 OR (signing_kid IS NULL AND $1 = $2))
        AND expires_at > $3 AND revoked_at IS NULL`;
      const events: NewAuditEvent[] = [];
      /** Revokes the live tokens `kid` signed, each with its event; how many. */
      const revokeSignedBy = async (kid: string): Promise<number> => {
        const revoked = (
          await rows<Row>(c, `UPDATE tokens SET revoked_at = $3 WHERE ${signedBy} RETURNING *`, [
            kid,
            oldest?.kid ?? null,
            at,
          ])
        ).map(tokenFromRow);
        events.push(...revoked.map((t) => plan.token(t, kid)));
        return revoked.length;
      };
      let tokensRevoked = 0;
      let alsoRevoked: string[] = [];
      let verifyUntil: string;
      if (plan.revokePrevious) {
        tokensRevoked = await revokeSignedBy(previous.kid);
        alsoRevoked = (
          await rows<{ kid: string }>(
            c,
            'SELECT kid FROM signing_keys WHERE retired_at IS NOT NULL AND verify_until > $1 ORDER BY created_at, kid',
            [at],
          )
        ).map((r) => r.kid);
        for (const kid of alsoRevoked) {
          tokensRevoked += await revokeSignedBy(kid);
          await c.query('UPDATE signing_keys SET verify_until = $1 WHERE kid = $2', [at, kid]);
        }
        verifyUntil = at;
      } else {
        const latest = await one<{ latest: string | null }>(
          c,
          `SELECT max(expires_at) AS latest FROM tokens WHERE ${signedBy}`,
          [previous.kid, oldest?.kid ?? null, at],
        );
        verifyUntil = plan.verifyUntil(latest?.latest ?? null);
      }
      await c.query('UPDATE signing_keys SET retired_at = $1, verify_until = $2 WHERE kid = $3', [
        at,
        verifyUntil,
        previous.kid,
      ]);
      await insertKey(c, fresh);
      const retired = { ...previous, retired_at: at, verify_until: verifyUntil };
      events.push(plan.rotate(retired, tokensRevoked, alsoRevoked));
      await this.chain.appendAfter(c, head, events);
      await notify(c, { topic: 'signing_keys' });
      return { previous: retired, tokensRevoked, alsoRevoked };
    });
  }

  async exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | MintRefusal> {
    return tx(this.pool, async (c) => {
      // After the chain head: a key revocation or a signing-key rotation (which hold it too) has
      // committed or waits.
      const head = await this.chain.lockHead(c);
      const refused = await refusal(c, token);
      if (refused) return refused;
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

  async insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | MintRefusal> {
    return tx(this.pool, async (c) => {
      const head = await this.chain.lockHead(c);
      const refused = await refusal(c, token);
      if (refused) return refused;
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

  async tokenState(id: string): Promise<TokenState | undefined> {
    return one<TokenState>(
      this.pool,
      'SELECT revoked_at, signing_kid, expires_at, tenant_id, agent_id FROM tokens WHERE id = $1',
      [id],
    );
  }
}

/**
 * Why the mint of `token` must write nothing now, if it must: the API key that mints it is revoked
 * (the admin principal has no row: never), or the key that signed it is no longer the active one.
 */
async function refusal(c: Client, token: TokenRecord): Promise<MintRefusal | undefined> {
  const r = await c.query('SELECT 1 FROM api_keys WHERE name = $1 AND revoked_at IS NOT NULL', [
    token.minted_by,
  ]);
  if ((r.rowCount ?? 0) > 0) return 'key_revoked';
  const active = await c.query('SELECT 1 FROM signing_keys WHERE kid = $1 AND retired_at IS NULL', [
    token.signing_kid ?? null,
  ]);
  return (active.rowCount ?? 0) > 0 ? undefined : 'signing_key_retired';
}

async function insertKey(c: Client, k: SigningKeyRecord): Promise<void> {
  await c.query(
    `INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at, retired_at, verify_until)
     VALUES ($1, $2, $3, $4, $5, $6)`,
    [k.kid, k.private_jwk, k.public_jwk, k.created_at, k.retired_at, k.verify_until],
  );
}
