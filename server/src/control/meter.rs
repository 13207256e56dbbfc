//! The leader's metering pass: books the completed hours of running jobs, books any closed
//! interval left without ledger rows, books reservation charges under the
//! reserved-plus-burst model, refreshes the rollups, and raises budget alerts.
//!
//! Closing an interval books it in the same transaction (see `reconcile::end_attempts`); this
//! pass exists for jobs that run across hour, day and month boundaries, so that a period's
//! bill holds every completed hour of them when finance closes it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ControlError, Ctx};
use crate::{billing, db, metering};

/// What one pass did.
#[derive(Debug, Default, Clone)]
pub struct MeterReport {
    /// Ledger rows written.
    pub booked: u64,
    /// Hours whose rollups were recomputed.
    pub hours_rolled_up: usize,
    /// Budget alerts raised.
    pub alerts: usize,
}

/// Runs passes on the configured interval, and right after each hour turns.
pub async fn run(ctx: Ctx) {
    loop {
        if let Err(e) = pass(&ctx, Utc::now()).await {
            tracing::warn!(error = %e, "metering pass failed");
        }
        let now = Utc::now();
        let next_hour = metering::hour_floor(now.timestamp_millis()) + metering::HOUR_MS;
        let to_hour = Duration::from_millis((next_hour - now.timestamp_millis()).max(0) as u64 + 1);
        tokio::time::sleep(ctx.config.metering_interval.min(to_hour)).await;
    }
}

/// One pass as of `now`.
pub async fn pass(ctx: &Ctx, now: DateTime<Utc>) -> Result<MeterReport, ControlError> {
    let mut report = MeterReport::default();
    let hour = DateTime::from_timestamp_millis(metering::hour_floor(now.timestamp_millis())).unwrap_or(now);
    let mut work = db::metering::open_intervals(&ctx.pool, hour).await?;
    work.extend(db::metering::unmetered_closed_intervals(&ctx.pool, 10_000).await?);
    for (job_id, attempt) in work {
        let mut tx = ctx.pool.begin().await?;
        report.booked += metering::ledger::book(&mut tx, job_id, attempt, Some(hour), &ctx.config.pricing).await?;
        tx.commit().await?;
    }
    if ctx.config.pricing.chargeback == metering::Chargeback::ReservedPlusBurst {
        let from = metering::reservations::next_from(&ctx.pool, now).await?;
        report.booked += metering::reservations::book(&ctx.pool, from, hour, &ctx.config.pricing).await?;
    }
    report.hours_rolled_up = db::metering::roll_up(&ctx.pool, hour).await?.len();
    report.alerts = billing::budgets::raise_alerts(&ctx.pool, now, ctx.config.pricing.chargeback, &ctx.metrics).await?;
    Ok(report)
}
