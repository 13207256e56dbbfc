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

/// A budget over a submitting team, for the check at submission.
#[derive(Debug, Clone)]
pub struct ChainBudget {
    pub team_id: TeamId,
    pub team: String,
    pub unit: String,
    pub amount: i64,
    pub enforcement: String,
}

/// The budgets of `team_id` and its ancestors for `period`, nearest first: a job spends
/// from each.
pub async fn of_chain(pool: &PgPool, team_id: TeamId, period: NaiveDate) -> Result<Vec<ChainBudget>, sqlx::Error> {
    // The depth bound keeps a cycle (which the API refuses) from looping.
    sqlx::query_as!(
        ChainBudget,
        r#"with recursive chain (id, parent_id, depth) as (
               select t.id, t.parent_id, 0 from teams t where t.id = $1
               union all
               select t.id, t.parent_id, c.depth + 1 from teams t join chain c on t.id = c.parent_id
               where c.depth < 64
           )
           select b.team_id as "team_id: TeamId", t.name as team, b.unit, b.amount, b.enforcement
           from chain c join budgets b on b.team_id = c.id and b.period = $2
           join teams t on t.id = b.team_id
           order by c.depth"#,
        team_id as TeamId,
        period
    )
    .fetch_all(pool)
    .await
}

/// What a job of `class` at `priority` costs per GPU-hour now: the class's rate in force
/// (0 with none yet), its share of a physical GPU in thousandths, and the priority class's
/// price multiplier in thousandths.
pub async fn price_now(
    pool: &PgPool,
    class: crate::domain::GpuClassId,
    priority: &str,
) -> Result<(i64, i32, i32), sqlx::Error> {
    let row = sqlx::query!(
        r#"select coalesce((select r.rate_micros_per_gpu_hour from gpu_class_rates r
                            where r.gpu_class_id = $1 and r.effective_from <= now()
                            order by r.effective_from desc limit 1), 0) as "rate!",
                  coalesce((select c.fraction_milli from gpu_classes c where c.id = $1), 1000) as "fraction!",
                  coalesce((select p.price_multiplier_milli from priority_classes p where p.name = $2), 1000)
                      as "multiplier!""#,
        class as crate::domain::GpuClassId,
        priority
    )
    .fetch_one(pool)
    .await?;
    Ok((row.rate, row.fraction, row.multiplier))
}
