//! A team's monthly statement: what it used by class and priority class, what it costs,
//! its budget, and its costliest jobs.

use crate::domain::TeamId;
use chrono::{DateTime, NaiveDate, Utc};

use super::budgets::{period_bounds, period_of, spend};
use crate::db::{
    self,
    billing::{StatementLine, TopJob},
};

/// A statement.
#[derive(Debug, Clone)]
pub struct Statement {
    pub period: NaiveDate,
    /// Whether finance has closed the period: a closed statement no longer changes.
    pub closed: bool,
    /// Billed usage, by class and priority class (corrections included).
    pub lines: Vec<StatementLine>,
    pub gpu_milli_ms: i64,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
    /// The team's budget of the period, if any: (unit, amount, enforcement).
    pub budget: Option<(String, i64, String)>,
    /// For the current period: spend so far including running jobs, and the forecast at
    /// the period's end, in the budget's unit (money when there is no budget).
    pub spent_to_date: Option<i64>,
    pub forecast: Option<i64>,
    pub top_jobs: Vec<TopJob>,
    /// The team's pro-rata share of the period's idle capacity (by its share of each
    /// class-hour's allocation), and its cost at the rate card: reported, not billed.
    pub idle_share_gpu_milli_ms: i64,
    pub idle_share_cost_micros: i64,
}

/// The statement of `team_id` for `period`, as of `now`.
pub async fn statement(
    pool: &sqlx::PgPool,
    team_id: TeamId,
    period: NaiveDate,
    now: DateTime<Utc>,
    chargeback: crate::metering::Chargeback,
) -> Result<Statement, sqlx::Error> {
    let lines = db::billing::statement_lines(pool, team_id, period).await?;
    let budget = db::budgets::list(pool, team_id)
        .await?
        .into_iter()
        .find(|b| b.period == period)
        .map(|b| (b.unit, b.amount, b.enforcement));
    let (spent_to_date, forecast) = if period_of(now) == period {
        let s = spend(pool, &[team_id], now, chargeback).await?.remove(&team_id).unwrap_or_default();
        let unit = budget.as_ref().map_or("money", |b| b.0.as_str());
        (Some(s.in_unit(unit)), Some(s.forecast_in_unit(unit, now, period_bounds(period).1)))
    } else {
        (None, None)
    };
    let (from, to) = period_bounds(period);
    let (idle_share_gpu_milli_ms, idle_share_cost_micros) = db::billing::idle_share(pool, team_id, from, to).await?;
    Ok(Statement {
        period,
        idle_share_gpu_milli_ms,
        idle_share_cost_micros,
        closed: db::metering::period_closed(pool, period).await?,
        gpu_milli_ms: lines.iter().map(|l| l.gpu_milli_ms).sum(),
        list_cost_micros: lines.iter().map(|l| l.list_cost_micros).sum(),
        billed_cost_micros: lines.iter().map(|l| l.billed_cost_micros).sum(),
        lines,
        budget,
        spent_to_date,
        forecast,
        top_jobs: db::billing::top_jobs(pool, team_id, period, 10).await?,
    })
}
