//! One scheduling cycle: snapshot → engine → one transaction that records the admissions
//! (with their outbox rows), the preemptions (with theirs) and every pending job's reason,
//! position and expected start, guarded by the leader's epoch.

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use serde_json::json;

use super::{forecast::ForecastInputs, world::World, ControlError};
use crate::{
    db::{
        self,
        decisions::{AdmitRow, PendingRow, PreemptRow},
        snapshot::{LiveJob, LiveJobs},
    },
    domain,
    scheduler::{self, decision::Decisions},
    telemetry::Waited,
};

/// What a cycle did.
#[derive(Debug, Clone, Default)]
pub struct CycleReport {
    pub admitted: usize,
    pub preempted: usize,
    pub pending: usize,
    /// The passes before the snapshot, snapshot read, engine and commit.
    pub duration: Duration,
    /// Of which the passes that release waiting jobs and start services' replicas,
    pub passes: Duration,
    /// reading the snapshot,
    pub read: Duration,
    /// the engine,
    pub engine: Duration,
    /// and the transaction that records the decisions.
    pub write: Duration,
    /// Submit → first admission of each job admitted for the first time.
    pub admission_latencies: Vec<Waited>,
    /// Time since each admitted job last entered the queue.
    pub queue_waits: Vec<Waited>,
    /// Reason codes of the preemptions.
    pub preemption_reasons: Vec<&'static str>,
    /// Jobs admitted on GPUs held for a blocked gang.
    pub backfills: usize,
    /// GPUs allocated and capacity per class name after the cycle.
    pub allocation: Vec<(String, u64, u64)>,
    /// Pending jobs per (team, class).
    pub pending_by_team: Vec<((String, String), u64)>,
    /// Pending jobs per reason code, every code of the fixed list, those waiting for their
    /// dependencies (`waiting_for_dependencies`, `dependency_failed`) and array tasks held
    /// by their array's parallelism (`array_task_limit`).
    pub pending_by_reason: Vec<(&'static str, u64)>,
}

/// Whose reason, position and expected start a cycle records. Under load cycles follow
/// each other closely and nearly every queued job's position and expected start move in
/// each, so the control loop refreshes them all only now and then (see
/// [`super::pending_refresh_interval`]): rewriting ten thousand rows per cycle would cost
/// the database more than the decisions themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Only the jobs with no reason recorded yet (just submitted or requeued): few rows, and
    /// what a user looks for first. A job that has one keeps it until the next refresh
    /// ([`Refresh::All`]) writes what it waits for then: under load the first blocking rule
    /// of a queued job can change in every cycle and back (its department full, then its GPUs
    /// held for a gang), and each change written was a row update and a timeline event (three
    /// of each per job in `fairway bench scale` at 50,000 jobs).
    Changed,
    /// Every pending job.
    All,
}

/// Starts gathering the statistics of `jobs` unless this process is already at it (see
/// `db::snapshot::analyze_jobs`): the cycle goes on meanwhile, and a failure only costs
/// plans until the next try or autovacuum.
fn analyze_jobs_in_background(pool: &sqlx::PgPool) {
    static ANALYZING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if ANALYZING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        match db::snapshot::analyze_jobs(&pool).await {
            Ok(()) => {
                let took_ms = started.elapsed().as_millis() as u64;
                tracing::debug!(took_ms, "gathered the statistics of jobs");
            }
            Err(error) => tracing::warn!(%error, "could not gather the statistics of jobs"),
        }
        ANALYZING.store(false, std::sync::atomic::Ordering::Release);
    });
}

/// Reads the world at one instant and builds the engine's snapshot. `live` is the copy of
/// the live jobs kept from the previous read, brought up to date (an empty one reads all);
/// `forecast` what the forecast learnt, read again when it is stale.
pub async fn world(
    pool: &sqlx::PgPool,
    config: &scheduler::snapshot::Config,
    pricing: &crate::metering::Pricing,
    live: &mut LiveJobs,
    forecast: &mut ForecastInputs,
) -> Result<World, ControlError> {
    let half_life = config.usage_half_life_ms as f64 / 1000.0;
    let rows = db::snapshot::snapshot_rows(pool, half_life, live).await?;
    let now = rows.now;
    let mut world = World::build(rows, config.clone());
    world.currency.clone_from(&pricing.currency);
    world.set_hard_budgets(&crate::billing::budgets::hard_left(pool, now, pricing.chargeback).await?);
    if config.estimate_start_times {
        forecast.refresh(pool).await?;
        world.set_forecast_inputs(forecast);
    }
    Ok(world)
}

