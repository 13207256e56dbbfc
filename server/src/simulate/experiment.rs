//! The comparison `fairway simulate` prints: one workload at one load, replayed under each
//! policy, with every team's sharing anomaly.
//!
//! # Load
//!
//! A trace may load its cluster too lightly for policies to differ. Arrival times are divided
//! by a compression factor (durations unchanged); [`find_compression`] doubles it from 1 until
//! FIFO's utilisation over the measurement window reaches the target (70%).
//!
//! # Measurement window
//!
//! Utilisation over the makespan is reported as asked, but a heavy-tailed trace makes it
//! meaningless as a load measure: in the Alibaba trace one pod runs for 145 days, so the
//! makespan is at least that at any compression, and it caps utilisation far below 70%. The
//! load is therefore measured over the *arrival window*, from the 1st to the 99th percentile
//! of arrival times, the same for every policy: the time during which work keeps coming and
//! a scheduler can keep GPUs busy or waste them. Trimming 1% at each end keeps a handful of
//! pods submitted weeks before the rest from stretching the window.
//!
//! # Sharing anomaly
//!
//! A team's sharing anomaly is its average queueing delay in the shared cluster minus its
//! average queueing delay when its own jobs alone are replayed under FIFO on a *private*
//! cluster of its reserved size. The private cluster is built from the real node list so that
//! fragmentation is as faithful as the shapes allow: per class, an evenly spaced sample of the
//! class's nodes (every `1/r`-th node, `r` = reserved / class capacity, so the mix of 1-, 2-,
//! 4- and 8-GPU nodes is the cluster's), topped up with the next nodes until it holds at least
//! the reserved GPUs (rounded up to whole nodes, which favours the private cluster), plus one
//! node large enough for the team's largest replica if the sample has none. Jobs of classes
//! where the team reserves nothing cannot run on a private cluster and are left out of both
//! averages. A team is *within reserved* when its jobs, started at submission, would never
//! need more than its reserved GPUs at once: the teams the guarantee is about.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    metrics::{self, summarize, RunMetrics, Window},
    replay::{replay, BadDecision, ReplayOutcome},
    Cluster, Workload,
};
use crate::scheduler::{ClassId, Policy, Quota, TeamId, UNIT};

/// FIFO's utilisation over the window that counts as contended.
pub const TARGET_UTILISATION: f64 = 0.70;
/// The largest compression factor tried.
pub const MAX_COMPRESSION: f64 = 65536.0;

/// The three policies, in table order, with their names.
pub const POLICIES: [(Policy, &str); 3] =
    [(Policy::Fairway, "Fairway"), (Policy::Fifo, "FIFO"), (Policy::QuotaNoHistory, "Quota (no history)")];

/// The printable name of a policy.
pub fn policy_name(policy: Policy) -> &'static str {
    POLICIES.iter().find(|(p, _)| *p == policy).map_or("?", |(_, n)| n)
}

/// The load search's record: factor and FIFO's utilisation at it, per factor tried.
#[derive(Debug, Clone)]
pub struct LoadSearch {
    pub tried: Vec<(f64, f64)>,
    /// The factor chosen: the first that reached the target, else the largest tried.
    pub factor: f64,
    pub reached: bool,
}

/// Doubles the compression factor from 1 until FIFO's window utilisation reaches `target`.
/// `progress` hears each factor tried with FIFO's utilisation at it.
pub fn find_compression(
    workload: &Workload,
    target: f64,
    progress: &mut dyn FnMut(f64, f64),
) -> Result<LoadSearch, BadDecision> {
    let mut tried = Vec::new();
    let mut factor = 1.0;
    loop {
        let compressed = workload.compressed(factor);
        let outcome = replay(&compressed, Policy::Fifo)?;
        let util = summarize(&compressed, &outcome, arrival_window(&compressed)).window_utilisation;
        tried.push((factor, util));
        progress(factor, util);
        if util >= target || factor >= MAX_COMPRESSION {
            return Ok(LoadSearch { tried, factor, reached: util >= target });
        }
        factor *= 2.0;
    }
}

