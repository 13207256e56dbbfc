//! Portal sessions.

use crate::domain::UserId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// A live session with its user.
#[derive(Debug, Clone)]
pub struct SessionUser {
    pub user_id: UserId,
    pub username: String,
    pub platform_role: Option<String>,
    pub csrf_token: String,
}

/// Stores a session; expired sessions are purged on the way. `signed_in_with` is the
/// provider and ID token of a single sign-on.
pub async fn create(
    pool: &PgPool,
    secret_hash: &[u8],
    user_id: UserId,
    csrf_token: &str,
    expires_at: DateTime<Utc>,
    signed_in_with: Option<(&str, &str)>,
) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from web_sessions where expires_at < now()").execute(pool).await?;
    sqlx::query!(
        "insert into web_sessions (secret_hash, user_id, csrf_token, expires_at, provider, id_token)
         values ($1, $2, $3, $4, $5, $6)",
        secret_hash,
        user_id as UserId,
        csrf_token,
        expires_at,
        signed_in_with.map(|(provider, _)| provider),
        signed_in_with.map(|(_, id_token)| id_token)
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The unexpired session with this secret hash, if its user is still enabled.
pub async fn find(pool: &PgPool, secret_hash: &[u8]) -> Result<Option<SessionUser>, sqlx::Error> {
    sqlx::query_as!(
        SessionUser,
        "select s.user_id, u.username, u.platform_role, s.csrf_token
         from web_sessions s join users u on u.id = s.user_id
         where s.secret_hash = $1 and s.expires_at > now() and not u.disabled",
        secret_hash
    )
    .fetch_optional(pool)
    .await
}

/// Ends a session; the provider it began with and its ID token, when it began with one
/// (what RP-initiated logout needs).
pub async fn delete(pool: &PgPool, secret_hash: &[u8]) -> Result<Option<(String, String)>, sqlx::Error> {
    let ended =
        sqlx::query!("delete from web_sessions where secret_hash = $1 returning provider, id_token", secret_hash)
            .fetch_optional(pool)
            .await?;
    Ok(ended.and_then(|row| row.provider.zip(row.id_token)))
}