/// Runs one cycle as the leader of `epoch`, recording every pending job's reason, position
/// and expected start.
pub async fn run(pool: &sqlx::PgPool, epoch: i64, config: &super::ControlConfig) -> Result<CycleReport, ControlError> {
    run_with(pool, epoch, config, Refresh::All, &mut LiveJobs::default(), &mut ForecastInputs::default()).await
}

/// Runs one cycle: one transaction records the admissions, the preemptions and the pending
/// rows `refresh` asks for. `live` is the leader's copy of the live jobs, kept between
/// cycles so that each reads only the jobs changed since the one before; `forecast` what the
/// forecast learnt, kept between cycles too.
pub async fn run_with(
    pool: &sqlx::PgPool,
    epoch: i64,
    config: &super::ControlConfig,
    refresh: Refresh,
    live: &mut LiveJobs,
    forecast: &mut ForecastInputs,
) -> Result<CycleReport, ControlError> {
    let started = Instant::now();
    let due = db::snapshot::passes_due(pool).await?;
    if due.jobs_statistics_stale {
        analyze_jobs_in_background(pool);
    }
    // Jobs whose dependencies are now met join this cycle's snapshot.
    let dependencies =
        if due.dependencies { super::dependencies::resolve(pool, epoch).await? } else { Default::default() };
    // And so do the tasks their arrays' parallelism now has room for (a task the dependency
    // pass just released may be one its array holds back).
    let arrays =
        if due.arrays || due.dependencies { super::arrays::release(pool, epoch).await? } else { Default::default() };
    // And the replicas services now need; replicas they no longer need are stopped.
    if due.services {
        super::services::reconcile(pool, epoch).await?;
    }
    // Extra replicas whose elastic gang stopped running end with it.
    {
        let mut tx = super::leader_tx(pool, epoch).await?;
        if db::jobs::end_orphan_extras(&mut tx).await? > 0 {
            db::jobs::notify(&mut tx, db::outbox::DISPATCH_CHANNEL).await?;
        }
        tx.commit().await?;
    }
    let passes = started.elapsed();
    let world = world(pool, &config.engine, &config.pricing, live, forecast).await?;
    let read = started.elapsed() - passes;
    let (world, decisions, engine) = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let decisions = scheduler::schedule(&world.snapshot);
        (world, decisions, t.elapsed())
    })
    .await?;
    let (mut admit, preempt, recorded) = rows(&world, &decisions, refresh);
    let (extras, extra_admissions, shrink) = elastic_rows(&world, &decisions);
    admit.extend(extra_admissions);
    let writing = Instant::now();
    let mut tx = super::leader_tx(pool, epoch).await?;
    // Pending rows first (rows others hold are skipped). Then the admitted and preempted
    // jobs, locked in id order as the reconciler locks the jobs it changes.
    let written: std::collections::HashSet<crate::domain::JobId> =
        db::decisions::set_pending(&mut tx, &recorded).await?.into_iter().collect();
    let mut changed: Vec<crate::domain::JobId> = admit
        .iter()
        .map(|a| a.job_id)
        .chain(preempt.iter().map(|p| p.job_id))
        .chain(shrink.iter().map(|k| k.job_id))
        .collect();
    changed.sort_unstable();
    db::decisions::lock_jobs(&mut tx, &changed).await?;
    // A growth's extras are new rows, admitted with the cycle's other admissions.
    for (gang, ids) in &extras {
        db::jobs::insert_extras(&mut tx, *gang, ids).await?;
    }
    let admitted = db::decisions::admit(&mut tx, &admit).await?;
    let preempted = db::decisions::preempt(&mut tx, &preempt).await?;
    let shrunk = db::decisions::shrink(&mut tx, &shrink).await?;
    if !admitted.is_empty() || !preempted.is_empty() || !shrunk.is_empty() {
        db::jobs::notify(&mut tx, db::outbox::DISPATCH_CHANNEL).await?;
    }
    tx.commit().await?;
    let write = writing.elapsed();
    // Only rows written: one skipped because another transaction held it still differs
    // from what the copy would say, and the next cycle tries again. (A row not written
    // because it already held these values holds the copy's reason too.)
    live.set_pending_reasons(
        recorded.iter().filter(|r| written.contains(&r.job_id)).map(|r| (r.job_id, r.reason.as_str())),
    );
    let now = world.snapshot.now_ms;
    let admitted: std::collections::HashSet<crate::domain::JobId> = admitted.into_iter().collect();
    let admitted_jobs: Vec<_> = world.jobs.values().filter(|j| admitted.contains(&j.id)).collect();
    let waited = |j: &LiveJob, since: chrono::DateTime<Utc>| Waited {
        gpu_class: world.class_name_of(j.gpu_class_id),
        priority_class: j.priority_class.clone(),
        seconds: (now - since.timestamp_millis()).max(0) as f64 / 1000.0,
    };
    let admission_latencies =
        admitted_jobs.iter().filter(|j| j.attempt == 0).map(|j| waited(j, j.submitted_at)).collect();
    let queue_waits = admitted_jobs.iter().map(|j| waited(j, j.queued_at)).collect();
    let preempted: std::collections::HashSet<crate::domain::JobId> = preempted.into_iter().collect();
    let preemption_reasons = decisions
        .preemptions
        .iter()
        .filter(|p| world.jobs.get(&p.victim).is_some_and(|j| preempted.contains(&j.id)))
        .map(|p| p.reason.code())
        .collect();
    Ok(CycleReport {
        admitted: admitted.len(),
        preempted: preempted.len(),
        pending: decisions.pending.len(),
        duration: started.elapsed(),
        passes,
        read,
        engine,
        write,
        admission_latencies,
        queue_waits,
        preemption_reasons,
        backfills: decisions
            .admissions
            .iter()
            .filter(|a| {
                a.backfilled_ahead_of.is_some() && world.jobs.get(&a.job).is_some_and(|j| admitted.contains(&j.id))
            })
            .count(),
        allocation: allocation(&world, &decisions),
        pending_by_team: pending_by_team(&world, &decisions),
        pending_by_reason: pending_by_reason(&decisions, &dependencies, &arrays),
    })
}

