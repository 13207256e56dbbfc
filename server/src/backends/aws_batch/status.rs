//! What an AWS Batch job's state means for Fairway: its status, status reason and exit code
//! normalised into [`Phase`] and [`Outcome`]. Pure: [`BatchJob`] is the part of
//! `DescribeJobs` that matters, so the mapping is tested without the SDK.

use chrono::{DateTime, Utc};

use crate::backends::{Outcome, Phase};

/// The reason we give when we stop a job, so its end reads as ours, not a failure.
pub const STOP_REASON_PREFIX: &str = "fairway:";

/// One AWS Batch job, as `DescribeJobs` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchJob {
    pub id: String,
    pub name: String,
    /// `SUBMITTED`, `PENDING`, `RUNNABLE`, `STARTING`, `RUNNING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    pub status_reason: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    /// The container's own reason (e.g. `OutOfMemoryError: Container killed ...`).
    pub container_reason: Option<String>,
    /// Each attempt's status reason, e.g. `Host EC2 (instance i-...) terminated.`.
    pub attempt_reasons: Vec<String>,
    pub tags: std::collections::HashMap<String, String>,
}

/// The job's phase at `now`.
pub fn phase(job: &BatchJob, now: DateTime<Utc>) -> Phase {
    match job.status.as_str() {
        "RUNNING" => Phase::Running { started_at: job.started_at.unwrap_or(now) },
        "SUCCEEDED" => Phase::Finished {
            started_at: job.started_at,
            ended_at: job.stopped_at.unwrap_or(now),
            outcome: Outcome::Succeeded,
        },
        "FAILED" => Phase::Finished {
            started_at: job.started_at,
            ended_at: job.stopped_at.unwrap_or(now),
            outcome: failure(job),
        },
        // Waiting for an instance the provider cannot supply: give the GPUs back and let the
        // engine place the job elsewhere.
        "RUNNABLE" if job.status_reason.as_deref().is_some_and(|r| r.starts_with("CAPACITY:")) => {
            Phase::Finished { started_at: None, ended_at: now, outcome: Outcome::CapacityUnavailable }
        }
        // The queue's compute environments can never run it as defined (e.g. it asks for more
        // GPUs than the instance type has): it would wait forever.
        "RUNNABLE" if job.status_reason.as_deref().is_some_and(|r| r.starts_with("MISCONFIGURATION:")) => {
            Phase::Finished {
                started_at: None,
                ended_at: now,
                outcome: Outcome::AppFailed { exit_code: None, reason: "Misconfiguration".into() },
            }
        }
        _ => Phase::Pending,
    }
}

/// Why a `FAILED` job failed.
fn failure(job: &BatchJob) -> Outcome {
    let reason = job.status_reason.as_deref().unwrap_or_default();
    let container = job.container_reason.as_deref().unwrap_or_default();
    let spot_reclaimed = |r: &str| r.starts_with("Host EC2") && r.contains("terminated");
    if reason.starts_with(STOP_REASON_PREFIX) {
        Outcome::Stopped
    } else if spot_reclaimed(reason) || job.attempt_reasons.iter().any(|r| spot_reclaimed(r)) {
        // The instance went away under the job: a spot interruption, not the job's fault.
        Outcome::Preempted
    } else if reason.contains("Job attempt duration exceeded timeout") {
        Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() }
    } else if container.starts_with("CannotPullContainerError") || reason.starts_with("CannotPullContainerError") {
        Outcome::AppFailed { exit_code: None, reason: "ImagePullError".into() }
    } else if container.starts_with("OutOfMemoryError") {
        Outcome::AppFailed { exit_code: job.exit_code, reason: "OOMKilled".into() }
    } else if reason.starts_with("CAPACITY:") {
        Outcome::CapacityUnavailable
    } else {
        let why = if container.is_empty() { reason } else { container };
        let why = why.split(':').next().filter(|w| !w.trim().is_empty()).unwrap_or("Error");
        Outcome::AppFailed { exit_code: job.exit_code, reason: why.trim().to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn job(status: &str, reason: Option<&str>) -> BatchJob {
        BatchJob {
            status: status.into(),
            status_reason: reason.map(Into::into),
            started_at: Some(t("2026-11-23T10:00:00Z")),
            stopped_at: Some(t("2026-11-23T11:00:00Z")),
            ..BatchJob::default()
        }
    }

    fn outcome(j: &BatchJob) -> Outcome {
        match phase(j, t("2026-11-23T12:00:00Z")) {
            Phase::Finished { outcome, .. } => outcome,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn running_and_finished_jobs_carry_the_services_own_start_and_stop_times() {
        assert_eq!(phase(&job("RUNNING", None), Utc::now()), Phase::Running { started_at: t("2026-11-23T10:00:00Z") });
        assert_eq!(
            phase(&job("SUCCEEDED", None), Utc::now()),
            Phase::Finished {
                started_at: Some(t("2026-11-23T10:00:00Z")),
                ended_at: t("2026-11-23T11:00:00Z"),
                outcome: Outcome::Succeeded
            }
        );
        for waiting in ["SUBMITTED", "PENDING", "RUNNABLE", "STARTING"] {
            assert_eq!(phase(&job(waiting, None), Utc::now()), Phase::Pending);
        }
    }

    #[test]
    fn a_spot_interruption_is_a_preemption_not_a_failure() {
        let reclaimed = job("FAILED", Some("Host EC2 (instance i-0abc) terminated."));
        assert_eq!(outcome(&reclaimed), Outcome::Preempted);
        let mut in_attempt = job("FAILED", Some("Essential container in task exited"));
        in_attempt.attempt_reasons = vec!["Host EC2 (instance i-0abc) terminated.".into()];
        assert_eq!(outcome(&in_attempt), Outcome::Preempted);
    }

    #[test]
    fn application_failures_keep_their_exit_code_and_reason() {
        let mut crashed = job("FAILED", Some("Essential container in task exited"));
        crashed.exit_code = Some(3);
        assert_eq!(
            outcome(&crashed),
            Outcome::AppFailed { exit_code: Some(3), reason: "Essential container in task exited".into() }
        );
        let mut oom = job("FAILED", Some("Essential container in task exited"));
        oom.exit_code = Some(137);
        oom.container_reason = Some("OutOfMemoryError: Container killed due to memory usage".into());
        assert_eq!(outcome(&oom), Outcome::AppFailed { exit_code: Some(137), reason: "OOMKilled".into() });
        let mut pull = job("FAILED", Some("Task failed to start"));
        pull.container_reason = Some("CannotPullContainerError: pull access denied".into());
        assert_eq!(outcome(&pull), Outcome::AppFailed { exit_code: None, reason: "ImagePullError".into() });
        let timeout = job("FAILED", Some("Job attempt duration exceeded timeout"));
        assert_eq!(outcome(&timeout), Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() });
        assert_eq!(outcome(&job("FAILED", None)), Outcome::AppFailed { exit_code: None, reason: "Error".into() });
    }

    #[test]
    fn our_own_stops_and_capacity_shortages_are_told_apart_from_failures() {
        assert_eq!(outcome(&job("FAILED", Some("fairway: preempted"))), Outcome::Stopped);
        let stuck = job("RUNNABLE", Some("CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no p5 capacity in us-east-1a"));
        assert_eq!(outcome(&stuck), Outcome::CapacityUnavailable);
        let never = job("RUNNABLE", Some("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - needs 16 GPUs"));
        assert_eq!(outcome(&never), Outcome::AppFailed { exit_code: None, reason: "Misconfiguration".into() });
    }
}
