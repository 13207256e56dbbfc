//! The dependency pass: the one place where jobs waiting for other jobs are resolved. Each
//! scheduling cycle, before the snapshot is read, one transaction checks the leader's epoch
//! and, for every job still waiting for its dependencies, applies the pure rule
//! ([`domain::dependency::verdict`]) to the states of the jobs it waits for, whichever way
//! they ended (success, failure, time limit, cancellation, preemption out of retries):
//!
//! - all met: the job is released to the scheduler (a `released` event);
//! - one can never be met: the job is cancelled with the reason `dependency_failed`, its
//!   event naming the job that made it unmeetable, or, with `if_dependency_fails: keep`,
//!   it stays pending with that reason. A cancelled job ends, so the jobs waiting for it
//!   are resolved by the next pass: a cancel cascades down a chain, one link a cycle (the
//!   pass wakes the next cycle when it changed anything);
//! - otherwise it keeps waiting, with the reason `waiting_for_dependencies` naming the jobs
//!   it still waits for and their states.

use serde_json::json;

use super::ControlError;
use crate::{
    db::{self, dependencies::WaitingRow, jobs::NewEvent},
    domain::{
        self,
        dependency::{Dependency, Verdict},
        WaitedJob,
    },
};

/// The reason a job waiting for its dependencies shows.
pub const WAITING_FOR_DEPENDENCIES: &str = "waiting_for_dependencies";
/// The reason (of the cancellation, or of the wait with `keep`) when a dependency can no
/// longer be met.
pub const DEPENDENCY_FAILED: &str = "dependency_failed";

/// What a pass did, and how many jobs it left waiting, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resolved {
    pub released: usize,
    pub cancelled: usize,
    /// Left waiting for jobs that have not ended yet (`waiting_for_dependencies`).
    pub waiting: u64,
    /// Kept pending though a dependency can no longer be met (`dependency_failed`).
    pub kept: u64,
}

impl Resolved {
    /// The jobs left waiting per reason code, both codes always: the part of the pending
    /// reasons gauge the engine does not see.
    pub fn pending_by_reason(&self) -> [(&'static str, u64); 2] {
        [(WAITING_FOR_DEPENDENCIES, self.waiting), (DEPENDENCY_FAILED, self.kept)]
    }
}

/// Runs the pass as the leader of `epoch`; a cycle calls it when `db::snapshot::passes_due`
/// says it has something to do.
pub async fn resolve(pool: &sqlx::PgPool, epoch: i64) -> Result<Resolved, ControlError> {
    let mut tx = pool.begin().await?;
    if !db::leader::check_epoch(&mut tx, epoch).await? {
        return Err(ControlError::NotLeader);
    }
    let rows = db::dependencies::waiting(&mut tx).await?;
    let mut done = Resolved::default();
    let mut released = Vec::new();
    let mut events = Vec::new();
    for group in rows.chunk_by(|a, b| a.job_id == b.job_id) {
        let first = &group[0];
        let rule: Vec<Dependency> =
            group.iter().map(|r| Dependency { after: r.after, state: r.state, holds_gpus: r.holds_gpus }).collect();
        let named = |r: &WaitingRow| format!("job {} ({}), {}", r.name, r.depends_on, r.state);
        let waited = |r: &WaitingRow| WaitedJob { job: r.depends_on, name: r.name.clone(), state: r.state };
        match domain::dependency::verdict(&rule) {
            Verdict::Met => {
                released.push(first.job_id);
                done.released += 1;
                let all: Vec<String> = group.iter().map(named).collect();
                events.push(event(first, "released", None, format!("dependencies met: {}", all.join("; ")), None));
            }
            Verdict::Unmeetable(i) => {
                let culprit = &group[i];
                let why = format!(
                    "job {} ({}) ended {} and this job waited for it to {}",
                    culprit.name,
                    culprit.depends_on,
                    culprit.state,
                    culprit.after.verb()
                );
                let data = Some(json!({"dependency": culprit.depends_on, "state": culprit.state}));
                if first.if_dependency_fails == "keep" && first.held_by_array {
                    // Its array holds it: it says so until released, then says this.
                } else if first.if_dependency_fails == "keep" {
                    done.kept += 1;
                    let message = format!("dependency can no longer be met: {why}; kept pending (if_dependency_fails: keep) until cancelled");
                    if first.pending_message.as_deref() != Some(message.as_str()) {
                        let figures = figures(vec![waited(culprit)]);
                        db::dependencies::set_reason(&mut tx, first.job_id, DEPENDENCY_FAILED, &message, &figures)
                            .await?;
                        events.push(event(first, "waiting", Some(DEPENDENCY_FAILED), message, data));
                    }
                } else {
                    db::dependencies::cancel(&mut tx, first.job_id).await?;
                    done.cancelled += 1;
                    events.push(event(first, "cancelled", Some(DEPENDENCY_FAILED), format!("cancelled: {why}"), data));
                }
            }
            // A task its array holds keeps that reason; the array pass counts it.
            Verdict::Waiting(_) if first.held_by_array => {}
            Verdict::Waiting(left) => {
                done.waiting += 1;
                let left: Vec<&WaitingRow> = left.iter().map(|&i| &group[i]).collect();
                let message = format!("waiting for {}", left.iter().map(|r| named(r)).collect::<Vec<_>>().join("; "));
                if first.pending_message.as_deref() != Some(message.as_str()) {
                    let figures = figures(left.iter().map(|r| waited(r)).collect());
                    db::dependencies::set_reason(&mut tx, first.job_id, WAITING_FOR_DEPENDENCIES, &message, &figures)
                        .await?;
                    if first.pending_message.is_none() {
                        events.push(event(first, "waiting", Some(WAITING_FOR_DEPENDENCIES), message, None));
                    }
                }
            }
        }
    }
    db::dependencies::release(&mut tx, &released).await?;
    db::jobs::add_events(&mut tx, &events).await?;
    if done.released + done.cancelled > 0 {
        // The released jobs are the next snapshot's; the cancelled ones may end others' waits.
        db::jobs::notify(&mut tx, db::jobs::SCHEDULE_CHANNEL).await?;
    }
    tx.commit().await?;
    Ok(done)
}

fn event(
    job: &WaitingRow,
    kind: &'static str,
    reason: Option<&str>,
    message: String,
    data: Option<serde_json::Value>,
) -> NewEvent {
    NewEvent { job_id: job.job_id, attempt: job.attempt, kind, reason: reason.map(str::to_owned), message, data }
}

/// The figures of a dependency reason: the jobs named, and no GPU numbers (the engine has
/// not looked at the job yet).
fn figures(waiting_for: Vec<WaitedJob>) -> serde_json::Value {
    let figures = domain::WaitFigures {
        needs_gpus: 0.0,
        free_gpus: 0.0,
        team: None,
        in_use_gpus: None,
        reserved_gpus: None,
        burst_gpus: None,
        budget: None,
        blocking_job: None,
        earliest_start_at: None,
        latest_start_at: None,
        unforeseeable: None,
        victims_preemptible_at: None,
        preempts_at: None,
        would_preempt_jobs: None,
        waiting_for,
        drivers: None,
    };
    serde_json::to_value(figures).unwrap_or_default()
}
