//! What a replay measured.
//!
//! - **Utilisation**: allocated milli-GPU-ms over capacity × time, over the makespan (first
//!   arrival to last completion) and over a window the caller chooses (the experiment uses one
//!   window for every policy, see [`super::experiment`]). GPUs held by preempted jobs during
//!   their grace period count as allocated: nobody else can use them.
//! - **Idle while jobs wait**: the capacity left unallocated at times when some job waited,
//!   over the same window, as a share of it. Unallocated capacity while no job waits is lost
//!   to every policy alike; this part is what a policy's rules (gang reservations, room held
//!   for preemptors, quota, shapes that do not fit what is free) leave idle.
//! - **Job completion time** (completion − submit), **queueing delay** (first start −
//!   submit) and **time queued** (completion − submit − runtime: every wait, the first and
//!   those after preemptions, and the work preemptions made it redo), averaged and at the
//!   99th percentile (nearest rank), over completed jobs. A policy that preempts can start
//!   jobs sooner by stopping others; time queued counts what that costs them.
//! - **Preemptions** and the **GPU-hours lost** to them: each victim's GPUs × its runtime
//!   since its last checkpoint when it stopped.
//! - **Jain's fairness index** over teams of each team's *service rate*: the GPU-time its
//!   jobs needed over the GPU-time they spent in the system, `Σ gpus × duration / Σ gpus ×
//!   (completion − submit)` over its completed jobs. It is 1 for a team that never waited and
//!   falls as its jobs queue, so it is a GPU-weighted inverse slowdown; weighting by GPU-time
//!   keeps one-second jobs from dominating, as they would an average of per-job slowdowns.
//!   (Allocated over demanded GPU-time would be ≈ 1 for every team once all jobs complete.)

use super::{replay::ReplayOutcome, Workload};
use crate::scheduler::{Policy, TeamId, UNIT};

/// A span of simulated time, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from_ms: i64,
    pub to_ms: i64,
}

impl Window {
    /// Length in seconds.
    pub fn seconds(&self) -> f64 {
        (self.to_ms - self.from_ms) as f64 / 1000.0
    }
}

/// One row of the comparison table.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    pub policy: Policy,
    /// The row's name (a policy may be run with more than one setting).
    pub name: &'static str,
    pub jobs: usize,
    pub completed: usize,
    /// Over the makespan.
    pub utilisation: f64,
    /// Over the caller's window.
    pub window_utilisation: f64,
    /// Over the caller's window, the share of capacity left idle while some job waited.
    pub idle_while_waiting: f64,
    pub avg_completion_s: f64,
    pub p99_completion_s: f64,
    pub avg_wait_s: f64,
    pub p99_wait_s: f64,
    /// Completion − submit − runtime: waits after preemptions and lost work included.
    pub avg_queued_s: f64,
    pub p99_queued_s: f64,
    /// Mean bounded slowdown of completed jobs (see [`TeamWaits::avg_slowdown`]).
    pub avg_slowdown: f64,
    /// First arrival to last completion.
    pub makespan_s: f64,
    pub preemptions: u64,
    /// Preemptions decided by reason: priority, reclaim, fair share, least attained service.
    pub preemptions_by_reason: [u64; 4],
    /// The most times one job was preempted.
    pub max_preemptions_of_one_job: u32,
    /// Share of all waiting time per pending reason (see [`PENDING_REASONS`](super::replay::PENDING_REASONS)).
    pub waiting_share_by_reason: Vec<f64>,
    pub lost_gpu_hours: f64,
    pub jain: f64,
    pub cycles: u64,
    /// Why the replay stopped early, if it did.
    pub stopped: Option<String>,
    /// Per team (by index), how long its completed jobs waited.
    pub teams: Vec<TeamWaits>,
}

/// How long one team's completed jobs waited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TeamWaits {
    pub jobs: usize,
    pub avg_wait_s: f64,
    pub p99_wait_s: f64,
    /// Completion − submit − runtime: waits after preemptions and lost work included.
    pub avg_queued_s: f64,
    pub p99_queued_s: f64,
    /// Mean bounded slowdown: (wait + runtime) / max(runtime, [`SLOWDOWN_BOUND_S`]), so a
    /// one-second job that waited a minute counts as 6, not 60.
    pub avg_slowdown: f64,
}

/// The runtime below which a job's slowdown is measured as if it ran this long (seconds).
pub const SLOWDOWN_BOUND_S: f64 = 10.0;

