//! The reconciler: brings job states in line with what each backend reports. Level-
//! triggered: every pass compares the whole picture, so a missed event, a crash between two
//! writes or a restart is repaired by the next pass.
//!
//! - an object running for an admitted job marks it running and opens its usage interval;
//! - a finished object ends its attempt (usage closed, GPUs released, the job requeued or
//!   finished by its outcome's retry policy) and is then deleted;
//! - a job asked to stop whose object has not been told (and whose stop is no longer in the
//!   dispatch outbox) is told again;
//! - an object no job holds (an old attempt, a job that finished, one we never knew) is
//!   deleted; one still running, or live and of a job we never knew, is an orphan: stopped
//!   and reported, then deleted;
//! - a job whose object vanished after it was created is lost (`node_lost`), and one whose
//!   submit was skipped because it was cancelled or preempted first is released;
//! - a job on a node with a GPU fault DCGM reported (`db::health`) is lost (`node_lost`) from
//!   the fault, and its object stopped.

use crate::domain::JobId;
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use chrono::{DateTime, Utc};
use serde_json::json;

use super::{
    leader_tx,
    lifecycle::{after_attempt, Counters},
    ControlError, Ctx,
};
use crate::{
    backends::{Backend, ObjectStatus, Outcome, Phase},
    db::{self, Tx},
    domain::JobState,
};

/// What one pass found and did.
#[derive(Debug, Default, Clone)]
pub struct ReconcileReport {
    pub started: usize,
    pub ended: usize,
    pub orphans: usize,
    pub lost: usize,
    /// The earliest announced change of a live object ([`ObjectStatus::next_change`]).
    pub next_change: Option<DateTime<Utc>>,
}

/// Slack for the two clocks (ours and the database's) when deciding that an object that
/// should exist is missing.
const CLOCK_SLACK: chrono::Duration = chrono::Duration::seconds(5);

/// An attempt that ended, as seen on the backend (or by the object's absence).
pub struct Ended {
    pub job_id: JobId,
    pub attempt: i32,
    pub outcome: Outcome,
    /// When it started, if it did: its usage interval opens then (once).
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: DateTime<Utc>,
    /// The backend object, for the timeline; empty when there was none.
    pub object: String,
    /// What ended it when the backend did not say: a GPU fault, in words, for the timeline.
    pub cause: Option<String>,
}

