//! The comparison `fairway simulate` prints: one workload at one load, replayed under each
//! policy, with every team's sharing anomaly.
//!
//! # Load
//!
//! A trace may load its cluster too lightly for policies to differ. Two knobs raise the load:
//! arrival times are divided by a *compression factor* (durations unchanged), and the cluster
//! can be *shrunk* to one node in `k` ([`Workload::shrunk`]). [`find_load`] tries shrink
//! factors 1, 2, 4, ... and for each doubles the compression from 1 up to
//! [`MAX_COMPRESSION`], stopping at the first load where FIFO's utilisation over the
//! measurement window reaches [`TARGET_UTILISATION`]. A shrink factor at which the whole trace
//! fits the cluster at once is skipped without replaying: no arrival pattern can make jobs
//! wait there. (The Alibaba trace's GPU pods add up to 5,485 GPUs, less than its 6,212, so it
//! needs a smaller cluster; compression alone tops out near 41% there.) Capping the
//! compression keeps the replay a stream of arrivals rather than one batch.
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
//! fragmentation is as faithful as the shapes allow: per class, an even sample of a share
//! `r` = reserved / class capacity of the nodes of each size ([`Cluster::sample_nodes`], so the
//! mix of 1-, 2-, 4- and 8-GPU nodes is the cluster's), topped up with the next nodes until it holds at least
//! the reserved GPUs (rounded up to whole nodes, which favours the private cluster), plus one
//! node large enough for the team's largest replica if the sample has none. Jobs of classes
//! where the team reserves nothing cannot run on a private cluster and are left out of both
//! averages.
//!
//! The guarantee (HiveD's) is about a team *within* its reserved quota. A team as a whole is
//! within reserved when its jobs, each run from submission for its duration, never need more
//! than its reserved GPUs at once; under a contended load with teams loaded in proportion to
//! their quotas, few are. So the anomaly is also measured per job: a *within-reserved job* is
//! one that, at its submission, fits with the team's earlier jobs still running (by that same
//! ideal schedule) within the reserved quota, and its anomaly is its own shared minus private
//! queueing delay, averaged per team.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    fmt::Write as _,
};

use super::{
    metrics::{self, summarize, RunMetrics, Window},
    replay::{replay, replay_ordered, BadDecision, ReplayOutcome, PENDING_REASONS},
    Cluster, TraceJob, Workload,
};
use crate::scheduler::{ClassId, Policy, QueueOrder, Quota, TeamId, UNIT};

/// FIFO's utilisation over the window that counts as contended.
pub const TARGET_UTILISATION: f64 = 0.70;
/// The largest compression factor tried.
pub const MAX_COMPRESSION: f64 = 1024.0;

/// The policies compared, in table order: each with its order of a team's waiting jobs
/// (which only Fairway's policy uses) and its name. Fairway runs twice, in arrival order
/// (its default) and by expected service, to show what the order alone changes.
pub const POLICIES: [(Policy, QueueOrder, &str); 4] = [
    (Policy::Fairway, QueueOrder::SERVICE, "Fairway, by service"),
    (Policy::Fairway, QueueOrder::Arrival, "Fairway"),
    (Policy::Fifo, QueueOrder::Arrival, "FIFO"),
    (Policy::QuotaNoHistory, QueueOrder::Arrival, "Quota (no history)"),
];

/// One load tried: shrink factor, compression factor, FIFO's window utilisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadTried {
    pub shrink: u32,
    pub compression: f64,
    /// `None` when skipped because the whole trace fits the cluster at once.
    pub fifo_utilisation: Option<f64>,
}

/// The load search's record.
#[derive(Debug, Clone)]
pub struct LoadSearch {
    pub tried: Vec<LoadTried>,
    /// The load chosen: the first that reached the target, else the most contended tried.
    pub shrink: u32,
    pub compression: f64,
    pub reached: bool,
}

