//! The dispatch outbox: rows the dispatcher claims (`for update skip locked`), completes or
//! retries later, and the mark that a backend accepted a job's object.

use crate::domain::JobId;

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

/// Records that the backend accepted the job's object.
pub async fn mark_dispatched(tx: &mut Tx<'_>, job_id: JobId, attempt: i32) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set dispatched_at = coalesce(dispatched_at, clock_timestamp()), updated_at = now()
         where id = $1 and attempt = $2",
        job_id as JobId,
        attempt
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
