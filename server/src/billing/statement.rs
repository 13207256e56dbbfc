//! A team's monthly statement: what it used by class and priority class, what it costs,
//! its budget, and its costliest jobs.

use std::collections::BTreeMap;

use crate::domain::{
    sizing::{recommend, ClassOption, Recommendation, Seen},
    GpuClassId, TeamId,
};
use chrono::{DateTime, NaiveDate, Utc};

use super::budgets::{period_bounds, period_of, spend};
use crate::db::{
    self,
    billing::{StatementLine, TopJob},
};
use crate::metering::{pieces, RateChange, HOUR_MS};

/// A statement.
#[derive(Debug, Clone)]
pub struct Statement {
    pub period: NaiveDate,
    /// Whether finance has closed the period: a closed statement no longer changes.
    pub closed: bool,
    /// Billed usage, by class and priority class (corrections included).
    pub lines: Vec<StatementLine>,
    pub gpu_milli_ms: i64,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
    /// The team's budget of the period, if any: (unit, amount, enforcement).
    pub budget: Option<(String, i64, String)>,
    /// For the current period: spend so far including running jobs, and the forecast at
    /// the period's end, in the budget's unit (money when there is no budget).
    pub spent_to_date: Option<i64>,
    pub forecast: Option<i64>,
    pub top_jobs: Vec<TopJob>,
    /// The team's pro-rata share of the period's idle capacity (by its share of each
    /// class-hour's allocation), and its cost at the rate card: reported, not billed.
    pub idle_share_gpu_milli_ms: i64,
    pub idle_share_cost_micros: i64,
    /// The team's jobs that held GPUs idle in the period (`domain::idle`), costliest first,
    /// each priced at what the job was billed per GPU-millisecond; and their totals. Part
    /// of `billed_cost` (the jobs held the GPUs), shown so the waste has a price.
    pub idle_jobs: Vec<db::idle::IdleJob>,
    pub idle_gpu_milli_ms: i64,
    pub idle_cost_micros: i64,
    /// Billed GPU time whose activity was measured (DCGM), and that time weighted by each
    /// job's mean SM activity: allocated against effective.
    pub measured_gpu_milli_ms: i64,
    pub effective_gpu_milli_ms: i64,
    /// The team's recurring jobs (by name and class) that a cheaper class or MIG profile
    /// would have held, with what they would have saved in the period; largest saving first.
    pub right_sizing: Vec<NameAdvice>,
}

/// Right-sizing advice for the jobs of one name on one class.
#[derive(Debug, Clone)]
pub struct NameAdvice {
    pub job_name: String,
    pub gpu_class: String,
    pub jobs: i64,
    pub seen: Seen,
    pub recommendation: Recommendation,
    /// What they were billed in the period would have been this much less.
    pub saving_micros: i64,
}

/// The GPU classes of the catalogue with the price in force, as the sizing rule sees them.
pub async fn sizing_options(pool: &sqlx::PgPool) -> Result<Vec<ClassOption>, sqlx::Error> {
    Ok(db::gpu_classes::list(pool, None, 10_000)
        .await?
        .into_iter()
        .map(|c| ClassOption {
            name: c.name,
            memory_mib: i64::from(c.memory_mib),
            fraction_milli: c.fraction_milli,
            rate_micros_per_hour: c.rate_micros_per_gpu_hour,
        })
        .collect())
}

/// Advice for each of the team's job names measured in the period that a cheaper class
/// would have held.
async fn right_sizing(pool: &sqlx::PgPool, team_id: TeamId, period: NaiveDate) -> Result<Vec<NameAdvice>, sqlx::Error> {
    let names = db::utilisation::sizing_by_job_name(pool, team_id, period).await?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let options = sizing_options(pool).await?;
    let mut advice: Vec<NameAdvice> = names
        .into_iter()
        .filter_map(|n| {
            let seen = Seen { peak_memory_mib: n.peak_memory_mib, mean_sm_active: n.mean_sm_active };
            let current = options.iter().find(|o| o.name == n.gpu_class)?;
            let recommendation = recommend(&seen, current, &options)?;
            Some(NameAdvice {
                saving_micros: recommendation.saving_of(n.billed_cost_micros),
                job_name: n.job_name,
                gpu_class: n.gpu_class,
                jobs: n.jobs,
                seen,
                recommendation,
            })
        })
        .collect();
    advice.sort_by(|a, b| b.saving_micros.cmp(&a.saving_micros).then(a.job_name.cmp(&b.job_name)));
    Ok(advice)
}