/// The shrink factors tried, in order.
pub const SHRINK_FACTORS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Finds a load where FIFO's window utilisation reaches `target` (see the module docs). A
/// fixed shrink or compression factor is used as given; `progress` hears each load tried.
pub fn find_load(
    workload: &Workload,
    target: f64,
    shrink: Option<u32>,
    compression: Option<f64>,
    progress: &mut dyn FnMut(&LoadTried),
) -> Result<LoadSearch, BadDecision> {
    let shrinks: Vec<u32> = shrink.map_or_else(|| SHRINK_FACTORS.to_vec(), |k| vec![k]);
    let compressions: Vec<f64> = compression.map_or_else(
        || std::iter::successors(Some(1.0), |f| (f * 2.0 <= MAX_COMPRESSION).then_some(f * 2.0)).collect(),
        |f| vec![f],
    );
    let mut tried = Vec::new();
    let mut best: Option<LoadTried> = None;
    for &k in &shrinks {
        let shrunk = workload.shrunk(k);
        let demand: u64 = shrunk.jobs.iter().map(TraceJob::total_milli).sum();
        if shrinks.len() > 1 && demand <= shrunk.cluster.total_capacity_milli() {
            let skipped = LoadTried { shrink: k, compression: 0.0, fifo_utilisation: None };
            progress(&skipped);
            tried.push(skipped);
            continue;
        }
        for &f in &compressions {
            let compressed = shrunk.compressed(f);
            let outcome = replay(&compressed, Policy::Fifo)?;
            let util = summarize(&compressed, &outcome, arrival_window(&compressed)).window_utilisation;
            let load = LoadTried { shrink: k, compression: f, fifo_utilisation: Some(util) };
            progress(&load);
            tried.push(load);
            if util >= target {
                return Ok(LoadSearch { tried, shrink: k, compression: f, reached: true });
            }
            if best.is_none_or(|b| b.fifo_utilisation < Some(util)) {
                best = Some(load);
            }
        }
    }
    let best = best.unwrap_or(LoadTried { shrink: 1, compression: 1.0, fifo_utilisation: None });
    Ok(LoadSearch { tried, shrink: best.shrink, compression: best.compression, reached: false })
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
    /// GPUs of its private cluster.
    pub private_gpus: f64,
    /// Jobs counted (those of classes it reserves).
    pub jobs: usize,
    /// The most GPUs its jobs would hold at once if each started at submission.
    pub peak_demand_gpus: f64,
    /// Whether that peak stays within its reserved quota.
    pub within_reserved: bool,
    /// Average queueing delay on the private cluster, in seconds.
    pub private_wait_s: f64,
    /// Average queueing delay in the shared cluster per policy (table order), in seconds.
    pub shared_wait_s: Vec<f64>,
    /// Its within-reserved jobs (see the module docs).
    pub within_jobs: usize,
    /// Per policy, the within-reserved jobs' average of shared minus private queueing delay;
    /// `None` without such jobs.
    pub within_anomaly_s: Vec<Option<f64>>,
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
    pub shrink: u32,
    pub compression: f64,
    pub window: Window,
    pub rows: Vec<RunMetrics>,
    pub anomalies: Vec<TeamAnomaly>,
    /// Team names, by index.
    pub teams: Vec<String>,
}

/// Replays `workload` shrunk by `shrink` and compressed by `compression` under every policy,
/// and measures each team's sharing anomaly.
pub fn compare(workload: &Workload, shrink: u32, compression: f64) -> Result<Comparison, BadDecision> {
    let loaded = workload.shrunk(shrink).compressed(compression);
    let window = arrival_window(&loaded);
    let mut rows = Vec::new();
    let mut outcomes = Vec::new();
    for (policy, order, name) in POLICIES {
        let outcome = replay_ordered(&loaded, policy, order)?;
        rows.push(RunMetrics { name, ..summarize(&loaded, &outcome, window) });
        outcomes.push(outcome);
    }
    let anomalies = team_anomalies(&loaded, &outcomes)?;
    Ok(Comparison {
        workload: loaded.name.clone(),
        jobs: loaded.jobs.len(),
        capacity_gpus: loaded.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
        shrink,
        compression,
        window,
        rows,
        anomalies,
        teams: loaded.cluster.teams.iter().map(|t| t.name.clone()).collect(),
    })
}