/// Summarises a replay of `workload`.
pub fn summarize(workload: &Workload, outcome: &ReplayOutcome, window: Window) -> RunMetrics {
    let capacity = workload.cluster.total_capacity_milli();
    let first_arrival = workload.jobs.iter().map(|j| j.submit_ms).min().unwrap_or(0);
    let last_completion =
        outcome.jobs.iter().filter_map(|o| o.completion_ms).max().unwrap_or(first_arrival).max(first_arrival);
    let makespan = Window { from_ms: first_arrival, to_ms: last_completion };
    let mut completion = Vec::new();
    let mut wait = Vec::new();
    let mut queued = Vec::new();
    let mut slowdown = Vec::new();
    // The same waits and slowdowns per team (by index).
    let mut team_wait = vec![Vec::new(); workload.cluster.teams.len()];
    let mut team_slowdown = team_wait.clone();
    let mut team_queued = team_wait.clone();
    for (job, o) in workload.jobs.iter().zip(&outcome.jobs) {
        if let (Some(start), Some(end)) = (o.first_start_ms, o.completion_ms) {
            completion.push((end - job.submit_ms) as f64 / 1000.0);
            let w = (start - job.submit_ms) as f64 / 1000.0;
            let run = job.duration_ms as f64 / 1000.0;
            let s = (w + run) / run.max(SLOWDOWN_BOUND_S);
            wait.push(w);
            let q = (end - job.submit_ms - job.duration_ms) as f64 / 1000.0;
            queued.push(q);
            if let Some(tq) = team_queued.get_mut(job.team as usize) {
                tq.push(q);
            }
            slowdown.push(s);
            if let (Some(tw), Some(ts)) =
                (team_wait.get_mut(job.team as usize), team_slowdown.get_mut(job.team as usize))
            {
                tw.push(w);
                ts.push(s);
            }
        }
    }
    RunMetrics {
        policy: outcome.policy,
        jobs: workload.jobs.len(),
        completed: completion.len(),
        utilisation: utilisation(&outcome.allocation, capacity, makespan),
        window_utilisation: utilisation(&outcome.allocation, capacity, window),
        idle_while_waiting: idle_while_waiting(&outcome.allocation, &outcome.waiting, capacity, window),
        avg_completion_s: mean(&completion),
        p99_completion_s: percentile(&completion, 99.0),
        avg_wait_s: mean(&wait),
        p99_wait_s: percentile(&wait, 99.0),
        avg_queued_s: mean(&queued),
        p99_queued_s: percentile(&queued, 99.0),
        avg_slowdown: mean(&slowdown),
        makespan_s: makespan.seconds(),
        preemptions: outcome.preemptions,
        preemptions_by_reason: outcome.preemptions_by_reason,
        max_preemptions_of_one_job: outcome.max_preemptions_of_one_job,
        waiting_share_by_reason: shares(&outcome.waiting_ms_by_reason),
        lost_gpu_hours: outcome.lost_milli_ms as f64 / f64::from(UNIT) / 3_600_000.0,
        jain: jain(&team_service_rates(workload, outcome)),
        cycles: outcome.cycles,
        stopped: outcome.stopped.clone(),
        name: "",
        teams: (0..team_wait.len()).map(|t| TeamWaits::of(&team_wait[t], &team_queued[t], &team_slowdown[t])).collect(),
    }
}

impl TeamWaits {
    /// From one team's waits (seconds) and slowdowns, one per completed job.
    fn of(waits: &[f64], queued: &[f64], slowdowns: &[f64]) -> Self {
        TeamWaits {
            jobs: waits.len(),
            avg_wait_s: mean(waits),
            p99_wait_s: percentile(waits, 99.0),
            avg_queued_s: mean(queued),
            p99_queued_s: percentile(queued, 99.0),
            avg_slowdown: mean(slowdowns),
        }
    }
}

/// Each entry's share of the sum; zeros when the sum is zero.
fn shares(values: &[u128]) -> Vec<f64> {
    let total: u128 = values.iter().sum();
    values.iter().map(|&v| if total == 0 { 0.0 } else { v as f64 / total as f64 }).collect()
}

/// Allocated over available milli-unit-ms within a window; 0 for an empty window.
pub fn utilisation(allocation: &[(i64, u64)], capacity_milli: u64, window: Window) -> f64 {
    let span = window.to_ms - window.from_ms;
    if span <= 0 || capacity_milli == 0 {
        return 0.0;
    }
    allocated_within(allocation, window) as f64 / (capacity_milli as f64 * span as f64)
}

/// Unallocated over available milli-unit-ms within a window, counting only the times when
/// `waiting` (a step function: from each time on, whether some job waited) says a job
/// waited; 0 for an empty window.
pub fn idle_while_waiting(
    allocation: &[(i64, u64)],
    waiting: &[(i64, bool)],
    capacity_milli: u64,
    window: Window,
) -> f64 {
    let span = window.to_ms - window.from_ms;
    if span <= 0 || capacity_milli == 0 {
        return 0.0;
    }
    let mut changes: Vec<i64> = allocation.iter().map(|a| a.0).chain(waiting.iter().map(|w| w.0)).collect();
    changes.sort_unstable();
    changes.dedup();
    let mut idle = 0u128;
    for (i, &from) in changes.iter().enumerate() {
        let to = changes.get(i + 1).copied().unwrap_or(window.to_ms);
        let (start, end) = (from.max(window.from_ms), to.min(window.to_ms));
        if end > start && step_at(waiting, from).unwrap_or(false) {
            let allocated = step_at(allocation, from).unwrap_or(0);
            idle += u128::from(capacity_milli.saturating_sub(allocated)) * (end - start) as u128;
        }
    }
    idle as f64 / (capacity_milli as f64 * span as f64)
}