/// One pass over one cluster. Every start and end it finds is written in one transaction,
/// so a busy cluster costs one commit per pass, not one per job.
pub async fn reconcile(
    ctx: &Ctx,
    epoch: i64,
    cluster: &str,
    backend: &dyn Backend,
) -> Result<ReconcileReport, ControlError> {
    let mut report = ReconcileReport::default();
    let mut clock = PhaseClock::start();
    // Read the backend first: any job whose object was created before this instant must
    // appear in the list.
    let listed_at = Utc::now();
    let objects = backend.objects().await?;
    let held = db::attempts::held_jobs(&ctx.pool, cluster).await?;
    let by_id: HashMap<JobId, &db::attempts::HeldJob> = held.iter().map(|j| (j.id, j)).collect();
    let mut seen = HashSet::new();
    let mut started = Vec::new();
    let mut ended = Vec::new();
    let mut stops = Vec::new();
    for obj in &objects {
        let job = by_id.get(&obj.job_id).filter(|j| j.attempt == obj.attempt);
        let Some(job) = job else {
            // One object the backend will not stop must not hold up every job of the cluster.
            match collect_orphan(ctx, epoch, cluster, backend, obj, &mut report).await {
                Err(ControlError::NotLeader) => return Err(ControlError::NotLeader),
                Err(e) => tracing::warn!(cluster, object = %obj.object, error = %e, "collecting an orphan failed"),
                Ok(()) => {}
            }
            continue;
        };
        seen.insert(job.id);
        report.next_change = report.next_change.into_iter().chain(obj.next_change).min();
        match &obj.phase {
            // A GPU of the gang failed (DCGM said so): the attempt is lost from the fault, its
            // billing ends there, and its object, hung or crashing, is stopped.
            Phase::Pending | Phase::Running { .. } if job.fault_since.is_some() => {
                let started_at = match obj.phase {
                    Phase::Running { started_at } => Some(started_at),
                    _ => None,
                };
                ended.push(Ended {
                    job_id: job.id,
                    attempt: job.attempt,
                    outcome: Outcome::NodeLost,
                    started_at,
                    ended_at: job.fault_since.unwrap_or(listed_at),
                    object: obj.object.clone(),
                    cause: job.fault.clone(),
                });
                if !obj.stop_requested {
                    stops.push((obj.object.as_str(), Duration::ZERO));
                }
            }
            Phase::Pending | Phase::Running { .. } => {
                if let (Phase::Running { started_at }, JobState::Admitted) = (&obj.phase, job.state) {
                    started.push((job.id, job.attempt, *started_at, obj.object.as_str()));
                }
                // A stop still in the outbox is the dispatcher's to deliver, with the whole grace.
                if let (Some(asked), false, false) = (job.stop_requested_at, obj.stop_requested, job.stop_pending) {
                    let spent = (Utc::now() - asked).num_milliseconds().max(0) as u64;
                    let left = (job.grace_ms.max(0) as u64).saturating_sub(spent);
                    stops.push((obj.object.as_str(), Duration::from_millis(left)));
                }
            }
            Phase::Finished { started_at, ended_at, outcome } => ended.push(Ended {
                job_id: job.id,
                attempt: job.attempt,
                outcome: outcome.clone(),
                started_at: *started_at,
                ended_at: *ended_at,
                object: obj.object.clone(),
                cause: None,
            }),
        }
    }
    clock.lap();
    // Their last lines first: once the end is recorded, a client that saw it reads the log,
    // and once the object is deleted the backend may have nothing left to read.
    let ran: Vec<(JobId, i32)> =
        ended.iter().filter(|e| e.started_at.is_some()).map(|e| (e.job_id, e.attempt)).collect();
    let unread: HashSet<(JobId, i32)> = match super::logs::read_last(ctx, epoch, backend, &ran).await {
        Ok(unread) => unread.into_iter().collect(),
        Err(ControlError::NotLeader) => return Err(ControlError::NotLeader),
        Err(e) => {
            tracing::warn!(cluster, error = %e, "reading ended attempts' logs failed");
            ran.into_iter().collect()
        }
    };
    // An object whose log could not be read stays one more pass, which reads again (as an
    // object of an ended attempt, see `collect_orphan`) and then deletes it regardless.
    let finished_objects: Vec<String> =
        ended.iter().filter(|e| !unread.contains(&(e.job_id, e.attempt))).map(|e| e.object.clone()).collect();
    report.ended = ended.len();
    for job in held.iter().filter(|j| !seen.contains(&j.id) && !j.submit_pending) {
        let outcome = match job.dispatched_at {
            // Created before we listed, yet not listed: it vanished.
            Some(at) if at < listed_at - CLOCK_SLACK => Outcome::NodeLost,
            // Created while we listed: the next pass sees it.
            Some(_) => continue,
            // Never created: its submit was skipped because it was cancelled or preempted
            // first. Nothing runs; release the GPUs.
            None => Outcome::Stopped,
        };
        if outcome == Outcome::NodeLost {
            report.lost += 1;
            tracing::warn!(cluster, job = %job.id, "the job's backend object vanished");
        }
        let (job_id, attempt) = (job.id, job.attempt);
        ended.push(Ended {
            job_id,
            attempt,
            outcome,
            started_at: None,
            ended_at: Utc::now(),
            object: String::new(),
            cause: None,
        });
    }
    clock.lap();
    // A lost node must leave the inventory before its jobs requeue, or the next cycle could
    // place them on it again.
    if ended.iter().any(|e| e.outcome == Outcome::NodeLost) {
        if let Err(e) = super::sync_cluster(ctx, cluster, backend).await {
            tracing::warn!(cluster, error = %e, "inventory sync after a node loss failed");
        }
    }
    if !started.is_empty() || !ended.is_empty() {
        let mut tx = leader_tx(&ctx.pool, epoch).await?;
        let mut ids: Vec<JobId> = started.iter().map(|s| s.0).chain(ended.iter().map(|e| e.job_id)).collect();
        ids.sort_unstable();
        db::decisions::lock_jobs(&mut tx, &ids).await?;
        let starts: Vec<db::attempts::AttemptAt> = started.iter().map(|s| (s.0, s.1, s.2)).collect();
        let running = db::attempts::mark_running(&mut tx, &starts).await?;
        let objects: HashMap<(JobId, i32), &str> = started.iter().map(|s| ((s.0, s.1), s.3)).collect();
        let events: Vec<db::jobs::NewEvent> = running
            .iter()
            .map(|&(job_id, attempt)| db::jobs::NewEvent {
                job_id,
                attempt,
                kind: "running",
                reason: None,
                message: format!("every replica of {} runs", objects.get(&(job_id, attempt)).copied().unwrap_or("")),
                data: None,
            })
            .collect();
        db::jobs::add_events(&mut tx, &events).await?;
        report.started = running.len();
        end_attempts(&mut tx, &ended, ctx).await?;
        // Booked in the transaction that closes the intervals: a crash leaves both or neither.
        let closed: Vec<(JobId, i32)> = ended.iter().map(|e| (e.job_id, e.attempt)).collect();
        crate::metering::ledger::book_many(&mut tx, &closed, None, &ctx.config.pricing).await?;
        tx.commit().await?;
    }
    clock.lap();
    // Stops first: a delete that fails must not hold back a stop. Each failure is retried by
    // the next pass, which finds the object as it is.
    for (object, grace) in stops {
        if let Err(e) = backend.stop(object, grace).await {
            tracing::warn!(cluster, object, error = %e, "stopping an object failed; the next pass retries");
        }
    }
    if !finished_objects.is_empty() {
        if let Err(e) = backend.delete_all(&finished_objects).await {
            tracing::warn!(cluster, error = %e, "deleting finished objects failed; the next pass retries");
        }
    }
    clock.lap();
    ctx.metrics.reconcile_phases(clock.took);
    Ok(report)
}