fn team_anomalies(workload: &Workload, outcomes: &[ReplayOutcome]) -> Result<Vec<TeamAnomaly>, BadDecision> {
    let mut rows = Vec::new();
    for team in 0..workload.cluster.teams.len() as TeamId {
        let Some(private) = private_workload(workload, team) else { continue };
        let private_outcome = replay(&private.workload, Policy::Fifo)?;
        let wait_s = |o: &ReplayOutcome, private_index: usize, job: usize| {
            let submit = workload.jobs[job].submit_ms;
            o.jobs[job]
                .first_start_ms
                .zip(private_outcome.jobs[private_index].first_start_ms)
                .map(|(shared, own)| ((shared - submit) as f64 / 1000.0, (own - submit) as f64 / 1000.0))
        };
        let within = within_reserved_jobs(workload, &private.original);
        let mut shared_wait_s = Vec::new();
        let mut within_anomaly_s = Vec::new();
        let mut private_waits = Vec::new();
        for o in outcomes {
            let pairs: Vec<(f64, f64)> =
                private.original.iter().enumerate().filter_map(|(i, &job)| wait_s(o, i, job)).collect();
            shared_wait_s.push(metrics::mean(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()));
            private_waits = pairs.iter().map(|p| p.1).collect();
            let differences: Vec<f64> = private
                .original
                .iter()
                .enumerate()
                .filter(|&(i, _)| within[i])
                .filter_map(|(i, &job)| wait_s(o, i, job))
                .map(|(shared, own)| shared - own)
                .collect();
            within_anomaly_s.push((!differences.is_empty()).then(|| metrics::mean(&differences)));
        }
        let peak = peak_demand(workload, team);
        let reserved: u64 = workload.cluster.teams[team as usize].quotas.values().map(|q| q.reserved).sum();
        rows.push(TeamAnomaly {
            team: workload.cluster.teams[team as usize].name.clone(),
            reserved_gpus: reserved as f64 / f64::from(UNIT),
            private_gpus: private.workload.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
            jobs: private.original.len(),
            peak_demand_gpus: peak.values().sum::<u64>() as f64 / f64::from(UNIT),
            within_reserved: peak.iter().all(|(&c, &p)| p <= workload.cluster.reserved_milli(team, c)),
            private_wait_s: metrics::mean(&private_waits),
            shared_wait_s,
            within_jobs: within.iter().filter(|&&w| w).count(),
            within_anomaly_s,
        });
    }
    Ok(rows)
}

/// For each of a team's jobs (indices into the workload, in submission order): whether, at
/// its submission, it fits within the reserved quota together with the team's earlier jobs
/// still running if every job ran from submission for its duration.
fn within_reserved_jobs(workload: &Workload, jobs: &[usize]) -> Vec<bool> {
    // Per class, the (end, milli) of jobs still running, soonest end first.
    let mut running: BTreeMap<ClassId, BinaryHeap<Reverse<(i64, u64)>>> = BTreeMap::new();
    let mut held: BTreeMap<ClassId, u64> = BTreeMap::new();
    jobs.iter()
        .map(|&i| {
            let job = &workload.jobs[i];
            let heap = running.entry(job.class).or_default();
            let used = held.entry(job.class).or_default();
            while let Some(&Reverse((end, milli))) = heap.peek() {
                if end > job.submit_ms {
                    break;
                }
                heap.pop();
                *used -= milli;
            }
            heap.push(Reverse((job.submit_ms + job.duration_ms, job.total_milli())));
            *used += job.total_milli();
            *used <= workload.cluster.reserved_milli(job.team, job.class)
        })
        .collect()
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
    /// Each private job's index in the shared workload.
    pub original: Vec<usize>,
}

