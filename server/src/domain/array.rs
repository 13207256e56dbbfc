//! Job arrays (Slurm's `--array`, Kubernetes' Indexed Jobs): how many tasks one may hold,
//! the environment each task learns its index from, and the pure rule for an array's state
//! from its tasks' states.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{check_range, FieldError, JobState};

/// The most tasks one array may hold.
pub const MAX_TASKS: i64 = 10_000;

/// The variable a task reads its index from (0 to count - 1).
pub const TASK_INDEX_ENV: &str = "FAIRWAY_ARRAY_TASK_ID";
/// The variable holding the number of tasks of the array.
pub const TASK_COUNT_ENV: &str = "FAIRWAY_ARRAY_TASK_COUNT";
/// The variable holding the array's id.
pub const ARRAY_ID_ENV: &str = "FAIRWAY_ARRAY_ID";
/// The index again under Kubernetes' Indexed Job name, which launchers and libraries that
/// shard work by index already read.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

/// The variables that tell task `index` of array `id` (of `count` tasks) its place.
pub fn task_env(id: super::ArrayId, index: i32, count: i32) -> Vec<(&'static str, String)> {
    vec![
        (ARRAY_ID_ENV, id.to_string()),
        (TASK_INDEX_ENV, index.to_string()),
        (TASK_COUNT_ENV, count.to_string()),
        (COMPLETION_INDEX_ENV, index.to_string()),
    ]
}

/// Checks an array's task count and parallelism, naming `count` and `parallelism`.
pub fn check_shape(count: i64, parallelism: Option<i64>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Err(e) = check_range("count", count, 1, MAX_TASKS) {
        errors.push(e);
    }
    if let Some(p) = parallelism {
        if p < 1 {
            errors.push(FieldError::new("parallelism", "too_small", "must be at least 1"));
        } else if (1..=MAX_TASKS).contains(&count) && p > count {
            errors.push(FieldError::new(
                "parallelism",
                "too_large",
                format!("must be at most the task count ({count}); leave it out to let every task run at once"),
            ));
        }
    }
    errors
}

/// Where an array is, from its tasks: what a person reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArrayState {
    /// No task has been admitted yet, and some still wait.
    Pending,
    /// Some task is admitted, running or stopping, or some have ended and others wait.
    Running,
    /// Every task succeeded.
    Succeeded,
    /// Every task ended and at least one failed (out of retries, its time limit included,
    /// or preempted out of retries).
    Failed,
    /// Every task ended, none failed, and at least one was cancelled.
    Cancelled,
}

impl ArrayState {
    /// The value shown in pages and filters.
    pub fn as_str(self) -> &'static str {
        match self {
            ArrayState::Pending => "pending",
            ArrayState::Running => "running",
            ArrayState::Succeeded => "succeeded",
            ArrayState::Failed => "failed",
            ArrayState::Cancelled => "cancelled",
        }
    }
}

/// How many tasks are in each state; `stopping` counts tasks in a final state that still
/// hold GPUs (cancelled or preempted, their grace period running), and `held` the pending
/// tasks the array's parallelism holds back (they are also `pending`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskCounts {
    pub pending: i64,
    pub held: i64,
    pub admitted: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    pub preempted: i64,
    pub stopping: i64,
}

impl TaskCounts {
    /// Adds `n` tasks in `state`, `holding` GPUs or not, `held` back by parallelism or not.
    pub fn add(&mut self, state: JobState, holding: bool, held: bool, n: i64) {
        match state {
            JobState::Pending => self.pending += n,
            JobState::Admitted => self.admitted += n,
            JobState::Running => self.running += n,
            JobState::Succeeded => self.succeeded += n,
            JobState::Failed => self.failed += n,
            JobState::Cancelled => self.cancelled += n,
            JobState::Preempted => self.preempted += n,
        }
        if held {
            self.held += n;
        }
        if holding && matches!(state, JobState::Cancelled | JobState::Preempted | JobState::Failed) {
            self.stopping += n;
        }
    }