/// Times the phases of one pass ([`crate::telemetry::RECONCILE_PHASES`]), each lap ending one.
struct PhaseClock {
    took: [Duration; crate::telemetry::RECONCILE_PHASES.len()],
    phase: usize,
    since: std::time::Instant,
}

impl PhaseClock {
    fn start() -> Self {
        Self { took: Default::default(), phase: 0, since: std::time::Instant::now() }
    }

    fn lap(&mut self) {
        let now = std::time::Instant::now();
        if let Some(slot) = self.took.get_mut(self.phase) {
            *slot = now - self.since;
        }
        self.phase += 1;
        self.since = now;
    }
}

/// What the reconciler does with an object that no held attempt owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leftover {
    /// Over, of a job we know (the reconciler was cut short before deleting it): its last
    /// log lines are read, then it is deleted.
    Collect,
    /// Not running, of an attempt that is over: deleted, with nothing to report. A gang
    /// whose removal was cut short looks like this on Kubernetes (its Service gone, a pod
    /// left), as does an old attempt's object that never came up.
    Discard,
    /// Over, of a job we never knew: deleted and reported.
    RemoveUnknown,
    /// Running for an attempt that is over, or live and of a job we never knew: an orphan,
    /// stopped now and reported; deleted once over.
    Stop,
    /// An orphan already asked to stop: left to end.
    Wait,
}

impl Leftover {
    fn of(phase: &Phase, known_job: bool, stop_requested: bool) -> Self {
        match (phase, known_job) {
            (Phase::Finished { .. }, true) => Self::Collect,
            (Phase::Finished { .. }, false) => Self::RemoveUnknown,
            (Phase::Pending, true) => Self::Discard,
            _ if stop_requested => Self::Wait,
            _ => Self::Stop,
        }
    }
}

/// An object no held attempt owns, handled as [`Leftover`] says. Orphans are reported in
/// the pass's count and, for a job we know, in its timeline.
async fn collect_orphan(
    ctx: &Ctx,
    epoch: i64,
    cluster: &str,
    backend: &dyn Backend,
    obj: &ObjectStatus,
    report: &mut ReconcileReport,
) -> Result<(), ControlError> {
    let known = db::attempts::job_attempt(&ctx.pool, obj.job_id).await?;
    match Leftover::of(&obj.phase, known.is_some(), obj.stop_requested) {
        Leftover::Collect => {
            if matches!(obj.phase, Phase::Finished { started_at: Some(_), .. }) {
                match super::logs::read_last(ctx, epoch, backend, &[(obj.job_id, obj.attempt)]).await {
                    Ok(unread) if !unread.is_empty() => {
                        tracing::warn!(cluster, object = %obj.object, "the last lines of a log could not be read");
                    }
                    Err(ControlError::NotLeader) => return Err(ControlError::NotLeader),
                    Err(e) => tracing::warn!(cluster, object = %obj.object, error = %e, "reading a log failed"),
                    Ok(_) => {}
                }
            }
            backend.delete(&obj.object).await?;
        }
        Leftover::Discard => {
            tracing::info!(cluster, object = %obj.object, "deleting what is left of an ended attempt's object");
            backend.delete(&obj.object).await?;
        }
        Leftover::RemoveUnknown => {
            backend.delete(&obj.object).await?;
            report.orphans += 1;
            tracing::warn!(cluster, object = %obj.object, "removed a backend object of an unknown job");
        }
        Leftover::Stop => {
            backend.stop(&obj.object, Duration::ZERO).await?;
            report.orphans += 1;
            tracing::warn!(cluster, object = %obj.object, "stopping an orphaned backend object");
            if let Some(known) = known {
                let mut tx = leader_tx(&ctx.pool, epoch).await?;
                db::jobs::add_event(
                    &mut tx,
                    obj.job_id,
                    known.attempt,
                    "orphan_removed",
                    Some("orphan"),
                    &format!("stopped backend object {} that no attempt of the job holds", obj.object),
                    Some(json!({"object": obj.object, "object_attempt": obj.attempt})),
                )
                .await?;
                tx.commit().await?;
            }
        }
        Leftover::Wait => {}
    }
    Ok(())
}

