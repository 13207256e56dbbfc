//! Single sign-on: users linked to a provider's subjects, and sign-ins under way.

use crate::domain::UserId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{users::UserRow, Tx};

/// The user linked to `subject` at `provider`, locked for the sign-in's changes.
pub async fn user_for_update(tx: &mut Tx<'_>, provider: &str, subject: &str) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select u.id, u.username, u.password_hash, u.platform_role, u.disabled, u.created_at
         from user_identities i join users u on u.id = i.user_id
         where i.provider = $1 and i.subject = $2
         for update of u",
        provider,
        subject
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Links `subject` at `provider` to `user_id`.
pub async fn link(tx: &mut Tx<'_>, provider: &str, subject: &str, user_id: UserId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into user_identities (provider, subject, user_id) values ($1, $2, $3)",
        provider,
        subject,
        user_id as UserId
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a sign-in through the link.
pub async fn touch(tx: &mut Tx<'_>, provider: &str, subject: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update user_identities set last_sign_in = now() where provider = $1 and subject = $2",
        provider,
        subject
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The providers each of `user_ids` is linked to, as `(user, provider)`.
pub async fn providers_of(pool: &PgPool, user_ids: &[UserId]) -> Result<Vec<(UserId, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select user_id as "user_id: UserId", provider from user_identities
           where user_id = any($1) order by provider"#,
        user_ids as &[UserId]
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.user_id, r.provider)).collect())
}

/// What a sign-in under way must find again when the provider sends the browser back.
#[derive(Debug, Clone)]
pub struct PendingSignIn {
    pub provider: String,
    pub nonce: String,
    pub verifier: String,
}

/// Keeps a sign-in under way by its state's hash; expired ones are purged on the way.
pub async fn begin(
    pool: &PgPool,
    state_hash: &[u8],
    pending: &PendingSignIn,
    expires_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from oidc_sign_ins where expires_at < now()").execute(pool).await?;
    sqlx::query!(
        "insert into oidc_sign_ins (state_hash, provider, nonce, verifier, expires_at) values ($1, $2, $3, $4, $5)",
        state_hash,
        pending.provider,
        pending.nonce,
        pending.verifier,
        expires_at
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes the unexpired sign-in with this state's hash: a second answer for the same sign-in
/// finds nothing.
pub async fn take(pool: &PgPool, state_hash: &[u8]) -> Result<Option<PendingSignIn>, sqlx::Error> {
    sqlx::query_as!(
        PendingSignIn,
        "delete from oidc_sign_ins where state_hash = $1 and expires_at > now()
         returning provider, nonce, verifier",
        state_hash
    )
    .fetch_optional(pool)
    .await
}
