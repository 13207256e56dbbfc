//! What the benchmarks compare against and read back: the raw PostgreSQL ceiling of a job
//! insert, and the figures of a replayed workload.

use crate::domain::{GpuClassId, JobId, JobState, TeamId};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Inserts one job row, the same row `POST .../jobs` stores, in its own durable transaction
/// (autocommit): the most PostgreSQL can do for a submission, with nothing around it.
pub async fn insert_bare_job(
    conn: &mut PgConnection,
    team_id: TeamId,
    gpu_class_id: GpuClassId,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"insert into jobs (id, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                             max_runtime_seconds, image, command, env, labels, topology_mode, max_retries, submitted_by)
           values ($1, $2, 'bench', $3, 'experiment', 1, 1, 3600, 'registry.example/train:1',
                   '["python", "train.py"]', '{}', '{}', 'any', 0, 'bench')"#,
        Uuid::new_v4(),
        team_id as TeamId,
        gpu_class_id as GpuClassId
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether any job still waits, runs or holds GPUs (a preempted job that will run again waits
/// as `pending`). Asked several times a second while a workload drains, so it reads the live
/// jobs' partial index and stops at the first: counting 50,000 rows each time took a core of
/// the database it measures.
pub async fn live_jobs_remain(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select exists (select 1 from jobs where state in ('pending', 'admitted', 'running') or holds_gpus) as "live!""#
    )
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

/// Seeds what a busy team's portal pages read (again and again: only new jobs get events
/// and ledger rows): `jobs` jobs of team `team_id` in class
/// `class_id` (5% pending with a reason and position, 3% running, the rest finished), three
/// timeline events each, a ledger row per finished job in billing period `period` spread
/// over its first `hours` hours, and hourly usage roll-ups of the 30 days before `today`.
pub async fn seed_portal(
    pool: &PgPool,
    team_id: TeamId,
    class_id: GpuClassId,
    jobs: i64,
    period: chrono::NaiveDate,
    hours: i64,
    today: chrono::NaiveDate,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        r#"insert into jobs (id, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                             max_runtime_seconds, image, command, submitted_by, state, attempt, pending_reason,
                             pending_message, queue_position, expected_start_at, submitted_at, admitted_at,
                             started_at, finished_at, exit_code)
           select gen_random_uuid(), $1, 'sweep-' || i, $2, 'experiment', 1 + i % 4, 8, 3600,
                  'registry.example/train:1', '["python", "train.py"]', 'user:bench', s.state,
                  case when s.state = 'pending' then 0 else 1 end,
                  case when s.state = 'pending' then 'insufficient_capacity' end,
                  case when s.state = 'pending' then 'not enough free GPUs of this class' end,
                  case when s.state = 'pending' then (i / 20)::int end,
                  case when s.state = 'pending' then now() + make_interval(mins => (i / 20)::int) end,
                  now() - make_interval(secs => ($3 - i)::float8 * 60),
                  case when s.state <> 'pending' then now() - make_interval(secs => ($3 - i)::float8 * 60) end,
                  case when s.state <> 'pending' then now() - make_interval(secs => ($3 - i)::float8 * 60) end,
                  case when s.state in ('succeeded', 'failed', 'cancelled') then now() - make_interval(secs => ($3 - i)::float8 * 30) end,
                  case when s.state = 'succeeded' then 0 when s.state = 'failed' then 1 end
           from generate_series(1, $3::int8) as i,
                lateral (select case when i % 20 = 0 then 'pending'
                                     when i % 33 = 1 then 'running'
                                     when i % 17 = 2 then 'failed'
                                     when i % 19 = 3 then 'cancelled'
                                     else 'succeeded' end as state) s"#,
        team_id as TeamId,
        class_id as GpuClassId,
        jobs
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into job_events (job_id, at, kind, attempt, message)
           select j.id, j.submitted_at + make_interval(secs => e.n), e.kind, 1, e.kind || ' (seeded)'
           from jobs j, (values (0, 'submitted'), (1, 'admitted'), (2, 'running')) as e (n, kind)
           where j.team_id = $1 and not exists (select 1 from job_events o where o.job_id = j.id)"#,
        team_id as TeamId
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into usage_ledger (kind, job_id, attempt, job_name, team_id, team_name, gpu_class_id, gpu_class,
                                    priority_class, gpus, fraction_milli, borrowing, charge_start, charge_end,
                                    duration_ms, gpu_milli_ms, rate_micros_per_gpu_hour, price_multiplier_milli,
                                    list_cost_micros, billed_cost_micros, currency, billing_period)
           select 'usage', j.id, 1, j.name, j.team_id, t.name, j.gpu_class_id, c.name, j.priority_class,
                  j.replicas * j.gpus_per_replica, 1000, false,
                  $2::date + make_interval(hours => (j.seq % $3)::int),
                  $2::date + make_interval(hours => (j.seq % $3)::int, mins => 30),
                  1800000, (j.replicas * j.gpus_per_replica)::int8 * 1000 * 1800000, 2500000, 1000,
                  (j.replicas * j.gpus_per_replica)::int8 * 1250000, (j.replicas * j.gpus_per_replica)::int8 * 1250000,
                  'USD', $2::date
           from jobs j join teams t on t.id = j.team_id join gpu_classes c on c.id = j.gpu_class_id
           where j.team_id = $1 and j.state in ('succeeded', 'failed', 'cancelled')
                 and not exists (select 1 from usage_ledger l where l.job_id = j.id)"#,
        team_id as TeamId,
        period,
        hours
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into usage_rollups (hour, team_id, gpu_class_id, priority_class, gpu_milli_ms, billed_cost_micros)
           select h, t.id, $1, 'experiment', 16 * 3600000000::int8, 40000000
           from generate_series(($2::date - 30)::timestamp at time zone 'UTC',
                                ($2::date)::timestamp at time zone 'UTC', interval '1 hour') as h,
                teams t
           on conflict do nothing"#,
        class_id as GpuClassId,
        today
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The id of one of the team's jobs (its newest).
pub async fn a_job_of(pool: &PgPool, team_id: TeamId) -> Result<JobId, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select id as "id: JobId" from jobs where team_id = $1 order by seq desc limit 1"#,
        team_id as TeamId
    )
    .fetch_one(pool)
    .await
}