/// A step function's value at `at_ms`: that of its last step at or before it.
fn step_at<T: Copy>(steps: &[(i64, T)], at_ms: i64) -> Option<T> {
    steps.partition_point(|s| s.0 <= at_ms).checked_sub(1).map(|i| steps[i].1)
}

/// Integral of the allocation step function over a window, in milli-unit-ms.
pub fn allocated_within(allocation: &[(i64, u64)], window: Window) -> u128 {
    let mut total = 0u128;
    for (i, &(from, milli)) in allocation.iter().enumerate() {
        let to = allocation.get(i + 1).map_or(window.to_ms, |next| next.0);
        let (start, end) = (from.max(window.from_ms), to.min(window.to_ms));
        if end > start {
            total += u128::from(milli) * (end - start) as u128;
        }
    }
    total
}

/// Each team's service rate (see the module docs), for teams with a completed job.
pub fn team_service_rates(workload: &Workload, outcome: &ReplayOutcome) -> Vec<f64> {
    let teams = workload.cluster.teams.len();
    let mut needed = vec![0f64; teams];
    let mut spent = vec![0f64; teams];
    for (job, o) in workload.jobs.iter().zip(&outcome.jobs) {
        if let Some(end) = o.completion_ms {
            let gpus = job.total_milli() as f64;
            needed[job.team as usize] += gpus * job.duration_ms as f64;
            spent[job.team as usize] += gpus * (end - job.submit_ms) as f64;
        }
    }
    needed.iter().zip(&spent).filter(|(_, &s)| s > 0.0).map(|(n, s)| n / s).collect()
}

/// Average queueing delay in seconds of one team's completed jobs, `None` if it has none.
pub fn team_average_wait_s(workload: &Workload, outcome: &ReplayOutcome, team: TeamId) -> Option<f64> {
    let waits: Vec<f64> = workload
        .jobs
        .iter()
        .zip(&outcome.jobs)
        .filter(|(j, _)| j.team == team)
        .filter_map(|(j, o)| Some((o.first_start_ms? - j.submit_ms) as f64 / 1000.0))
        .collect();
    (!waits.is_empty()).then(|| mean(&waits))
}

/// Jain's fairness index `(Σx)² / (n Σx²)`: 1 when all are equal, 1/n when one has
/// everything. 1 for an empty or all-zero input (nobody is treated worse than another).
pub fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|x| x * x).sum();
    if values.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

/// The `p`-th percentile (0 < p ≤ 100) by nearest rank; 0 for no values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Arithmetic mean; 0 for no values.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() {
        assert!((jain(&[0.5, 0.5, 0.5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 1.0), 1.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn utilisation_integrates_the_allocation_steps_within_the_window() {
        // 1 GPU of 2 from t=0, 2 from t=10, none from t=20.
        let steps = [(0, 1000), (10, 2000), (20, 0)];
        assert!((utilisation(&steps, 2000, Window { from_ms: 0, to_ms: 20 }) - 0.75).abs() < 1e-12);
        assert!((utilisation(&steps, 2000, Window { from_ms: 10, to_ms: 30 }) - 0.5).abs() < 1e-12);
        assert!((utilisation(&steps, 2000, Window { from_ms: 5, to_ms: 15 }) - 0.75).abs() < 1e-12);
        assert_eq!(utilisation(&steps, 2000, Window { from_ms: 5, to_ms: 5 }), 0.0);
    }

    #[test]
    fn idle_capacity_counts_only_while_some_job_waits() {
        // 4 GPUs: 1 allocated from t=0, all 4 from t=10, none from t=20. Jobs wait from 0 to
        // 10 (3 idle) and from 15 on (none idle until 20, then 4).
        let allocation = [(0, 1000), (10, 4000), (20, 0)];
        let waiting = [(0, true), (10, false), (15, true)];
        let all = Window { from_ms: 0, to_ms: 30 };
        let idle = idle_while_waiting(&allocation, &waiting, 4000, all);
        assert!((idle - (3000.0 * 10.0 + 4000.0 * 10.0) / (4000.0 * 30.0)).abs() < 1e-12, "{idle}");
        let late = Window { from_ms: 12, to_ms: 18 };
        assert_eq!(idle_while_waiting(&allocation, &waiting, 4000, late), 0.0, "full or nobody waiting");
        let none = [(0, false)];
        assert_eq!(idle_while_waiting(&allocation, &none, 4000, all), 0.0);
    }
}