/// Ends attempts: closes their usage intervals (opening those that started and have none),
/// releases their GPUs and moves each job on by its outcome's retry policy, with an event.
/// The caller books the closed intervals in the same transaction
/// (`metering::ledger::book_many`). An attempt that is no longer its job's, or that holds
/// no GPUs (a repeat after a crash), is left alone. A busy cluster ends hundreds of
/// attempts in one reconciler pass, so each step is one statement for all of them.
pub async fn end_attempts(tx: &mut Tx<'_>, ended: &[Ended], ctx: &Ctx) -> Result<(), ControlError> {
    if ended.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = ended.iter().map(|e| e.job_id).collect();
    let locked: HashMap<JobId, db::attempts::AttemptEnd> =
        db::attempts::lock_for_end(tx, &ids).await?.into_iter().map(|j| (j.id, j)).collect();
    let mut seen = HashSet::new();
    let ending: Vec<(&Ended, &db::attempts::AttemptEnd)> = ended
        .iter()
        .filter_map(|e| locked.get(&e.job_id).filter(|j| j.holds_gpus && j.attempt == e.attempt).map(|j| (e, j)))
        .filter(|(e, _)| seen.insert(e.job_id))
        .collect();
    let starts: Vec<db::attempts::AttemptAt> =
        ending.iter().filter_map(|(e, _)| e.started_at.map(|at| (e.job_id, e.attempt, at))).collect();
    db::attempts::open_intervals(tx, &starts).await?;
    let ends: Vec<db::attempts::AttemptAt> = ending.iter().map(|(e, _)| (e.job_id, e.attempt, e.ended_at)).collect();
    db::attempts::close_intervals(tx, &ends).await?;
    let mut updates = Vec::with_capacity(ending.len());
    let mut events = Vec::with_capacity(ending.len());
    for (e, job) in &ending {
        let counters = Counters {
            max_retries: job.max_retries,
            preemptions: job.preemptions,
            capacity_retries: job.capacity_retries,
            node_lost_retries: job.node_lost_retries,
            app_retries: job.app_retries,
        };
        let next = after_attempt(job.state, &e.outcome, counters);
        let exit_code = match &e.outcome {
            Outcome::AppFailed { exit_code, .. } => *exit_code,
            Outcome::Succeeded => Some(0),
            _ => None,
        };
        updates.push(db::attempts::EndUpdate {
            job_id: e.job_id,
            attempt: e.attempt,
            state: next.state,
            exit_code,
            bump: next.bump,
        });
        let (message, data) = match &e.cause {
            Some(cause) => (
                format!("{}: {cause}", next.message),
                json!({"outcome": e.outcome, "object": e.object, "ended_at": e.ended_at, "cause": cause}),
            ),
            None => (next.message, json!({"outcome": e.outcome, "object": e.object, "ended_at": e.ended_at})),
        };
        events.push(db::jobs::NewEvent {
            job_id: e.job_id,
            attempt: e.attempt,
            kind: next.event,
            reason: Some(next.reason),
            message,
            data: Some(data),
        });
        ctx.metrics.outcome(e.outcome.code());
    }
    db::attempts::end_attempts(tx, &updates).await?;
    db::jobs::add_events(tx, &events).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished() -> Phase {
        Phase::Finished { started_at: None, ended_at: Utc::now(), outcome: Outcome::Succeeded }
    }

    #[test]
    fn an_ended_attempts_object_is_reported_as_an_orphan_only_while_something_of_it_runs() {
        let running = Phase::Running { started_at: Utc::now() };
        // What a cut-short removal leaves on Kubernetes (the Service gone, one of two pods
        // left, so the gang reads as not yet up) is deleted without an orphan report.
        assert_eq!(Leftover::of(&Phase::Pending, true, false), Leftover::Discard);
        assert_eq!(Leftover::of(&finished(), true, false), Leftover::Collect);
        assert_eq!(Leftover::of(&running, true, false), Leftover::Stop);
        assert_eq!(Leftover::of(&running, true, true), Leftover::Wait);
        // A job we never knew: whatever is live is an orphan, and so is what is left of it.
        assert_eq!(Leftover::of(&Phase::Pending, false, false), Leftover::Stop);
        assert_eq!(Leftover::of(&Phase::Pending, false, true), Leftover::Wait);
        assert_eq!(Leftover::of(&finished(), false, false), Leftover::RemoveUnknown);
    }
}