/// Where a replayed class's held time goes, in mean milliseconds per attempt that ran to its
/// end: admission to dispatch (the outbox), dispatch to the backend's start, the run itself,
/// and the backend's end to the release of the GPUs (the reconciler noticing).
#[derive(Debug, Clone)]
pub struct HeldBreakdown {
    pub priority_class: String,
    pub to_dispatch_ms: f64,
    pub to_start_ms: f64,
    pub run_ms: f64,
    pub to_release_ms: f64,
}

/// [`HeldBreakdown`] per priority class.
pub async fn held_breakdown(pool: &PgPool) -> Result<Vec<HeldBreakdown>, sqlx::Error> {
    sqlx::query_as!(
        HeldBreakdown,
        r#"with attempts as (
               select e.job_id, e.attempt,
                      min(e.at) filter (where e.kind = 'admitted') as admitted,
                      min(e.at) filter (where e.kind = 'dispatched') as dispatched,
                      max(e.at) as released
               from job_events e where e.attempt > 0 group by e.job_id, e.attempt
           )
           select j.priority_class,
                  coalesce(avg(extract(epoch from a.dispatched - a.admitted)) * 1000, 0)::float8 as "to_dispatch_ms!",
                  coalesce(avg(extract(epoch from u.started_at - a.dispatched)) * 1000, 0)::float8 as "to_start_ms!",
                  coalesce(avg(extract(epoch from u.ended_at - u.started_at)) * 1000, 0)::float8 as "run_ms!",
                  coalesce(avg(extract(epoch from a.released - u.ended_at)) * 1000, 0)::float8 as "to_release_ms!"
           from attempts a
           join jobs j on j.id = a.job_id
           join usage_intervals u on u.job_id = a.job_id and u.attempt = a.attempt
           where u.ended_at is not null and a.dispatched is not null
           group by j.priority_class
           order by j.priority_class"#
    )
    .fetch_all(pool)
    .await
}

/// Creates `pg_stat_statements` in the pool's database. The server must preload its library
/// (`db::embedded::Tuning::statement_stats`).
pub async fn track_statements(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("create extension if not exists pg_stat_statements").execute(pool).await?;
    Ok(())
}

/// Zeroes the database's activity counters (transactions, rows per table, WAL, statements), so
/// that what a workload did can be read afterwards without the setup before it.
pub async fn reset_activity(pool: &PgPool) -> Result<(), sqlx::Error> {
    // Not checked at compile time: the functions return `void`, which the macros cannot
    // describe, and the last exists only where `track_statements` created it.
    sqlx::query("select pg_stat_reset(), pg_stat_reset_shared('wal'), pg_stat_statements_reset()")
        .execute(pool)
        .await?;
    Ok(())
}

/// What the database did since [`reset_activity`]: committed transactions, WAL written and
/// rows written per table. Backends publish their counts when a transaction ends (at most
/// once a second) or when they exit, so read this after the writers have closed.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub commits: i64,
    pub wal_bytes: f64,
    pub tables: Vec<TableWrites>,
}

/// Rows one table had written to it.
#[derive(Debug, Clone)]
pub struct TableWrites {
    pub table: String,
    pub inserted: i64,
    pub updated: i64,
    /// Updates that wrote no index entry (heap-only tuples): the cheap kind.
    pub hot_updated: i64,
    pub deleted: i64,
}

impl TableWrites {
    /// Rows inserted, updated or deleted.
    pub fn written(&self) -> i64 {
        self.inserted + self.updated + self.deleted
    }
}

