//! Budgets against spend: spend to date, a forecast to the period's end, alerts at 50, 80
//! and 100%, and what hard budgets leave for admission.
//!
//! Spend to date is what the ledger booked for charges in the period plus what running
//! attempts used since their last booked piece, priced at today's rate. A budget covers its
//! team's whole subtree (a department's budget counts every child team's jobs). The forecast
//! assumes the jobs running now keep running until the period ends: spend to date plus the
//! current burn rate times the time left.

use std::collections::{BTreeMap, HashMap};

use crate::domain::{JobId, TeamId};
use chrono::{DateTime, Datelike, NaiveDate, Utc};

use crate::{
    db::{self, billing::PeriodBudget},
    metering::{cost_micros, gpu_milli_ms, Chargeback, HOUR_MS},
    telemetry::Metrics,
};

/// The thresholds, in percent, at which a budget raises an alert.
pub const THRESHOLDS: [i32; 3] = [50, 80, 100];

/// Spend of one team's subtree in one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    pub cost_micros: i64,
    pub gpu_milli_ms: i64,
    /// What the attempts running now cost per hour.
    pub burn_micros_per_hour: i64,
    /// The GPU time they take per hour.
    pub burn_gpu_milli_ms_per_hour: i64,
}

impl Spend {
    fn add(&mut self, other: &Spend) {
        self.cost_micros += other.cost_micros;
        self.gpu_milli_ms += other.gpu_milli_ms;
        self.burn_micros_per_hour += other.burn_micros_per_hour;
        self.burn_gpu_milli_ms_per_hour += other.burn_gpu_milli_ms_per_hour;
    }

    /// Spent so far in the budget's unit: micro-units, or whole GPU-hours rounded down.
    pub fn in_unit(&self, unit: &str) -> i64 {
        match unit {
            "gpu-hours" => self.gpu_milli_ms / (1000 * HOUR_MS),
            _ => self.cost_micros,
        }
    }

    /// The forecast at the period's end, in the budget's unit, at the current burn.
    pub fn forecast_in_unit(&self, unit: &str, now: DateTime<Utc>, period_end: DateTime<Utc>) -> i64 {
        let left_ms = (period_end - now).num_milliseconds().max(0);
        let ahead = |per_hour: i64| (i128::from(per_hour) * i128::from(left_ms) / i128::from(HOUR_MS)) as i64;
        match unit {
            "gpu-hours" => (self.gpu_milli_ms + ahead(self.burn_gpu_milli_ms_per_hour)) / (1000 * HOUR_MS),
            _ => self.cost_micros + ahead(self.burn_micros_per_hour),
        }
    }
}

