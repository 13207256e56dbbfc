//! The dispatch outbox: rows the dispatcher claims (`for update skip locked`), completes or
//! retries later, and the mark that a backend accepted a job's object.

use crate::domain::JobId;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::Tx;
use crate::domain::JobState;

/// The channel the dispatcher listens on.
pub const DISPATCH_CHANNEL: &str = "fairway_dispatch";

/// A claimed outbox row with what the dispatcher needs of its job.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub job_id: JobId,
    pub attempt: i32,
    pub action: String,
    pub grace_ms: i64,
    pub tries: i32,
    pub job_state: JobState,
    pub job_attempt: i32,
    pub cluster: Option<String>,
}

/// Claims the oldest due outbox rows (up to `limit`) nobody else holds, locking them and
/// (shared) their jobs for the rest of the transaction, so the scheduler cannot change a job
/// while its object is being created. A row whose job someone is changing right now is left
/// for the next claim: waiting for it while holding the batch's other jobs could deadlock
/// with the reconciler, which locks jobs in id order. Only rows from id `from` on are looked
/// at (see `control::dispatch::Cursor`).
pub async fn claim(tx: &mut Tx<'_>, from: i64, limit: i64) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as!(
        OutboxRow,
        r#"select o.id, o.job_id, o.attempt, o.action, o.grace_ms, o.tries, j.state as "job_state: JobState",
                  j.attempt as job_attempt, cl.name as "cluster?"
           from dispatch_outbox o
           join jobs j on j.id = o.job_id
           left join clusters cl on cl.id = j.cluster_id
           where o.done_at is null and o.not_before <= now() and o.id >= $2
           order by o.id
           limit $1
           for update of o skip locked
           for share of j skip locked"#,
        limit,
        from
    )
    .fetch_all(&mut **tx)
    .await
}

/// Marks an outbox row done.
pub async fn complete(tx: &mut Tx<'_>, id: i64, note: Option<&str>) -> Result<(), sqlx::Error> {
    sqlx::query!("update dispatch_outbox set done_at = now(), last_error = $2 where id = $1", id, note)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Schedules another try of an outbox row after `delay_ms`.
pub async fn retry_later(tx: &mut Tx<'_>, id: i64, delay_ms: i64, error: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update dispatch_outbox set tries = tries + 1, last_error = $3,
                not_before = now() + make_interval(secs => $2::float8 / 1000.0)
         where id = $1",
        id,
        delay_ms as f64,
        error
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// An outbox row whose job's object a cluster accepted (see [`record_dispatched`]).
pub struct Dispatched {
    pub outbox_id: i64,
    pub job_id: JobId,
    pub attempt: i32,
    /// When the cluster accepted it.
    pub at: DateTime<Utc>,
    /// The `dispatched` event's message and data.
    pub message: String,
    pub data: Value,
}

/// Records a batch of accepted objects in one statement: each job's `dispatched_at` (the
/// first acceptance of its attempt), a `dispatched` event in the batch's order, and the
/// outbox row done. One statement instead of three per job: at tens of thousands of jobs a
/// minute the round trips were a tenth of the database's time.
pub async fn record_dispatched(tx: &mut Tx<'_>, rows: &[Dispatched]) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let outbox_ids: Vec<i64> = rows.iter().map(|r| r.outbox_id).collect();
    let job_ids: Vec<JobId> = rows.iter().map(|r| r.job_id).collect();
    let attempts: Vec<i32> = rows.iter().map(|r| r.attempt).collect();
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.at).collect();
    let messages: Vec<&str> = rows.iter().map(|r| r.message.as_str()).collect();
    let data: Vec<Value> = rows.iter().map(|r| r.data.clone()).collect();
    sqlx::query!(
        "with d as (
             select * from unnest($1::int8[], $2::uuid[], $3::int4[], $4::timestamptz[], $5::text[], $6::jsonb[])
                 with ordinality as d(outbox_id, job_id, attempt, at, message, data, n)
         ), marked as (
             update jobs j set dispatched_at = coalesce(j.dispatched_at, d.at), updated_at = now()
             from d where j.id = d.job_id and j.attempt = d.attempt
         ), events as (
             insert into job_events (job_id, attempt, kind, message, data)
             select job_id, attempt, 'dispatched', message, data from d order by n
         )
         update dispatch_outbox o set done_at = now(), last_error = null from d where o.id = d.outbox_id",
        &outbox_ids,
        &job_ids as &[JobId],
        &attempts,
        &at,
        &messages as &[&str],
        &data
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
