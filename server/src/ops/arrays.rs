//! Job arrays: one submission of up to 10,000 tasks that differ only in their index, each a
//! job of its own (its own attempts, retries, state and bill), the scheduler seeing them as
//! it sees separate jobs; at most `parallelism` of them released to the queue at once; the
//! array cancelled as a whole (one task is cancelled as any job is).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    jobs::{array_budget_warnings, validated, JobSpec},
    Error, Result,
};
use crate::{
    auth::CatalogueVersion,
    db::{
        self,
        jobs::{ArrayTask, NewEvent},
    },
    domain::{
        array::{self, TaskCounts},
        ArrayId, FieldError, JobId,
    },
    state::AppState,
};

/// An array to submit: `count` tasks of `task`, each told its index.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArraySpec {
    /// How many tasks, 1 to 10,000. Task `i` (0 to count - 1) finds its index in
    /// `FAIRWAY_ARRAY_TASK_ID` and `JOB_COMPLETION_INDEX`, and the count in
    /// `FAIRWAY_ARRAY_TASK_COUNT`.
    #[schema(minimum = 1, maximum = 10000)]
    pub count: i64,
    /// At most this many tasks are released to the queue or run at once (Slurm's `%N`,
    /// Kubernetes' `parallelism`); the rest wait, lowest index first, with the reason
    /// `array_task_limit`. Default: all may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10000)]
    pub parallelism: Option<i64>,
    /// What every task runs, as a job is submitted; its `name` names the array, and
    /// `max_retries` applies to each task on its own.
    pub task: JobSpec,
}

/// A stored array and the warnings it was accepted with.
pub struct SubmittedArray {
    pub array: db::arrays::ArrayRow,
    pub counts: TaskCounts,
    pub warnings: Vec<FieldError>,
}

/// Validates `spec` as `team` submits a job (the task's fields named `task.<field>`) and
/// stores the array and all its tasks in one transaction, on behalf of `by`.
pub async fn submit(
    state: &AppState,
    team: &db::teams::TeamRow,
    by: &str,
    spec: ArraySpec,
    version: CatalogueVersion,
) -> Result<SubmittedArray> {
    let shape = array::check_shape(spec.count, spec.parallelism);
    if !shape.is_empty() {
        return Err(Error::Validation(shape));
    }
    let (job, mut warnings) = validated(state, team.id, "task.", &spec.task, version).await?;
    // Checked above: within 1 and MAX_TASKS.
    let count = spec.count as i32;
    if count > 1 {
        warnings.extend(array_budget_warnings(state, team.id, &spec.task, &job, count, version).await?);
    }
    let parallelism = spec.parallelism.map(|p| p as i32);
    let held = parallelism.filter(|&p| p < count).map(|p| {
        format!(
            "held by its array's parallelism: at most {p} of its {count} tasks wait in the queue or run at once, lowest index first; released when an earlier task ends"
        )
    });
    let array_id = ArrayId::new();
    let tasks: Vec<_> = (0..count)
        .map(|index| db::jobs::NewJob {
            id: JobId::new(),
            array: Some(ArrayTask {
                array_id,
                index,
                count,
                held: held.clone().filter(|_| parallelism.is_some_and(|p| index >= p)),
            }),
            ..job.clone()
        })
        .collect();
    let mut tx = state.db.begin().await?;
    db::arrays::insert(&mut tx, array_id, team.id, &job.name, count, parallelism, by).await?;
    db::jobs::insert_many(&mut *tx, team.id, by, &tasks).await?;
    tx.commit().await?;
    state.wake_scheduler();
    let array = db::arrays::get(&state.db, team.id, array_id).await?.ok_or(Error::NotFound("array"))?;
    let counts = counts_of(state, array_id).await?;
    Ok(SubmittedArray { array, counts, warnings })
}

/// The task counts of array `id`.
pub async fn counts_of(state: &AppState, id: ArrayId) -> Result<TaskCounts> {
    Ok(db::arrays::counts(&state.db, &[id]).await?.into_iter().next().map(|(_, c)| c).unwrap_or_default())
}

/// What cancelling an array did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Cancelled {
    /// Tasks cancelled at once (they held no GPUs).
    pub cancelled: usize,
    /// Tasks asked to stop with their grace period; they end when they have.
    pub stopping: usize,
}

/// Cancels every task of array `id` of team `team_id` that has not ended, on behalf of
/// `actor`, in one transaction: tasks holding GPUs are stopped with their grace period,
/// the others cancelled at once. Tasks that ended keep their state; cancelling an array
/// that has ended changes nothing.
pub async fn cancel(state: &AppState, actor: &str, team_id: crate::domain::TeamId, id: ArrayId) -> Result<Cancelled> {
    db::arrays::get(&state.db, team_id, id).await?.ok_or(Error::NotFound("array"))?;
    let mut tx = state.db.begin().await?;
    let open = db::arrays::lock_open_tasks(&mut tx, id).await?;
    let (stopping, idle): (Vec<_>, Vec<_>) = open.into_iter().partition(|t| t.holds_gpus);
    let idle_ids: Vec<JobId> = idle.iter().map(|t| t.job_id).collect();
    db::jobs::cancel_idle(&mut tx, &idle_ids).await?;
    let mut events: Vec<NewEvent> = idle
        .iter()
        .map(|t| NewEvent {
            job_id: t.job_id,
            attempt: t.attempt,
            kind: "cancelled",
            reason: Some("user".into()),
            message: format!("cancelled with its array by {actor} before it ran"),
            data: None,
        })
        .collect();
    for t in &stopping {
        db::jobs::mark_cancelled(&mut tx, t.job_id, t.attempt, Some(t.grace_ms)).await?;
        events.push(NewEvent {
            job_id: t.job_id,
            attempt: t.attempt,
            kind: "cancel_requested",
            reason: Some("user".into()),
            message: format!(
                "cancel of its array requested by {actor}; stopping with a {} s grace period",
                t.grace_ms / 1000
            ),
            data: None,
        });
    }
    db::jobs::add_events(&mut tx, &events).await?;
    if !idle_ids.is_empty() {
        db::jobs::notify(&mut tx, db::jobs::SCHEDULE_CHANNEL).await?;
    }
    tx.commit().await?;
    Ok(Cancelled { cancelled: idle.len(), stopping: stopping.len() })
}
