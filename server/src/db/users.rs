//! Users and their passwords.

use crate::domain::UserId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored user.
#[derive(Debug, Clone)]
pub struct UserRow {
    pub id: UserId,
    pub username: String,
    pub password_hash: String,
    pub platform_role: Option<String>,
    pub disabled: bool,
    pub created_at: DateTime<Utc>,
}

/// The user called `username`.
pub async fn by_username(pool: &PgPool, username: &str) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select id, username, password_hash, platform_role, disabled, created_at
         from users where username = $1",
        username
    )
    .fetch_optional(pool)
    .await
}

/// The user called `username`, read inside a transaction.
pub async fn by_username_in(tx: &mut Tx<'_>, username: &str) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select id, username, password_hash, platform_role, disabled, created_at
         from users where username = $1",
        username
    )
    .fetch_optional(&mut **tx)
    .await
}

/// The user with `id`.
pub async fn by_id(pool: &PgPool, id: UserId) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select id, username, password_hash, platform_role, disabled, created_at
         from users where id = $1",
        id as UserId
    )
    .fetch_optional(pool)
    .await
}

/// Creates a user; fails on `users_username_key` when the name is taken.
pub async fn insert(
    tx: &mut Tx<'_>,
    username: &str,
    password_hash: &str,
    platform_role: Option<&str>,
) -> Result<UserRow, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "insert into users (id, username, password_hash, platform_role) values ($1, $2, $3, $4)
         returning id, username, password_hash, platform_role, disabled, created_at",
        UserId::new() as UserId,
        username,
        password_hash,
        platform_role
    )
    .fetch_one(&mut **tx)
    .await
}

/// Users ordered by name, after `after`.
pub async fn list(pool: &PgPool, after: Option<&str>, limit: i64) -> Result<Vec<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select id, username, password_hash, platform_role, disabled, created_at
         from users where $1::text is null or username > $1
         order by username limit $2",
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Creates the platform admin `admin` unless a user of that name exists. True when created.
pub async fn ensure_admin(pool: &PgPool, password_hash: &str) -> Result<bool, sqlx::Error> {
    let created = sqlx::query!(
        "insert into users (id, username, password_hash, platform_role)
         values ($1, 'admin', $2, 'platform-admin')
         on conflict (username) do nothing
         returning id",
        UserId::new() as UserId,
        password_hash
    )
    .fetch_optional(pool)
    .await?;
    Ok(created.is_some())
}

/// Changes a user's role, disabled flag and, when given, password hash.
pub async fn update(
    tx: &mut Tx<'_>,
    id: UserId,
    platform_role: Option<&str>,
    disabled: bool,
    password_hash: Option<&str>,
) -> Result<UserRow, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "update users set platform_role = $2, disabled = $3, password_hash = coalesce($4, password_hash),
                updated_at = now(), version = version + 1
         where id = $1
         returning id, username, password_hash, platform_role, disabled, created_at",
        id as UserId,
        platform_role,
        disabled,
        password_hash
    )
    .fetch_one(&mut **tx)
    .await
}

/// The user `username`, locked for update.
pub async fn get_for_update(tx: &mut Tx<'_>, username: &str) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as!(
        UserRow,
        "select id, username, password_hash, platform_role, disabled, created_at
         from users where username = $1 for update",
        username
    )
    .fetch_optional(&mut **tx)
    .await
}
