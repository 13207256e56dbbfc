//! What the benchmarks compare against and read back: the raw PostgreSQL ceiling of a job
//! insert, and the figures of a replayed workload.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Inserts one job row, the same row `POST .../jobs` stores, in its own durable transaction
/// (autocommit): the most PostgreSQL can do for a submission, with nothing around it.
pub async fn insert_bare_job(conn: &mut PgConnection, team_id: Uuid, gpu_class_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"insert into jobs (id, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                             max_runtime_seconds, image, command, env, labels, topology_mode, max_retries, submitted_by)
           values ($1, $2, 'bench', $3, 'experiment', 1, 1, 3600, 'registry.example/train:1',
                   '["python", "train.py"]', '{}', '{}', 'any', 0, 'bench')"#,
        Uuid::new_v4(),
        team_id,
        gpu_class_id
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Jobs not yet in a final state.
pub async fn unfinished_jobs(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select count(*) as "n!" from jobs where state not in ('succeeded', 'failed', 'cancelled')"#)
        .fetch_one(pool)
        .await
}

/// A replayed workload's figures for one priority class.
#[derive(Debug, Clone)]
pub struct ClassFigures {
    pub priority_class: String,
    pub jobs: i64,
    pub succeeded: i64,
    /// Mean seconds from submission to the first admission.
    pub mean_admission_s: f64,
    pub preemptions: i64,
}

/// Per priority class: jobs, how many succeeded, the mean time to first admission and the
/// preemptions they suffered.
pub async fn class_figures(pool: &PgPool) -> Result<Vec<ClassFigures>, sqlx::Error> {
    sqlx::query_as!(
        ClassFigures,
        r#"select j.priority_class,
                  count(*) as "jobs!",
                  count(*) filter (where j.state = 'succeeded') as "succeeded!",
                  coalesce(avg(extract(epoch from a.first - j.submitted_at))::float8, 0) as "mean_admission_s!",
                  coalesce(sum(j.preemptions), 0) as "preemptions!"
           from jobs j
           left join lateral (select min(e.at) as first from job_events e
                              where e.job_id = j.id and e.kind = 'admitted') a on true
           group by j.priority_class
           order by j.priority_class"#
    )
    .fetch_all(pool)
    .await
}

/// The span of a replayed workload and the GPU time it took.
#[derive(Debug, Clone)]
pub struct WorkloadSpan {
    /// Seconds from the first submission to the last job's end.
    pub drain_s: f64,
    /// GPU-seconds jobs ran (usage intervals: from their real start to their real end).
    pub gpu_seconds_run: f64,
    /// GPU-seconds of quota jobs held: from each admission to the end of that attempt.
    pub gpu_seconds_held: f64,
}

/// The workload's span and GPU time.
pub async fn workload_span(pool: &PgPool) -> Result<WorkloadSpan, sqlx::Error> {
    sqlx::query_as!(
        WorkloadSpan,
        r#"with span as (select min(submitted_at) as first, max(finished_at) as last from jobs),
                run as (select coalesce(sum(extract(epoch from u.ended_at - u.started_at) * u.gpus), 0)::float8 as s
                        from usage_intervals u where u.ended_at is not null),
                attempts as (select e.job_id, e.attempt,
                                    min(e.at) filter (where e.kind = 'admitted') as admitted,
                                    max(e.at) as ended
                             from job_events e where e.attempt > 0 group by e.job_id, e.attempt),
                held as (select coalesce(sum(extract(epoch from a.ended - a.admitted)
                                             * j.replicas * j.gpus_per_replica), 0)::float8 as s
                         from attempts a join jobs j on j.id = a.job_id where a.admitted is not null)
           select coalesce(extract(epoch from span.last - span.first), 0)::float8 as "drain_s!",
                  run.s as "gpu_seconds_run!", held.s as "gpu_seconds_held!"
           from span, run, held"#
    )
    .fetch_one(pool)
    .await
}

/// Appends `rows` synthetic ledger rows to billing period `period` (30-minute pieces of
/// 1–8 H100s spread over the month's hours, 500 teams), in one statement.
pub async fn seed_ledger(pool: &PgPool, rows: i64, period: chrono::NaiveDate) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        r#"insert into usage_ledger (kind, job_id, attempt, job_name, team_id, team_name, gpu_class_id, gpu_class,
                                    priority_class, gpus, fraction_milli, borrowing, charge_start, charge_end,
                                    duration_ms, gpu_milli_ms, rate_micros_per_gpu_hour, price_multiplier_milli,
                                    list_cost_micros, billed_cost_micros, currency, billing_period, labels)
           select 'usage', gen_random_uuid(), 1, 'bench-job-' || i, t.team_id, 'team-' || (i % 500), t.class_id,
                  'h100-80gb', 'production', g, 1000, false,
                  $2::date + make_interval(hours => (i % 720)::int), $2::date + make_interval(hours => (i % 720)::int, mins => 30),
                  1800000, g::int8 * 1000 * 1800000, 2500000, 1000, g::int8 * 1250000, g::int8 * 1250000, 'USD', $2::date,
                  jsonb_build_object('pipeline', 'bench', 'run', (i % 97)::text)
           from generate_series(1, $1::int8) as i,
                lateral (select (1 + i % 8)::int4 as g) gg,
                (select md5('bench-team')::uuid as team_id, md5('bench-class')::uuid as class_id) t"#,
        rows,
        period
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// PostgreSQL's own ceiling for reading a period out: `COPY ... TO STDOUT (FORMAT csv)` of the
/// same rows in the same order, read to the end. The bytes read.
pub async fn copy_out_period(conn: &mut PgConnection, period: chrono::NaiveDate) -> Result<u64, sqlx::Error> {
    use futures_util::StreamExt as _;
    // COPY takes no parameters; the date is formatted by chrono, never user text.
    let statement = format!(
        "copy (select * from usage_ledger where billing_period = '{period}' order by id) to stdout (format csv, header)"
    );
    let mut stream = conn.copy_out_raw(&statement).await?;
    let mut bytes = 0u64;
    while let Some(chunk) = stream.next().await {
        bytes += chunk?.len() as u64;
    }
    Ok(bytes)
}