/// The window load is measured over: the 1st to the 99th percentile of arrival times.
pub fn arrival_window(workload: &Workload) -> Window {
    let mut submits: Vec<i64> = workload.jobs.iter().map(|j| j.submit_ms).collect();
    submits.sort_unstable();
    if submits.is_empty() {
        return Window { from_ms: 0, to_ms: 0 };
    }
    let at = |p: usize| submits[(submits.len() - 1) * p / 100];
    Window { from_ms: at(1), to_ms: at(99) }
}

/// One team's row of the anomaly table.
#[derive(Debug, Clone)]
pub struct TeamAnomaly {
    pub team: String,
    pub reserved_gpus: f64,
    /// Jobs counted (those of classes it reserves).
    pub jobs: usize,
    /// The most GPUs its jobs would hold at once if each started at submission.
    pub peak_demand_gpus: f64,
    pub within_reserved: bool,
    /// GPUs of its private cluster.
    pub private_gpus: f64,
    /// Average queueing delay on the private cluster, in seconds.
    pub private_wait_s: f64,
    /// Average queueing delay in the shared cluster per policy (table order), in seconds.
    pub shared_wait_s: Vec<f64>,
}

impl TeamAnomaly {
    /// Shared minus private average queueing delay, per policy.
    pub fn anomaly_s(&self) -> Vec<f64> {
        self.shared_wait_s.iter().map(|w| w - self.private_wait_s).collect()
    }
}

/// Everything `fairway simulate` prints.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub workload: String,
    pub jobs: usize,
    pub capacity_gpus: f64,
    pub compression: f64,
    pub window: Window,
    pub rows: Vec<RunMetrics>,
    pub anomalies: Vec<TeamAnomaly>,
}

/// Replays `workload` compressed by `factor` under every policy and measures anomalies.
pub fn compare(workload: &Workload, factor: f64) -> Result<Comparison, BadDecision> {
    let compressed = workload.compressed(factor);
    let window = arrival_window(&compressed);
    let mut rows = Vec::new();
    let mut outcomes = Vec::new();
    for (policy, _) in POLICIES {
        let outcome = replay(&compressed, policy)?;
        rows.push(summarize(&compressed, &outcome, window));
        outcomes.push(outcome);
    }
    let anomalies = team_anomalies(&compressed, &outcomes)?;
    Ok(Comparison {
        workload: workload.name.clone(),
        jobs: workload.jobs.len(),
        capacity_gpus: workload.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
        compression: factor,
        window,
        rows,
        anomalies,
    })
}

fn team_anomalies(workload: &Workload, outcomes: &[ReplayOutcome]) -> Result<Vec<TeamAnomaly>, BadDecision> {
    let mut rows = Vec::new();
    for team in 0..workload.cluster.teams.len() as TeamId {
        let Some(private) = private_workload(workload, team) else { continue };
        let private_outcome = replay(&private.workload, Policy::Fifo)?;
        let Some(private_wait_s) = metrics::team_average_wait_s(&private.workload, &private_outcome, 0) else {
            continue;
        };
        let counted = |j: &super::TraceJob| j.team == team && workload.cluster.reserved_milli(team, j.class) > 0;
        let shared_wait_s = outcomes
            .iter()
            .map(|o| {
                let waits: Vec<f64> = workload
                    .jobs
                    .iter()
                    .zip(&o.jobs)
                    .filter(|(j, _)| counted(j))
                    .filter_map(|(j, o)| Some((o.first_start_ms? - j.submit_ms) as f64 / 1000.0))
                    .collect();
                metrics::mean(&waits)
            })
            .collect();
        let peak = peak_demand(workload, team);
        let reserved: u64 = workload.cluster.teams[team as usize].quotas.values().map(|q| q.reserved).sum();
        rows.push(TeamAnomaly {
            team: workload.cluster.teams[team as usize].name.clone(),
            reserved_gpus: reserved as f64 / f64::from(UNIT),
            jobs: private.workload.jobs.len(),
            peak_demand_gpus: peak.values().sum::<u64>() as f64 / f64::from(UNIT),
            within_reserved: peak.iter().all(|(&c, &p)| p <= workload.cluster.reserved_milli(team, c)),
            private_gpus: private.workload.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
            private_wait_s,
            shared_wait_s,
        });
    }
    Ok(rows)
}

