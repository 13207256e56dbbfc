//! What billing reads: ledger rows for exports, spend for budgets, usage over time.

use crate::domain::{GpuClassId, JobId, TeamId};
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// A ledger row as exported.
#[derive(Debug, Clone)]
pub struct ExportRow {
    pub id: i64,
    pub kind: String,
    pub corrects: Option<i64>,
    pub reason: Option<String>,
    /// None for a reservation charge.
    pub job_id: Option<JobId>,
    pub attempt: Option<i32>,
    pub job_name: Option<String>,
    pub team_id: TeamId,
    pub team_name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub gpus: i32,
    pub fraction_milli: i32,
    pub borrowing: bool,
    pub charge_start: DateTime<Utc>,
    pub charge_end: DateTime<Utc>,
    pub duration_ms: i64,
    pub gpu_milli_ms: i64,
    pub rate_micros_per_gpu_hour: i64,
    pub price_multiplier_milli: i32,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
    pub currency: String,
    pub billing_period: NaiveDate,
    pub labels: Value,
}

/// Up to `limit` ledger rows of billing period `period` after row `after_id`, in id order:
/// keyset pages, so an export of millions of rows holds one page at a time.
pub async fn export_page(
    conn: &mut PgConnection,
    period: NaiveDate,
    after_id: i64,
    limit: i64,
) -> Result<Vec<ExportRow>, sqlx::Error> {
    sqlx::query_as!(
        ExportRow,
        r#"select id, kind, corrects, reason, job_id as "job_id: JobId", attempt, job_name, team_id, team_name,
                gpu_class, priority_class, gpus, fraction_milli, borrowing, charge_start, charge_end, duration_ms,
                gpu_milli_ms, rate_micros_per_gpu_hour, price_multiplier_milli, list_cost_micros,
                billed_cost_micros, currency, billing_period, labels
         from usage_ledger where billing_period = $1 and id > $2 order by id limit $3"#,
        period,
        after_id,
        limit
    )
    .fetch_all(conn)
    .await
}

/// Ledger totals of a billing period: (rows, GPU time, billed cost).
pub async fn period_totals(pool: &PgPool, period: NaiveDate) -> Result<(i64, i64, i64), sqlx::Error> {
    let r = sqlx::query!(
        r#"select count(*) as "rows!", coalesce(sum(gpu_milli_ms), 0)::int8 as "gpu!",
                  coalesce(sum(billed_cost_micros), 0)::int8 as "cost!"
           from usage_ledger where billing_period = $1"#,
        period
    )
    .fetch_one(pool)
    .await?;
    Ok((r.rows, r.gpu, r.cost))
}

/// One team's ledger rows of a billing period, summed: what its statement totals and what
/// the period's exports hold for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamPeriodTotal {
    pub team: String,
    pub rows: i64,
    pub gpu_milli_ms: i64,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
}

/// Every team's ledger totals of billing period `period`, by team name; teams without a
/// charge in it are there with zeros. The rows are those of [`period_totals`], split by team
/// (a team no longer there keeps the name its charges were booked under).
pub async fn period_by_team(pool: &PgPool, period: NaiveDate) -> Result<Vec<TeamPeriodTotal>, sqlx::Error> {
    sqlx::query_as!(
        TeamPeriodTotal,
        r#"select coalesce(t.name, l.team_name) as "team!", coalesce(l.rows, 0)::int8 as "rows!",
                  coalesce(l.gpu, 0)::int8 as "gpu_milli_ms!", coalesce(l.list, 0)::int8 as "list_cost_micros!",
                  coalesce(l.billed, 0)::int8 as "billed_cost_micros!"
           from (select team_id, min(team_name) as team_name, count(*) as rows, sum(gpu_milli_ms) as gpu,
                        sum(list_cost_micros) as list, sum(billed_cost_micros) as billed
                 from usage_ledger where billing_period = $1 group by team_id) l
           full join teams t on t.id = l.team_id
           order by 1"#,
        period
    )
    .fetch_all(pool)
    .await
}

