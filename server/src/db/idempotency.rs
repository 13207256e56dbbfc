//! Idempotency records: the first response to each `(principal, Idempotency-Key)`, kept for
//! at least 24 hours so a retried create returns the same answer instead of a duplicate.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// A stored record.
#[derive(Debug, Clone)]
pub struct IdempotencyRow {
    pub method: String,
    pub path: String,
    pub request_hash: Vec<u8>,
    pub response_status: Option<i32>,
    pub response_headers: Option<serde_json::Value>,
    pub response_body: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
}

/// Claims the key for a new request. True when this request is the first with this key (or
/// the earlier one expired, or was abandoned in flight for longer than `stale_after_secs`).
pub async fn claim(
    pool: &PgPool,
    principal: &str,
    key: &str,
    method: &str,
    path: &str,
    request_hash: &[u8],
    stale_after_secs: f64,
) -> Result<bool, sqlx::Error> {
    let row = sqlx::query!(
        "insert into idempotency_keys (principal, key, method, path, request_hash)
         values ($1, $2, $3, $4, $5)
         on conflict (principal, key) do update
         set method = excluded.method, path = excluded.path, request_hash = excluded.request_hash,
             response_status = null, response_headers = null, response_body = null, created_at = now()
         where idempotency_keys.created_at < now() - interval '24 hours'
            or (idempotency_keys.response_status is null
                and idempotency_keys.created_at < now() - make_interval(secs => $6))
         returning key",
        principal,
        key,
        method,
        path,
        request_hash,
        stale_after_secs
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.is_some())
}

/// The record for a key.
pub async fn get(pool: &PgPool, principal: &str, key: &str) -> Result<Option<IdempotencyRow>, sqlx::Error> {
    sqlx::query_as!(
        IdempotencyRow,
        "select method, path, request_hash, response_status, response_headers, response_body, created_at
         from idempotency_keys where principal = $1 and key = $2",
        principal,
        key
    )
    .fetch_optional(pool)
    .await
}

/// Stores the response of the first request.
pub async fn complete(
    pool: &PgPool,
    principal: &str,
    key: &str,
    status: i32,
    headers: serde_json::Value,
    body: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update idempotency_keys set response_status = $3, response_headers = $4, response_body = $5
         where principal = $1 and key = $2",
        principal,
        key,
        status,
        headers,
        body
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Forgets a key whose request failed on our side, so the client may retry it.
pub async fn release(pool: &PgPool, principal: &str, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from idempotency_keys where principal = $1 and key = $2", principal, key)
        .execute(pool)
        .await?;
    Ok(())
}

/// Deletes records older than 24 hours. Returns how many.
pub async fn purge_expired(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!("delete from idempotency_keys where created_at < now() - interval '25 hours'")
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
