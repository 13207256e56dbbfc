//! What follows the end of a job's attempt: the pure rule, kept apart from the I/O so it
//! can be read and tested in one place.

use crate::{
    backends::{Outcome, Retry},
    domain::{JobState, RetryCounter},
};

/// The retry counters and limits of a job when an attempt ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub max_retries: i32,
    pub preemptions: i32,
    pub capacity_retries: i32,
    pub node_lost_retries: i32,
    pub app_retries: i32,
}

/// The job's next state and what to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    /// Pending to requeue, or a final state.
    pub state: JobState,
    /// Which counter to bump.
    pub bump: Option<RetryCounter>,
    /// Event kind for the timeline.
    pub event: &'static str,
    /// Event reason code.
    pub reason: String,
    /// A sentence for people.
    pub message: String,
}

/// How many requeues `outcome` allows this job.
fn budget(outcome: &Outcome, c: Counters) -> i32 {
    match outcome.retry() {
        Retry::Never => 0,
        Retry::JobBudget => c.max_retries,
        Retry::Budget(b) => b,
    }
}

/// Decides what follows an attempt that ended with `outcome` while the job was in `state`.
pub fn after_attempt(state: JobState, outcome: &Outcome, c: Counters) -> Next {
    let done = |state: JobState, reason: &str, message: &str| Next {
        state,
        bump: None,
        event: state.as_str(),
        reason: reason.into(),
        message: message.into(),
    };
    // (counter, its value, the outcome whose budget applies, state when out of retries, what happened)
    let (bump, used, charged, final_state, what) = match (state, outcome) {
        // Cancelled (by a user, or by an idle policy: its `cancel_requested` event says
        // which): stays cancelled whatever the object did.
        (JobState::Cancelled, _) => return done(JobState::Cancelled, "cancelled", "stopped as asked"),
        // Preempted by us, but it finished its work before the stop reached it (a backend
        // reports success only for an end of the job's own): running it again would only
        // waste the GPUs the preemption was for.
        (JobState::Preempted, Outcome::Succeeded) => {
            return done(
                JobState::Succeeded,
                "succeeded",
                "every replica exited 0 before the preemption's stop reached it",
            )
        }
        // Preempted by us: requeues on the preemption budget (the GPUs went to a job that
        // needed them more).
        (JobState::Preempted, _) => (
            RetryCounter::Preemptions,
            c.preemptions,
            &Outcome::Preempted,
            JobState::Preempted,
            "stopped after preemption".to_owned(),
        ),
        (_, Outcome::Succeeded) => return done(JobState::Succeeded, "succeeded", "every replica exited 0"),
        (_, Outcome::AppFailed { exit_code, reason }) => {
            let what = match exit_code {
                Some(code) => format!("the application failed ({reason}, exit code {code})"),
                None => format!("the application failed ({reason})"),
            };
            (RetryCounter::AppRetries, c.app_retries, outcome, JobState::Failed, what)
        }
        (_, Outcome::Preempted) => (
            RetryCounter::Preemptions,
            c.preemptions,
            outcome,
            JobState::Preempted,
            "the provider took the capacity back".to_owned(),
        ),
        (_, Outcome::CapacityUnavailable) => (
            RetryCounter::CapacityRetries,
            c.capacity_retries,
            outcome,
            JobState::Failed,
            "the cluster had no capacity for the placement".to_owned(),
        ),
        // An object that stopped without being asked to is as good as lost.
        (_, Outcome::NodeLost | Outcome::Stopped) => (
            RetryCounter::NodeLostRetries,
            c.node_lost_retries,
            &Outcome::NodeLost,
            JobState::Failed,
            "a node of the job was lost".to_owned(),
        ),
    };
    let budget = budget(charged, c);
    let reason = match outcome {
        Outcome::AppFailed { reason, .. } if state != JobState::Preempted => format!("app_failed:{reason}"),
        _ => outcome.code().to_owned(),
    };
    if used < budget {
        Next {
            state: JobState::Pending,
            bump: Some(bump),
            event: "requeued",
            reason,
            message: format!("{what}; back in the queue (retry {} of {budget})", used + 1),
        }
    } else {
        Next {
            state: final_state,
            bump: None,
            event: final_state.as_str(),
            reason,
            message: format!("{what}; no retries left ({budget} used)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successful_attempt_finishes_the_job() {
        let next = after_attempt(JobState::Running, &Outcome::Succeeded, Counters::default());
        assert_eq!((next.state, next.bump), (JobState::Succeeded, None));
    }

    #[test]
    fn application_failures_retry_only_within_the_jobs_own_budget() {
        let failed = Outcome::AppFailed { exit_code: Some(3), reason: "Error".into() };
        let next = after_attempt(JobState::Running, &failed, Counters { max_retries: 1, ..Counters::default() });
        assert_eq!((next.state, next.bump), (JobState::Pending, Some(RetryCounter::AppRetries)));
        let next = after_attempt(
            JobState::Running,
            &failed,
            Counters { max_retries: 1, app_retries: 1, ..Counters::default() },
        );
        assert_eq!(next.state, JobState::Failed);
        assert!(next.message.contains("exit code 3"), "{}", next.message);
    }

    #[test]
    fn a_preempted_job_requeues_and_a_cancelled_one_stays_cancelled() {
        let next = after_attempt(JobState::Preempted, &Outcome::Stopped, Counters::default());
        assert_eq!(
            (next.state, next.bump, next.event),
            (JobState::Pending, Some(RetryCounter::Preemptions), "requeued")
        );
        let next = after_attempt(JobState::Cancelled, &Outcome::Succeeded, Counters::default());
        assert_eq!(next.state, JobState::Cancelled);
    }

    #[test]
    fn a_preempted_job_that_finished_before_the_stop_reached_it_is_not_run_again() {
        let next = after_attempt(JobState::Preempted, &Outcome::Succeeded, Counters::default());
        assert_eq!((next.state, next.bump, next.event), (JobState::Succeeded, None, "succeeded"));
        assert!(next.message.contains("before the preemption"), "{}", next.message);
    }

    #[test]
    fn lost_nodes_and_missing_capacity_have_platform_budgets() {
        let next = after_attempt(
            JobState::Running,
            &Outcome::NodeLost,
            Counters { node_lost_retries: 3, ..Counters::default() },
        );
        assert_eq!(next.state, JobState::Failed);
        let next = after_attempt(JobState::Admitted, &Outcome::CapacityUnavailable, Counters::default());
        assert_eq!((next.state, next.bump), (JobState::Pending, Some(RetryCounter::CapacityRetries)));
        let next =
            after_attempt(JobState::Running, &Outcome::Preempted, Counters { preemptions: 100, ..Counters::default() });
        assert_eq!(next.state, JobState::Preempted);
    }
}
