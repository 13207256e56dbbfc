//! How wrong past forecasts were, so that the next ones say how sure they are.
//!
//! The play of [`eta`](super::eta) cannot know the jobs that will arrive later and rank
//! ahead of a waiting job (fair share ranks a team that ran little first), nor how long jobs
//! with no history will run: left alone its median starts jobs too early, and its runtime
//! quantiles give an interval far narrower than what happens. Rather than guess these
//! effects, the forecast is corrected by its own record, as conformal prediction does: for
//! every job that started, the engine is told the wait the play forecast when the job first
//! waited and the wait it really had, and keeps the error as the log of their ratio (each
//! with a floor of [`FLOOR_MS`], so that "now" and "in 10 s" are not infinitely apart).
//!
//! Errors of starts alone would be biased early: at any moment the jobs that waited long are
//! still waiting, so the errors known are those of the jobs that started soon. The jobs
//! still waiting count too, as what they are, censored errors (their wait is at least what
//! it has been so far), and the quantiles come from the Kaplan-Meier estimate over both.
//!
//! Errors are kept per priority class and band of forecast wait (Mondrian conformal
//! prediction): a forecast of "within a minute" errs differently from one of "in six hours",
//! and a scavenger job, overtaken by every job of a higher class that arrives after it, errs
//! later than an experiment (on the Alibaba replay, half the scavengers started after their
//! p90 when the classes were pooled, one in ten experiments). A new forecast takes the p10,
//! p50 and p90 of its group's errors as its interval and median; with exchangeable jobs that
//! puts 80% of starts inside the interval by construction, and `fairway simulate --eta`
//! measures whether it does on a replay. A group with fewer than [`MIN_SAMPLES`] errors uses
//! all groups together; with fewer than that in all, the play's own interval stands.
//!
//! The engine only reads this; the control loop (from the jobs its leader saw start) and the
//! simulator (from the replay) record into it.

use std::collections::{BTreeMap, VecDeque};

use super::PriorityId;

/// Waits are compared as `(wait + FLOOR_MS)`: below a minute, every wait is about "now".
pub const FLOOR_MS: i64 = 60_000;

/// Newest errors kept per band: the forecast follows a changing load within a few thousand
/// starts.
pub const WINDOW: usize = 2_000;

/// Fewest errors a band (or all bands together) needs to calibrate a forecast.
pub const MIN_SAMPLES: usize = 30;

/// Upper bounds of the bands of forecast wait, in ms; the last band is unbounded.
const BANDS_MS: [i64; 4] = [60_000, 10 * 60_000, 3_600_000, 6 * 3_600_000];

/// The quantiles of error an interval takes: its start, median and end.
const QUANTILES: [f64; 3] = [0.10, 0.50, 0.90];

/// The errors of one priority class's forecasts, per band.
#[derive(Debug, Clone, Default)]
struct Bands {
    started: [VecDeque<f64>; BANDS_MS.len() + 1],
    /// The censored errors of the jobs waiting now, replaced every cycle.
    waiting: [Vec<f64>; BANDS_MS.len() + 1],
}

/// Recent forecast errors (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct ForecastErrors {
    classes: BTreeMap<PriorityId, Bands>,
}

fn error(forecast_wait_ms: i64, actual_wait_ms: i64) -> f64 {
    ((actual_wait_ms.max(0) + FLOOR_MS) as f64 / (forecast_wait_ms + FLOOR_MS) as f64).ln()
}

fn band(forecast_wait_ms: i64) -> usize {
    BANDS_MS.iter().take_while(|&&upper| forecast_wait_ms >= upper).count()
}

/// The quantiles of errors from `started` (exact) and `waiting` (each at least its value):
/// the Kaplan-Meier product-limit estimate. A quantile beyond what was observed (too many
/// still waiting to know it) is the largest value observed, a lower bound.
fn quantiles(started: &[f64], waiting: &[f64]) -> [f64; 3] {
    // (error, started); at equal values starts come first, as the estimator wants.
    let mut all: Vec<(f64, bool)> =
        started.iter().map(|&e| (e, true)).chain(waiting.iter().map(|&e| (e, false))).collect();
    all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out = [all.last().map_or(0.0, |a| a.0); 3];
    let mut survival = 1.0;
    let mut next = 0;
    for (i, &(value, started)) in all.iter().enumerate() {
        if !started {
            continue;
        }
        survival *= 1.0 - 1.0 / (all.len() - i) as f64;
        while next < QUANTILES.len() && 1.0 - survival >= QUANTILES[next] - 1e-9 {
            out[next] = value;
            next += 1;
        }
    }
    out
}