    /// Every task counted.
    pub fn total(&self) -> i64 {
        self.pending + self.admitted + self.running + self.succeeded + self.failed + self.cancelled + self.preempted
    }

    /// Tasks that have ended for good: in a final state, their GPUs given back.
    pub fn ended(&self) -> i64 {
        self.succeeded + self.failed + self.cancelled + self.preempted - self.stopping
    }

    /// The array's state. A preempted task counted here is one out of retries (one that
    /// requeues is pending again), so it counts as failed.
    pub fn state(&self) -> ArrayState {
        let under_way = self.admitted + self.running + self.stopping;
        if self.ended() < self.total() {
            if under_way > 0 || self.ended() > 0 {
                ArrayState::Running
            } else {
                ArrayState::Pending
            }
        } else if self.failed + self.preempted > 0 {
            ArrayState::Failed
        } else if self.cancelled > 0 {
            ArrayState::Cancelled
        } else {
            ArrayState::Succeeded
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(tasks: &[(JobState, bool)]) -> TaskCounts {
        let mut c = TaskCounts::default();
        for &(state, holding) in tasks {
            c.add(state, holding, false, 1);
        }
        c
    }

    #[test]
    fn an_array_is_pending_until_a_task_is_admitted_and_running_while_any_task_is_under_way() {
        assert_eq!(counts(&[(JobState::Pending, false), (JobState::Pending, false)]).state(), ArrayState::Pending);
        assert_eq!(counts(&[(JobState::Pending, false), (JobState::Admitted, true)]).state(), ArrayState::Running);
        // One ended and one waits: the array is under way, not back to pending.
        assert_eq!(counts(&[(JobState::Succeeded, false), (JobState::Pending, false)]).state(), ArrayState::Running);
        // A cancelled task still stopping keeps the array running until its GPUs are free.
        assert_eq!(counts(&[(JobState::Cancelled, true), (JobState::Succeeded, false)]).state(), ArrayState::Running);
    }

    #[test]
    fn an_ended_array_is_failed_if_any_task_failed_then_cancelled_if_any_was_cancelled_else_succeeded() {
        assert_eq!(counts(&[(JobState::Succeeded, false); 3]).state(), ArrayState::Succeeded);
        let failed = counts(&[(JobState::Succeeded, false), (JobState::Failed, false), (JobState::Cancelled, false)]);
        assert_eq!(failed.state(), ArrayState::Failed);
        let out_of_retries = counts(&[(JobState::Succeeded, false), (JobState::Preempted, false)]);
        assert_eq!(out_of_retries.state(), ArrayState::Failed);
        assert_eq!(
            counts(&[(JobState::Succeeded, false), (JobState::Cancelled, false)]).state(),
            ArrayState::Cancelled
        );
    }

    #[test]
    fn counts_add_up_and_held_tasks_are_also_pending() {
        let mut c = TaskCounts::default();
        c.add(JobState::Pending, false, true, 7);
        c.add(JobState::Running, true, false, 3);
        c.add(JobState::Cancelled, true, false, 1);
        assert_eq!((c.pending, c.held, c.running, c.cancelled, c.stopping), (7, 7, 3, 1, 1));
        assert_eq!(c.total(), 11);
        assert_eq!(c.ended(), 0);
    }

    #[test]
    fn the_shape_names_the_field_that_is_wrong() {
        assert!(check_shape(1, None).is_empty());
        assert!(check_shape(MAX_TASKS, Some(MAX_TASKS)).is_empty());
        let fields = |errors: Vec<FieldError>| errors.into_iter().map(|e| (e.field, e.code)).collect::<Vec<_>>();
        assert_eq!(fields(check_shape(0, None)), [("count".to_owned(), "too_small".to_owned())]);
        assert_eq!(fields(check_shape(MAX_TASKS + 1, None)), [("count".to_owned(), "too_large".to_owned())]);
        assert_eq!(fields(check_shape(10, Some(11))), [("parallelism".to_owned(), "too_large".to_owned())]);
        assert_eq!(fields(check_shape(10, Some(0))), [("parallelism".to_owned(), "too_small".to_owned())]);
    }
}
