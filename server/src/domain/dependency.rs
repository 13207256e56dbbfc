//! Job dependencies (Slurm's `--dependency=afterok/afterany/afternotok`): what a job may
//! wait for, and the pure rule that says, from the states of the jobs it waits for, whether
//! it may run now, must wait, or never can.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::JobState;

/// The most dependencies one job may name.
pub const MAX_DEPENDENCIES: usize = 32;

/// What a job waits for of a job it depends on.
// Stored as text (`job_dependencies.after`, checked by `job_dependencies_after_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum After {
    /// The job succeeded (Slurm's `afterok`).
    Succeeded,
    /// The job ended, in any final state (`afterany`).
    Finished,
    /// The job ended in any final state other than succeeded: failed (its time limit
    /// included), cancelled, or preempted out of retries (`afternotok`).
    Failed,
}

impl After {
    /// What the job waited for must do, in words: `succeed`, `finish` or `fail`.
    pub fn verb(self) -> &'static str {
        match self {
            After::Succeeded => "succeed",
            After::Finished => "finish",
            After::Failed => "fail",
        }
    }

    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            After::Succeeded => "succeeded",
            After::Finished => "finished",
            After::Failed => "failed",
        }
    }
}

/// What becomes of a job whose dependency can no longer be met.
// Stored as text (`jobs.if_dependency_fails`, checked by `jobs_if_dependency_fails_check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum IfDependencyFails {
    /// Cancelled, with the reason `dependency_failed` (and so are the jobs that wait for it
    /// to succeed, in turn).
    #[default]
    Cancel,
    /// Kept pending, with a reason saying its dependency can no longer be met, until someone
    /// cancels it.
    Keep,
}

impl IfDependencyFails {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IfDependencyFails::Cancel => "cancel",
            IfDependencyFails::Keep => "keep",
        }
    }
}

/// Whether a job in `state` (holding GPUs or not) has ended for good: succeeded, failed,
/// cancelled, or preempted out of retries, and no longer holding GPUs. A cancelled or
/// preempted job still stopping has not.
pub fn has_ended(state: JobState, holds_gpus: bool) -> bool {
    !holds_gpus && matches!(state, JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Preempted)
}

/// One dependency as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dependency {
    pub after: After,
    pub state: JobState,
    pub holds_gpus: bool,
}

/// Where a dependency stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Met,
    Waiting,
    /// It can never be met: the job ended otherwise than waited for.
    Unmeetable,
}

impl Dependency {
    /// Where this dependency stands.
    pub fn standing(&self) -> Standing {
        if !has_ended(self.state, self.holds_gpus) {
            return Standing::Waiting;
        }
        let succeeded = self.state == JobState::Succeeded;
        match self.after {
            After::Finished => Standing::Met,
            After::Succeeded if succeeded => Standing::Met,
            After::Failed if !succeeded => Standing::Met,
            After::Succeeded | After::Failed => Standing::Unmeetable,
        }
    }
}

/// Where a job stands with all its dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every one is met: the job may be scheduled.
    Met,
    /// Some are not met yet (their indices); none is unmeetable.
    Waiting(Vec<usize>),
    /// The one at this index can never be met (the first such).
    Unmeetable(usize),
}

/// The rule: unmeetable as soon as one dependency is, else waiting while any is, else met.
pub fn verdict(dependencies: &[Dependency]) -> Verdict {
    if let Some(i) = dependencies.iter().position(|d| d.standing() == Standing::Unmeetable) {
        return Verdict::Unmeetable(i);
    }
    let waiting: Vec<usize> =
        dependencies.iter().enumerate().filter(|(_, d)| d.standing() == Standing::Waiting).map(|(i, _)| i).collect();
    if waiting.is_empty() {
        Verdict::Met
    } else {
        Verdict::Waiting(waiting)
    }
}

