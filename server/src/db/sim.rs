//! The simulated cluster's objects (`sim_objects`): what a real cluster keeps in its own
//! store, kept here so the simulation survives restarts. Only the `sim` backend calls these,
//! each in its own statement, never inside a scheduler transaction.
//!
//! Every timestamp is passed in by the caller rather than taken from `now()` in SQL: the
//! backend computes phases from these times with its own clock, so both must be one clock.

use crate::domain::JobId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// An object as the backend reads it back to compute its phase. The timeline fields kept in
/// `spec` are extracted here so that the phase is a pure function of this row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimObjectRow {
    pub name: String,
    pub job_id: JobId,
    pub attempt: i32,
    pub created_at: DateTime<Utc>,
    /// Real time between creation and start (`spec.start_delay_ms`; 0 when absent).
    pub start_delay_ms: i64,
    /// Scaled run time until the application exits by itself.
    pub run_ms: i64,
    /// The application's exit code at the end of `run_ms`.
    pub exit_code: i32,
    /// Scaled maximum runtime after the start (`spec.deadline_ms`); none means no limit.
    pub deadline_ms: Option<i64>,
    /// Scaled time after the start when a node of the gang disappears.
    pub lost_after_ms: Option<i64>,
    /// When the first stop request arrived.
    pub stop_requested_at: Option<DateTime<Utc>>,
    /// The first stop request's grace period (real time).
    pub grace_ms: i64,
    /// Scaled time the application needs to checkpoint and exit after SIGTERM.
    pub checkpoint_ms: i64,
}

/// A new object, its timeline fixed at creation.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSimObject {
    pub name: String,
    pub cluster: String,
    pub job_id: JobId,
    pub attempt: i32,
    /// The whole gang and the timeline fields (`start_delay_ms`, `deadline_ms`).
    pub spec: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub run_ms: i64,
    pub exit_code: i32,
    pub lost_after_ms: Option<i64>,
    pub checkpoint_ms: i64,
}

/// Creates the objects, each unless one of its name exists, in one statement. Returns how
/// many this call created.
pub async fn insert_many(pool: &PgPool, objects: &[NewSimObject]) -> Result<u64, sqlx::Error> {
    let column = |f: fn(&NewSimObject) -> String| objects.iter().map(f).collect::<Vec<_>>();
    let names = column(|o| o.name.clone());
    let clusters = column(|o| o.cluster.clone());
    let job_ids: Vec<JobId> = objects.iter().map(|o| o.job_id).collect();
    let attempts: Vec<i32> = objects.iter().map(|o| o.attempt).collect();
    let specs: Vec<serde_json::Value> = objects.iter().map(|o| o.spec.clone()).collect();
    let created_at: Vec<DateTime<Utc>> = objects.iter().map(|o| o.created_at).collect();
    let run_ms: Vec<i64> = objects.iter().map(|o| o.run_ms).collect();
    let exit_codes: Vec<i32> = objects.iter().map(|o| o.exit_code).collect();
    let lost_after_ms: Vec<Option<i64>> = objects.iter().map(|o| o.lost_after_ms).collect();
    let checkpoint_ms: Vec<i64> = objects.iter().map(|o| o.checkpoint_ms).collect();
    let done = sqlx::query!(
        "insert into sim_objects (name, cluster, job_id, attempt, spec, created_at, run_ms, exit_code,
                                  lost_after_ms, checkpoint_ms)
         select * from unnest($1::text[], $2::text[], $3::uuid[], $4::int4[], $5::jsonb[], $6::timestamptz[],
                              $7::int8[], $8::int4[], $9::int8[], $10::int8[])
         on conflict (name) do nothing",
        &names,
        &clusters,
        &job_ids as &[JobId],
        &attempts,
        &specs,
        &created_at,
        &run_ms,
        &exit_codes,
        &lost_after_ms as &[Option<i64>],
        &checkpoint_ms
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Records a stop request at `at` with `grace_ms`; a later request changes nothing, as a
/// cluster keeps the first termination it started. True when the object exists.
pub async fn request_stop(
    pool: &PgPool,
    cluster: &str,
    name: &str,
    at: DateTime<Utc>,
    grace_ms: i64,
) -> Result<bool, sqlx::Error> {
    let row = sqlx::query!(
        "update sim_objects
         set grace_ms = case when stop_requested_at is null then $4 else grace_ms end,
             stop_requested_at = coalesce(stop_requested_at, $3)
         where cluster = $1 and name = $2
         returning name",
        cluster,
        name,
        at,
        grace_ms
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.is_some())
}

/// Every object of `cluster`, oldest first.
pub async fn list(pool: &PgPool, cluster: &str) -> Result<Vec<SimObjectRow>, sqlx::Error> {
    sqlx::query_as!(
        SimObjectRow,
        r#"select name, job_id, attempt, created_at,
                  coalesce((spec->>'start_delay_ms')::bigint, 0) as "start_delay_ms!",
                  run_ms, exit_code,
                  (spec->>'deadline_ms')::bigint as deadline_ms,
                  lost_after_ms, stop_requested_at, grace_ms, checkpoint_ms
           from sim_objects where cluster = $1
           order by created_at, name"#,
        cluster
    )
    .fetch_all(pool)
    .await
}

/// One object with the spec it was created from (what its log lines are made of); `None`
/// when it does not exist.
pub async fn find(
    pool: &PgPool,
    cluster: &str,
    name: &str,
) -> Result<Option<(SimObjectRow, serde_json::Value)>, sqlx::Error> {
    Ok(find_many(pool, cluster, &[name]).await?.pop())
}

/// The objects named `names` that exist, each with the spec it was created from, in one
/// statement.
pub async fn find_many(
    pool: &PgPool,
    cluster: &str,
    names: &[&str],
) -> Result<Vec<(SimObjectRow, serde_json::Value)>, sqlx::Error> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let rows = sqlx::query!(
        r#"select name, job_id as "job_id: JobId", attempt, created_at,
                  coalesce((spec->>'start_delay_ms')::bigint, 0) as "start_delay_ms!",
                  run_ms, exit_code,
                  (spec->>'deadline_ms')::bigint as deadline_ms,
                  lost_after_ms, stop_requested_at, grace_ms, checkpoint_ms, spec
           from sim_objects where cluster = $1 and name = any($2)"#,
        cluster,
        &names
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let object = SimObjectRow {
                name: r.name,
                job_id: r.job_id,
                attempt: r.attempt,
                created_at: r.created_at,
                start_delay_ms: r.start_delay_ms,
                run_ms: r.run_ms,
                exit_code: r.exit_code,
                deadline_ms: r.deadline_ms,
                lost_after_ms: r.lost_after_ms,
                stop_requested_at: r.stop_requested_at,
                grace_ms: r.grace_ms,
                checkpoint_ms: r.checkpoint_ms,
            };
            (object, r.spec)
        })
        .collect())
}

/// Removes the object. True when it existed.
pub async fn delete(pool: &PgPool, cluster: &str, name: &str) -> Result<bool, sqlx::Error> {
    let done =
        sqlx::query!("delete from sim_objects where cluster = $1 and name = $2", cluster, name).execute(pool).await?;
    Ok(done.rows_affected() > 0)
}

/// Removes the named objects; how many existed.
pub async fn delete_all(pool: &PgPool, cluster: &str, names: &[String]) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!("delete from sim_objects where cluster = $1 and name = any($2)", cluster, names)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
