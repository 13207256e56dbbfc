//! What the expected starts learn from: the runtimes of recently finished jobs and the
//! errors of recent forecasts (see `scheduler::runtime` and `scheduler::forecast_errors`).

use sqlx::PgPool;

use crate::domain::TeamId;

/// One finished job's runtime: its last attempt, from its real start to its real stop.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub team_id: TeamId,
    pub name: String,
    pub runtime_ms: i64,
}

/// The runtimes of the `limit` jobs that finished last (succeeded or failed: both held their
/// GPUs that long; cancelled and preempted jobs say nothing about how long a job runs).
pub async fn recent_runtimes(pool: &PgPool, limit: i64) -> Result<Vec<Runtime>, sqlx::Error> {
    sqlx::query_as!(
        Runtime,
        r#"select j.team_id as "team_id: TeamId", j.name,
                  (extract(epoch from (u.ended_at - u.started_at)) * 1000)::int8 as "runtime_ms!"
           from jobs j join usage_intervals u on u.job_id = j.id and u.attempt = j.attempt
           where j.state in ('succeeded', 'failed') and j.finished_at is not null and u.ended_at is not null
           order by j.finished_at desc
           limit $1"#,
        limit
    )
    .fetch_all(pool)
    .await
}

/// One job's forecast error: the wait forecast when it first waited and the wait it had
/// (for a job still waiting, the wait so far), in ms, and its priority class, whose
/// forecasts err in their own way.
#[derive(Debug, Clone)]
pub struct ForecastError {
    pub priority_class: String,
    pub forecast_ms: i64,
    pub actual_ms: i64,
}

/// Recent forecast errors: those of the `limit` jobs admitted last after a forecast, newest
/// first, and those of up to `limit` jobs still waiting on one.
pub async fn errors(pool: &PgPool, limit: i64) -> Result<(Vec<ForecastError>, Vec<ForecastError>), sqlx::Error> {
    let started = sqlx::query_as!(
        ForecastError,
        r#"select priority_class, forecast_wait_ms as "forecast_ms!",
                  (extract(epoch from (admitted_at - forecast_at)) * 1000)::int8 as "actual_ms!"
           from jobs
           where forecast_at is not null and forecast_wait_ms is not null and admitted_at >= forecast_at
           order by admitted_at desc
           limit $1"#,
        limit
    )
    .fetch_all(pool)
    .await?;
    let waiting = sqlx::query_as!(
        ForecastError,
        r#"select priority_class, forecast_wait_ms as "forecast_ms!",
                  (extract(epoch from (now() - forecast_at)) * 1000)::int8 as "actual_ms!"
           from jobs
           where state = 'pending' and forecast_at is not null and forecast_wait_ms is not null
           limit $1"#,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok((started, waiting))
}