/// A cycle among the jobs of one batch, where `edges[i]` holds the batch indices job `i`
/// waits for: the indices around the first cycle found, starting and ending with the same
/// job (`[0, 2, 0]`), or `None` when the jobs can run in some order. Indices out of range
/// are ignored (they are refused on their own).
pub fn batch_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    // Depth-first, iteratively: 0 unvisited, 1 on the current path, 2 done.
    let mut mark = vec![0u8; edges.len()];
    for start in 0..edges.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            let Some(&to) = edges[node].get(*next) else {
                mark[node] = 2;
                path.pop();
                continue;
            };
            *next += 1;
            if to >= edges.len() {
                continue;
            }
            match mark[to] {
                0 => {
                    mark[to] = 1;
                    path.push((to, 0));
                }
                1 => {
                    let from = path.iter().position(|&(n, _)| n == to).unwrap_or(0);
                    let mut cycle: Vec<usize> = path[from..].iter().map(|&(n, _)| n).collect();
                    cycle.push(to);
                    return Some(cycle);
                }
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(after: After, state: JobState) -> Dependency {
        Dependency { after, state, holds_gpus: false }
    }

    #[test]
    fn after_succeeded_is_met_only_by_success_and_unmeetable_after_any_other_end() {
        assert_eq!(verdict(&[dep(After::Succeeded, JobState::Succeeded)]), Verdict::Met);
        for end in [JobState::Failed, JobState::Cancelled, JobState::Preempted] {
            assert_eq!(verdict(&[dep(After::Succeeded, end)]), Verdict::Unmeetable(0), "{end:?}");
        }
    }

    #[test]
    fn after_failed_is_met_by_any_end_but_success() {
        for end in [JobState::Failed, JobState::Cancelled, JobState::Preempted] {
            assert_eq!(verdict(&[dep(After::Failed, end)]), Verdict::Met, "{end:?}");
        }
        assert_eq!(verdict(&[dep(After::Failed, JobState::Succeeded)]), Verdict::Unmeetable(0));
    }

    #[test]
    fn after_finished_is_met_by_every_end() {
        for end in [JobState::Succeeded, JobState::Failed, JobState::Cancelled, JobState::Preempted] {
            assert_eq!(verdict(&[dep(After::Finished, end)]), Verdict::Met, "{end:?}");
        }
    }

    #[test]
    fn a_job_still_live_or_still_stopping_is_waited_for() {
        for live in [JobState::Pending, JobState::Admitted, JobState::Running] {
            assert_eq!(verdict(&[dep(After::Finished, live)]), Verdict::Waiting(vec![0]), "{live:?}");
        }
        let stopping = Dependency { after: After::Failed, state: JobState::Cancelled, holds_gpus: true };
        assert_eq!(verdict(&[stopping]), Verdict::Waiting(vec![0]));
    }

    #[test]
    fn one_unmeetable_dependency_outweighs_the_ones_still_waited_for() {
        let deps = [
            dep(After::Succeeded, JobState::Running),
            dep(After::Succeeded, JobState::Succeeded),
            dep(After::Succeeded, JobState::Failed),
        ];
        assert_eq!(verdict(&deps), Verdict::Unmeetable(2));
        assert_eq!(verdict(&deps[..2]), Verdict::Waiting(vec![0]));
        assert_eq!(verdict(&[]), Verdict::Met);
    }

    #[test]
    fn a_batch_whose_jobs_can_run_in_some_order_has_no_cycle_and_one_that_cannot_names_it() {
        // 2 waits for 0 and 1, 1 for 0: a chain in any submission order.
        assert_eq!(batch_cycle(&[vec![], vec![0], vec![0, 1]]), None);
        assert_eq!(batch_cycle(&[vec![1], vec![2], vec![]]), None, "forward references are fine");
        assert_eq!(batch_cycle(&[vec![1], vec![0]]), Some(vec![0, 1, 0]));
        assert_eq!(batch_cycle(&[vec![], vec![2], vec![3], vec![1]]), Some(vec![1, 2, 3, 1]));
        assert_eq!(batch_cycle(&[vec![0]]), Some(vec![0, 0]), "a job waiting for itself");
        assert_eq!(batch_cycle(&[vec![7]]), None, "an index out of range is refused elsewhere");
    }
}
