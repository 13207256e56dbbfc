//! How long a job is likely to run: quantiles of its runtime from the runtimes of finished
//! jobs like it, bounded by its maximum runtime.
//!
//! Jobs are alike when they share a team and a *kind* (a hash of the job's name, or of the
//! labels a trace has): a team's `nightly-eval` runs like its last `nightly-eval`s, as
//! Tiresias and Slurm users rely on. With too few samples of the kind in the team, the
//! estimate falls back to the kind in every team, then to the team, then to every job (the
//! few samples there are, below [`MIN_SAMPLES`]), and with no history at all to a runtime
//! uniform over `[0, max runtime]`. A job that declares
//! an expected runtime gets it as its median, with a spread of a factor of two either way.
//!
//! A running job's remaining time is conditioned on the time it has already run: the
//! quantiles of the samples *longer* than its elapsed time, minus that time (a job that has
//! run an hour is not one of the jobs that ran ten minutes). A job that has outlived every
//! sample of every level is given a heavy tail (Pareto with index 1: it is as likely to run
//! as long again as not), still bounded by its maximum runtime.

use std::collections::BTreeMap;

use super::snapshot::{JobSpec, TeamId};

/// What a job is, for runtime history: a stable hash of its name (or of a trace's labels).
pub type KindId = u64;

/// The quantiles of runtime the forecast plays: p10, p50, p90.
pub const QUANTILES: [f64; 3] = [0.10, 0.50, 0.90];

/// Fewest samples (longer than the elapsed time) a level needs to be used.
pub const MIN_SAMPLES: usize = 5;

/// Runtimes of finished jobs (ms), each list sorted ascending. Built by the control loop
/// from the jobs that finished over a recent window, and by the simulator from the jobs that
/// completed earlier in the replay; the engine only reads it.
#[derive(Debug, Clone, Default)]
pub struct RuntimeHistory {
    by_team_kind: BTreeMap<(TeamId, KindId), Vec<i64>>,
    by_kind: BTreeMap<KindId, Vec<i64>>,
    by_team: BTreeMap<TeamId, Vec<i64>>,
    all: Vec<i64>,
}

fn insert_sorted(v: &mut Vec<i64>, x: i64) {
    let at = v.partition_point(|&y| y <= x);
    v.insert(at, x);
}

impl RuntimeHistory {
    /// Records that a job of `team` and `kind` ran `runtime_ms` to its end.
    pub fn record(&mut self, team: TeamId, kind: Option<KindId>, runtime_ms: i64) {
        let runtime_ms = runtime_ms.max(0);
        if let Some(kind) = kind {
            insert_sorted(self.by_team_kind.entry((team, kind)).or_default(), runtime_ms);
            insert_sorted(self.by_kind.entry(kind).or_default(), runtime_ms);
        }
        insert_sorted(self.by_team.entry(team).or_default(), runtime_ms);
        insert_sorted(&mut self.all, runtime_ms);
    }

    /// How many runtimes it holds.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// The levels a job's estimate may come from, most specific first.
    fn levels(&self, job: &JobSpec) -> impl Iterator<Item = &[i64]> {
        let team_kind = job.kind.and_then(|k| self.by_team_kind.get(&(job.team, k)));
        let kind = job.kind.and_then(|k| self.by_kind.get(&k));
        let team = self.by_team.get(&job.team);
        [team_kind, kind, team, Some(&self.all)].into_iter().flatten().map(Vec::as_slice)
    }

    /// The job's remaining runtime at each of [`QUANTILES`], having run `elapsed_ms` already
    /// (0 for a job not started): non-decreasing, each within `[0, max runtime - elapsed]`.
    pub fn remaining(&self, job: &JobSpec, elapsed_ms: i64) -> [i64; 3] {
        let mut out = self.remaining_at(job, elapsed_ms, QUANTILES);
        // Rounding and capping keep the order; make sure of it.
        out[1] = out[1].max(out[0]);
        out[2] = out[2].max(out[1]);
        out
    }