/// The elastic gangs' growths as new extras to insert and admit (per gang, one admission per
/// replica; a replica the engine put on another cluster than its gang's is left out, as a
/// gang runs on one cluster), and their shrinks as extras to give back.
type ElasticRows = (Vec<(crate::domain::JobId, Vec<crate::domain::JobId>)>, Vec<AdmitRow>, Vec<PreemptRow>);

fn elastic_rows(world: &World, decisions: &Decisions) -> ElasticRows {
    let mut extras = Vec::new();
    let mut admissions = Vec::new();
    for g in &decisions.growths {
        let Some(gang) = world.jobs.get(&g.job) else { continue };
        let mut rows = Vec::new();
        for (replica, &borrowing) in g.placement.iter().zip(&g.borrowing) {
            let Some((cluster_id, cluster, slots)) = world.stored_placement(std::slice::from_ref(replica)) else {
                continue;
            };
            if gang.cluster_id != Some(cluster_id) {
                continue;
            }
            let nodes: Vec<String> =
                slots.iter().map(|s| format!("{} (GPUs {})", s.node, join(s.gpus.iter().map(u8::to_string)))).collect();
            rows.push(AdmitRow {
                job_id: crate::domain::JobId::new(),
                cluster_id,
                placement: json!(slots),
                borrowing,
                message: format!(
                    "admitted on cluster {cluster}, {}, as an extra replica of elastic gang {}{}: it is given back, before the gang itself, when a job that may preempt the gang (of higher priority in its team, a lender reclaiming its quota, or fair share) needs its GPUs",
                    nodes.join(", "),
                    gang.id,
                    if borrowing { ", borrowing burst capacity" } else { "" }
                ),
                data: json!({"cluster": cluster, "placement": slots, "extra_of": gang.id, "borrowing": borrowing}),
            });
        }
        if !rows.is_empty() {
            extras.push((gang.id, rows.iter().map(|r| r.job_id).collect()));
            admissions.extend(rows);
        }
    }
    let mut shrink = Vec::new();
    for k in &decisions.shrinks {
        let (Some(gang), Some(for_job)) = (world.jobs.get(&k.job), world.jobs.get(&k.for_job)) else { continue };
        let Some((own, rows)) = world.extras.get(&k.job) else { continue };
        let Some(&extra) = usize::from(k.replica).checked_sub(*own).and_then(|i| rows.get(i)) else { continue };
        let for_team = world.team_name_of(for_job.team_id);
        let message = match k.reason {
            scheduler::PreemptReason::OwnTeam => format!(
                "given back by elastic gang {} to job {} of its own team {for_team}, which waits for the GPUs it grew into (own_team): an extra holds only capacity no waiting job can use",
                gang.id, for_job.id
            ),
            reason => format!(
                "given back by elastic gang {} for job {} of team {for_team} ({}), before the gang itself would be preempted",
                gang.id,
                for_job.id,
                reason.code()
            ),
        };
        shrink.push(PreemptRow {
            job_id: extra,
            grace_ms: k.grace_ms,
            reason: "shrunk".to_owned(),
            message,
            data: json!({"extra_of": gang.id, "by_job": for_job.id, "by_team": for_team, "rule": k.reason.code(), "grace_ms": k.grace_ms}),
        });
    }
    (extras, admissions, shrink)
}