/// The team's jobs (of classes it reserves) on a private cluster (see the module docs), as
/// team 0 of a one-team cluster; `None` when it has no such jobs.
pub fn private_workload(workload: &Workload, team: TeamId) -> Option<PrivateReplay> {
    let cluster = &workload.cluster;
    let quotas = &cluster.teams[team as usize].quotas;
    let original: Vec<usize> = (0..workload.jobs.len())
        .filter(|&i| {
            let j = &workload.jobs[i];
            j.team == team && quotas.get(&j.class).is_some_and(|q| q.reserved > 0)
        })
        .collect();
    let jobs: Vec<TraceJob> = original.iter().map(|&i| TraceJob { team: 0, ..workload.jobs[i].clone() }).collect();
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
    let workload = Workload { name: format!("{} private", workload.name), cluster: private, jobs };
    Some(PrivateReplay { workload, original })
}

/// Indices of the nodes of a private cluster of one class (see the module docs).
fn private_nodes(cluster: &Cluster, class: ClassId, reserved: u64, largest_units: u32) -> Vec<usize> {
    let capacity = cluster.capacity_milli(class);
    let mut chosen = cluster.sample_nodes(class, u128::from(reserved), u128::from(capacity));
    let units = |n: usize| u64::from(cluster.nodes[n].units) * u64::from(UNIT);
    let mut held: u64 = chosen.iter().map(|&n| units(n)).sum();
    let spare: Vec<usize> =
        (0..cluster.nodes.len()).filter(|&n| cluster.nodes[n].class == class && !chosen.contains(&n)).collect();
    for n in spare {
        if held >= reserved {
            break;
        }
        chosen.push(n);
        held += units(n);
    }
    let fits_largest = |n: usize| u32::from(cluster.nodes[n].units) >= largest_units;
    if !chosen.iter().any(|&n| fits_largest(n)) {
        if let Some(n) = (0..cluster.nodes.len())
            .find(|&n| cluster.nodes[n].class == class && !chosen.contains(&n) && fits_largest(n))
        {
            chosen.push(n);
        }
    }
    chosen.sort_unstable();
    chosen
}

/// Formats the comparison: the load, the policy table, where the waiting went, and the
/// anomaly table.
pub fn render(comparison: &Comparison, search: Option<&LoadSearch>) -> String {
    let mut out = String::new();
    render_load(&mut out, comparison, search);
    render_policies(&mut out, comparison);
    render_waiting(&mut out, comparison);
    render_team_waits(&mut out, comparison);
    render_anomalies(&mut out, comparison);
    out
}

fn render_load(out: &mut String, c: &Comparison, search: Option<&LoadSearch>) {
    if search.is_some_and(|s| !s.reached) {
        let _ = writeln!(
            out,
            "FIFO never reached {:.0}% utilisation; using the most contended load tried.",
            TARGET_UTILISATION * 100.0
        );
    }
    let _ = writeln!(out, "Workload: {} ({} jobs on {} GPUs)", c.workload, c.jobs, c.capacity_gpus);
    let _ = writeln!(
        out,
        "Load: cluster shrink factor {}, arrival compression factor {}; utilisation window {:.0} s (1st to 99th percentile of arrivals)\n",
        c.shrink,
        c.compression,
        c.window.seconds()
    );
}

