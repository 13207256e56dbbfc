//! API tokens: stored only as hashes.

use crate::domain::{CiTrustId, TeamId, TokenId, UserId};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored token, without its secret.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenRow {
    pub id: TokenId,
    pub team_id: TeamId,
    pub name: String,
    pub role: String,
    pub display_prefix: String,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// What authenticating a token yields.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    pub id: TokenId,
    pub name: String,
    pub role: String,
    /// The token's team, read with it: its own team's routes need not read it again.
    pub team: super::teams::TeamRow,
    /// The catalogue's version at this moment (see `db::jobs::submit_catalogue`).
    pub catalogue_version: i64,
}

/// A token to store.
#[derive(Debug)]
pub struct NewToken<'a> {
    pub team_id: TeamId,
    pub name: &'a str,
    pub role: &'a str,
    pub token_hash: &'a [u8],
    pub display_prefix: &'a str,
    /// The user who minted it; `None` for a token a pipeline exchanged its ID token for.
    pub created_by: Option<UserId>,
    pub expires_at: DateTime<Utc>,
    /// The trust policy a pipeline's ID token was exchanged under, if it was.
    pub ci_trust_id: Option<CiTrustId>,
}

/// Stores a new token.
pub async fn insert(tx: &mut Tx<'_>, token: &NewToken<'_>) -> Result<TokenRow, sqlx::Error> {
    sqlx::query_as!(
        TokenRow,
        r#"with t as (
               insert into api_tokens (id, team_id, name, role, token_hash, display_prefix, created_by, expires_at,
                                       ci_trust_id)
               values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
               returning *
           )
           select t.id, t.team_id, t.name, t.role, t.display_prefix, u.username as "created_by?",
                  t.created_at, t.expires_at, t.last_used_at, t.revoked_at
           from t left join users u on u.id = t.created_by"#,
        TokenId::new() as TokenId,
        token.team_id as TeamId,
        token.name,
        token.role,
        token.token_hash,
        token.display_prefix,
        token.created_by as Option<UserId>,
        token.expires_at,
        token.ci_trust_id as Option<CiTrustId>
    )
    .fetch_one(&mut **tx)
    .await
}

/// Tokens of `team_id`, newest first, after the token `after`.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    after: Option<TokenId>,
    limit: i64,
) -> Result<Vec<TokenRow>, sqlx::Error> {
    sqlx::query_as!(
        TokenRow,
        r#"select t.id, t.team_id, t.name, t.role, t.display_prefix, u.username as "created_by?",
                  t.created_at, t.expires_at, t.last_used_at, t.revoked_at
           from api_tokens t left join users u on u.id = t.created_by
           where t.team_id = $1 and ($2::uuid is null or t.id > $2)
           order by t.id limit $3"#,
        team_id as TeamId,
        after as Option<TokenId>,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The token `id` of `team_id`, locked for update.
pub async fn get_for_update(tx: &mut Tx<'_>, team_id: TeamId, id: TokenId) -> Result<Option<TokenRow>, sqlx::Error> {
    sqlx::query_as!(
        TokenRow,
        r#"select t.id, t.team_id, t.name, t.role, t.display_prefix, u.username as "created_by?",
                  t.created_at, t.expires_at, t.last_used_at, t.revoked_at
           from api_tokens t left join users u on u.id = t.created_by
           where t.team_id = $1 and t.id = $2
           for update of t"#,
        team_id as TeamId,
        id as TokenId
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Revokes a token from now on.
pub async fn revoke(tx: &mut Tx<'_>, team_id: TeamId, id: TokenId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update api_tokens set revoked_at = coalesce(revoked_at, now()) where team_id = $1 and id = $2",
        team_id as TeamId,
        id as TokenId
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Revokes the live tokens of `team_id` exchanged under the trust policy `trust_id`, from now
/// on; how many.
pub async fn revoke_exchanged_under(tx: &mut Tx<'_>, team_id: TeamId, trust_id: CiTrustId) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "update api_tokens set revoked_at = now()
         where team_id = $1 and ci_trust_id = $2 and revoked_at is null and expires_at > now()",
        team_id as TeamId,
        trust_id as CiTrustId
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// The live (unrevoked, unexpired) token with this hash, recording its use. The use is
/// written at most once a minute per token so busy pipelines do not turn reads into writes.
pub async fn authenticate(pool: &PgPool, token_hash: &[u8]) -> Result<Option<TokenAuth>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"select t.id as "id: TokenId", t.name, t.role,
                  (t.last_used_at is null or t.last_used_at < now() - interval '1 minute') as "stale!",
                  tm.id as "team_id: TeamId", tm.name as team_name, tm.parent_id as "parent_id: TeamId", p.name as "parent?", tm.display_name,
                  tm.created_at, tm.updated_at, tm.version,
                  (select v.version from catalogue_version v where v.id = 1) as "catalogue_version!"
           from api_tokens t
           join teams tm on tm.id = t.team_id
           left join teams p on p.id = tm.parent_id
           where t.token_hash = $1 and t.revoked_at is null and t.expires_at > now()"#,
        token_hash
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    if row.stale {
        sqlx::query!(
            "update api_tokens set last_used_at = now()
             where id = $1 and (last_used_at is null or last_used_at < now() - interval '1 minute')",
            row.id as TokenId
        )
        .execute(pool)
        .await?;
    }
    let team = super::teams::TeamRow {
        id: row.team_id,
        name: row.team_name,
        parent_id: row.parent_id,
        parent: row.parent,
        display_name: row.display_name,
        created_at: row.created_at,
        updated_at: row.updated_at,
        version: row.version,
    };
    Ok(Some(TokenAuth { id: row.id, name: row.name, role: row.role, team, catalogue_version: row.catalogue_version }))
}