/// The decisions as rows to write, with the pending rows `refresh` asks for.
fn rows(world: &World, decisions: &Decisions, refresh: Refresh) -> (Vec<AdmitRow>, Vec<PreemptRow>, Vec<PendingRow>) {
    let mut admit = Vec::new();
    for a in &decisions.admissions {
        let Some(job) = world.jobs.get(&a.job) else { continue };
        // A gang spanning clusters cannot run; it waits for a placement on one.
        let Some((cluster_id, cluster, slots)) = world.stored_placement(&a.placement) else { continue };
        let nodes: Vec<String> =
            slots.iter().map(|s| format!("{} (GPUs {})", s.node, join(s.gpus.iter().map(u8::to_string)))).collect();
        let gang = a.backfilled_ahead_of.and_then(|g| world.jobs.get(&g));
        let preemptible =
            world.snapshot.priorities.iter().find(|p| p.name == job.priority_class).is_none_or(|p| p.preemptible);
        let message = format!(
            "admitted on cluster {cluster}, {}{}{}",
            nodes.join(", "),
            match (a.borrowing, preemptible) {
                (true, true) => "; borrowing burst capacity, so it may be preempted to give it back",
                // Its team's preemptible jobs hold the reserved quota it runs beside: what
                // the team now holds beyond it is burst, billed so, and theirs to give back.
                (true, false) => "; its team now holds more than its reserved quota, so it is billed as burst, and the team's preemptible jobs give the capacity back if it is reclaimed",
                (false, _) => "",
            },
            gang.map_or(String::new(), |g| format!(
                "; backfilled on GPUs held for job {}, a gang it ends before by its maximum runtime",
                g.id
            )),
        );
        admit.push(AdmitRow {
            job_id: job.id,
            cluster_id,
            placement: json!(slots),
            borrowing: a.borrowing,
            message,
            data: json!({
                "cluster": cluster,
                "placement": slots,
                "borrowing": a.borrowing,
                "max_cost_micros": a.max_cost_micros,
                "exceeds_soft_budget": a.exceeds_soft_budget,
                "backfilled_ahead_of": gang.map(|g| g.id),
            }),
        });
    }
    let mut preempt = Vec::new();
    for p in &decisions.preemptions {
        let (Some(victim), Some(for_job)) = (world.jobs.get(&p.victim), world.jobs.get(&p.for_job)) else { continue };
        let for_team = world.team_name_of(for_job.team_id);
        let why = match p.reason {
            scheduler::PreemptReason::Priority => "a higher-priority job of the same team needs the GPUs".to_owned(),
            scheduler::PreemptReason::Reclaim => {
                format!("team {for_team} reclaims its reserved quota, which this job was borrowing")
            }
            scheduler::PreemptReason::FairShare => {
                format!("team {for_team} is below its fair share of burst capacity and this job's team above it")
            }
            // The engine takes only extras for it, and those are shrinks; worded for
            // completeness.
            scheduler::PreemptReason::OwnTeam => {
                "a job of the same team and no lower priority waits for the GPUs this job grew into".to_owned()
            }
            scheduler::PreemptReason::LeastService => {
                "a job of the same team and priority that has had less GPU time waits, and this one has had more than the threshold".to_owned()
            }
        };
        // The engine's: the victim's own grace period, or its priority class's.
        let grace_ms = p.grace_ms;
        preempt.push(PreemptRow {
            job_id: victim.id,
            grace_ms,
            reason: p.reason.code().to_owned(),
            message: format!("preempted for job {} of team {for_team}: {why}", for_job.id),
            data: json!({
                "by_job": for_job.id,
                "by_team": for_team,
                "reason": p.reason.code(),
                "grace_ms": grace_ms,
                "lost_gpu_ms": p.lost_work,
            }),
        });
    }
    let pending = decisions
        .pending
        .iter()
        .filter_map(|p| {
            let job = world.jobs.get(&p.job)?;
            let code = p.reason.code();
            if refresh == Refresh::Changed && job.pending_reason.is_some() {
                return None;
            }
            let row = PendingRow {
                job_id: job.id,
                reason: code.to_owned(),
                // A wait no forecast can foresee says what it waits for instead of a time.
                message: match p.unforeseeable {
                    Some(u) => format!(
                        "{}: {}",
                        world.pending_message(job.team_id, job.gpu_class_id, &p.reason, &p.figures),
                        u.message(&|t| world.team_name(t))
                    ),
                    None => world.pending_message(job.team_id, job.gpu_class_id, &p.reason, &p.figures),
                },
                figures: domain::WaitFigures {
                    earliest_start_at: p.earliest_start_ms.and_then(at),
                    latest_start_at: p.latest_start_ms.and_then(at),
                    unforeseeable: p.unforeseeable.map(|u| u.code().to_owned()),
                    ..world.pending_figures(&p.reason, &p.figures)
                },
                position: i32::try_from(p.position).unwrap_or(i32::MAX),
                expected_start_at: p.expected_start_ms.and_then(at),
                played_wait_ms: p.played_start_ms.map(|ms| ms - world.snapshot.now_ms),
            };
            Some(row)
        })
        .collect();
    (admit, preempt, pending)
}

