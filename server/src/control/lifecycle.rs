//! What follows the end of a job's attempt: the pure rule, kept apart from the I/O so it
//! can be read and tested in one place.

use crate::backends::{Outcome, Retry};

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
    /// `pending` to requeue, or a final state.
    pub state: &'static str,
    /// Which counter to bump.
    pub bump: Option<&'static str>,
    /// Event kind for the timeline.
    pub event: &'static str,
    /// Event reason code.
    pub reason: String,
    /// A sentence for people.
    pub message: String,
}

/// Decides what follows an attempt that ended with `outcome` while the job was in `state`.
pub fn after_attempt(state: &str, outcome: &Outcome, c: Counters) -> Next {
    let requeue_or = |bump: &'static str, used: i32, budget: i32, final_state: &'static str, what: &str| {
        if used < budget {
            Next {
                state: "pending",
                bump: Some(bump),
                event: "requeued",
                reason: outcome.code().to_owned(),
                message: format!("{what}; back in the queue (retry {} of {budget})", used + 1),
            }
        } else {
            Next {
                state: final_state,
                bump: None,
                event: final_state,
                reason: outcome.code().to_owned(),
                message: format!("{what}; no retries left ({budget} used)"),
            }
        }
    };
    match state {
        // Cancelled by a user: stays cancelled whatever the object did.
        "cancelled" => Next {
            state: "cancelled",
            bump: None,
            event: "cancelled",
            reason: "cancelled".into(),
            message: "stopped at the user's request".into(),
        },
        // Preempted by us: requeues (the GPUs went to someone who needed them more).
        "preempted" => match Outcome::Preempted.retry() {
            Retry::Budget(b) => requeue_or("preemptions", c.preemptions, b, "preempted", "stopped after preemption"),
            _ => unreachable_next(),
        },
        _ => match (outcome, outcome.retry()) {
            (Outcome::Succeeded, _) => Next {
                state: "succeeded",
                bump: None,
                event: "succeeded",
                reason: "succeeded".into(),
                message: "every replica exited 0".into(),
            },
            (Outcome::AppFailed { exit_code, reason }, _) => {
                let what = match exit_code {
                    Some(code) => format!("the application failed ({reason}, exit code {code})"),
                    None => format!("the application failed ({reason})"),
                };
                let mut next = requeue_or("app_retries", c.app_retries, c.max_retries, "failed", &what);
                next.reason = format!("app_failed:{reason}");
                next
            }
            (Outcome::Preempted, Retry::Budget(b)) => {
                requeue_or("preemptions", c.preemptions, b, "preempted", "the provider took the capacity back")
            }
            (Outcome::CapacityUnavailable, Retry::Budget(b)) => requeue_or(
                "capacity_retries",
                c.capacity_retries,
                b,
                "failed",
                "the cluster had no capacity for the placement",
            ),
            (Outcome::NodeLost | Outcome::Stopped, _) => requeue_or(
                "node_lost_retries",
                c.node_lost_retries,
                match Outcome::NodeLost.retry() {
                    Retry::Budget(b) => b,
                    _ => 0,
                },
                "failed",
                "a node of the job was lost",
            ),
            _ => unreachable_next(),
        },
    }
}

fn unreachable_next() -> Next {
    Next {
        state: "failed",
        bump: None,
        event: "failed",
        reason: "internal".into(),
        message: "no retry policy for this outcome".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successful_attempt_finishes_the_job() {
        let next = after_attempt("running", &Outcome::Succeeded, Counters::default());
        assert_eq!((next.state, next.bump), ("succeeded", None));
    }

    #[test]
    fn application_failures_retry_only_within_the_jobs_own_budget() {
        let failed = Outcome::AppFailed { exit_code: Some(3), reason: "Error".into() };
        let next = after_attempt("running", &failed, Counters { max_retries: 1, ..Counters::default() });
        assert_eq!((next.state, next.bump), ("pending", Some("app_retries")));
        let next =
            after_attempt("running", &failed, Counters { max_retries: 1, app_retries: 1, ..Counters::default() });
        assert_eq!(next.state, "failed");
        assert!(next.message.contains("exit code 3"), "{}", next.message);
    }

    #[test]
    fn a_preempted_job_requeues_and_a_cancelled_one_stays_cancelled() {
        let next = after_attempt("preempted", &Outcome::Stopped, Counters::default());
        assert_eq!((next.state, next.bump, next.event), ("pending", Some("preemptions"), "requeued"));
        let next = after_attempt("cancelled", &Outcome::Succeeded, Counters::default());
        assert_eq!(next.state, "cancelled");
    }

    #[test]
    fn lost_nodes_and_missing_capacity_have_platform_budgets() {
        let next =
            after_attempt("running", &Outcome::NodeLost, Counters { node_lost_retries: 3, ..Counters::default() });
        assert_eq!(next.state, "failed");
        let next = after_attempt("admitted", &Outcome::CapacityUnavailable, Counters::default());
        assert_eq!((next.state, next.bump), ("pending", Some("capacity_retries")));
        let next = after_attempt("running", &Outcome::Preempted, Counters { preemptions: 100, ..Counters::default() });
        assert_eq!(next.state, "preempted");
    }
}