/// Booked spend of one team: its ledger over a span of charge time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Booked {
    pub cost_micros: i64,
    pub gpu_milli_ms: i64,
}

/// Booked spend per team of charges in `[from, to)`, for the teams in `teams`.
pub async fn booked_by_team(
    pool: &PgPool,
    teams: &[TeamId],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<(TeamId, Booked)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select team_id as "team_id: TeamId", coalesce(sum(billed_cost_micros), 0)::int8 as "cost!",
                  coalesce(sum(gpu_milli_ms), 0)::int8 as "gpu!"
           from usage_ledger
           where team_id = any($1) and charge_start >= $2 and charge_start < $3
           group by team_id"#,
        teams as &[TeamId],
        from,
        to
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.team_id, Booked { cost_micros: r.cost, gpu_milli_ms: r.gpu })).collect())
}

/// A running attempt's usage not yet booked: from `booked_to` on, at today's rate.
#[derive(Debug, Clone)]
pub struct Unbooked {
    pub team_id: TeamId,
    /// On borrowed capacity (billed under every chargeback model).
    pub borrowing: bool,
    pub gpus: i32,
    pub fraction_milli: i32,
    pub booked_to: DateTime<Utc>,
    pub rate_micros_per_gpu_hour: i64,
    pub price_multiplier_milli: i32,
}

/// Running attempts of the teams in `teams` and how far each is booked.
pub async fn unbooked(pool: &PgPool, teams: &[TeamId], now: DateTime<Utc>) -> Result<Vec<Unbooked>, sqlx::Error> {
    running_unbooked(pool, teams, None, now).await
}

/// The job's running attempt and how far it is booked, if it runs.
pub async fn unbooked_for_job(
    pool: &PgPool,
    job_id: JobId,
    now: DateTime<Utc>,
) -> Result<Option<Unbooked>, sqlx::Error> {
    Ok(running_unbooked(pool, &[], Some(job_id), now).await?.pop())
}

/// Running attempts of the teams in `teams` or of the job `job_id`.
async fn running_unbooked(
    pool: &PgPool,
    teams: &[TeamId],
    job_id: Option<JobId>,
    now: DateTime<Utc>,
) -> Result<Vec<Unbooked>, sqlx::Error> {
    sqlx::query_as!(
        Unbooked,
        r#"select u.team_id, u.borrowing, u.gpus, u.fraction_milli,
                  greatest(u.started_at, coalesce(b.booked_to, u.started_at)) as "booked_to!",
                  coalesce(r.rate, 0) as "rate_micros_per_gpu_hour!",
                  coalesce(p.price_multiplier_milli, 1000) as "price_multiplier_milli!"
           from usage_intervals u
           left join lateral (select max(l.charge_end) as booked_to from usage_ledger l
                              where l.job_id = u.job_id and l.attempt = u.attempt and l.kind = 'usage') b on true
           left join lateral (select g.rate_micros_per_gpu_hour as rate from gpu_class_rates g
                              where g.gpu_class_id = u.gpu_class_id and g.effective_from <= $2
                              order by g.effective_from desc limit 1) r on true
           left join priority_classes p on p.name = u.priority_class
           where u.ended_at is null and (u.team_id = any($1) or u.job_id = $3)"#,
        teams as &[TeamId],
        now,
        job_id as Option<JobId>
    )
    .fetch_all(pool)
    .await
}

/// A budget of one period, with its team's name.
#[derive(Debug, Clone)]
pub struct PeriodBudget {
    pub team_id: TeamId,
    pub team: String,
    pub unit: String,
    pub amount: i64,
    pub enforcement: String,
}