/// The first instant of `period` and of the period after it.
pub fn period_bounds(period: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = period.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
    let next = if period.month() == 12 {
        NaiveDate::from_ymd_opt(period.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(period.year(), period.month() + 1, 1)
    };
    (start, next.unwrap_or(period).and_hms_opt(0, 0, 0).unwrap_or_default().and_utc())
}

/// The period (first day of the UTC month) holding `at`.
pub fn period_of(at: DateTime<Utc>) -> NaiveDate {
    NaiveDate::from_ymd_opt(at.year(), at.month(), 1).unwrap_or_default()
}

/// The spend of `teams` (each with its whole subtree) in the period holding `now`, priced as
/// `chargeback` books it: under reserved-plus-burst, running use within reserved quota
/// costs nothing and the reservation's not yet booked time is added.
pub async fn spend(
    pool: &sqlx::PgPool,
    teams: &[TeamId],
    now: DateTime<Utc>,
    chargeback: Chargeback,
) -> Result<HashMap<TeamId, Spend>, sqlx::Error> {
    if teams.is_empty() {
        return Ok(HashMap::new());
    }
    let parents: HashMap<TeamId, Option<TeamId>> = db::billing::team_parents(pool).await?.into_iter().collect();
    // Every team under one of `teams`, with the budgeted ancestors it counts towards.
    let mut counts_towards: HashMap<TeamId, Vec<TeamId>> = HashMap::new();
    for &team in parents.keys() {
        let mut at = Some(team);
        let mut hops = 0;
        while let Some(t) = at {
            if teams.contains(&t) {
                counts_towards.entry(team).or_default().push(t);
            }
            at = parents.get(&t).copied().flatten();
            hops += 1;
            if hops > 64 {
                break;
            }
        }
    }
    let members: Vec<TeamId> = counts_towards.keys().copied().collect();
    let (from, to) = period_bounds(period_of(now));
    let mut own: HashMap<TeamId, Spend> = HashMap::new();
    for (team, booked) in db::billing::booked_by_team(pool, &members, from, to).await? {
        let s = own.entry(team).or_default();
        s.cost_micros += booked.cost_micros;
        s.gpu_milli_ms += booked.gpu_milli_ms;
    }
    let reserved_plus_burst = chargeback == Chargeback::ReservedPlusBurst;
    for u in db::billing::unbooked(pool, &members, now).await? {
        let s = own.entry(u.team_id).or_default();
        s.add(&unbooked_spend(&u, from, now, chargeback));
    }
    if reserved_plus_burst {
        for r in db::billing::unbooked_reservations(pool, &members, now).await? {
            let since = r.booked_to.max(from);
            let s = own.entry(r.team_id).or_default();
            let ms = (now - since).num_milliseconds().max(0);
            s.cost_micros += cost_micros(r.reserved, ms, r.rate_micros_per_gpu_hour, 1000);
            s.burn_micros_per_hour += cost_micros(r.reserved, HOUR_MS, r.rate_micros_per_gpu_hour, 1000);
        }
    }
    let mut out: HashMap<TeamId, Spend> = teams.iter().map(|t| (*t, Spend::default())).collect();
    for (team, s) in &own {
        for budgeted in counts_towards.get(team).into_iter().flatten() {
            if let Some(total) = out.get_mut(budgeted) {
                total.add(s);
            }
        }
    }
    Ok(out)
}

/// What a running attempt has used since it was last booked (and not before `from`), and
/// what it burns per hour, priced as `chargeback` books it: under reserved-plus-burst, use
/// within reserved quota costs nothing (the reservation is charged instead).
fn unbooked_spend(u: &db::billing::Unbooked, from: DateTime<Utc>, now: DateTime<Utc>, chargeback: Chargeback) -> Spend {
    let ms = (now - u.booked_to.max(from)).num_milliseconds().max(0);
    let free_within_reserved = chargeback == Chargeback::ReservedPlusBurst && !u.borrowing;
    let multiplier = if free_within_reserved { 0 } else { u.price_multiplier_milli };
    Spend {
        cost_micros: cost_micros(u.gpus, ms, u.rate_micros_per_gpu_hour, multiplier),
        gpu_milli_ms: gpu_milli_ms(u.gpus, u.fraction_milli, ms),
        burn_micros_per_hour: cost_micros(u.gpus, HOUR_MS, u.rate_micros_per_gpu_hour, multiplier),
        burn_gpu_milli_ms_per_hour: gpu_milli_ms(u.gpus, u.fraction_milli, HOUR_MS),
    }
}

/// One job's cost so far, over all its attempts and periods: what the ledger booked plus
/// its running attempt's use since, priced as `chargeback` books it.
pub async fn job_cost(
    pool: &sqlx::PgPool,
    job_id: JobId,
    now: DateTime<Utc>,
    chargeback: Chargeback,
) -> Result<Spend, sqlx::Error> {
    let booked = db::billing::booked_for_job(pool, job_id).await?;
    let mut spend = Spend { cost_micros: booked.cost_micros, gpu_milli_ms: booked.gpu_milli_ms, ..Spend::default() };
    if let Some(open) = db::billing::unbooked_for_job(pool, job_id, now).await? {
        spend.add(&unbooked_spend(&open, open.booked_to, now, chargeback));
    }
    Ok(spend)
}

/// What hard budgets leave this period, per budgeted team: money in micro-units, GPU time
/// in the ledger's unit. Teams without a hard budget of that unit are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HardBudgets {
    pub money_micros: HashMap<TeamId, i64>,
    pub gpu_milli_ms: HashMap<TeamId, i64>,
}

