//! Jobs' log tails (`job_logs`) and where the control loop's collector is in each replica's
//! log (`job_log_cursors`). The collector writes, the API reads; a job's team is checked by
//! the caller before any read here (the route's policy finds the job in the caller's team).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::JobId;

/// One replica's log of one attempt, as `(job, attempt, replica)`.
pub type LogKey = (JobId, i32, i32);

/// Where the collector is in one replica's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub job_id: JobId,
    pub attempt: i32,
    pub replica: i32,
    /// The newest kept line's time; `None` before the first line.
    pub read_to: Option<DateTime<Utc>>,
    /// How many kept lines carry exactly `read_to`.
    pub read_at_to: i32,
    /// Older lines let go to keep the tail bounded.
    pub dropped: i64,
    /// The attempt ended and its last lines were read.
    pub complete: bool,
}

/// An attempt whose application runs on `cluster` now, with its replica count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningAttempt {
    pub job_id: JobId,
    pub attempt: i32,
    pub replicas: i32,
}

/// Attempts running on `cluster`, the collector's work between two ends.
pub async fn running_attempts(pool: &PgPool, cluster: &str) -> Result<Vec<RunningAttempt>, sqlx::Error> {
    sqlx::query_as!(
        RunningAttempt,
        r#"select j.id as "job_id: JobId", j.attempt, j.replicas
           from jobs j join clusters cl on cl.id = j.cluster_id
           where j.holds_gpus and j.state = 'running' and cl.name = $1
           order by j.id"#,
        cluster
    )
    .fetch_all(pool)
    .await
}

/// The replica count of each job named, for attempts the reconciler ends.
pub async fn replica_counts(pool: &PgPool, jobs: &[JobId]) -> Result<Vec<(JobId, i32)>, sqlx::Error> {
    let rows =
        sqlx::query!(r#"select id as "id: JobId", replicas from jobs where id = any($1::uuid[])"#, jobs as &[JobId])
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.replicas)).collect())
}

/// The cursors of `keys` as they are (a replica never read has none).
pub async fn cursors(pool: &PgPool, keys: &[LogKey]) -> Result<Vec<Cursor>, sqlx::Error> {
    let (jobs, attempts, replicas) = split(keys);
    sqlx::query_as!(
        Cursor,
        r#"select c.job_id as "job_id: JobId", c.attempt, c.replica, c.read_to, c.read_at_to, c.dropped, c.complete
           from job_log_cursors c
           join unnest($1::uuid[], $2::int4[], $3::int4[]) as k(job_id, attempt, replica)
             on (c.job_id, c.attempt, c.replica) = (k.job_id, k.attempt, k.replica)"#,
        &jobs as &[JobId],
        &attempts,
        &replicas
    )
    .fetch_all(pool)
    .await
}

/// The cursors of `keys`, created where missing and locked until the transaction ends, so
/// two collectors (a running attempt's periodic read and its end's last read) cannot keep
/// the same lines twice. In key order, so that concurrent lockers cannot deadlock.
pub async fn lock_cursors(tx: &mut Tx<'_>, keys: &[LogKey]) -> Result<Vec<Cursor>, sqlx::Error> {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (jobs, attempts, replicas) = split(&sorted);
    // A job deleted meanwhile has no cursor to make: the join leaves it out.
    sqlx::query!(
        "insert into job_log_cursors (job_id, attempt, replica)
         select k.job_id, k.attempt, k.replica
         from unnest($1::uuid[], $2::int4[], $3::int4[]) with ordinality as k(job_id, attempt, replica, n)
         join jobs j on j.id = k.job_id
         order by k.n
         on conflict do nothing",
        &jobs as &[JobId],
        &attempts,
        &replicas
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query_as!(
        Cursor,
        r#"select c.job_id as "job_id: JobId", c.attempt, c.replica, c.read_to, c.read_at_to, c.dropped, c.complete
           from job_log_cursors c
           join unnest($1::uuid[], $2::int4[], $3::int4[]) as k(job_id, attempt, replica)
             on (c.job_id, c.attempt, c.replica) = (k.job_id, k.attempt, k.replica)
           order by c.job_id, c.attempt, c.replica
           for update of c"#,
        &jobs as &[JobId],
        &attempts,
        &replicas
    )
    .fetch_all(&mut **tx)
    .await
}

/// New lines of one replica and where its cursor moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub key: LogKey,
    /// Oldest first.
    pub lines: Vec<(DateTime<Utc>, String)>,
    pub read_to: Option<DateTime<Utc>>,
    pub read_at_to: i32,
    pub complete: bool,
}