fn render_policies(out: &mut String, c: &Comparison) {
    let _ = writeln!(
        out,
        "| policy | util (window) | idle while jobs wait (window) | util (makespan) | avg JCT s | p99 JCT s | avg wait s | p99 wait s | avg queued s | p99 queued s | makespan s | preemptions (priority/reclaim/fair share/least service) | most of one job | GPU-h lost | Jain | completed |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &c.rows {
        let _ = writeln!(
            out,
            "| {} | {:.1}% | {:.2}% | {:.2}% | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} ({}/{}/{}/{}) | {} | {:.1} | {:.3} | {}/{} |",
            r.name,
            r.window_utilisation * 100.0,
            r.idle_while_waiting * 100.0,
            r.utilisation * 100.0,
            r.avg_completion_s,
            r.p99_completion_s,
            r.avg_wait_s,
            r.p99_wait_s,
            r.avg_queued_s,
            r.p99_queued_s,
            r.makespan_s,
            r.preemptions,
            r.preemptions_by_reason[0],
            r.preemptions_by_reason[1],
            r.preemptions_by_reason[2],
            r.preemptions_by_reason[3],
            r.max_preemptions_of_one_job,
            r.lost_gpu_hours,
            r.jain,
            r.completed,
            r.jobs
        );
    }
    for r in c.rows.iter().filter(|r| r.stopped.is_some()) {
        let _ = writeln!(out, "  {} stopped early: {}", r.name, r.stopped.as_deref().unwrap_or(""));
    }
}

