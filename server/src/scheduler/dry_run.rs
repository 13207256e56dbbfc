//! "If I submitted this job now": the same engine, on the same snapshot plus the job.

use super::{
    decision::{Figures, PendingReason, Preemption, Shrink, Unforeseeable},
    engine::cost_micros,
    snapshot::{JobSpec, ReplicaPlacement, Snapshot},
};

/// The answer to a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRun {
    /// Where it would run, if it would be admitted now.
    pub placement: Option<Vec<ReplicaPlacement>>,
    /// Running jobs that would be preempted to make room for it.
    pub victims: Vec<Preemption>,
    /// Extra replicas of running elastic gangs that would be given back to make room for it
    /// (the gangs run on).
    pub shrinks: Vec<Shrink>,
    /// Why it would wait, if it would, and the numbers behind the reason.
    pub reason: Option<(PendingReason, Figures)>,
    /// Its rank among pending jobs.
    pub position: Option<u32>,
    /// When it would be expected to start (now, if admitted): the forecast's median.
    pub expected_start_ms: Option<i64>,
    /// The interval it would be expected to start in (p10 and p90 of the forecast).
    pub earliest_start_ms: Option<i64>,
    pub latest_start_ms: Option<i64>,
    /// Why no forecast can say when it would start, when none can.
    pub unforeseeable: Option<Unforeseeable>,
    /// Its maximum cost in micro-units (GPUs × rate × max runtime × multiplier).
    pub max_cost_micros: i64,
}

/// Decides `job` as if it had been submitted at `snapshot.now_ms`, without changing
/// anything. Other jobs' decisions in the same cycle are computed but not returned.
pub fn dry_run(snapshot: &Snapshot, job: &JobSpec) -> DryRun {
    let mut s = snapshot.clone();
    let mut job = job.clone();
    job.submitted_ms = s.now_ms;
    s.pending.push(job.clone());
    s.config.estimate_start_times = true;
    let decisions = super::schedule(&s);
    let admission = decisions.admissions.iter().find(|a| a.job == job.id);
    let pending = decisions.pending.iter().find(|p| p.job == job.id);
    DryRun {
        placement: admission.map(|a| a.placement.clone()),
        victims: decisions.preemptions.iter().filter(|p| p.for_job == job.id).cloned().collect(),
        shrinks: decisions.shrinks.iter().filter(|k| k.for_job == job.id).cloned().collect(),
        reason: pending.map(|p| (p.reason.clone(), p.figures)),
        position: pending.map(|p| p.position),
        expected_start_ms: if admission.is_some() { Some(s.now_ms) } else { pending.and_then(|p| p.expected_start_ms) },
        earliest_start_ms: if admission.is_some() { Some(s.now_ms) } else { pending.and_then(|p| p.earliest_start_ms) },
        latest_start_ms: if admission.is_some() { Some(s.now_ms) } else { pending.and_then(|p| p.latest_start_ms) },
        unforeseeable: pending.and_then(|p| p.unforeseeable),
        max_cost_micros: cost_micros(&s, &job, job.max_runtime_ms),
    }
}
