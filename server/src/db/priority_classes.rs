//! Priority classes.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored priority class.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PriorityClassRow {
    pub name: String,
    pub priority: i32,
    pub preemptible: bool,
    pub usage_factor_milli: i32,
    pub price_multiplier_milli: i32,
    /// How long its jobs wait for capacity before they may preempt anyone.
    pub preemption_delay_seconds: i32,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// All priority classes, highest priority first.
pub async fn list(pool: &PgPool) -> Result<Vec<PriorityClassRow>, sqlx::Error> {
    sqlx::query_as!(
        PriorityClassRow,
        "select name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_delay_seconds, description,
                created_at, updated_at, version
         from priority_classes order by priority desc, name"
    )
    .fetch_all(pool)
    .await
}

/// The class called `name`.
pub async fn by_name(pool: &PgPool, name: &str) -> Result<Option<PriorityClassRow>, sqlx::Error> {
    sqlx::query_as!(
        PriorityClassRow,
        "select name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_delay_seconds, description,
                created_at, updated_at, version
         from priority_classes where name = $1",
        name
    )
    .fetch_optional(pool)
    .await
}

/// The class called `name`, locked for update.
pub async fn get_for_update(tx: &mut Tx<'_>, name: &str) -> Result<Option<PriorityClassRow>, sqlx::Error> {
    sqlx::query_as!(
        PriorityClassRow,
        "select name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_delay_seconds, description,
                created_at, updated_at, version
         from priority_classes where name = $1 for update",
        name
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Creates or replaces a class, bumping its version when it existed.
pub async fn upsert(tx: &mut Tx<'_>, row: &PriorityClassRow) -> Result<PriorityClassRow, sqlx::Error> {
    sqlx::query_as!(
        PriorityClassRow,
        "insert into priority_classes (name, priority, preemptible, usage_factor_milli, price_multiplier_milli,
                                       preemption_delay_seconds, description)
         values ($1, $2, $3, $4, $5, $6, $7)
         on conflict (name) do update
         set priority = excluded.priority, preemptible = excluded.preemptible,
             usage_factor_milli = excluded.usage_factor_milli,
             price_multiplier_milli = excluded.price_multiplier_milli,
             preemption_delay_seconds = excluded.preemption_delay_seconds,
             description = excluded.description, updated_at = now(),
             version = priority_classes.version + 1
         returning name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_delay_seconds,
                   description,
                   created_at, updated_at, version",
        row.name,
        row.priority,
        row.preemptible,
        row.usage_factor_milli,
        row.price_multiplier_milli,
        row.preemption_delay_seconds,
        row.description
    )
    .fetch_one(&mut **tx)
    .await
}