/// What each team's hard budget leaves this period, for admission: the budget less what its
/// whole subtree spent. The engine holds a job to its team's budget and every ancestor's,
/// and spends each as it admits.
pub async fn hard_left(
    pool: &sqlx::PgPool,
    now: DateTime<Utc>,
    chargeback: Chargeback,
) -> Result<HardBudgets, sqlx::Error> {
    let budgets: Vec<PeriodBudget> =
        db::billing::budgets_of(pool, period_of(now)).await?.into_iter().filter(|b| b.enforcement == "hard").collect();
    let mut out = HardBudgets::default();
    if budgets.is_empty() {
        return Ok(out);
    }
    let teams: Vec<TeamId> = budgets.iter().map(|b| b.team_id).collect();
    let spent = spend(pool, &teams, now, chargeback).await?;
    for b in &budgets {
        let s = spent.get(&b.team_id).copied().unwrap_or_default();
        if b.unit == "gpu-hours" {
            let amount = i128::from(b.amount) * 1000 * i128::from(HOUR_MS);
            let left = (amount - i128::from(s.gpu_milli_ms)).clamp(0, i128::from(i64::MAX)) as i64;
            out.gpu_milli_ms.insert(b.team_id, left);
        } else {
            out.money_micros.insert(b.team_id, (b.amount - s.cost_micros).max(0));
        }
    }
    Ok(out)
}

/// Raises the alerts that this period's spend has crossed, once each: recorded, written to
/// the audit log, counted on `/metrics`. Also refreshes the spent-ratio gauges. How many
/// alerts were new.
pub async fn raise_alerts(
    pool: &sqlx::PgPool,
    now: DateTime<Utc>,
    chargeback: Chargeback,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let period = period_of(now);
    let budgets = db::billing::budgets_of(pool, period).await?;
    let teams: Vec<TeamId> = budgets.iter().map(|b| b.team_id).collect();
    let spent = spend(pool, &teams, now, chargeback).await?;
    let mut ratios = BTreeMap::new();
    let mut raised = 0;
    for b in &budgets {
        let used = spent.get(&b.team_id).map_or(0, |s| s.in_unit(&b.unit));
        ratios.insert(b.team.clone(), if b.amount > 0 { used as f64 / b.amount as f64 } else { 0.0 });
        let crossed: Vec<i32> = THRESHOLDS
            .into_iter()
            .filter(|t| i128::from(used) * 100 >= i128::from(*t) * i128::from(b.amount))
            .collect();
        if crossed.is_empty() {
            continue;
        }
        let mut tx = pool.begin().await?;
        for threshold in crossed {
            if db::billing::record_alert(&mut tx, b.team_id, period, threshold, used, b.amount, &b.unit).await? {
                let object = format!("{}/{}", b.team, crate::domain::BudgetPeriod::from_date(period));
                db::audit::record(
                    &mut tx,
                    db::audit::Change {
                        actor: "system:metering",
                        action: "budget.alert",
                        object_type: "budget",
                        object_id: &object,
                        team_id: Some(b.team_id),
                        before: None,
                        after: Some(serde_json::json!({
                            "threshold_percent": threshold, "spent": used, "amount": b.amount,
                            "unit": b.unit, "enforcement": b.enforcement,
                        })),
                    },
                )
                .await?;
                metrics.budget_alert(&b.team, threshold);
                tracing::warn!(team = %b.team, threshold, spent = used, amount = b.amount, unit = %b.unit, "budget alert");
                raised += 1;
            }
        }
        tx.commit().await?;
    }
    metrics.budgets(ratios);
    Ok(raised)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_runs_from_the_first_of_its_month_to_the_first_of_the_next() {
        let (from, to) = period_bounds(NaiveDate::from_ymd_opt(2026, 12, 1).unwrap());
        assert_eq!(from.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2027-01-01T00:00:00+00:00");
    }

    #[test]
    fn the_forecast_adds_the_current_burn_until_the_period_ends() {
        let spend = Spend {
            cost_micros: 10_000_000,
            gpu_milli_ms: 2 * 1000 * HOUR_MS,
            burn_micros_per_hour: 1_000_000,
            burn_gpu_milli_ms_per_hour: 1000 * HOUR_MS,
        };
        let now = "2026-11-30T14:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let end = period_bounds(period_of(now)).1;
        // Ten hours left.
        assert_eq!(spend.forecast_in_unit("money", now, end), 20_000_000);
        assert_eq!(spend.forecast_in_unit("gpu-hours", now, end), 12);
        assert_eq!(spend.in_unit("gpu-hours"), 2);
    }
}
