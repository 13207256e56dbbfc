//! The leader's utilisation pass: what running jobs' GPUs did, read from the Prometheus
//! server that scrapes the clusters' dcgm-exporters (`backends::dcgm`), added to each
//! replica's row (`db::utilisation`), and then idle reclamation (`domain::idle`): each
//! sampled job's idle stretch is opened, extended or closed, and the governing policy warns
//! and then stops or preempts a job idle too long. One transaction under the leader's epoch,
//! so two replicas of Fairway never count one sample twice nor act twice.
//!
//! Before that, GPU health: every GPU's XID and row-remap fields, a fault opened for each
//! GPU whose field changed to a fault (`domain::gpu_health`), its node out of the inventory
//! and the reconciler woken to end the gangs on it (`control::reconcile`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use chrono::{DateTime, Utc};
use serde_json::json;

use super::{leader_tx, ControlError, Ctx};
use crate::{
    backends::dcgm::DcgmSource,
    db::{
        self,
        idle::{Sampled, SpanChange},
    },
    domain::{
        gpu_health,
        idle::{duration_words as words, governing, step, IdleAction, IdlePolicy, Step, Stretch},
        JobId,
    },
};

/// Reads every `ctx.config.utilisation_interval` until leadership is lost.
pub async fn run(ctx: Ctx, epoch: i64, source: DcgmSource) {
    let mut tick = tokio::time::interval(ctx.config.utilisation_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut faulted = BTreeSet::new();
    loop {
        tick.tick().await;
        match pass(&ctx, epoch, &source, &mut faulted).await {
            Ok(_) => {}
            Err(ControlError::NotLeader) => return,
            Err(e) => tracing::warn!(error = %e, "reading GPU activity failed; the next pass reads again"),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UtilisationReport {
    /// Replicas of running attempts recorded.
    pub replicas: u64,
    /// Jobs warned that their GPUs are idle.
    pub warned: usize,
    /// Jobs stopped for idleness.
    pub stopped: usize,
    /// Jobs preempted for idleness.
    pub preempted: usize,
    /// GPU faults opened.
    pub faults: usize,
}

/// How far back the health read looks: far enough that a pass that came late still sees
/// when a value began, at most a few passes.
fn health_window(interval: std::time::Duration) -> std::time::Duration {
    (interval * 4).max(std::time::Duration::from_secs(60))
}

/// Reads every GPU's health fields and opens a fault for each that changed to a fault
/// (`domain::gpu_health::opens`), from when the GPU first reported it. A node with a new
/// fault leaves its cluster's inventory at once (a sync, which leaves it out) and the
/// reconciler is woken to end the gangs on it; a node whose faults a platform admin cleared
/// since the last pass (it is in `faulted` no more) comes back the same way. Returns the
/// faults opened.
async fn health(
    ctx: &Ctx,
    epoch: i64,
    source: &DcgmSource,
    faulted: &mut BTreeSet<(String, String)>,
) -> Result<usize, ControlError> {
    let reads = source.read_health(health_window(ctx.config.utilisation_interval)).await?;
    let at = Utc::now();
    let mut tx = leader_tx(&ctx.pool, epoch).await?;
    let keys: Vec<db::health::FieldKey> =
        reads.iter().map(|r| (r.host.clone(), r.gpu.clone(), r.field.to_owned())).collect();
    let last = db::health::last_reads(&mut tx, &keys).await?;
    let mut changed = Vec::new();
    let mut new_faults = Vec::new();
    let mut kinds = BTreeMap::new();
    for (read, key) in reads.iter().zip(keys) {
        let previous = last.get(&key).copied();
        if previous == Some(read.value) {
            continue;
        }
        if let Some(why) = gpu_health::opens(read.field, previous, read.value) {
            let kind = if read.field == gpu_health::XID_ERRORS { "xid" } else { "row_remap_failure" };
            kinds.insert((read.host.clone(), read.gpu.clone()), kind);
            new_faults.push((read.host.clone(), read.gpu.clone(), read.since.min(at), why));
        }
        changed.push((key, read.value));
    }
    db::health::record_reads(&mut tx, &changed, at).await?;
    let opened = db::health::open_faults(&mut tx, &new_faults).await?;
    tx.commit().await?;
    for fault in &opened {
        tracing::warn!(cluster = %fault.cluster, node = %fault.node, gpu = %fault.gpu, since = %fault.since,
                       why = %fault.why, "a GPU reported a fault: its node leaves the inventory until it is cleared");
        let kind = kinds.get(&(fault.node.clone(), fault.gpu.clone())).copied().unwrap_or("xid");
        ctx.metrics.gpu_fault(&fault.cluster, kind);
    }
    let now_faulted = db::health::faulted_nodes(&ctx.pool).await?;
    let changed: BTreeSet<&str> = now_faulted
        .symmetric_difference(faulted)
        .map(|(cluster, _)| cluster.as_str())
        .chain(opened.iter().map(|f| f.cluster.as_str()))
        .collect();
    for cluster in changed {
        if let Some(backend) = ctx.backends.get(cluster) {
            if let Err(e) = super::sync_cluster(ctx, cluster, backend.as_ref()).await {
                tracing::warn!(cluster, error = %e, "inventory sync after a GPU fault changed failed");
            }
        }
    }
    *faulted = now_faulted;
    if opened.is_empty() {
        return Ok(0);
    }
    ctx.reconcile_soon.notify_one();
    Ok(opened.len())
}

/// The GPU health read, then one read of activity and the idle rule over the jobs it sampled.
/// `faulted` holds the nodes with a GPU fault as the last pass left them.
pub async fn pass(
    ctx: &Ctx,
    epoch: i64,
    source: &DcgmSource,
    faulted: &mut BTreeSet<(String, String)>,
) -> Result<UtilisationReport, ControlError> {
    // Health first, and on its own: a GPU that failed must leave the inventory even when
    // reading activity fails.
    let faults = match health(ctx, epoch, source, faulted).await {
        Ok(opened) => opened,
        Err(ControlError::NotLeader) => return Err(ControlError::NotLeader),
        Err(e) => {
            tracing::warn!(error = %e, "reading GPU health failed; the next pass reads again");
            0
        }
    };
    let read = source.read().await?;
    let at = Utc::now();
    let mut tx = leader_tx(&ctx.pool, epoch).await?;
    let mut report = UtilisationReport {
        replicas: db::utilisation::record(&mut tx, &read, at).await?,
        faults,
        ..UtilisationReport::default()
    };
    let mut jobs: Vec<JobId> = read.iter().map(|r| r.job_id).collect();
    jobs.sort_unstable();
    jobs.dedup();
    let sampled = db::idle::sampled_at(&mut tx, &jobs, at).await?;
    let mut idle = HashSet::new();
    if !sampled.is_empty() {
        let policies: Vec<IdlePolicy> = db::idle::policies(&mut *tx).await?.into_iter().map(|p| p.policy).collect();
        idle = apply(&mut tx, &policies, &sampled, at, &mut report).await?;
    }
    tx.commit().await?;
    // Per team and class: SM activity weighted by GPUs, and the GPUs held idle.
    let mut by_team_class: BTreeMap<(String, String), (f64, f64, f64)> = BTreeMap::new();
    for job in &sampled {
        let gpus = job.gpu_milli as f64 / 1000.0;
        let entry = by_team_class.entry((job.team.clone(), job.gpu_class.clone())).or_default();
        entry.0 += job.sm_active * gpus;
        entry.1 += gpus;
        if idle.contains(&(job.job_id, job.attempt)) {
            entry.2 += gpus;
        }
    }
    ctx.metrics.gpu_activity(
        by_team_class
            .into_iter()
            .map(|(key, (weighted, gpus, idle))| (key, (if gpus > 0.0 { weighted / gpus } else { 0.0 }, idle)))
            .collect(),
    );
    for (action, n) in [("warned", report.warned), ("stopped", report.stopped), ("preempted", report.preempted)] {
        if n > 0 {
            ctx.metrics.idle_action(action, n);
        }
    }
    Ok(report)
}

/// The idle rule over the sampled jobs: stretches changed in one statement per kind of
/// change, events in one, preemptions in one. Counts what it did in `report`; returns the
/// attempts idle after this read.
async fn apply(
    tx: &mut db::Tx<'_>,
    policies: &[IdlePolicy],
    sampled: &[Sampled],
    at: DateTime<Utc>,
    report: &mut UtilisationReport,
) -> Result<HashSet<(JobId, i32)>, ControlError> {
    let mut open = Vec::new();
    // The open stretches each read extends, warns on, acts on or closes.
    let (mut extend, mut warn, mut act, mut close) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut events = Vec::new();
    let mut preempt = Vec::new();
    let mut stop = Vec::new();
    for job in sampled {
        let policy = governing(policies, job.team_id, &job.priority_class);
        let stretch = job.stretch_started_at.map(|started_at| Stretch {
            started_at,
            warned_at: job.warned_at,
            acted: job.acted_at.is_some(),
        });
        let sm = job.sm_active * 100.0;
        let key = (job.job_id, job.attempt);
        let event = |kind: &'static str, message: String, data| db::jobs::NewEvent {
            job_id: job.job_id,
            attempt: job.attempt,
            kind,
            reason: Some("idle".into()),
            message,
            data: Some(data),
        };
        match step(policy, stretch.as_ref(), sm, at) {
            Step::Busy => {}
            Step::Began => open.push((job.job_id, job.attempt, job.gpu_milli)),
            Step::Continues => extend.push(key),
            Step::Ended { warned } => {
                close.push(key);
                if warned {
                    events.push(event(
                        "active",
                        format!("its GPUs are busy again (SM activity {sm:.1}%): the idle warning is lifted"),
                        json!({"sm_active_percent": round1(sm)}),
                    ));
                }
            }
            Step::Warn { act_at } => {
                warn.push(key);
                let (Some(policy), Some(started)) = (policy, stretch.as_ref().map(|s| s.started_at)) else { continue };
                let then = match (act_at, policy.action) {
                    (Some(when), IdleAction::Stop) => {
                        format!("it will be stopped at {} unless they get busy", when.format("%H:%M:%S UTC"))
                    }
                    (Some(when), _) => format!(
                        "it will be preempted (and requeued) at {} unless they get busy",
                        when.format("%H:%M:%S UTC")
                    ),
                    (None, _) => "the policy only notifies".into(),
                };
                events.push(event(
                    "idle",
                    format!(
                        "its GPUs have been idle for {} (SM activity {sm:.1}%, below the {}% of {}): {then}",
                        words((at - started).num_seconds()),
                        policy.below_sm_active_percent,
                        scope(policy, job)
                    ),
                    json!({"sm_active_percent": round1(sm), "below_sm_active_percent": policy.below_sm_active_percent,
                           "idle_since": started, "action": policy.action, "acts_at": act_at}),
                ));
            }
            Step::Act(action) => {
                act.push(key);
                let Some(policy) = policy else { continue };
                let started = stretch.as_ref().map_or(at, |s| s.started_at);
                let message = format!(
                    "its GPUs stayed idle for {} (SM activity {sm:.1}%, below the {}% of {}) after the warning",
                    words((at - started).num_seconds()),
                    policy.below_sm_active_percent,
                    scope(policy, job)
                );
                let data = json!({"sm_active_percent": round1(sm), "idle_since": started, "action": action});
                match action {
                    IdleAction::Preempt => preempt.push(db::decisions::PreemptRow {
                        job_id: job.job_id,
                        grace_ms: job.grace_ms,
                        reason: "idle".into(),
                        message: format!("preempted: {message}"),
                        data,
                    }),
                    _ => stop.push((job, format!("stopped by the idle policy: {message}"), data)),
                }
            }
        }
    }
    db::idle::open_spans(tx, &open, at).await?;
    for (change, attempts) in
        [(SpanChange::Extend, &extend), (SpanChange::Warn, &warn), (SpanChange::Act, &act), (SpanChange::Close, &close)]
    {
        db::idle::change_spans(tx, attempts, change, at).await?;
    }
    report.warned = warn.len();
    let idle: HashSet<(JobId, i32)> = open
        .iter()
        .map(|&(job, attempt, _)| (job, attempt))
        .chain(extend.iter().chain(&warn).chain(&act).copied())
        .collect();
    let mut ids: Vec<_> = preempt.iter().map(|p| p.job_id).chain(stop.iter().map(|s| s.0.job_id)).collect();
    ids.sort_unstable();
    // The cycle and the reconciler lock the jobs they change in id order; so must this.
    db::decisions::lock_jobs(tx, &ids).await?;
    report.preempted = db::decisions::preempt(tx, &preempt).await?.len();
    report.stopped = stop.len();
    for (job, message, data) in &stop {
        db::jobs::mark_cancelled(tx, job.job_id, job.attempt, Some(job.grace_ms)).await?;
        events.push(db::jobs::NewEvent {
            job_id: job.job_id,
            attempt: job.attempt,
            kind: "cancel_requested",
            reason: Some("idle".into()),
            message: message.clone(),
            data: Some(data.clone()),
        });
    }
    db::jobs::add_events(tx, &events).await?;
    Ok(idle)
}

/// Whose policy it is, in words.
fn scope(policy: &IdlePolicy, job: &Sampled) -> String {
    let class = policy.priority_class.as_deref().map(|c| format!(" for {c} jobs")).unwrap_or_default();
    match policy.team_id {
        Some(_) => format!("team {}'s idle policy{class}", job.team),
        None => format!("the platform's idle policy{class}"),
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
