//! Job arrays: the array rows, their tasks' counts per state, an array's tasks in index
//! order, the leader's release of tasks the parallelism held back, and cancelling what is
//! left of an array. The tasks themselves are jobs (`db::jobs`).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::{array::TaskCounts, ArrayId, JobId, JobState, TeamId};

/// An array, with what its tasks share (read from its first task).
#[derive(Debug, Clone)]
pub struct ArrayRow {
    pub id: ArrayId,
    pub seq: i64,
    pub team_id: TeamId,
    pub team: String,
    pub name: String,
    pub task_count: i32,
    pub parallelism: Option<i32>,
    pub gpu_class: String,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    pub image: String,
    pub submitted_by: String,
    pub submitted_at: DateTime<Utc>,
}

/// Stores array `id` of `team_id`; its tasks are stored by `db::jobs::insert_many` in the
/// same transaction.
pub async fn insert(
    tx: &mut Tx<'_>,
    id: ArrayId,
    team_id: TeamId,
    name: &str,
    task_count: i32,
    parallelism: Option<i32>,
    submitted_by: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into job_arrays (id, team_id, name, task_count, parallelism, submitted_by)
         values ($1, $2, $3, $4, $5, $6)",
        id as ArrayId,
        team_id as TeamId,
        name,
        task_count,
        parallelism,
        submitted_by
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A query for [`ArrayRow`]s followed by `$rest` (the where clause and what follows).
macro_rules! select_arrays {
    ($rest:tt, $($arg:expr),* $(,)?) => {
        sqlx::query_as!(
            ArrayRow,
            r#"select a.id as "id: ArrayId", a.seq, a.team_id as "team_id: TeamId", t.name as team, a.name,
                      a.task_count, a.parallelism, c.name as gpu_class, j.priority_class, j.replicas,
                      j.gpus_per_replica, j.image, a.submitted_by, a.submitted_at
               from job_arrays a
               join teams t on t.id = a.team_id
               join jobs j on j.array_id = a.id and j.array_index = 0
               join gpu_classes c on c.id = j.gpu_class_id
               "# + $rest,
            $($arg),*
        )
    };
}

/// Array `id` of `team_id`; `None` for another team's, exactly as for one that does not exist.
pub async fn get(pool: &PgPool, team_id: TeamId, id: ArrayId) -> Result<Option<ArrayRow>, sqlx::Error> {
    select_arrays!(r#"where a.id = $1 and a.team_id = $2"#, id as ArrayId, team_id as TeamId).fetch_optional(pool).await
}

/// A team's arrays, newest first, before `before_seq` when given.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    before_seq: Option<i64>,
    limit: i64,
) -> Result<Vec<ArrayRow>, sqlx::Error> {
    select_arrays!(
        r#"where a.team_id = $1 and ($2::int8 is null or a.seq < $2) order by a.seq desc limit $3"#,
        team_id as TeamId,
        before_seq,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The task counts of each of `ids` (an array missing from the answer has none).
pub async fn counts(pool: &PgPool, ids: &[ArrayId]) -> Result<Vec<(ArrayId, TaskCounts)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select array_id as "array_id!: ArrayId", state as "state: JobState", holds_gpus, held_by_array,
                  count(*) as "n!"
           from jobs where array_id = any($1)
           group by array_id, state, holds_gpus, held_by_array
           order by array_id"#,
        ids as &[ArrayId]
    )
    .fetch_all(pool)
    .await?;
    let mut out: Vec<(ArrayId, TaskCounts)> = Vec::new();
    for r in rows {
        if out.last().map(|(id, _)| *id) != Some(r.array_id) {
            out.push((r.array_id, TaskCounts::default()));
        }
        if let Some((_, c)) = out.last_mut() {
            c.add(r.state, r.holds_gpus, r.held_by_array, r.n);
        }
    }
    Ok(out)
}

/// A task the array pass released to the scheduler.
#[derive(Debug, Clone)]
pub struct ReleasedTask {
    pub job_id: JobId,
    pub attempt: i32,
    pub index: i32,
    pub task_count: i32,
    pub parallelism: i32,
}

/// Releases, for every array holding tasks back, as many of its held tasks (lowest index
/// first) as its parallelism has room for: the tasks under way (not held and not ended)
/// count against it. Tasks another transaction holds are skipped; the next pass takes them.
/// What it released, and how many tasks it left held.
pub async fn release(tx: &mut Tx<'_>) -> Result<(Vec<ReleasedTask>, i64), sqlx::Error> {
    let released = sqlx::query_as!(
        ReleasedTask,
        r#"with held as (
               select distinct array_id from jobs where held_by_array
           ),
           room as (
               select a.id, a.task_count, a.parallelism,
                      a.parallelism - (select count(*) from jobs t
                                       where t.array_id = a.id and not t.held_by_array
                                         and (t.state in ('pending', 'admitted', 'running') or t.holds_gpus)) as free
               from job_arrays a join held on held.array_id = a.id
           ),
           chosen as (
               select c.id, r.task_count, r.parallelism
               from room r
               cross join lateral (
                   select t.id from jobs t
                   where t.array_id = r.id and t.held_by_array and t.state = 'pending'
                   order by t.array_index
                   limit greatest(r.free, 0)
                   for update skip locked
               ) c
           )
           update jobs j set held_by_array = false, pending_reason = null, pending_message = null,
                  pending_figures = null, updated_at = now(), version = j.version + 1
           from chosen
           where j.id = chosen.id
           returning j.id as "job_id: JobId", j.attempt, j.array_index as "index!", chosen.task_count,
                     chosen.parallelism as "parallelism!""#
    )
    .fetch_all(&mut **tx)
    .await?;
    let left =
        sqlx::query_scalar!(r#"select count(*) as "n!" from jobs where held_by_array"#).fetch_one(&mut **tx).await?;
    Ok((released, left))
}

/// A task of an array that a cancel of the whole array must end.
#[derive(Debug, Clone)]
pub struct OpenTask {
    pub job_id: JobId,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub grace_ms: i64,
}

/// Locks the tasks of array `id` that have not ended (waiting, under way, or stopping to
/// be requeued), as `db::jobs::lock` does for one job.
pub async fn lock_open_tasks(tx: &mut Tx<'_>, id: ArrayId) -> Result<Vec<OpenTask>, sqlx::Error> {
    sqlx::query_as!(
        OpenTask,
        r#"select j.id as "job_id: JobId", j.attempt, j.holds_gpus,
                  coalesce(j.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as "grace_ms!"
           from jobs j join priority_classes p on p.name = j.priority_class
           where j.array_id = $1
             and (j.state in ('pending', 'admitted', 'running') or (j.state = 'preempted' and j.holds_gpus))
           order by j.array_index
           for update of j"#,
        id as ArrayId
    )
    .fetch_all(&mut **tx)
    .await
}