impl ForecastErrors {
    /// Records that a job of priority class `priority` forecast to wait `forecast_wait_ms`
    /// when it first waited in fact waited `actual_wait_ms` from then.
    pub fn record(&mut self, priority: PriorityId, forecast_wait_ms: i64, actual_wait_ms: i64) {
        let forecast = forecast_wait_ms.max(0);
        let band = &mut self.classes.entry(priority).or_default().started[band(forecast)];
        if band.len() == WINDOW {
            band.pop_front();
        }
        band.push_back(error(forecast, actual_wait_ms));
    }

    /// Replaces the jobs waiting now: each `(priority, forecast_wait_ms, waited_ms)`, of
    /// priority class `priority`, forecast to wait `forecast_wait_ms` when it first waited
    /// and waiting `waited_ms` since.
    pub fn set_waiting(&mut self, waiting: impl IntoIterator<Item = (PriorityId, i64, i64)>) {
        for bands in self.classes.values_mut() {
            bands.waiting.iter_mut().for_each(Vec::clear);
        }
        for (priority, forecast_wait_ms, waited_ms) in waiting {
            let forecast = forecast_wait_ms.max(0);
            self.classes.entry(priority).or_default().waiting[band(forecast)].push(error(forecast, waited_ms));
        }
    }

    /// How many errors of started jobs it holds.
    pub fn len(&self) -> usize {
        self.classes.values().flat_map(|b| &b.started).map(VecDeque::len).sum()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The quantiles of error per priority class and band, computed once for a cycle's
    /// forecasts.
    pub fn calibrator(&self) -> Calibrator {
        let all = self.classes.values();
        let started: Vec<f64> = all.clone().flat_map(|b| b.started.iter().flatten()).copied().collect();
        let waiting: Vec<f64> = all.flat_map(|b| b.waiting.iter().flatten()).copied().collect();
        let pooled = (started.len() >= MIN_SAMPLES).then(|| quantiles(&started, &waiting));
        let classes = self
            .classes
            .iter()
            .map(|(&priority, bands)| {
                let quantiles = std::array::from_fn(|b| {
                    let band = bands.started[b].iter().copied().collect::<Vec<f64>>();
                    if band.len() >= MIN_SAMPLES {
                        Some(quantiles(&band, &bands.waiting[b]))
                    } else {
                        pooled
                    }
                });
                (priority, quantiles)
            })
            .collect();
        Calibrator { classes, pooled }
    }
}

/// Turns a played forecast into a calibrated interval (see [`ForecastErrors::calibrator`]).
#[derive(Debug, Clone)]
pub struct Calibrator {
    classes: BTreeMap<PriorityId, [Option<[f64; 3]>; BANDS_MS.len() + 1]>,
    /// For a priority class with no errors of its own.
    pooled: Option<[f64; 3]>,
}

impl Calibrator {
    /// The waits (p10, p50, p90; non-decreasing, none negative) of a job of priority class
    /// `priority` the play forecast to wait `forecast_wait_ms`, or `None` while too few
    /// errors are known.
    pub fn waits(&self, priority: PriorityId, forecast_wait_ms: i64) -> Option<[i64; 3]> {
        let forecast = forecast_wait_ms.max(0);
        let errors = self.classes.get(&priority).map_or(self.pooled, |bands| bands[band(forecast)])?;
        let base = (forecast + FLOOR_MS) as f64;
        // Quantiles are sorted and the map is increasing, so the waits are too.
        Some(errors.map(|e| ((base * e.exp()).round() as i64 - FLOOR_MS).max(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forecast_is_left_alone_until_enough_starts_are_known() {
        let mut errors = ForecastErrors::default();
        for _ in 0..MIN_SAMPLES - 1 {
            errors.record(0, 600_000, 1_200_000);
        }
        assert_eq!(errors.calibrator().waits(0, 600_000), None);
        errors.record(0, 600_000, 1_200_000);
        assert!(errors.calibrator().waits(0, 600_000).is_some());
    }

    #[test]
    fn forecasts_that_were_always_twice_too_short_are_doubled() {
        let mut errors = ForecastErrors::default();
        // Forecast 9 min, waited 19 min: (19 + 1) / (9 + 1) = 2.
        for _ in 0..100 {
            errors.record(0, 9 * 60_000, 19 * 60_000);
        }
        let waits = errors.calibrator().waits(0, 9 * 60_000).unwrap();
        assert_eq!(waits, [19 * 60_000; 3]);
    }

    #[test]
    fn the_interval_covers_the_middle_eight_tenths_of_past_errors() {
        let mut errors = ForecastErrors::default();
        // Forecast 4 min each time; waited 0..99 min, one of each.
        for actual_min in 0..100 {
            errors.record(0, 4 * 60_000, actual_min * 60_000);
        }
        let [low, mid, high] = errors.calibrator().waits(0, 4 * 60_000).unwrap();
        let inside = (0..100).filter(|m| (low..=high).contains(&(m * 60_000))).count();
        assert!((79..=82).contains(&inside), "{inside} of 100 inside [{low}, {high}]");
        assert!(low <= mid && mid <= high);
        assert!((49 * 60_000..=51 * 60_000).contains(&mid), "median {mid}");
    }

    #[test]
    fn each_band_of_forecast_learns_its_own_errors() {
        let mut errors = ForecastErrors::default();
        for _ in 0..50 {
            // Short forecasts were 3x too short; long ones were right.
            errors.record(0, 0, 2 * 60_000);
            errors.record(0, 10 * 3_600_000, 10 * 3_600_000);
        }
        let c = errors.calibrator();
        assert_eq!(c.waits(0, 0), Some([2 * 60_000; 3]));
        assert_eq!(c.waits(0, 10 * 3_600_000), Some([10 * 3_600_000; 3]));
    }

    #[test]
    fn jobs_still_waiting_past_their_forecast_push_the_interval_later() {
        let mut errors = ForecastErrors::default();
        // 50 jobs forecast at 9 min started on time; 50 more with the same forecast have
        // waited 39 min so far and still wait.
        for _ in 0..50 {
            errors.record(0, 9 * 60_000, 9 * 60_000);
        }
        let before = errors.calibrator().waits(0, 9 * 60_000).unwrap();
        assert_eq!(before, [9 * 60_000; 3]);
        errors.set_waiting((0..50).map(|_| (0, 9 * 60_000, 39 * 60_000)));
        let [low, mid, high] = errors.calibrator().waits(0, 9 * 60_000).unwrap();
        assert_eq!((low, mid), (9 * 60_000, 9 * 60_000), "half started on time");
        assert!(high >= 39 * 60_000, "the p90 is at least what the waiting jobs waited: {high}");
    }

    #[test]
    fn only_the_newest_errors_count() {
        let mut errors = ForecastErrors::default();
        for _ in 0..WINDOW {
            errors.record(0, 0, 10 * 60_000);
        }
        for _ in 0..WINDOW {
            errors.record(0, 0, 0);
        }
        assert_eq!(errors.len(), WINDOW);
        assert_eq!(errors.calibrator().waits(0, 0), Some([0; 3]));
    }

    #[test]
    fn each_priority_class_learns_its_own_errors() {
        let mut errors = ForecastErrors::default();
        for _ in 0..50 {
            // Experiments (1) started on time; scavengers (2) waited three times as long.
            errors.record(1, 9 * 60_000, 9 * 60_000);
            errors.record(2, 9 * 60_000, 29 * 60_000);
        }
        let c = errors.calibrator();
        assert_eq!(c.waits(1, 9 * 60_000), Some([9 * 60_000; 3]));
        assert_eq!(c.waits(2, 9 * 60_000), Some([29 * 60_000; 3]));
    }

    #[test]
    fn a_class_with_few_errors_of_its_own_borrows_everyones() {
        let mut errors = ForecastErrors::default();
        for _ in 0..MIN_SAMPLES {
            errors.record(1, 9 * 60_000, 19 * 60_000);
        }
        errors.record(2, 9 * 60_000, 9 * 60_000);
        let c = errors.calibrator();
        // 31 errors pooled: 30 of them doubled, so the median is doubled for class 2 too,
        // and for class 0, which never had a forecast.
        assert_eq!(c.waits(2, 9 * 60_000).map(|w| w[1]), Some(19 * 60_000));
        assert_eq!(c.waits(0, 9 * 60_000).map(|w| w[1]), Some(19 * 60_000));
    }
}
