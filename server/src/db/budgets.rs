//! Budgets per team per month.

use crate::domain::TeamId;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored budget.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BudgetRow {
    pub period: NaiveDate,
    pub unit: String,
    pub amount: i64,
    pub enforcement: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// Budgets of `team_id`, newest period first.
pub async fn list(pool: &PgPool, team_id: TeamId) -> Result<Vec<BudgetRow>, sqlx::Error> {
    sqlx::query_as!(
        BudgetRow,
        "select period, unit, amount, enforcement, created_at, updated_at, version
         from budgets where team_id = $1 order by period desc",
        team_id as TeamId
    )
    .fetch_all(pool)
    .await
}

/// The budget of `team_id` for `period`, locked for update.
pub async fn get_for_update(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    period: NaiveDate,
) -> Result<Option<BudgetRow>, sqlx::Error> {
    sqlx::query_as!(
        BudgetRow,
        "select period, unit, amount, enforcement, created_at, updated_at, version
         from budgets where team_id = $1 and period = $2 for update",
        team_id as TeamId,
        period
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Creates or replaces a budget.
pub async fn upsert(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    period: NaiveDate,
    unit: &str,
    amount: i64,
    enforcement: &str,
) -> Result<BudgetRow, sqlx::Error> {
    sqlx::query_as!(
        BudgetRow,
        "insert into budgets (team_id, period, unit, amount, enforcement) values ($1, $2, $3, $4, $5)
         on conflict (team_id, period) do update
         set unit = excluded.unit, amount = excluded.amount, enforcement = excluded.enforcement,
             updated_at = now(), version = budgets.version + 1
         returning period, unit, amount, enforcement, created_at, updated_at, version",
        team_id as TeamId,
        period,
        unit,
        amount,
        enforcement
    )
    .fetch_one(&mut **tx)
    .await
}

/// Removes a budget.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, period: NaiveDate) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from budgets where team_id = $1 and period = $2", team_id as TeamId, period)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