/// [`Activity`] since the last reset, busiest tables first.
pub async fn activity(conn: &mut PgConnection) -> Result<Activity, sqlx::Error> {
    let commits =
        sqlx::query_scalar!(r#"select xact_commit as "n!" from pg_stat_database where datname = current_database()"#)
            .fetch_one(&mut *conn)
            .await?;
    let wal_bytes =
        sqlx::query_scalar!(r#"select wal_bytes::float8 as "bytes!" from pg_stat_wal"#).fetch_one(&mut *conn).await?;
    let tables = sqlx::query_as!(
        TableWrites,
        r#"select relname as "table!", n_tup_ins as "inserted!", n_tup_upd as "updated!",
                  n_tup_hot_upd as "hot_updated!", n_tup_del as "deleted!"
           from pg_stat_user_tables
           where n_tup_ins + n_tup_upd + n_tup_del > 0
           order by n_tup_ins + n_tup_upd + n_tup_del desc, relname"#
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(Activity { commits, wal_bytes, tables })
}

/// One statement's share of the database's time, from `pg_stat_statements`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StatementTime {
    /// The statement's text, parameters as `$n`.
    pub query: String,
    pub calls: i64,
    pub total_ms: f64,
    pub rows: i64,
}

/// Every statement run in this database since [`reset_activity`], the most time first.
pub async fn statement_times(conn: &mut PgConnection) -> Result<Vec<StatementTime>, sqlx::Error> {
    // Not checked at compile time: the view exists only where `track_statements` created it.
    sqlx::query_as(
        "select query, calls, total_exec_time as total_ms, rows
         from pg_stat_statements
         where dbid = (select oid from pg_database where datname = current_database())
         order by total_exec_time desc",
    )
    .fetch_all(conn)
    .await
}

/// The seconds from submission to first admission of every job whose name starts with
/// `name_prefix` (all jobs for `""`), none for a job never admitted.
pub async fn admission_waits(pool: &PgPool, name_prefix: &str) -> Result<Vec<f64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select extract(epoch from a.first - j.submitted_at)::float8 as "seconds!"
           from jobs j
           join lateral (select min(e.at) as first from job_events e
                         where e.job_id = j.id and e.kind = 'admitted') a on a.first is not null
           where starts_with(j.name, $1)"#,
        name_prefix
    )
    .fetch_all(pool)
    .await
}

/// Jobs in `state` whose name starts with `name_prefix`.
pub async fn jobs_in_state(pool: &PgPool, state: JobState, name_prefix: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select count(*) as "n!" from jobs where state = $1 and starts_with(name, $2)"#,
        state as JobState,
        name_prefix
    )
    .fetch_one(pool)
    .await
}

/// Pending jobs whose name starts with `name_prefix` that a scheduling cycle has given a reason.
pub async fn pending_with_reason(pool: &PgPool, name_prefix: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select count(*) as "n!" from jobs
           where state = 'pending' and pending_reason is not null and starts_with(name, $1)"#,
        name_prefix
    )
    .fetch_one(pool)
    .await
}

/// What followed one job's submission when it had to take GPUs back: seconds from its
/// submission to the first preemption decided after it, to the first stop the dispatcher
/// handed to a cluster after it (the victim signalled), and to its own admission; and how
/// many jobs were preempted.
#[derive(Debug, Clone, Copy)]
pub struct Reclaim {
    pub decided_s: Option<f64>,
    pub signalled_s: Option<f64>,
    pub admitted_s: Option<f64>,
    /// Jobs preempted since the submission.
    pub victims: i64,
}

/// [`Reclaim`] for the job `probe`; meaningful while nothing else preempts.
pub async fn reclaim(pool: &PgPool, probe: JobId) -> Result<Reclaim, sqlx::Error> {
    sqlx::query_as!(
        Reclaim,
        r#"select
             (select extract(epoch from min(e.at) - j.submitted_at)::float8 from job_events e
               where e.kind = 'preempted' and e.at >= j.submitted_at) as decided_s,
             (select extract(epoch from min(o.done_at) - j.submitted_at)::float8 from dispatch_outbox o
               where o.action = 'stop' and o.created_at >= j.submitted_at and o.done_at is not null) as signalled_s,
             (select extract(epoch from min(e.at) - j.submitted_at)::float8 from job_events e
               where e.job_id = j.id and e.kind = 'admitted') as admitted_s,
             (select count(*) from job_events e
               where e.kind = 'preempted' and e.at >= j.submitted_at) as "victims!"
           from jobs j where j.id = $1"#,
        probe as JobId
    )
    .fetch_one(pool)
    .await
}

/// Admissions recorded per wall-clock second, in order: `(second since the epoch, admissions)`.
pub async fn admissions_per_second(pool: &PgPool) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select extract(epoch from date_trunc('second', at))::int8 as "second!", count(*) as "n!"
           from job_events where kind = 'admitted' group by 1 order by 1"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.second, r.n)).collect())
}

/// Ends the benchmarked service's pool connections still open (`application_name`
/// `fairway-bench`), each backend publishing its counters as it exits; how many there were.
pub async fn end_service_backends(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"with service as materialized (
               select pid from pg_stat_activity
               where datname = current_database() and application_name = 'fairway-bench' and pid <> pg_backend_pid()
           )
           select count(pg_terminate_backend(pid, 5000)) as "n!" from service"#
    )
    .fetch_one(conn)
    .await
}