/// The statement of `team_id` for `period`, as of `now`.
pub async fn statement(
    pool: &sqlx::PgPool,
    team_id: TeamId,
    period: NaiveDate,
    now: DateTime<Utc>,
    chargeback: crate::metering::Chargeback,
) -> Result<Statement, sqlx::Error> {
    let lines = db::billing::statement_lines(pool, team_id, period).await?;
    let budget = db::budgets::list(pool, team_id)
        .await?
        .into_iter()
        .find(|b| b.period == period)
        .map(|b| (b.unit, b.amount, b.enforcement));
    let (spent_to_date, forecast) = if period_of(now) == period {
        let s = spend(pool, &[team_id], now, chargeback).await?.remove(&team_id).unwrap_or_default();
        let unit = budget.as_ref().map_or("money", |b| b.0.as_str());
        (Some(s.in_unit(unit)), Some(s.forecast_in_unit(unit, now, period_bounds(period).1)))
    } else {
        (None, None)
    };
    let (from, to) = period_bounds(period);
    let (idle_share_gpu_milli_ms, idle_share_cost_micros) = idle_share(pool, team_id, from, to).await?;
    let idle_jobs = db::idle::idle_jobs(pool, team_id, period, from, to).await?;
    let (measured_gpu_milli_ms, effective_gpu_milli_ms) =
        db::utilisation::effective_in_period(pool, team_id, period).await?;
    Ok(Statement {
        right_sizing: right_sizing(pool, team_id, period).await?,
        measured_gpu_milli_ms,
        effective_gpu_milli_ms,
        idle_gpu_milli_ms: idle_jobs.iter().map(|j| j.idle_gpu_milli_ms).sum(),
        idle_cost_micros: idle_jobs.iter().map(|j| j.idle_cost_micros).sum(),
        idle_jobs,
        period,
        idle_share_gpu_milli_ms,
        idle_share_cost_micros,
        closed: db::metering::period_closed(pool, period).await?,
        gpu_milli_ms: lines.iter().map(|l| l.gpu_milli_ms).sum(),
        list_cost_micros: lines.iter().map(|l| l.list_cost_micros).sum(),
        billed_cost_micros: lines.iter().map(|l| l.billed_cost_micros).sum(),
        lines,
        budget,
        spent_to_date,
        forecast,
        top_jobs: db::billing::top_jobs(pool, team_id, period, 10).await?,
    })
}