    /// The job's remaining runtime at each quantile of `qs` (each in `[0, 1)`), having run
    /// `elapsed_ms` already, within `[0, max runtime - elapsed]`.
    pub fn remaining_at<const N: usize>(&self, job: &JobSpec, elapsed_ms: i64, qs: [f64; N]) -> [i64; N] {
        let elapsed = elapsed_ms.max(0);
        let left = job.max_runtime_ms.saturating_sub(elapsed).max(0);
        let total = if let Some(declared) = job.expected_runtime_ms.filter(|&d| d > 0) {
            qs.map(|q| {
                // A factor of two either way at p10 and p90, log-linear between.
                let factor = 2f64.powf((q - 0.5) / 0.4);
                let at = (declared as f64 * factor).round() as i64;
                if at > elapsed {
                    at
                } else {
                    elapsed.saturating_add(pareto_remaining(elapsed, q))
                }
            })
        } else if let Some(tail) =
            self.levels(job).map(|v| &v[v.partition_point(|&x| x <= elapsed)..]).find(|t| t.len() >= MIN_SAMPLES)
        {
            qs.map(|q| quantile(tail, q))
        } else if let Some(tail) =
            Some(&self.all[self.all.partition_point(|&x| x <= elapsed)..]).filter(|t| !t.is_empty())
        {
            // Too few samples anywhere: the few there are.
            qs.map(|q| quantile(tail, q))
        } else if self.all.is_empty() || elapsed == 0 {
            // No history: uniform over what is left of the maximum runtime.
            qs.map(|q| elapsed + (left as f64 * q).round() as i64)
        } else {
            qs.map(|q| elapsed.saturating_add(pareto_remaining(elapsed, q)))
        };
        total.map(|t| t.saturating_sub(elapsed).clamp(0, left))
    }

    /// The job's Gittins index for GPU-time (per GPU-ms, higher goes first), before it has
    /// run: `max over Δ of P(S ≤ Δ) / E[min(S, Δ)]` for its service `S` = GPUs × runtime,
    /// with the runtime's distribution estimated like [`Self::remaining`] (declared, history,
    /// or uniform over the maximum runtime). For a known runtime it is 1 / service, shortest
    /// job first; for an uncertain one it weighs the chance of finishing soon against the
    /// time the attempt may take, which is what minimises the mean wait when runtimes are
    /// not known but their distribution is (Gittins; Tiresias without known durations).
    pub fn gittins_index(&self, job: &JobSpec) -> f64 {
        let gpus = (job.total_milli() as f64 / f64::from(super::snapshot::UNIT)).max(0.001);
        gittins_index(&self.remaining_at(job, job.attained_ms, INDEX_GRID).map(|ms| ms as f64 * gpus))
    }
}

/// Equally likely runtimes a job's Gittins index is computed over: the quantiles at the
/// middle of ten equal slices of probability.
const INDEX_GRID: [f64; 10] = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95];

/// The Gittins index of a service whose equally likely values are `sorted` (ascending): the
/// best ratio, over every quantum `Δ` at one of the values, of the chance of finishing within
/// `Δ` to the service expected to be spent trying. Values below 1 count as 1.
pub fn gittins_index(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    let mut best = 0f64;
    let mut below = 0f64;
    for (k, &s) in sorted.iter().enumerate() {
        let s = s.max(1.0);
        // E[min(S, Δ = s)] × n: the values up to s in full, the rest cut at s.
        let spent = below + s * (n - k) as f64;
        best = best.max((k + 1) as f64 / spent);
        below += s;
    }
    best
}

/// Remaining time at quantile `q` of a job that has run `elapsed_ms` under a Pareto tail of
/// index 1: `P(T > t | T > e) = e / t`, so `t_q = e / (1 - q)`; at least a minute.
fn pareto_remaining(elapsed_ms: i64, q: f64) -> i64 {
    let e = elapsed_ms.max(60_000) as f64;
    // Saturates (to i64::MAX) as q nears 1; the caller caps it at the maximum runtime.
    (e * q / (1.0 - q).max(f64::MIN_POSITIVE)).round() as i64
}

/// The `q` quantile of sorted values, linearly interpolated; `values` is not empty.
fn quantile(values: &[i64], q: f64) -> i64 {
    let pos = q.clamp(0.0, 1.0) * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    let frac = pos - lo as f64;
    (values[lo] as f64 + (values[hi] - values[lo]) as f64 * frac).round() as i64
}

