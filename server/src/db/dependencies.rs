//! Job dependencies: which jobs a team may wait for, the dependencies of a job with the
//! states of the jobs they name, and the leader's dependency pass (the waiting jobs, locked,
//! and what it does to them). Jobs' dependencies are written with the jobs
//! (`jobs::insert_submissions`).

use serde_json::Value;
use sqlx::PgPool;

use super::Tx;
use crate::domain::{dependency::After, JobId, JobState, TeamId};

/// Of `ids`, the jobs a job of `team_id` may wait for: jobs of the team, of its ancestors
/// or of its descendants. Another tenant's job is missing from the answer, as is one that
/// does not exist, so the caller can say nothing that tells them apart.
pub async fn visible(pool: &PgPool, team_id: TeamId, ids: &[JobId]) -> Result<Vec<JobId>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"with recursive up as (
               select id, parent_id from teams where id = $1
               union all
               select t.id, t.parent_id from teams t join up on t.id = up.parent_id
           ),
           down as (
               select id from teams where id = $1
               union all
               select t.id from teams t join down on t.parent_id = down.id
           )
           select j.id as "id!: JobId" from jobs j
           where j.id = any($2) and (j.team_id in (select id from up) or j.team_id in (select id from down))"#,
        team_id as TeamId,
        ids as &[JobId]
    )
    .fetch_all(pool)
    .await
}

/// A job depended on, with what is waited for and where it stands.
#[derive(Debug, Clone)]
pub struct DependencyRow {
    pub job: JobId,
    pub name: String,
    pub state: JobState,
    pub holds_gpus: bool,
    pub after: After,
}

/// The jobs `job_id` waits for, in the order they were submitted.
pub async fn of_job(db: impl sqlx::PgExecutor<'_>, job_id: JobId) -> Result<Vec<DependencyRow>, sqlx::Error> {
    sqlx::query_as!(
        DependencyRow,
        r#"select j.id as "job: JobId", j.name, j.state as "state: JobState", j.holds_gpus,
                  d.after as "after: After"
           from job_dependencies d join jobs j on j.id = d.depends_on
           where d.job_id = $1
           order by j.seq"#,
        job_id as JobId
    )
    .fetch_all(db)
    .await
}

/// The jobs each of `ids` waits for, as (waiting job, dependency), by waiting job and then
/// in the order the dependencies were submitted: one read for a page of jobs.
pub async fn of_jobs(pool: &PgPool, ids: &[JobId]) -> Result<Vec<(JobId, DependencyRow)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select d.job_id as "waiting: JobId", j.id as "job: JobId", j.name, j.state as "state: JobState",
                  j.holds_gpus, d.after as "after: After"
           from job_dependencies d join jobs j on j.id = d.depends_on
           where d.job_id = any($1)
           order by d.job_id, j.seq"#,
        ids as &[JobId]
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                r.waiting,
                DependencyRow { job: r.job, name: r.name, state: r.state, holds_gpus: r.holds_gpus, after: r.after },
            )
        })
        .collect())
}

/// A job that depends on another, as the job page lists them.
#[derive(Debug, Clone)]
pub struct DependentRow {
    pub job: JobId,
    pub name: String,
    pub state: JobState,
    pub after: After,
}

/// The jobs of team `team_id` that wait for `job_id`, in the order they were submitted.
pub async fn dependents(pool: &PgPool, team_id: TeamId, job_id: JobId) -> Result<Vec<DependentRow>, sqlx::Error> {
    sqlx::query_as!(
        DependentRow,
        r#"select j.id as "job: JobId", j.name, j.state as "state: JobState", d.after as "after: After"
           from job_dependencies d join jobs j on j.id = d.job_id
           where d.depends_on = $2 and j.team_id = $1
           order by j.seq"#,
        team_id as TeamId,
        job_id as JobId
    )
    .fetch_all(pool)
    .await
}

/// One dependency of a waiting job, with the waiting job's own columns the pass needs.
#[derive(Debug, Clone)]
pub struct WaitingRow {
    pub job_id: JobId,
    pub attempt: i32,
    /// `cancel` or `keep`.
    pub if_dependency_fails: String,
    pub pending_message: Option<String>,
    pub depends_on: JobId,
    pub name: String,
    pub state: JobState,
    pub holds_gpus: bool,
    pub after: After,
    /// The waiting job is also held by its array's parallelism: it keeps that reason (the
    /// array pass releases it) and is counted under it.
    pub held_by_array: bool,
}

/// The waiting jobs' dependencies, the waiting jobs locked (rows others hold are skipped:
/// the next pass takes them), ordered by waiting job, then by the dependencies' submission.
pub async fn waiting(tx: &mut Tx<'_>) -> Result<Vec<WaitingRow>, sqlx::Error> {
    sqlx::query_as!(
        WaitingRow,
        r#"select w.id as "job_id: JobId", w.attempt, w.if_dependency_fails, w.pending_message,
                  j.id as "depends_on: JobId", j.name, j.state as "state: JobState", j.holds_gpus,
                  d.after as "after: After", w.held_by_array
           from jobs w
           join job_dependencies d on d.job_id = w.id
           join jobs j on j.id = d.depends_on
           where w.waits_for_dependencies and w.state = 'pending'
           order by w.seq, j.seq
           for update of w skip locked"#
    )
    .fetch_all(&mut **tx)
    .await
}

/// Hands waiting jobs to the scheduler: their next snapshot sees them (the version bump
/// marks them changed).
pub async fn release(tx: &mut Tx<'_>, ids: &[JobId]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set waits_for_dependencies = false,
                -- A task its array still holds keeps saying so.
                pending_reason = case when held_by_array then pending_reason end,
                pending_message = case when held_by_array then pending_message end,
                pending_figures = case when held_by_array then pending_figures end,
                updated_at = now(), version = version + 1
         where id = any($1) and waits_for_dependencies",
        ids as &[JobId]
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Cancels a waiting job whose dependency can no longer be met. It never held GPUs.
pub async fn cancel(tx: &mut Tx<'_>, id: JobId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set state = 'cancelled', waits_for_dependencies = false, held_by_array = false, finished_at = now(),
                pending_reason = null, pending_message = null, pending_figures = null, queue_position = null,
                expected_start_at = null, updated_at = now(), version = version + 1
         where id = $1 and state = 'pending'",
        id as JobId
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records why a job still waits: a reason code and its words, with the numbers behind them.
pub async fn set_reason(
    tx: &mut Tx<'_>,
    id: JobId,
    reason: &str,
    message: &str,
    figures: &Value,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set pending_reason = $2, pending_message = $3, pending_figures = $4, queue_position = null,
                expected_start_at = null, updated_at = now()
         where id = $1",
        id as JobId,
        reason,
        message,
        figures
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
