//! Attempts as the reconciler sees them: jobs holding GPUs, attempts that started (usage
//! intervals opened at the backend's real start) and that ended (intervals closed, the job
//! requeued or finished, retry counters bumped).

use crate::domain::JobId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::{JobState, RetryCounter};

/// A job holding GPUs on a cluster, as the reconciler compares it with the backend.
#[derive(Debug, Clone)]
pub struct HeldJob {
    pub id: JobId,
    pub attempt: i32,
    pub state: JobState,
    pub stop_requested_at: Option<DateTime<Utc>>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub grace_ms: i64,
    /// A `submit` for this attempt is still in the outbox.
    pub submit_pending: bool,
    /// A `stop` for this attempt is still in the outbox: the dispatcher tells the backend.
    pub stop_pending: bool,
    /// When a GPU fault DCGM reported began on a node the attempt runs on (the earliest),
    /// and on which node and why: the attempt is lost from then.
    pub fault_since: Option<DateTime<Utc>>,
    pub fault: Option<String>,
}

/// Jobs holding GPUs on `cluster`.
pub async fn held_jobs(pool: &PgPool, cluster: &str) -> Result<Vec<HeldJob>, sqlx::Error> {
    sqlx::query_as!(
        HeldJob,
        r#"select j.id as "id: JobId", j.attempt, j.state as "state: JobState", j.stop_requested_at, j.dispatched_at, j.started_at,
                  coalesce(j.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as "grace_ms!",
                  exists (select 1 from dispatch_outbox o where o.job_id = j.id and o.attempt = j.attempt
                          and o.action = 'submit' and o.done_at is null) as "submit_pending!",
                  exists (select 1 from dispatch_outbox o where o.job_id = j.id and o.attempt = j.attempt
                          and o.action = 'stop' and o.done_at is null) as "stop_pending!",
                  f.since as "fault_since?", f.what as "fault?"
           from jobs j
           join clusters cl on cl.id = j.cluster_id
           join priority_classes p on p.name = j.priority_class
           left join lateral (
               select g.since, 'node ' || g.node || ', GPU ' || g.gpu || ': ' || g.why as what from gpu_faults g
               where g.cluster_id = j.cluster_id
                 and g.node in (select r ->> 'node' from jsonb_array_elements(j.placement) r)
               order by g.since limit 1) f on true
           where j.holds_gpus and cl.name = $1"#,
        cluster
    )
    .fetch_all(pool)
    .await
}

/// What the reconciler needs of any job an object names.
pub struct JobAttempt {
    pub attempt: i32,
    pub holds_gpus: bool,
}

/// The current attempt of job `id`.
pub async fn job_attempt(pool: &PgPool, id: JobId) -> Result<Option<JobAttempt>, sqlx::Error> {
    sqlx::query_as!(JobAttempt, "select attempt, holds_gpus from jobs where id = $1", id as JobId)
        .fetch_optional(pool)
        .await
}

/// An attempt and an instant: when it started or ended.
pub type AttemptAt = (JobId, i32, DateTime<Utc>);

/// Marks admitted attempts running and opens their usage intervals (once). Returns the
/// attempts that were admitted until now.
pub async fn mark_running(tx: &mut Tx<'_>, starts: &[AttemptAt]) -> Result<Vec<(JobId, i32)>, sqlx::Error> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, attempts, at) = columns(starts);
    let updated = sqlx::query!(
        r#"update jobs j set state = 'running', started_at = u.at, dispatched_at = coalesce(j.dispatched_at, u.at),
                updated_at = now(), version = j.version + 1
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         where j.id = u.id and j.attempt = u.attempt and j.state = 'admitted'
         returning j.id as "id: JobId", j.attempt"#,
        &ids as &[JobId],
        &attempts,
        &at
    )
    .fetch_all(&mut **tx)
    .await?;
    open_intervals(tx, starts).await?;
    Ok(updated.into_iter().map(|r| (r.id, r.attempt)).collect())
}

fn columns(rows: &[AttemptAt]) -> (Vec<JobId>, Vec<i32>, Vec<DateTime<Utc>>) {
    (rows.iter().map(|r| r.0).collect(), rows.iter().map(|r| r.1).collect(), rows.iter().map(|r| r.2).collect())
}

/// Opens the usage intervals of attempts that started; a repeat does nothing.
pub async fn open_intervals(tx: &mut Tx<'_>, starts: &[AttemptAt]) -> Result<(), sqlx::Error> {
    if starts.is_empty() {
        return Ok(());
    }
    let (ids, attempts, at) = columns(starts);
    sqlx::query!(
        "insert into usage_intervals (job_id, attempt, team_id, gpu_class_id, priority_class, gpus, fraction_milli,
                                      borrowing, started_at, rate_micros_per_gpu_hour)
         select j.id, u.attempt, j.team_id, j.gpu_class_id, j.priority_class, j.replicas * j.gpus_per_replica,
                c.fraction_milli, j.borrowing, u.at,
                -- A pool with a price of its own (a cloud pool) meters the attempt at it.
                (select n.price_micros_per_gpu_hour from cluster_nodes n
                 where n.cluster_id = j.cluster_id and n.gpu_class_id = j.gpu_class_id
                   and n.name = j.placement -> 0 ->> 'node')
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         join jobs j on j.id = u.id and j.attempt = u.attempt
         join gpu_classes c on c.id = j.gpu_class_id
         on conflict (job_id, attempt) do nothing",
        &ids as &[JobId],
        &attempts,
        &at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Closes the usage intervals of attempts that ended; an interval already closed keeps its
/// end.
pub async fn close_intervals(tx: &mut Tx<'_>, ends: &[AttemptAt]) -> Result<(), sqlx::Error> {
    if ends.is_empty() {
        return Ok(());
    }
    let (ids, attempts, at) = columns(ends);
    sqlx::query!(
        "update usage_intervals i set ended_at = greatest(i.started_at, u.at)
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         where i.job_id = u.id and i.attempt = u.attempt and i.ended_at is null",
        &ids as &[JobId],
        &attempts,
        &at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The counters and limits that decide what follows an attempt.
pub struct AttemptEnd {
    pub id: JobId,
    pub state: JobState,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub max_retries: i32,
    pub preemptions: i32,
    pub capacity_retries: i32,
    pub node_lost_retries: i32,
    pub app_retries: i32,
}

/// Locks jobs, in id order, to end their attempts.
pub async fn lock_for_end(tx: &mut Tx<'_>, ids: &[JobId]) -> Result<Vec<AttemptEnd>, sqlx::Error> {
    sqlx::query_as!(
        AttemptEnd,
        r#"select id as "id: JobId", state as "state: JobState", attempt, holds_gpus, max_retries, preemptions, capacity_retries,
                node_lost_retries, app_retries
           from jobs where id = any($1) order by id for update"#,
        ids as &[JobId]
    )
    .fetch_all(&mut **tx)
    .await
}

/// How an attempt's end changes its job.
pub struct EndUpdate {
    pub job_id: JobId,
    pub attempt: i32,
    /// The next state: pending to requeue, or a final one.
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// Which retry counter to bump, if any.
    pub bump: Option<RetryCounter>,
}

/// Applies attempts' ends: GPUs released, states set, counters bumped, and the scheduler
/// woken to use the freed GPUs.
pub async fn end_attempts(tx: &mut Tx<'_>, updates: &[EndUpdate]) -> Result<(), sqlx::Error> {
    if updates.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = updates.iter().map(|u| u.job_id).collect();
    let attempts: Vec<i32> = updates.iter().map(|u| u.attempt).collect();
    let states: Vec<&str> = updates.iter().map(|u| u.state.as_str()).collect();
    let exit_codes: Vec<Option<i32>> = updates.iter().map(|u| u.exit_code).collect();
    // The SQL bumps the counter whose column the stored text names.
    let bumps: Vec<&str> = updates.iter().map(|u| u.bump.map_or("", RetryCounter::column)).collect();
    sqlx::query!(
        "update jobs j set holds_gpus = false, state = u.state, exit_code = coalesce(u.exit_code, j.exit_code),
                finished_at = case when u.state = 'pending' then null else now() end,
                queued_at = case when u.state = 'pending' then now() else j.queued_at end,
                attained_ms = j.attained_ms + case when u.state = 'pending' and j.started_at is not null
                    then greatest(0, floor(extract(epoch from now() - j.started_at) * 1000))::bigint else 0 end,
                preemptions = j.preemptions + (case when u.bump = 'preemptions' then 1 else 0 end),
                capacity_retries = j.capacity_retries + (case when u.bump = 'capacity_retries' then 1 else 0 end),
                node_lost_retries = j.node_lost_retries + (case when u.bump = 'node_lost_retries' then 1 else 0 end),
                app_retries = j.app_retries + (case when u.bump = 'app_retries' then 1 else 0 end),
                updated_at = now(), version = j.version + 1
         from unnest($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::text[])
              as u(id, attempt, state, exit_code, bump)
         where j.id = u.id and j.attempt = u.attempt",
        &ids as &[JobId],
        &attempts,
        &states as &[&str],
        &exit_codes as &[Option<i32>],
        &bumps as &[&str]
    )
    .execute(&mut **tx)
    .await?;
    super::jobs::notify(tx, super::jobs::SCHEDULE_CHANNEL).await
}
