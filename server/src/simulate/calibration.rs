//! `fairway simulate --eta`: how well expected starts predict real ones, on a trace replay.
//!
//! The workload is replayed once under Fairway's policy with forecasts on
//! ([`replay_with_forecasts`]): at the first cycle a job waits (its arrival), the engine's
//! forecasts (an interval and its median) and the naive model (running jobs end at their
//! maximum runtimes) are recorded on the same snapshot, with runtime history learnt only from
//! the jobs that completed before. When the replay is over, each prediction is compared with
//! the job's actual first start:
//! - **inside**: the share of jobs that started within their predicted interval, `[earliest,
//!   latest]`; the naive model gives a point, so its interval is that point;
//! - **by latest**: the share that started no later than the interval's end (for the naive
//!   model, its point): how often the estimate is a safe upper bound;
//! - **median relative error**: the median over jobs of `|expected wait - actual wait| /
//!   actual wait`, waits counted from the prediction;
//! - the median absolute error, in minutes.
//!
//! Three models are measured: the forecast as jobs are told it (calibrated by the errors of
//! the forecasts made for the jobs that started earlier in the replay, see
//! [`forecast_errors`](crate::scheduler::forecast_errors)), the same play before calibration
//! (its starts with every runtime at p10, p50 and p90), and the naive model. Each is measured over the
//! jobs it gave an estimate for, and all three over the jobs all gave one for (the fair
//! comparison). Jobs the forecast calls unforeseeable (a quota, budget
//! or capacity change) are counted apart.

use std::fmt::Write as _;

use super::{
    replay::{replay_with_forecasts, BadDecision, Prediction},
    Workload,
};
use crate::scheduler::Policy;

/// The default load of `fairway simulate --eta` on the Alibaba trace: the one the load search
/// of `fairway simulate` finds (FIFO at 71% over the arrival window).
pub const DEFAULT_SHRINK: u32 = 8;
/// See [`DEFAULT_SHRINK`].
pub const DEFAULT_COMPRESSION: f64 = 512.0;

/// One model's figures over a set of jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRow {
    /// `forecast` or `naive (max runtime)`, and over which jobs.
    pub model: String,
    /// Jobs with an estimate that started.
    pub jobs: usize,
    pub inside: f64,
    pub by_latest: f64,
    pub median_relative_error: f64,
    pub median_absolute_error_min: f64,
    /// Share of jobs that started later than the interval's end.
    pub late: f64,
}

/// Everything `fairway simulate --eta` prints.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub workload: String,
    pub jobs: usize,
    /// Jobs predicted (every how many by id).
    pub every: u64,
    /// Jobs that waited at their arrival (and so got a prediction).
    pub waited: usize,
    /// Of those, the ones the forecast called unforeseeable.
    pub unforeseeable: usize,
    /// Of those, the ones neither model estimated nor called unforeseeable.
    pub without: usize,
    pub rows: Vec<ModelRow>,
    /// Median actual wait of the jobs that waited, in minutes.
    pub median_wait_min: f64,
    pub stopped: Option<String>,
}

/// Replays the workload (already loaded as wanted) under Fairway with forecasts for every
/// `every`-th job and measures them.
pub fn calibrate(workload: &Workload, every: u64) -> Result<Calibration, BadDecision> {
    let outcome = replay_with_forecasts(workload, Policy::Fairway, every)?;
    // (prediction, actual start) of the jobs that waited and started.
    let observed: Vec<(Prediction, i64)> =
        outcome.predictions.iter().zip(&outcome.jobs).filter_map(|(p, o)| Some(((*p)?, o.first_start_ms?))).collect();
    let waited = outcome.predictions.iter().flatten().count();
    let unforeseeable = outcome.predictions.iter().flatten().filter(|p| p.unforeseeable).count();
    let without = outcome
        .predictions
        .iter()
        .flatten()
        .filter(|p| !p.unforeseeable && p.forecast.is_none() && p.played.is_none() && p.naive.is_none())
        .count();
    let forecast = |p: &Prediction| p.forecast;
    let played = |p: &Prediction| p.played;
    let naive = |p: &Prediction| p.naive.map(|t| [t; 3]);
    let all: Vec<(Prediction, i64)> = observed
        .iter()
        .copied()
        .filter(|(p, _)| p.forecast.is_some() && p.played.is_some() && p.naive.is_some())
        .collect();
    let rows = vec![
        row("forecast (calibrated), its jobs", &observed, &forecast),
        row("forecast before calibration (p10/p50/p90 runtimes), its jobs", &observed, &played),
        row("naive (max runtime), its jobs", &observed, &naive),
        row("forecast (calibrated), jobs all estimate", &all, &forecast),
        row("forecast before calibration (p10/p50/p90 runtimes), jobs all estimate", &all, &played),
        row("naive (max runtime), jobs all estimate", &all, &naive),
    ];
    let waits: Vec<f64> = observed.iter().map(|(p, start)| (start - p.at_ms) as f64 / 60_000.0).collect();
    Ok(Calibration {
        every,
        workload: workload.name.clone(),
        jobs: workload.jobs.len(),
        waited,
        unforeseeable,
        without,
        rows,
        median_wait_min: median(waits),
        stopped: outcome.stopped,
    })
}