/// A stable 64-bit hash of a job's name or labels (FNV-1a), for [`JobSpec::kind`].
pub fn kind_of(name: &str) -> KindId {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::snapshot::Topology;

    const MIN: i64 = 60_000;
    const HOUR: i64 = 60 * MIN;

    fn job(team: TeamId, kind: Option<KindId>, max_runtime_ms: i64) -> JobSpec {
        JobSpec {
            id: 1,
            team,
            class: 0,
            replicas: 1,
            milli_per_replica: 1000,
            priority: 0,
            topology: Topology::Any,
            submitted_ms: 0,
            queued_ms: 0,
            max_runtime_ms,
            allow_spot: false,
            fixed_nodes_only: false,
            kind,
            expected_runtime_ms: None,
            grace_ms: None,
            min_drivers: Default::default(),
            host: Default::default(),
            preemption_delay_ms: None,
            attained_ms: 0,
            elastic: None,
        }
    }

    #[test]
    fn a_job_with_no_history_is_expected_to_use_its_maximum_runtime_uniformly() {
        let h = RuntimeHistory::default();
        assert_eq!(h.remaining(&job(0, None, 10 * HOUR), 0), [HOUR, 5 * HOUR, 9 * HOUR]);
    }

    #[test]
    fn a_job_is_expected_to_run_like_its_teams_earlier_jobs_of_the_same_kind() {
        let mut h = RuntimeHistory::default();
        for m in 1..=9 {
            h.record(0, Some(7), m * 10 * MIN);
            h.record(0, Some(8), m * 5 * HOUR);
        }
        let [p10, p50, p90] = h.remaining(&job(0, Some(7), 24 * HOUR), 0);
        assert_eq!(p50, 50 * MIN);
        assert!(p10 < p50 && p50 < p90 && p90 <= 90 * MIN, "{p10} {p50} {p90}");
    }

    #[test]
    fn a_kind_with_too_few_samples_falls_back_to_the_team() {
        let mut h = RuntimeHistory::default();
        h.record(0, Some(7), 10 * HOUR);
        for _ in 0..9 {
            h.record(0, Some(8), HOUR);
        }
        assert_eq!(h.remaining(&job(0, Some(7), 24 * HOUR), 0)[1], HOUR);
    }

    #[test]
    fn an_estimate_never_exceeds_what_is_left_of_the_maximum_runtime() {
        let mut h = RuntimeHistory::default();
        for _ in 0..9 {
            h.record(0, None, 10 * HOUR);
        }
        assert_eq!(h.remaining(&job(0, None, 2 * HOUR), 30 * MIN), [90 * MIN; 3]);
    }

    #[test]
    fn a_running_job_is_expected_to_outlast_the_samples_shorter_than_its_elapsed_time() {
        let mut h = RuntimeHistory::default();
        for m in 1..=20 {
            h.record(0, None, m * HOUR);
        }
        // Ran 10 hours: only the 10 samples of 11..20 hours are like it.
        let [p10, p50, p90] = h.remaining(&job(0, None, 48 * HOUR), 10 * HOUR + MIN);
        assert!(p10 > 0 && p50 >= 4 * HOUR && p90 <= 10 * HOUR, "{p10} {p50} {p90}");
    }

    #[test]
    fn a_job_older_than_all_history_gets_a_heavy_tail_bounded_by_its_maximum() {
        let mut h = RuntimeHistory::default();
        for _ in 0..9 {
            h.record(0, None, MIN);
        }
        let [p10, p50, p90] = h.remaining(&job(0, None, 10 * HOUR), HOUR);
        assert_eq!(p50, HOUR, "as likely to run as long again as not");
        assert!(p10 < p50 && p90 == 9 * HOUR, "{p10} {p90}");
    }

    #[test]
    fn a_declared_expected_runtime_is_the_median() {
        let mut h = RuntimeHistory::default();
        for _ in 0..9 {
            h.record(0, None, 10 * HOUR);
        }
        let mut j = job(0, None, 24 * HOUR);
        j.expected_runtime_ms = Some(2 * HOUR);
        assert_eq!(h.remaining(&j, 0), [HOUR, 2 * HOUR, 4 * HOUR]);
    }

    #[test]
    fn the_gittins_index_of_a_known_service_is_its_inverse() {
        assert!((gittins_index(&[4.0; 10]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn a_service_that_is_often_short_outranks_one_always_of_its_mean() {
        // Nine in ten finish in 1, one in ten runs 91: mean 10, yet most attempts end at once.
        let mut mostly_short = [1.0; 10];
        mostly_short[9] = 91.0;
        assert!(gittins_index(&mostly_short) > gittins_index(&[10.0; 10]));
        // Trying for 1 finishes nine times in ten: index 0.9 / 1.
        assert!((gittins_index(&mostly_short) - 0.9).abs() < 1e-12);
    }

    #[test]
    fn a_job_expected_to_take_less_gpu_time_has_the_higher_index() {
        let mut h = RuntimeHistory::default();
        for m in 1..=9 {
            h.record(0, Some(7), m * MIN);
            h.record(0, Some(8), m * HOUR);
        }
        let short = job(0, Some(7), 24 * HOUR);
        let long = job(0, Some(8), 24 * HOUR);
        assert!(h.gittins_index(&short) > h.gittins_index(&long));
        let mut wide = short.clone();
        wide.replicas = 64;
        assert!(h.gittins_index(&short) > h.gittins_index(&wide), "64 GPUs for minutes is more service than 1");
    }

    #[test]
    fn kinds_are_stable_hashes_of_names() {
        assert_eq!(kind_of("train"), kind_of("train"));
        assert_ne!(kind_of("train"), kind_of("eval"));
    }
}
