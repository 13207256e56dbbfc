//! Recording a cycle: admissions (with their attempts, events and outbox rows),
//! preemptions, why each pending job waits, and the quota invariant the cycle must keep.

use crate::domain::{ClusterId, JobId, JobState};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::Tx;

/// An admission to record.
pub struct AdmitRow {
    pub job_id: JobId,
    pub cluster_id: ClusterId,
    pub placement: Value,
    pub borrowing: bool,
    pub message: String,
    pub data: Value,
}

/// Records admissions: the job becomes `admitted` with its placement, a new attempt, an
/// event and a `submit` outbox row. Jobs no longer pending (cancelled meanwhile) are left
/// alone. Returns the admitted jobs.
pub async fn admit(tx: &mut Tx<'_>, rows: &[AdmitRow]) -> Result<Vec<JobId>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<JobId> = rows.iter().map(|r| r.job_id).collect();
    let clusters: Vec<ClusterId> = rows.iter().map(|r| r.cluster_id).collect();
    let placements: Vec<Value> = rows.iter().map(|r| r.placement.clone()).collect();
    let borrowing: Vec<bool> = rows.iter().map(|r| r.borrowing).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let data: Vec<Value> = rows.iter().map(|r| r.data.clone()).collect();
    sqlx::query_scalar!(
        r#"with u as (
               select * from unnest($1::uuid[], $2::uuid[], $3::jsonb[], $4::bool[], $5::text[], $6::jsonb[])
                   as u(id, cluster, placement, borrowing, message, data)
           ), admitted as (
               update jobs j set state = 'admitted', attempt = j.attempt + 1, holds_gpus = true,
                      cluster_id = u.cluster, placement = u.placement, borrowing = u.borrowing,
                      admitted_at = now(), dispatched_at = null, started_at = null, stop_requested_at = null,
                      exit_code = null, pending_reason = null, pending_message = null, pending_figures = null, queue_position = null,
                      expected_start_at = null, updated_at = now(), version = j.version + 1
               from u where j.id = u.id and j.state = 'pending'
               returning j.id, j.attempt
           ), events as (
               insert into job_events (job_id, attempt, kind, reason, message, data)
               select a.id, a.attempt, 'admitted', case when u.borrowing then 'burst' else 'reserved' end,
                      u.message, u.data
               from admitted a join u on u.id = a.id
           ), outbox as (
               insert into dispatch_outbox (job_id, attempt, action) select id, attempt, 'submit' from admitted
           )
           select id as "id!: JobId" from admitted"#,
        &ids as &[JobId],
        &clusters as &[ClusterId],
        &placements,
        &borrowing,
        &messages,
        &data
    )
    .fetch_all(&mut **tx)
    .await
}

/// A preemption to record, or an extra replica to give back ([`shrink`]).
pub struct PreemptRow {
    pub job_id: JobId,
    pub grace_ms: i64,
    pub reason: String,
    pub message: String,
    pub data: Value,
}

/// Records preemptions: the job becomes `preempted`, keeps its GPUs until its object is
/// gone, and gets an event and a `stop` outbox row with its grace period.
pub async fn preempt(tx: &mut Tx<'_>, rows: &[PreemptRow]) -> Result<Vec<JobId>, sqlx::Error> {
    stop(tx, rows, JobState::Preempted, "preempted", false).await
}

/// Gives extra replicas of elastic gangs back (a preemption that requeues nothing): each is
/// cancelled, keeps its GPUs until its object is gone, and gets an event and a `stop` outbox
/// row with its grace period. Returns those given back.
pub async fn shrink(tx: &mut Tx<'_>, rows: &[PreemptRow]) -> Result<Vec<JobId>, sqlx::Error> {
    stop(tx, rows, JobState::Cancelled, "cancel_requested", true).await
}

/// Tells the admitted or running jobs of `rows` (only extra replicas, with `extras_only`) to
/// stop: each takes `state` and an event of `kind`, and gets a `stop` outbox row with its
/// grace period. Returns those told.
async fn stop(
    tx: &mut Tx<'_>,
    rows: &[PreemptRow],
    state: JobState,
    kind: &str,
    extras_only: bool,
) -> Result<Vec<JobId>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<JobId> = rows.iter().map(|r| r.job_id).collect();
    let graces: Vec<i64> = rows.iter().map(|r| r.grace_ms).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let data: Vec<Value> = rows.iter().map(|r| r.data.clone()).collect();
    sqlx::query_scalar!(
        r#"with u as (
               select * from unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::jsonb[])
                   as u(id, grace, reason, message, data)
           ), told as (
               update jobs j set state = $6, stop_requested_at = now(), updated_at = now(),
                      version = j.version + 1
               from u where j.id = u.id and j.state in ('admitted', 'running') and (not $8 or j.extra_of is not null)
               returning j.id, j.attempt
           ), events as (
               insert into job_events (job_id, attempt, kind, reason, message, data)
               select t.id, t.attempt, $7, u.reason, u.message, u.data from told t join u on u.id = t.id
           ), outbox as (
               insert into dispatch_outbox (job_id, attempt, action, grace_ms)
               select t.id, t.attempt, 'stop', u.grace from told t join u on u.id = t.id
           )
           select id as "id!: JobId" from told"#,
        &ids as &[JobId],
        &graces,
        &reasons,
        &messages,
        &data,
        state.as_str(),
        kind,
        extras_only
    )
    .fetch_all(&mut **tx)
    .await
}