/// Every team's budget for `period`.
pub async fn budgets_of(pool: &PgPool, period: NaiveDate) -> Result<Vec<PeriodBudget>, sqlx::Error> {
    sqlx::query_as!(
        PeriodBudget,
        "select b.team_id, t.name as team, b.unit, b.amount, b.enforcement
         from budgets b join teams t on t.id = b.team_id where b.period = $1 order by t.name",
        period
    )
    .fetch_all(pool)
    .await
}

/// (team, parent) for every team: budgets of a department cover its whole subtree.
pub async fn team_parents(pool: &PgPool) -> Result<Vec<(TeamId, Option<TeamId>)>, sqlx::Error> {
    let rows = sqlx::query!(r#"select id as "id: TeamId", parent_id as "parent_id: TeamId" from teams"#)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.parent_id)).collect())
}

/// Records a budget alert once; true when it is new.
pub async fn record_alert(
    tx: &mut super::Tx<'_>,
    team_id: TeamId,
    period: NaiveDate,
    threshold: i32,
    spent: i64,
    amount: i64,
    unit: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "insert into budget_alerts (team_id, period, threshold, spent, amount, unit)
         values ($1, $2, $3, $4, $5, $6) on conflict do nothing",
        team_id as TeamId,
        period,
        threshold,
        spent,
        amount,
        unit
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A raised budget alert.
#[derive(Debug, Clone)]
pub struct AlertRow {
    pub period: NaiveDate,
    pub threshold: i32,
    pub spent: i64,
    pub amount: i64,
    pub unit: String,
    pub raised_at: DateTime<Utc>,
}

/// A team's alerts of `period`, lowest threshold first.
pub async fn alerts(pool: &PgPool, team_id: TeamId, period: NaiveDate) -> Result<Vec<AlertRow>, sqlx::Error> {
    sqlx::query_as!(
        AlertRow,
        "select period, threshold, spent, amount, unit, raised_at from budget_alerts
         where team_id = $1 and period = $2 order by threshold",
        team_id as TeamId,
        period
    )
    .fetch_all(pool)
    .await
}

/// Usage of one team over time: one bucket per step and group.
#[derive(Debug, Clone)]
pub struct UsageBucket {
    pub bucket: DateTime<Utc>,
    pub group: String,
    pub gpu_milli_ms: i64,
    pub billed_cost_micros: i64,
}

/// A team's booked usage in `[from, to)` by `step` (`hour`, `day` or `month`, UTC) and by
/// `group_by` (`gpu_class`, `priority_class`, `label`, or anything else for no grouping);
/// `label` groups by the value of label `label_key` (`""` when a job lacks it).
pub async fn usage(
    pool: &PgPool,
    team_id: TeamId,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: &str,
    group_by: &str,
    label_key: &str,
) -> Result<Vec<UsageBucket>, sqlx::Error> {
    sqlx::query_as!(
        UsageBucket,
        r#"select date_trunc($4, charge_start, 'UTC') as "bucket!",
                  case $5 when 'gpu_class' then gpu_class
                          when 'priority_class' then priority_class
                          when 'label' then coalesce(labels ->> $6, '')
                          else '' end as "group!",
                  sum(gpu_milli_ms)::int8 as "gpu_milli_ms!", sum(billed_cost_micros)::int8 as "billed_cost_micros!"
           from usage_ledger
           where team_id = $1 and charge_start >= $2 and charge_start < $3
           group by 1, 2 order by 1, 2"#,
        team_id as TeamId,
        from,
        to,
        step,
        group_by,
        label_key
    )
    .fetch_all(pool)
    .await
}

/// One line of a statement: usage of one class and priority class.
#[derive(Debug, Clone)]
pub struct StatementLine {
    pub gpu_class: String,
    pub priority_class: String,
    pub gpu_milli_ms: i64,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
}

/// A team's billed usage of billing period `period`, by class and priority class.
pub async fn statement_lines(
    pool: &PgPool,
    team_id: TeamId,
    period: NaiveDate,
) -> Result<Vec<StatementLine>, sqlx::Error> {
    sqlx::query_as!(
        StatementLine,
        r#"select gpu_class, priority_class, sum(gpu_milli_ms)::int8 as "gpu_milli_ms!",
                  sum(list_cost_micros)::int8 as "list_cost_micros!", sum(billed_cost_micros)::int8 as "billed_cost_micros!"
           from usage_ledger where team_id = $1 and billing_period = $2
           group by 1, 2 order by 1, 2"#,
        team_id as TeamId,
        period
    )
    .fetch_all(pool)
    .await
}

/// A job on a statement.
#[derive(Debug, Clone)]
pub struct TopJob {
    pub job_id: JobId,
    pub job_name: String,
    pub gpu_milli_ms: i64,
    pub billed_cost_micros: i64,
}

/// The team's `limit` costliest jobs of billing period `period`.
pub async fn top_jobs(
    pool: &PgPool,
    team_id: TeamId,
    period: NaiveDate,
    limit: i64,
) -> Result<Vec<TopJob>, sqlx::Error> {
    sqlx::query_as!(
        TopJob,
        r#"select job_id as "job_id!", min(job_name) as "job_name!", sum(gpu_milli_ms)::int8 as "gpu_milli_ms!",
                  sum(billed_cost_micros)::int8 as "billed_cost_micros!"
           from usage_ledger where team_id = $1 and billing_period = $2 and job_id is not null
           group by job_id order by 4 desc, 1 limit $3"#,
        team_id as TeamId,
        period,
        limit
    )
    .fetch_all(pool)
    .await
}

/// A team's pro-rata share of the idle capacity of one completed class-hour: the hour's idle
/// time × the team's share of that hour's allocated time.
#[derive(Debug, Clone)]
pub struct IdleShare {
    pub hour: DateTime<Utc>,
    pub gpu_class_id: GpuClassId,
    /// GPU time, rounded down to the ledger's unit.
    pub gpu_milli_ms: i64,
    /// Thousandths of a physical GPU in one unit of the class (to price per unit).
    pub fraction_milli: i32,
}

/// A team's share of idle capacity in each completed class-hour of `[from, to)` in which it
/// used the class, oldest first. Pricing it is `billing::statement`'s (at the rates in force
/// over the hour).
pub async fn idle_shares(
    pool: &PgPool,
    team_id: TeamId,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<IdleShare>, sqlx::Error> {
    sqlx::query_as!(
        IdleShare,
        r#"with team_hours as (
               select hour, gpu_class_id, sum(gpu_milli_ms) as allocated
               from usage_rollups where team_id = $1 and hour >= $2 and hour < $3
               group by 1, 2)
           select ch.hour, ch.gpu_class_id as "gpu_class_id: GpuClassId",
                  floor(ch.idle_milli_ms::numeric * th.allocated / ch.allocated_milli_ms)::int8 as "gpu_milli_ms!",
                  g.fraction_milli
           from class_hours ch
           join team_hours th on th.hour = ch.hour and th.gpu_class_id = ch.gpu_class_id
           join gpu_classes g on g.id = ch.gpu_class_id
           where ch.idle_milli_ms > 0 and ch.allocated_milli_ms > 0 and th.allocated > 0
           order by ch.hour, ch.gpu_class_id"#,
        team_id as TeamId,
        from,
        to
    )
    .fetch_all(pool)
    .await
}

/// Per GPU class over `[from, to)` of completed hours: capacity, allocated and idle time.
#[derive(Debug, Clone)]
pub struct ClassUtilisation {
    pub gpu_class: String,
    pub capacity_milli_ms: i64,
    pub allocated_milli_ms: i64,
    pub idle_milli_ms: i64,
}

/// Capacity, allocation and idle time per class, from the hourly rollups.
pub async fn class_utilisation(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<ClassUtilisation>, sqlx::Error> {
    sqlx::query_as!(
        ClassUtilisation,
        r#"select g.name as gpu_class, sum(ch.capacity_milli_ms)::int8 as "capacity_milli_ms!",
                  sum(ch.allocated_milli_ms)::int8 as "allocated_milli_ms!", sum(ch.idle_milli_ms)::int8 as "idle_milli_ms!"
           from class_hours ch join gpu_classes g on g.id = ch.gpu_class_id
           where ch.hour >= $1 and ch.hour < $2
           group by g.name order by g.name"#,
        from,
        to
    )
    .fetch_all(pool)
    .await
}

/// A reservation's time not yet booked: since the end of its last booked charge (or the
/// point reservation charges started from), at today's rate.
#[derive(Debug, Clone)]
pub struct UnbookedReservation {
    pub team_id: TeamId,
    pub reserved: i32,
    pub booked_to: DateTime<Utc>,
    pub rate_micros_per_gpu_hour: i64,
}

/// The current reservations of the teams in `teams` and how far each is booked.
pub async fn unbooked_reservations(
    pool: &PgPool,
    teams: &[TeamId],
    now: DateTime<Utc>,
) -> Result<Vec<UnbookedReservation>, sqlx::Error> {
    sqlx::query_as!(
        UnbookedReservation,
        r#"select q.team_id, q.reserved,
                  coalesce((select max(l.charge_end) from usage_ledger l
                            where l.kind = 'reservation' and l.team_id = q.team_id and l.gpu_class_id = q.gpu_class_id),
                           (select at from metering_state where key = 'reservations_from'),
                           $2) as "booked_to!",
                  coalesce((select g.rate_micros_per_gpu_hour from gpu_class_rates g
                            where g.gpu_class_id = q.gpu_class_id and g.effective_from <= $2
                            order by g.effective_from desc limit 1), 0) as "rate_micros_per_gpu_hour!"
           from quotas q where q.team_id = any($1) and q.reserved > 0"#,
        teams as &[TeamId],
        now
    )
    .fetch_all(pool)
    .await
}

/// GPU time and billed cost of one day, team and GPU class, from the hourly rollups.
#[derive(Debug, Clone)]
pub struct DailyUsage {
    pub day: NaiveDate,
    pub team: String,
    pub gpu_class: String,
    pub gpu_milli_ms: i64,
    pub billed_cost_micros: i64,
}

/// Usage per UTC day, team and GPU class for the days `[from, to)`.
pub async fn daily_usage(pool: &PgPool, from: NaiveDate, to: NaiveDate) -> Result<Vec<DailyUsage>, sqlx::Error> {
    sqlx::query_as!(
        DailyUsage,
        r#"select (r.hour at time zone 'UTC')::date as "day!", t.name as team, c.name as gpu_class,
                  sum(r.gpu_milli_ms)::int8 as "gpu_milli_ms!", sum(r.billed_cost_micros)::int8 as "billed_cost_micros!"
           from usage_rollups r
           join teams t on t.id = r.team_id
           join gpu_classes c on c.id = r.gpu_class_id
           where r.hour >= ($1::date)::timestamp at time zone 'UTC' and r.hour < ($2::date)::timestamp at time zone 'UTC'
           group by 1, 2, 3
           order by 1, 2, 3"#,
        from,
        to
    )
    .fetch_all(pool)
    .await
}

/// What the ledger has booked for one job so far (usage and its corrections, every
/// attempt): billed cost in micro-units and GPU time in the ledger's unit.
pub async fn booked_for_job(pool: &PgPool, job_id: JobId) -> Result<Booked, sqlx::Error> {
    let row = sqlx::query!(
        r#"select coalesce(sum(billed_cost_micros), 0)::int8 as "cost!", coalesce(sum(gpu_milli_ms), 0)::int8 as "gpu!"
           from usage_ledger where job_id = $1"#,
        job_id as JobId
    )
    .fetch_one(pool)
    .await?;
    Ok(Booked { cost_micros: row.cost, gpu_milli_ms: row.gpu })
}
