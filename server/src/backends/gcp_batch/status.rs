//! What a Google Cloud Batch job's state means for Fairway. Pure: it reads the `Job` resource
//! as JSON (the v1 API's shape), so the mapping is tested without a server.
//!
//! Batch reports why a task ended by its exit code; codes from 50001 are the service's own:
//! 50001 the spot VM was preempted, 50002/50003/50004/50006 the VM was lost (maintenance,
//! reboot, unresponsive, recreated), 50005 the maximum run duration passed.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::backends::{Outcome, Phase};

/// A job's phase and whether a stop was asked (it is being cancelled or was).
pub fn phase(job: &Value, now: DateTime<Utc>) -> (Phase, bool) {
    let state = job["status"]["state"].as_str().unwrap_or("STATE_UNSPECIFIED");
    let events = job["status"]["statusEvents"].as_array().map(Vec::as_slice).unwrap_or_default();
    let entered = |to: &str| -> Option<DateTime<Utc>> {
        events
            .iter()
            .filter(|e| e["description"].as_str().is_some_and(|d| d.contains(&format!("to {to}"))))
            .filter_map(|e| e["eventTime"].as_str()?.parse::<DateTime<Utc>>().ok())
            .max()
    };
    let updated = job["updateTime"].as_str().and_then(|t| t.parse::<DateTime<Utc>>().ok());
    let started_at = entered("RUNNING");
    let finished = |outcome: Outcome, to: &str| Phase::Finished {
        started_at,
        ended_at: entered(to).or(updated).unwrap_or(now),
        outcome,
    };
    match state {
        "RUNNING" => (Phase::Running { started_at: started_at.or(updated).unwrap_or(now) }, false),
        "SUCCEEDED" => (finished(Outcome::Succeeded, "SUCCEEDED"), false),
        "FAILED" => (finished(failure(events), "FAILED"), false),
        "CANCELLED" => (finished(Outcome::Stopped, "CANCELLED"), true),
        "CANCELLATION_IN_PROGRESS" => {
            let phase = match started_at {
                Some(started_at) => Phase::Running { started_at },
                None => Phase::Pending,
            };
            (phase, true)
        }
        _ => (Phase::Pending, false),
    }
}

/// Why a failed job failed, from the last task exit code its events report.
fn failure(events: &[Value]) -> Outcome {
    let code = events.iter().rev().find_map(|e| e["taskExecution"]["exitCode"].as_i64());
    match code {
        Some(50001) => Outcome::Preempted,
        Some(50002 | 50003 | 50004 | 50006) => Outcome::NodeLost,
        Some(50005) => Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() },
        Some(code) => Outcome::AppFailed { exit_code: i32::try_from(code).ok(), reason: "Error".into() },
        None => Outcome::AppFailed { exit_code: None, reason: "Error".into() },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn job(state: &str, exit_code: Option<i64>) -> Value {
        let mut events = vec![json!({"type": "STATUS_CHANGED", "eventTime": "2026-11-23T10:00:00Z",
                   "description": "Job state is set from SCHEDULED to RUNNING for job projects/p/locations/l/jobs/j."})];
        if state != "RUNNING" {
            let mut end = json!({"type": "STATUS_CHANGED", "eventTime": "2026-11-23T11:00:00Z",
                                 "description": format!("Job state is set from RUNNING to {state} for job projects/p/locations/l/jobs/j.")});
            if let Some(code) = exit_code {
                end["taskExecution"] = json!({"exitCode": code});
            }
            events.push(end);
        }
        json!({"status": {"state": state, "statusEvents": events}, "updateTime": "2026-11-23T11:00:01Z"})
    }

    fn outcome(j: &Value) -> Outcome {
        match phase(j, Utc::now()).0 {
            Phase::Finished { outcome, .. } => outcome,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn running_and_finished_jobs_carry_the_services_own_times() {
        assert_eq!(
            phase(&job("RUNNING", None), Utc::now()).0,
            Phase::Running { started_at: t("2026-11-23T10:00:00Z") }
        );
        assert_eq!(
            phase(&job("SUCCEEDED", None), Utc::now()).0,
            Phase::Finished {
                started_at: Some(t("2026-11-23T10:00:00Z")),
                ended_at: t("2026-11-23T11:00:00Z"),
                outcome: Outcome::Succeeded
            }
        );
        assert_eq!(phase(&json!({"status": {"state": "QUEUED"}}), Utc::now()).0, Phase::Pending);
    }

    #[test]
    fn a_spot_preemption_is_not_a_failure_and_lost_vms_are_lost_nodes() {
        assert_eq!(outcome(&job("FAILED", Some(50001))), Outcome::Preempted);
        assert_eq!(outcome(&job("FAILED", Some(50002))), Outcome::NodeLost);
        assert_eq!(
            outcome(&job("FAILED", Some(50005))),
            Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() }
        );
        assert_eq!(outcome(&job("FAILED", Some(3))), Outcome::AppFailed { exit_code: Some(3), reason: "Error".into() });
    }

    #[test]
    fn a_cancelled_job_stopped_because_we_asked() {
        assert_eq!(outcome(&job("CANCELLED", None)), Outcome::Stopped);
        assert!(phase(&job("CANCELLED", None), Utc::now()).1);
        let cancelling = json!({"status": {"state": "CANCELLATION_IN_PROGRESS"}});
        assert_eq!(phase(&cancelling, Utc::now()), (Phase::Pending, true));
    }
}