/// Locks the rows of `ids` in id order. The scheduling cycle and the reconciler both
/// change several jobs in one transaction; taking every lock up front in one order is what
/// keeps the two from deadlocking on jobs they both touch.
pub async fn lock_jobs(tx: &mut Tx<'_>, ids: &[JobId]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query!("select id from jobs where id = any($1) order by id for update", ids as &[JobId])
        .fetch_all(&mut **tx)
        .await?;
    Ok(())
}

/// Why each pending job waits.
#[derive(Debug, Clone)]
pub struct PendingRow {
    pub job_id: JobId,
    pub reason: String,
    pub message: String,
    /// The numbers behind the reason.
    pub figures: crate::domain::WaitFigures,
    pub position: i32,
    pub expected_start_at: Option<DateTime<Utc>>,
    /// The forecast's played median wait before calibration: kept, with its time, from the
    /// first refresh of the job's stay in the queue that has one (see `db::forecast`).
    pub played_wait_ms: Option<i64>,
}

/// Refreshes the reason, position and expected start of pending jobs, touching only rows
/// whose values changed, and adds a `waiting` event to the timeline of every job whose
/// reason changed (its first reason included), so a job's history says why it waited when.
/// Rows another transaction holds are skipped, not waited for: what is written here is for
/// people to read, and the next refresh writes it. Returns the jobs whose rows were written.
pub async fn set_pending(tx: &mut Tx<'_>, rows: &[PendingRow]) -> Result<Vec<JobId>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<JobId> = rows.iter().map(|r| r.job_id).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let figures: Vec<serde_json::Value> =
        rows.iter().map(|r| serde_json::to_value(&r.figures).unwrap_or(serde_json::Value::Null)).collect();
    let positions: Vec<i32> = rows.iter().map(|r| r.position).collect();
    let starts: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.expected_start_at).collect();
    let played: Vec<Option<i64>> = rows.iter().map(|r| r.played_wait_ms).collect();
    sqlx::query_scalar!(
        r#"with target as (
             select j.id, j.attempt, u.reason, u.message, u.figures, u.position, u.start, u.played,
                    j.pending_reason is distinct from u.reason as reason_changed,
                    u.played is not null and (j.forecast_at is null or j.forecast_at < j.queued_at) as first_forecast
             from unnest($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[], $6::jsonb[], $7::int8[])
                  as u(id, reason, message, position, start, figures, played)
             join jobs j on j.id = u.id
             where j.state = 'pending'
               and ((j.pending_reason, j.pending_message, j.queue_position, j.expected_start_at, j.pending_figures)
                   is distinct from (u.reason, u.message, u.position, u.start, u.figures)
                   or (u.played is not null and (j.forecast_at is null or j.forecast_at < j.queued_at)))
             for update of j skip locked
         ), events as (
             insert into job_events (job_id, attempt, kind, reason, message)
             select t.id, t.attempt, 'waiting', t.reason, t.message from target t where t.reason_changed
         )
         update jobs j set pending_reason = t.reason, pending_message = t.message, queue_position = t.position,
                expected_start_at = t.start, pending_figures = t.figures,
                forecast_at = case when t.first_forecast then now() else j.forecast_at end,
                forecast_wait_ms = case when t.first_forecast then t.played else j.forecast_wait_ms end
         from target t where j.id = t.id
         returning j.id as "id: JobId""#,
        &ids as &[JobId],
        &reasons,
        &messages,
        &positions,
        &starts as &[Option<DateTime<Utc>>],
        &figures,
        &played as &[Option<i64>]
    )
    .fetch_all(&mut **tx)
    .await
}

/// Teams whose admitted GPUs exceed reserved + burst for a class, at any level of the team
/// tree: the invariant every cycle must keep. Empty when all is well.
pub async fn quota_violations(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<(String, String, i64, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"with recursive ancestry (team_id, ancestor_id) as (
               select id, id from teams
               union all
               select a.team_id, t.parent_id from ancestry a join teams t on t.id = a.ancestor_id
               where t.parent_id is not null
           ), used as (
               select a.ancestor_id as team_id, j.gpu_class_id, sum(j.replicas * j.gpus_per_replica)::int8 as gpus
               from jobs j join ancestry a on a.team_id = j.team_id
               where j.holds_gpus
               group by a.ancestor_id, j.gpu_class_id
           )
           select t.name as "team!", c.name as "gpu_class!", u.gpus as "used!",
                  (coalesce(q.reserved, 0) + coalesce(q.burst, 0))::int8 as "limit!"
           from used u
           join teams t on t.id = u.team_id
           join gpu_classes c on c.id = u.gpu_class_id
           left join quotas q on q.team_id = u.team_id and q.gpu_class_id = u.gpu_class_id
           where u.gpus > coalesce(q.reserved, 0) + coalesce(q.burst, 0)"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.team, r.gpu_class, r.used, r.limit)).collect())
}