/// Appends lines and moves cursors (locked by [`lock_cursors`] in the same transaction),
/// then lets go of each touched replica's lines older than its newest `keep`.
pub async fn append(tx: &mut Tx<'_>, appended: &[Appended], keep: i64) -> Result<(), sqlx::Error> {
    if appended.is_empty() {
        return Ok(());
    }
    let mut jobs = Vec::new();
    let mut attempts = Vec::new();
    let mut replicas = Vec::new();
    let mut ats = Vec::new();
    let mut texts = Vec::new();
    for a in appended {
        for (at, text) in &a.lines {
            jobs.push(a.key.0);
            attempts.push(a.key.1);
            replicas.push(a.key.2);
            ats.push(*at);
            texts.push(text.as_str());
        }
    }
    sqlx::query!(
        "insert into job_logs (job_id, attempt, replica, at, line)
         select job_id, attempt, replica, at, line
         from unnest($1::uuid[], $2::int4[], $3::int4[], $4::timestamptz[], $5::text[])
              with ordinality as l(job_id, attempt, replica, at, line, n)
         order by n",
        &jobs as &[JobId],
        &attempts,
        &replicas,
        &ats,
        &texts as &[&str]
    )
    .execute(&mut **tx)
    .await?;
    let keys: Vec<LogKey> = appended.iter().map(|a| a.key).collect();
    let (jobs, attempts, replicas) = split(&keys);
    let read_to: Vec<Option<DateTime<Utc>>> = appended.iter().map(|a| a.read_to).collect();
    let read_at_to: Vec<i32> = appended.iter().map(|a| a.read_at_to).collect();
    let complete: Vec<bool> = appended.iter().map(|a| a.complete).collect();
    sqlx::query!(
        "update job_log_cursors c
         set read_to = k.read_to, read_at_to = k.read_at_to, complete = c.complete or k.complete
         from unnest($1::uuid[], $2::int4[], $3::int4[], $4::timestamptz[], $5::int4[], $6::bool[])
              as k(job_id, attempt, replica, read_to, read_at_to, complete)
         where (c.job_id, c.attempt, c.replica) = (k.job_id, k.attempt, k.replica)",
        &jobs as &[JobId],
        &attempts,
        &replicas,
        &read_to as &[Option<DateTime<Utc>>],
        &read_at_to,
        &complete
    )
    .execute(&mut **tx)
    .await?;
    // Only replicas that grew can have grown past the bound.
    let grew: Vec<LogKey> = appended.iter().filter(|a| !a.lines.is_empty()).map(|a| a.key).collect();
    let (jobs, attempts, replicas) = split(&grew);
    sqlx::query!(
        "with ranked as (
             select l.id, l.job_id, l.attempt, l.replica,
                    row_number() over (partition by l.job_id, l.attempt, l.replica order by l.id desc) as newer
             from job_logs l
             join unnest($1::uuid[], $2::int4[], $3::int4[]) as k(job_id, attempt, replica)
               on (l.job_id, l.attempt, l.replica) = (k.job_id, k.attempt, k.replica)),
         gone as (
             delete from job_logs l using ranked r
             where l.id = r.id and r.newer > $4
             returning l.job_id, l.attempt, l.replica)
         update job_log_cursors c set dropped = c.dropped + g.n
         from (select job_id, attempt, replica, count(*) as n from gone group by 1, 2, 3) g
         where (c.job_id, c.attempt, c.replica) = (g.job_id, g.attempt, g.replica)",
        &jobs as &[JobId],
        &attempts,
        &replicas,
        keep
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A kept line as readers get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRow {
    /// Increasing in the order lines were kept: a follower's position.
    pub id: i64,
    pub replica: i32,
    pub at: DateTime<Utc>,
    pub line: String,
}

/// Kept lines of `job`'s attempt after line id `after`, of one replica or all, oldest first.
pub async fn lines(
    pool: &PgPool,
    job: JobId,
    attempt: i32,
    replica: Option<i32>,
    after: i64,
    limit: i64,
) -> Result<Vec<LineRow>, sqlx::Error> {
    sqlx::query_as!(
        LineRow,
        "select id, replica, at, line from job_logs
         where job_id = $1 and attempt = $2 and ($3::int4 is null or replica = $3) and id > $4
         order by id limit $5",
        job as JobId,
        attempt,
        replica,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The newest `limit` kept lines of `job`'s attempt, every replica's, oldest first.
pub async fn tail(pool: &PgPool, job: JobId, attempt: i32, limit: i64) -> Result<Vec<LineRow>, sqlx::Error> {
    sqlx::query_as!(
        LineRow,
        r#"select id as "id!", replica as "replica!", at as "at!", line as "line!" from (
               select id, replica, at, line from job_logs
               where job_id = $1 and attempt = $2 order by id desc limit $3) newest
           order by id"#,
        job as JobId,
        attempt,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The cursors of every replica of `job`'s attempt that has one, in replica order.
pub async fn attempt_cursors(pool: &PgPool, job: JobId, attempt: i32) -> Result<Vec<Cursor>, sqlx::Error> {
    sqlx::query_as!(
        Cursor,
        r#"select job_id as "job_id: JobId", attempt, replica, read_to, read_at_to, dropped, complete
           from job_log_cursors where job_id = $1 and attempt = $2 order by replica"#,
        job as JobId,
        attempt
    )
    .fetch_all(pool)
    .await
}

/// The newest kept line's id over every job (0 with none): what the event feed watches to
/// wake log followers.
pub async fn newest_line_id(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select coalesce(max(id), 0)::int8 as "id!" from job_logs"#).fetch_one(pool).await
}

fn split(keys: &[LogKey]) -> (Vec<JobId>, Vec<i32>, Vec<i32>) {
    let mut jobs = Vec::with_capacity(keys.len());
    let mut attempts = Vec::with_capacity(keys.len());
    let mut replicas = Vec::with_capacity(keys.len());
    for &(job, attempt, replica) in keys {
        jobs.push(job);
        attempts.push(attempt);
        replicas.push(replica);
    }
    (jobs, attempts, replicas)
}