/// Per class, the most milli-units a team's jobs would hold at once if each ran from its
/// submission for its duration.
fn peak_demand(workload: &Workload, team: TeamId) -> BTreeMap<ClassId, u64> {
    let mut changes: BTreeMap<ClassId, Vec<(i64, i64)>> = BTreeMap::new();
    for job in workload.jobs.iter().filter(|j| j.team == team) {
        let entry = changes.entry(job.class).or_default();
        entry.push((job.submit_ms, job.total_milli() as i64));
        entry.push((job.submit_ms + job.duration_ms, -(job.total_milli() as i64)));
    }
    changes
        .into_iter()
        .map(|(class, mut deltas)| {
            // Ends before starts at the same instant: a job finishing as another arrives.
            deltas.sort_unstable_by_key(|&(t, d)| (t, d));
            let (mut held, mut peak) = (0i64, 0i64);
            for (_, d) in deltas {
                held += d;
                peak = peak.max(held);
            }
            (class, peak as u64)
        })
        .collect()
}

/// A team's jobs alone on a private cluster of its reserved size.
pub struct PrivateReplay {
    pub workload: Workload,
}

/// The team's jobs (of classes it reserves) on a private cluster (see the module docs), as
/// team 0 of a one-team cluster; `None` when it has no such jobs.
pub fn private_workload(workload: &Workload, team: TeamId) -> Option<PrivateReplay> {
    let cluster = &workload.cluster;
    let quotas = &cluster.teams[team as usize].quotas;
    let jobs: Vec<_> = workload
        .jobs
        .iter()
        .filter(|j| j.team == team && quotas.get(&j.class).is_some_and(|q| q.reserved > 0))
        .map(|j| super::TraceJob { team: 0, ..j.clone() })
        .collect();
    if jobs.is_empty() {
        return None;
    }
    let mut nodes = Vec::new();
    let mut team_quotas = BTreeMap::new();
    for (&class, quota) in quotas.iter().filter(|(_, q)| q.reserved > 0) {
        let largest_units = jobs
            .iter()
            .filter(|j| j.class == class && j.milli_per_replica >= UNIT)
            .map(|j| j.milli_per_replica / UNIT)
            .max()
            .unwrap_or(1);
        let chosen = private_nodes(cluster, class, quota.reserved, largest_units);
        let capacity: u64 = chosen.iter().map(|&n| u64::from(cluster.nodes[n].units) * u64::from(UNIT)).sum();
        nodes.extend(chosen.into_iter().map(|n| cluster.nodes[n].clone()));
        // The whole private cluster is the team's, rounding included.
        team_quotas.insert(class, Quota { reserved: capacity, burst: 0, lendable: 0 });
    }
    let mut private_team = cluster.teams[team as usize].clone();
    private_team.parent = None;
    private_team.quotas = team_quotas;
    private_team.usage_history_micros = 0.0;
    let private = Cluster {
        classes: cluster.classes.clone(),
        nodes,
        teams: vec![private_team],
        priorities: cluster.priorities.clone(),
    };
    Some(PrivateReplay { workload: Workload { name: format!("{} private", workload.name), cluster: private, jobs } })
}

/// Indices of the nodes of a private cluster of one class (see the module docs).
fn private_nodes(cluster: &Cluster, class: ClassId, reserved: u64, largest_units: u32) -> Vec<usize> {
    let of_class: Vec<usize> = (0..cluster.nodes.len()).filter(|&n| cluster.nodes[n].class == class).collect();
    let capacity = cluster.capacity_milli(class).max(1);
    let units = |n: usize| u64::from(cluster.nodes[n].units) * u64::from(UNIT);
    // An even sample: node i is taken when ⌊(i+1)·r⌋ > ⌊i·r⌋, r = reserved / capacity.
    let mut chosen: Vec<usize> = Vec::new();
    let mut taken = vec![false; of_class.len()];
    for i in 0..of_class.len() as u64 {
        let (r, c) = (u128::from(reserved), u128::from(capacity));
        if (u128::from(i) + 1) * r / c > u128::from(i) * r / c {
            taken[i as usize] = true;
        }
    }
    let mut held: u64 = 0;
    for (i, &n) in of_class.iter().enumerate() {
        if taken[i] {
            chosen.push(n);
            held += units(n);
        }
    }
    for (i, &n) in of_class.iter().enumerate() {
        if held >= reserved {
            break;
        }
        if !taken[i] {
            taken[i] = true;
            chosen.push(n);
            held += units(n);
        }
    }
    let fits_largest = |n: usize| u32::from(cluster.nodes[n].units) >= largest_units;
    if !chosen.iter().any(|&n| fits_largest(n)) {
        if let Some(i) = (0..of_class.len()).find(|&i| !taken[i] && fits_largest(of_class[i])) {
            chosen.push(of_class[i]);
        }
    }
    chosen.sort_unstable();
    chosen
}

