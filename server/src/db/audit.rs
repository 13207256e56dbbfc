//! The audit log: one row per change, written in the change's own transaction so a change
//! and its record commit or roll back together.

use crate::domain::TeamId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A change to record.
#[derive(Debug)]
pub struct Change<'a> {
    /// Who made it, e.g. `user:admin` or `token:deploy-bot`.
    pub actor: &'a str,
    /// What was done, e.g. `quota.update`.
    pub action: &'a str,
    /// The kind of object, e.g. `quota`.
    pub object_type: &'a str,
    /// The object's natural key, e.g. `ml-research/h100-80gb`.
    pub object_id: &'a str,
    /// The team the object belongs to, if any.
    pub team_id: Option<TeamId>,
    /// The object before the change (`None` on create).
    pub before: Option<serde_json::Value>,
    /// The object after the change (`None` on delete).
    pub after: Option<serde_json::Value>,
}

/// A recorded change.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    pub team: Option<String>,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// Records a change inside the transaction that makes it.
pub async fn record(tx: &mut Tx<'_>, change: Change<'_>) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into audit_log (actor, action, object_type, object_id, team_id, before, after)
         values ($1, $2, $3, $4, $5, $6, $7)",
        change.actor,
        change.action,
        change.object_type,
        change.object_id,
        change.team_id as Option<TeamId>,
        change.before,
        change.after
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Entries newest first, before the entry `before_id`; only those of `team_id` when given.
pub async fn list(
    pool: &PgPool,
    team_id: Option<TeamId>,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditRow>, sqlx::Error> {
    sqlx::query_as!(
        AuditRow,
        r#"select a.id, a.at, a.actor, a.action, a.object_type, a.object_id, t.name as "team?",
                  a.before, a.after
           from audit_log a left join teams t on t.id = a.team_id
           where ($1::uuid is null or a.team_id = $1) and ($2::bigint is null or a.id < $2)
           order by a.id desc limit $3"#,
        team_id as Option<TeamId>,
        before_id,
        limit
    )
    .fetch_all(pool)
    .await
}