fn row(model: &str, observed: &[(Prediction, i64)], estimate: &dyn Fn(&Prediction) -> Option<[i64; 3]>) -> ModelRow {
    let mut n = 0usize;
    let (mut inside, mut by_latest, mut late) = (0usize, 0usize, 0usize);
    let mut relative = Vec::new();
    let mut absolute = Vec::new();
    for (p, start) in observed {
        let Some([earliest, expected, latest]) = estimate(p) else { continue };
        n += 1;
        inside += usize::from(earliest <= *start && *start <= latest);
        by_latest += usize::from(*start <= latest);
        late += usize::from(*start > latest);
        let actual = (start - p.at_ms) as f64;
        let error = ((expected - p.at_ms) as f64 - actual).abs();
        absolute.push(error / 60_000.0);
        if actual > 0.0 {
            relative.push(error / actual);
        }
    }
    let share = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    ModelRow {
        model: model.to_owned(),
        jobs: n,
        inside: share(inside),
        by_latest: share(by_latest),
        median_relative_error: median(relative),
        median_absolute_error_min: median(absolute),
        late: share(late),
    }
}

/// The median (the mean of the middle two for an even count); 0 for no values.
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    }
}

/// The table.
pub fn render(c: &Calibration) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ETA calibration on {} ({} jobs), Fairway policy", c.workload, c.jobs);
    if c.every > 1 {
        let _ = writeln!(out, "Predictions for every {}th job by id", c.every);
    }
    let _ = writeln!(
        out,
        "Jobs that waited at arrival: {} (median wait {:.1} min); the forecast calls {} unforeseeable; {} got no estimate",
        c.waited, c.median_wait_min, c.unforeseeable, c.without
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| model | jobs | inside [p10, p90] | started by p90 | later than p90 | median abs error / wait | median abs error (min) |"
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &c.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1} |",
            r.model,
            r.jobs,
            r.inside * 100.0,
            r.by_latest * 100.0,
            r.late * 100.0,
            r.median_relative_error * 100.0,
            r.median_absolute_error_min
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Goals: >= 80% inside [p10, p90] and a median error <= 25% of the wait. The naive model gives a point, not an interval."
    );
    if let Some(stopped) = &c.stopped {
        let _ = writeln!(out, "The replay stopped early: {stopped}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{cluster::parse_cluster, TraceJob};

    const MINUTE: i64 = 60_000;

    #[test]
    fn calibration_compares_the_forecast_with_the_naive_model_on_the_same_jobs() {
        // One 1-GPU node: jobs of one kind queue behind each other; their maximum runtime is
        // far above what they run, so the naive model is late and the forecast learns.
        let cluster = parse_cluster(
            "[[classes]]\nname = \"gpu\"\nrate_per_gpu_hour = 1.0\n\
             [[nodes]]\nname_prefix = \"n\"\ncount = 1\nclass = \"gpu\"\ngpus = 1\n\
             [[teams]]\nname = \"a\"\nreserved = { gpu = 1 }\nburst = { gpu = 1 }\n",
        )
        .unwrap();
        let jobs = (0..40)
            .map(|i| TraceJob {
                team: 0,
                class: 0,
                replicas: 1,
                milli_per_replica: 1000,
                priority: 2,
                submit_ms: i * 5 * MINUTE,
                duration_ms: (9 + i % 3) * MINUTE,
                max_runtime_ms: 240 * MINUTE,
                template: None,
            })
            .collect();
        let c = calibrate(&Workload { name: "queue".into(), cluster, jobs }, 1).unwrap();
        assert!(c.waited > 20, "{c:?}");
        let forecast = &c.rows[3];
        let naive = &c.rows[5];
        assert_eq!(forecast.jobs, naive.jobs, "the same jobs");
        assert!(forecast.median_relative_error < naive.median_relative_error, "{c:?}");
        let text = render(&c);
        assert!(text.contains("inside [p10, p90]") && text.contains("naive (max runtime)"));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![7.0]), 7.0);
    }
}