fn at(ms: i64) -> Option<chrono::DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single()
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(",")
}

fn allocation(world: &World, decisions: &Decisions) -> Vec<(String, u64, u64)> {
    let s = &world.snapshot;
    let mut out: Vec<(String, u64, u64)> = s.classes.iter().map(|c| (c.name.clone(), 0, 0)).collect();
    for n in &s.nodes {
        if let Some(row) = out.get_mut(usize::from(n.class)) {
            row.2 += u64::from(n.units);
        }
    }
    for r in &s.running {
        if let Some(row) = out.get_mut(usize::from(r.spec.class)) {
            row.1 += r.spec.total_milli() / 1000;
        }
    }
    let specs: std::collections::HashMap<u64, &scheduler::JobSpec> = s.pending.iter().map(|j| (j.id, j)).collect();
    for a in &decisions.admissions {
        if let Some(spec) = specs.get(&a.job) {
            if let Some(row) = out.get_mut(usize::from(spec.class)) {
                row.1 += spec.total_milli() / 1000;
            }
        }
    }
    out.retain(|r| r.2 > 0 || r.1 > 0);
    out
}

/// The engine's reasons, then those of jobs it does not see yet: held by their
/// dependencies or by their array's parallelism.
fn pending_by_reason(
    decisions: &Decisions,
    dependencies: &super::dependencies::Resolved,
    arrays: &super::arrays::Released,
) -> Vec<(&'static str, u64)> {
    let mut counts = [0u64; scheduler::PendingReason::CODES.len()];
    for p in &decisions.pending {
        counts[p.reason.index()] += 1;
    }
    scheduler::PendingReason::CODES
        .into_iter()
        .zip(counts)
        .chain(dependencies.pending_by_reason())
        .chain(arrays.pending_by_reason())
        .collect()
}

fn pending_by_team(world: &World, decisions: &Decisions) -> Vec<((String, String), u64)> {
    let s = &world.snapshot;
    let specs: std::collections::HashMap<u64, &scheduler::JobSpec> = s.pending.iter().map(|j| (j.id, j)).collect();
    let mut counts: std::collections::BTreeMap<(String, String), u64> = std::collections::BTreeMap::new();
    for p in &decisions.pending {
        if let Some(spec) = specs.get(&p.job) {
            let class = s.classes.get(usize::from(spec.class)).map(|c| c.name.clone()).unwrap_or_default();
            *counts.entry((world.team_name(spec.team), class)).or_default() += 1;
        }
    }
    counts.into_iter().collect()
}
