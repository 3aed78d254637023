import type { Statement } from 'better-sqlite3';
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
import type { AuditWriter } from './audit.js';
import type { Db } from './db.js';

export class SqliteTokenStore implements TokenStore {
  private readonly byId: Statement;
  private readonly stateStmt: Statement;
  private readonly insertStmt: Statement;
  private readonly keyRevoked: Statement;
  private readonly signingKeyRetired: Statement;
  constructor(
    private readonly db: Db,
    private readonly writer: AuditWriter,
  ) {
    this.byId = db.prepare('SELECT * FROM tokens WHERE id = ?');
    this.stateStmt = db.prepare(
      'SELECT revoked_at, signing_kid, expires_at, tenant_id, agent_id FROM tokens WHERE id = ?',
    );
    // The admin principal has no row: never revoked.
    this.keyRevoked = db.prepare('SELECT 1 FROM api_keys WHERE name = ? AND revoked_at IS NOT NULL').pluck();
    // A token with no signing_kid is refused too: every mint names the key it signed with.
    this.signingKeyRetired = db
      .prepare('SELECT NOT EXISTS (SELECT 1 FROM signing_keys WHERE kid = ? AND retired_at IS NULL)')
      .pluck();
    this.insertStmt =
      db.prepare(`INSERT INTO tokens (id, request_id, subject, scopes, audience, tenant_id, issued_at,
      expires_at, revoked_at, minted_by, trace_id, request_digest, policy_revision, signing_kid, agent_id, user_id)
      VALUES (@id, @request_id, @subject, @scopes, @audience, @tenant_id, @issued_at, @expires_at, @revoked_at,
      @minted_by, @trace_id, @request_digest, @policy_revision, @signing_kid, @agent_id, @user_id)`);
  }

  async ensureSigningKey(create: () => Promise<SigningKeyRecord>): Promise<void> {
    const any = this.db.prepare('SELECT 1 FROM signing_keys LIMIT 1').pluck();
    if (any.get()) return;
    const fresh = await create();
    this.db
      .transaction(() => {
        // Another process may have won the race: the first key stored is the key.
        if (any.get()) return;
        this.insertKey(fresh);
      })
      .immediate();
  }

  async signingKeys(): Promise<SigningKeyRecord[]> {
    return this.db
      .prepare('SELECT * FROM signing_keys ORDER BY created_at DESC, kid DESC')
      .all() as SigningKeyRecord[];
  }

  async rotateSigningKey(fresh: SigningKeyRecord, plan: RotationPlan): Promise<RotationOutcome | undefined> {
    return this.db
      .transaction(() => {
        const previous = this.db
          .prepare('SELECT * FROM signing_keys WHERE retired_at IS NULL ORDER BY created_at DESC LIMIT 1')
          .get() as SigningKeyRecord | undefined;
        if (!previous) return undefined;
        const at = fresh.created_at;
        const oldest = this.db
          .prepare('SELECT kid FROM signing_keys ORDER BY created_at, kid LIMIT 1')
          .pluck()
          .get() as string;
        // Tokens minted before signing_kid existed were signed by the oldest key.
        const signedBy = `(signing_kid = @kid OR (signing_kid IS NULL AND @kid = @oldest))
          AND expires_at > @at AND revoked_at IS NULL`;
        const events: NewAuditEvent[] = [];
        /** Revokes the live tokens `kid` signed, each with its event; how many. */
        const revokeSignedBy = (kid: string): number => {
          const args = { kid, oldest, at };
          const live = (this.db.prepare(`SELECT * FROM tokens WHERE ${signedBy}`).all(args) as Row[]).map(
            tokenFromRow,
          );
          this.db.prepare(`UPDATE tokens SET revoked_at = @at WHERE ${signedBy}`).run(args);
          events.push(...live.map((t) => plan.token({ ...t, revoked_at: at }, kid)));
          return live.length;
        };
        let tokensRevoked = 0;
        let alsoRevoked: string[] = [];
        let verifyUntil: string;
        if (plan.revokePrevious) {
          tokensRevoked = revokeSignedBy(previous.kid);
          alsoRevoked = this.db
            .prepare(
              'SELECT kid FROM signing_keys WHERE retired_at IS NOT NULL AND verify_until > ? ORDER BY created_at, kid',
            )
            .pluck()
            .all(at) as string[];
          for (const kid of alsoRevoked) {
            tokensRevoked += revokeSignedBy(kid);
            this.db.prepare('UPDATE signing_keys SET verify_until = ? WHERE kid = ?').run(at, kid);
          }
          verifyUntil = at;
        } else {
          const latest = this.db
            .prepare(`SELECT max(expires_at) FROM tokens WHERE ${signedBy}`)
            .pluck()
            .get({ kid: previous.kid, oldest, at }) as string | null;
          verifyUntil = plan.verifyUntil(latest);
        }
        this.db
          .prepare('UPDATE signing_keys SET retired_at = ?, verify_until = ? WHERE kid = ?')
          .run(at, verifyUntil, previous.kid);
        this.insertKey(fresh);
        const retired = { ...previous, retired_at: at, verify_until: verifyUntil };
        events.push(plan.rotate(retired, tokensRevoked, alsoRevoked));
        this.writer.appendInTx(events);
        return { previous: retired, tokensRevoked, alsoRevoked };
      })
      .immediate();
  }

  private insertKey(k: SigningKeyRecord): void {
    this.db
      .prepare(
        `INSERT INTO signing_keys (kid, private_jwk, public_jwk, created_at, retired_at, verify_until)
         VALUES (@kid, @private_jwk, @public_jwk, @created_at, @retired_at, @verify_until)`,
      )
      .run(k);
  }

  /** Why the mint of `token` must write nothing now, if it must. */
  private refusal(token: TokenRecord): MintRefusal | undefined {
    if (this.keyRevoked.get(token.minted_by)) return 'key_revoked';
    if (this.signingKeyRetired.get(token.signing_kid ?? null)) return 'signing_key_retired';
    return undefined;
  }

  async exchange(
    requestId: string,
    token: TokenRecord,
    event: NewAuditEvent,
  ): Promise<'ok' | 'already' | MintRefusal> {
    return this.db
      .transaction(() => {
        const refused = this.refusal(token);
        if (refused) return refused;
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

  async insert(token: TokenRecord, event: NewAuditEvent): Promise<'ok' | MintRefusal> {
    return this.db
      .transaction(() => {
        const refused = this.refusal(token);
        if (refused) return refused;
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

  async tokenState(id: string): Promise<TokenState | undefined> {
    return this.stateStmt.get(id) as TokenState | undefined;
  }
}