/// Formats the comparison: the load, the policy table and the anomaly table.
pub fn render(comparison: &Comparison, search: Option<&LoadSearch>) -> String {
    let mut out = String::new();
    render_load(&mut out, comparison, search);
    render_policies(&mut out, comparison);
    render_anomalies(&mut out, comparison);
    out
}

fn render_load(out: &mut String, c: &Comparison, search: Option<&LoadSearch>) {
    let _ = writeln!(out, "Workload: {} ({} jobs on {} GPUs)", c.workload, c.jobs, c.capacity_gpus);
    if let Some(search) = search {
        let tried: Vec<String> = search.tried.iter().map(|(f, u)| format!("{f}x: {:.1}%", u * 100.0)).collect();
        let _ = writeln!(out, "Load search (FIFO window utilisation): {}", tried.join(", "));
        if !search.reached {
            let _ = writeln!(
                out,
                "  (FIFO never reached {:.0}%; using the largest factor tried)",
                TARGET_UTILISATION * 100.0
            );
        }
    }
    let _ = writeln!(
        out,
        "Arrival compression factor: {} (arrival window {:.0} s, 1st to 99th percentile of arrivals)\n",
        c.compression,
        c.window.seconds()
    );
}

fn render_policies(out: &mut String, c: &Comparison) {
    let _ = writeln!(
        out,
        "| policy | util (window) | util (makespan) | avg JCT s | p99 JCT s | avg wait s | p99 wait s | makespan s | preemptions | GPU-h lost | Jain | completed |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &c.rows {
        let _ = writeln!(
            out,
            "| {} | {:.1}% | {:.2}% | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {:.3} | {}/{} |",
            policy_name(r.policy),
            r.window_utilisation * 100.0,
            r.utilisation * 100.0,
            r.avg_completion_s,
            r.p99_completion_s,
            r.avg_wait_s,
            r.p99_wait_s,
            r.makespan_s,
            r.preemptions,
            r.lost_gpu_hours,
            r.jain,
            r.completed,
            r.jobs
        );
    }
    for r in c.rows.iter().filter(|r| r.stopped.is_some()) {
        let _ = writeln!(out, "  {} stopped early: {}", policy_name(r.policy), r.stopped.as_deref().unwrap_or(""));
    }
    let _ = writeln!(out);
}

fn render_anomalies(out: &mut String, c: &Comparison) {
    let names: Vec<&str> = POLICIES.iter().map(|(_, n)| *n).collect();
    let _ = writeln!(
        out,
        "Sharing anomaly = team's avg queueing delay shared - on a private FIFO cluster of its reserved size (s)"
    );
    let _ = writeln!(
        out,
        "| team | reserved GPUs | private GPUs | jobs | peak demand GPUs | within reserved | private wait s | {} |",
        names.iter().map(|n| format!("{n} anomaly s")).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|:---:|---:|{}", "---:|".repeat(names.len()));
    for a in &c.anomalies {
        let anomalies: Vec<String> = a.anomaly_s().iter().map(|x| format!("{x:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.0} | {} | {:.1} | {} | {:.0} | {} |",
            a.team,
            a.reserved_gpus,
            a.private_gpus,
            a.jobs,
            a.peak_demand_gpus,
            if a.within_reserved { "yes" } else { "no" },
            a.private_wait_s,
            anomalies.join(" | ")
        );
    }
    for (i, name) in names.iter().enumerate() {
        let max = |within: bool| {
            c.anomalies
                .iter()
                .filter(|a| !within || a.within_reserved)
                .map(|a| a.anomaly_s()[i])
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        };
        let show = |x: Option<f64>| x.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.0} s"));
        let _ = writeln!(
            out,
            "Max anomaly, {name}: {} over all teams, {} over teams within reserved",
            show(max(false)),
            show(max(true))
        );
    }
}