/// A team's share of the idle capacity of `[from, to)` (GPU time) and what it costs at the
/// rate card (micro-units): each class-hour's share priced by [`idle_cost_micros`].
async fn idle_share(
    pool: &sqlx::PgPool,
    team_id: TeamId,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(i64, i64), sqlx::Error> {
    let shares = db::billing::idle_shares(pool, team_id, from, to).await?;
    let mut classes: Vec<GpuClassId> = shares.iter().map(|s| s.gpu_class_id).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut rates: BTreeMap<GpuClassId, Vec<RateChange>> = BTreeMap::new();
    if !classes.is_empty() {
        let mut tx = pool.begin().await?;
        for (class, at, rate) in db::metering::rates_of(&mut tx, &classes).await? {
            rates
                .entry(class)
                .or_default()
                .push(RateChange { from_ms: at.timestamp_millis(), micros_per_gpu_hour: rate });
        }
        tx.commit().await?;
    }
    let gpu = shares.iter().map(|s| s.gpu_milli_ms).sum();
    let cost = shares
        .iter()
        .map(|s| {
            let card = rates.get(&s.gpu_class_id).map_or(&[][..], Vec::as_slice);
            idle_cost_micros(s.hour.timestamp_millis(), s.gpu_milli_ms, s.fraction_milli, card)
        })
        .sum();
    Ok((gpu, cost))
}

/// What `gpu_milli_ms` of idle time in the class-hour starting at `hour_ms` costs at the
/// class's rate card `rates` (sorted by `from_ms`), for a class whose unit is
/// `fraction_milli` thousandths of a GPU; micro-units, rounded half away from zero once.
///
/// Idle time cannot be placed within its hour (it is capacity less allocation over the
/// whole hour), so it is priced at the rates in force during the hour, each weighted by how
/// long it was in force. The part of the hour before the class's first rate has no rate to
/// weigh: the hour a rate card starts in is priced at that rate, not at nothing.
pub fn idle_cost_micros(hour_ms: i64, gpu_milli_ms: i64, fraction_milli: i32, rates: &[RateChange]) -> i64 {
    let Some(first) = rates.first() else { return 0 };
    let (mut weighted, mut span) = (0i128, 0i128);
    for p in pieces(hour_ms, hour_ms + HOUR_MS, rates).iter().filter(|p| p.start_ms >= first.from_ms) {
        weighted += i128::from(p.micros_per_gpu_hour) * i128::from(p.duration_ms());
        span += i128::from(p.duration_ms());
    }
    if span == 0 || fraction_milli <= 0 {
        return 0;
    }
    let numerator = i128::from(gpu_milli_ms) * weighted;
    let denominator = span * i128::from(fraction_milli) * i128::from(HOUR_MS);
    let rounded = (numerator.abs() + denominator / 2) / denominator;
    let signed = if numerator < 0 { -rounded } else { rounded };
    i64::try_from(signed).unwrap_or(if signed < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::{idle_cost_micros, RateChange, HOUR_MS};

    const H: i64 = HOUR_MS;
    /// A whole GPU for a whole hour, in the ledger's unit.
    const GPU_HOUR: i64 = 1000 * HOUR_MS;

    fn rate(from_ms: i64, micros_per_gpu_hour: i64) -> RateChange {
        RateChange { from_ms, micros_per_gpu_hour }
    }

    #[test]
    fn idle_time_in_the_hour_a_rate_starts_is_priced_at_that_rate_not_at_zero() {
        // The class's only rate, $2.50, starts at 10:30; 0.64 idle GPU-hours in 10:00–11:00.
        let rates = [rate(10 * H + H / 2, 2_500_000)];
        assert_eq!(idle_cost_micros(10 * H, GPU_HOUR * 64 / 100, 1000, &rates), 1_600_000);
        // And the hours after it, of course.
        assert_eq!(idle_cost_micros(11 * H, GPU_HOUR, 1000, &rates), 2_500_000);
    }

    #[test]
    fn idle_time_before_any_rate_costs_nothing() {
        let rates = [rate(12 * H, 2_500_000)];
        assert_eq!(idle_cost_micros(10 * H, GPU_HOUR, 1000, &rates), 0);
        assert_eq!(idle_cost_micros(10 * H, GPU_HOUR, 1000, &[]), 0);
    }

    #[test]
    fn a_rate_change_within_the_hour_prices_idle_time_by_how_long_each_rate_was_in_force() {
        // $2.00 until 10:15, $4.00 from then: three quarters of the hour at $4.00.
        let rates = [rate(0, 2_000_000), rate(10 * H + H / 4, 4_000_000)];
        assert_eq!(idle_cost_micros(10 * H, GPU_HOUR, 1000, &rates), 3_500_000);
    }

    #[test]
    fn a_mig_slice_is_priced_per_slice_hour() {
        // One 1g slice (142 thousandths of a GPU) idle for an hour at $0.90 a slice-hour.
        let rates = [rate(0, 900_000)];
        assert_eq!(idle_cost_micros(5 * H, 142 * HOUR_MS, 142, &rates), 900_000);
    }
}