/// Where the waiting went: each pending reason's share of the job-seconds spent waiting.
fn render_waiting(out: &mut String, c: &Comparison) {
    let used: Vec<usize> = (0..PENDING_REASONS.len())
        .filter(|&i| c.rows.iter().any(|r| r.waiting_share_by_reason.get(i).is_some_and(|&x| x > 0.0)))
        .collect();
    if used.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nWaiting time by pending reason (share of all job-seconds spent waiting):");
    let header: Vec<&str> = used.iter().map(|&i| PENDING_REASONS[i]).collect();
    let _ = writeln!(out, "| policy | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(used.len()));
    for r in &c.rows {
        let cells: Vec<String> =
            used.iter().map(|&i| format!("{:.1}%", r.waiting_share_by_reason[i] * 100.0)).collect();
        let _ = writeln!(out, "| {} | {} |", r.name, cells.join(" | "));
    }
}

/// Each team's wait under every policy: average and p99 in seconds, and mean bounded
/// slowdown.
fn render_team_waits(out: &mut String, c: &Comparison) {
    let cell = |avg: f64, p99: f64, slowdown: f64| format!("{avg:.0} / {p99:.0} / {slowdown:.1}");
    let _ = writeln!(
        out,
        "\nWait per team: average s / p99 s / mean bounded slowdown ((wait + run) / max(run, {:.0} s))",
        metrics::SLOWDOWN_BOUND_S
    );
    let names: Vec<&str> = c.rows.iter().map(|r| r.name).collect();
    let _ = writeln!(out, "| team | jobs | {} |", names.join(" | "));
    let _ = writeln!(out, "|---|---:|{}", "---:|".repeat(names.len()));
    for (t, a) in c.teams.iter().enumerate() {
        let Some(jobs) = c.rows.first().and_then(|r| r.teams.get(t)).map(|w| w.jobs).filter(|&n| n > 0) else {
            continue;
        };
        let cells: Vec<String> = c
            .rows
            .iter()
            .map(|r| {
                let w = r.teams.get(t).copied().unwrap_or_default();
                cell(w.avg_wait_s, w.p99_wait_s, w.avg_slowdown)
            })
            .collect();
        let _ = writeln!(out, "| {a} | {jobs} | {} |", cells.join(" | "));
    }
    let cells: Vec<String> = c.rows.iter().map(|r| cell(r.avg_wait_s, r.p99_wait_s, r.avg_slowdown)).collect();
    let _ = writeln!(out, "| all | {} | {} |", c.jobs, cells.join(" | "));
}

fn render_anomalies(out: &mut String, c: &Comparison) {
    let names: Vec<&str> = POLICIES.iter().map(|(_, _, n)| *n).collect();
    let _ = writeln!(
        out,
        "\nSharing anomaly: avg queueing delay in the shared cluster minus on a private FIFO cluster of the team's reserved size (s); \"within\" = over its within-reserved jobs"
    );
    let per_policy = |suffix: &str| names.iter().map(|n| format!("{n}{suffix}")).collect::<Vec<_>>().join(" | ");
    let _ = writeln!(
        out,
        "| team | reserved GPUs | private GPUs | jobs | peak demand GPUs | within-reserved jobs | private wait s | {} | {} |",
        per_policy(" anomaly s"),
        per_policy(" within s")
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|{}", "---:|".repeat(2 * names.len()));
    // Rounded to whole seconds; -0.4 prints as 0, not -0.
    let show =
        |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{:.0}", if x.abs() < 0.5 { 0.0 } else { x }));
    for a in &c.anomalies {
        let all: Vec<String> = a.anomaly_s().iter().map(|&x| show(Some(x))).collect();
        let within: Vec<String> = a.within_anomaly_s.iter().map(|&x| show(x)).collect();
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.0} | {} | {:.1} | {} | {:.0} | {} | {} |",
            a.team,
            a.reserved_gpus,
            a.private_gpus,
            a.jobs,
            a.peak_demand_gpus,
            a.within_jobs,
            a.private_wait_s,
            all.join(" | "),
            within.join(" | ")
        );
    }
    let whole_teams = c.anomalies.iter().filter(|a| a.within_reserved).count();
    let _ = writeln!(out, "Teams whose peak demand stays within reserved: {whole_teams} of {}", c.anomalies.len());
    let max = |values: Vec<Option<f64>>| {
        values.into_iter().flatten().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    for (i, name) in names.iter().enumerate() {
        let all = max(c.anomalies.iter().map(|a| Some(a.anomaly_s()[i])).collect());
        let within = max(c.anomalies.iter().map(|a| a.within_anomaly_s[i]).collect());
        let whole = max(c.anomalies.iter().filter(|a| a.within_reserved).map(|a| Some(a.anomaly_s()[i])).collect());
        let s = |x: Option<f64>| x.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.0} s"));
        let _ = writeln!(
            out,
            "Max anomaly, {name}: {} over all teams; {} over teams within reserved; {} over within-reserved jobs (team averages)",
            s(all),
            s(whole),
            s(within)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::cluster::parse_cluster;

    /// Two teams reserving 2 and 6 GPUs of a cluster of 1-, 2- and 8-GPU nodes.
    fn workload(jobs: Vec<TraceJob>) -> Workload {
        let cluster = parse_cluster(
            "[[classes]]\nname = \"gpu\"\nrate_per_gpu_hour = 1.0\n\
             [[nodes]]\nname_prefix = \"one-\"\ncount = 4\nclass = \"gpu\"\ngpus = 1\n\
             [[nodes]]\nname_prefix = \"two-\"\ncount = 4\nclass = \"gpu\"\ngpus = 2\n\
             [[nodes]]\nname_prefix = \"eight-\"\ncount = 1\nclass = \"gpu\"\ngpus = 8\n\
             [[teams]]\nname = \"small\"\nreserved = { gpu = 2 }\nburst = { gpu = 18 }\n\
             [[teams]]\nname = \"large\"\nreserved = { gpu = 6 }\nburst = { gpu = 14 }\n",
        )
        .unwrap();
        Workload { name: "test".into(), cluster, jobs }
    }

    fn job(team: TeamId, gpus: u32, submit_s: i64, duration_s: i64) -> TraceJob {
        TraceJob {
            team,
            class: 0,
            replicas: 1,
            milli_per_replica: gpus * UNIT,
            priority: 2,
            submit_ms: submit_s * 1000,
            duration_ms: duration_s * 1000,
            max_runtime_ms: crate::simulate::traces::max_runtime_ms(duration_s * 1000),
            template: None,
        }
    }

    #[test]
    fn a_private_cluster_holds_the_reserved_gpus_and_the_largest_replica() {
        let w = workload(vec![job(0, 1, 0, 10), job(0, 8, 5, 10), job(1, 2, 0, 10)]);
        let small = private_workload(&w, 0).unwrap();
        let capacity = small.workload.cluster.total_capacity_milli();
        assert!(capacity >= 2000, "at least the reserved 2 GPUs: {capacity}");
        assert!(small.workload.cluster.nodes.iter().any(|n| n.units == 8), "room for its 8-GPU job");
        assert_eq!(small.original, [0, 1]);
        assert!(small.workload.jobs.iter().all(|j| j.team == 0));
        let large = private_workload(&w, 1).unwrap();
        let capacity = large.workload.cluster.total_capacity_milli();
        assert!((6000..=6000 + 8000).contains(&capacity), "reserved rounded up to whole nodes: {capacity}");
    }

    #[test]
    fn a_job_is_within_reserved_when_it_fits_beside_the_teams_running_jobs() {
        // Team small reserves 2: a 1-GPU job, a second beside it (2 in use), a third while
        // both run (3 > 2), and a fourth after the first two ended.
        let jobs = vec![job(0, 1, 0, 100), job(0, 1, 10, 100), job(0, 1, 20, 100), job(0, 1, 115, 10)];
        let w = workload(jobs);
        assert_eq!(within_reserved_jobs(&w, &[0, 1, 2, 3]), [true, true, false, true]);
    }

    #[test]
    fn the_arrival_window_trims_the_first_and_last_percent_of_arrivals() {
        let jobs: Vec<TraceJob> = (0..=100).map(|i| job(0, 1, if i == 0 { -10_000 } else { i }, 1)).collect();
        let window = arrival_window(&workload(jobs));
        assert_eq!((window.from_ms, window.to_ms), (1000, 99_000));
    }

    #[test]
    fn the_load_search_skips_a_cluster_the_whole_trace_fits_at_once() {
        // Ten 1-GPU jobs (10 GPUs) on 20 GPUs: skipped at shrink 1; at shrink 2 FIFO runs.
        let jobs: Vec<TraceJob> = (0..10u32).map(|i| job(i % 2, 1, i64::from(i), 600)).collect();
        let w = workload(jobs);
        let mut seen = Vec::new();
        let search = find_load(&w, 0.01, None, Some(1.0), &mut |t| seen.push(*t)).unwrap();
        assert_eq!(seen[0].fifo_utilisation, None);
        assert!(search.reached && search.shrink > 1, "{search:?}");
    }

    #[test]
    fn the_comparison_has_a_row_per_policy_and_an_anomaly_per_team() {
        let jobs: Vec<TraceJob> = (0..30).map(|i| job(i % 2, 1 + i % 3, i64::from(i) * 60, 900)).collect();
        let comparison = compare(&workload(jobs), 1, 2.0).unwrap();
        assert_eq!(comparison.rows.len(), 4);
        assert!(comparison.rows.iter().all(|r| r.completed == 30 && r.stopped.is_none()));
        assert_eq!(comparison.anomalies.len(), 2);
        // Each team's waits add up to the row's: 15 jobs each.
        for r in &comparison.rows {
            assert_eq!(r.teams.iter().map(|t| t.jobs).collect::<Vec<_>>(), [15, 15]);
            let mean = (r.teams[0].avg_wait_s + r.teams[1].avg_wait_s) / 2.0;
            assert!((mean - r.avg_wait_s).abs() < 1e-9 && r.avg_slowdown >= 1.0, "{r:?}");
        }
        let text = render(&comparison, None);
        assert!(text.contains("| Fairway |") && text.contains("| FIFO |") && text.contains("| Quota (no history) |"));
        assert!(text.contains("| Fairway, by service |") && text.contains("Wait per team"));
        assert!(text.contains("Max anomaly, Fairway"));
    }
}
