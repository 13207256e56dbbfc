//! Reservation charges under the reserved-plus-burst chargeback model: each completed hour,
//! every team pays for the GPUs it had reserved, used or not, at the rate in force.
//!
//! Charges are cut like usage (at hours and rate changes) and also where the reserved quota
//! changed, from the quota's history. One ledger row per team, class and piece start, so a
//! pass that books the same hours again writes nothing.

use std::collections::BTreeMap;

use crate::domain::{GpuClassId, TeamId};
use chrono::{DateTime, Utc};

use super::{cost_micros, pieces, Pricing, RateChange, HOUR_MS};
use crate::db::{self, metering::NewReservationRow};

/// A stretch of a reservation: `reserved` units of a class from `start_ms` to `end_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedPiece {
    pub start_ms: i64,
    pub end_ms: i64,
    pub reserved: i32,
    pub micros_per_gpu_hour: i64,
}

/// The pieces of `[from_ms, until_ms)` during which `quota` (sorted changes: from, reserved)
/// reserved anything, cut at hours, rate changes and quota changes. Pure.
pub fn reserved_pieces(from_ms: i64, until_ms: i64, quota: &[(i64, i32)], rates: &[RateChange]) -> Vec<ReservedPiece> {
    let reserved_at = |ms: i64| {
        let i = quota.partition_point(|(from, _)| *from <= ms);
        if i == 0 {
            0
        } else {
            quota[i - 1].1
        }
    };
    let mut out = Vec::new();
    for piece in pieces(from_ms, until_ms, rates) {
        let mut cuts: Vec<i64> =
            quota.iter().map(|(from, _)| *from).filter(|from| *from > piece.start_ms && *from < piece.end_ms).collect();
        cuts.push(piece.end_ms);
        let mut at = piece.start_ms;
        for cut in cuts {
            let reserved = reserved_at(at);
            if reserved > 0 {
                out.push(ReservedPiece {
                    start_ms: at,
                    end_ms: cut,
                    reserved,
                    micros_per_gpu_hour: piece.micros_per_gpu_hour,
                });
            }
            at = cut;
        }
    }
    out
}

/// Books the reservation charges of `[from, until)` for every team and class; how many rows
/// were written (0 for hours already booked).
pub async fn book(
    pool: &sqlx::PgPool,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    pricing: &Pricing,
) -> Result<u64, sqlx::Error> {
    if until <= from {
        return Ok(0);
    }
    let history = db::metering::quota_history(pool).await?;
    let mut series: BTreeMap<(TeamId, GpuClassId), Vec<(i64, i32)>> = BTreeMap::new();
    for h in &history {
        series.entry((h.team_id, h.gpu_class_id)).or_default().push((h.effective_from.timestamp_millis(), h.reserved));
    }
    let mut tx = pool.begin().await?;
    let mut rates_of: BTreeMap<GpuClassId, Vec<RateChange>> = BTreeMap::new();
    let mut rows = Vec::new();
    for ((team_id, class_id), quota) in &series {
        if !rates_of.contains_key(class_id) {
            let rates = db::metering::rates(&mut tx, *class_id).await?;
            let rates = rates
                .into_iter()
                .map(|(at, rate)| RateChange { from_ms: at.timestamp_millis(), micros_per_gpu_hour: rate })
                .collect();
            rates_of.insert(*class_id, rates);
        }
        let rates = rates_of.get(class_id).map(Vec::as_slice).unwrap_or_default();
        for p in reserved_pieces(from.timestamp_millis(), until.timestamp_millis(), quota, rates) {
            let duration = p.end_ms - p.start_ms;
            let cost = cost_micros(p.reserved, duration, p.micros_per_gpu_hour, 1000);
            rows.push(NewReservationRow {
                team_id: *team_id,
                gpu_class_id: *class_id,
                reserved: p.reserved,
                charge_start: DateTime::from_timestamp_millis(p.start_ms).unwrap_or(from),
                charge_end: DateTime::from_timestamp_millis(p.end_ms).unwrap_or(until),
                duration_ms: duration,
                rate_micros_per_gpu_hour: p.micros_per_gpu_hour,
                cost_micros: cost,
            });
        }
    }
    let written = db::metering::append_reservations(&mut tx, &pricing.currency, &rows).await?;
    tx.commit().await?;
    Ok(written)
}

/// Where the next pass starts: after the last booked reservation hour, or else at the hour
/// reservation charges started from, which the first call under the model records as the
/// start of the current hour (reservations are never billed back to before the model was on).
pub async fn next_from(pool: &sqlx::PgPool, now: DateTime<Utc>) -> Result<DateTime<Utc>, sqlx::Error> {
    if let Some(end) = db::metering::last_reservation_end(pool).await? {
        // Resume at the hour the last booking reached (it always ends on an hour).
        return Ok(
            DateTime::from_timestamp_millis(super::hour_floor(end.timestamp_millis() - 1) + HOUR_MS).unwrap_or(end)
        );
    }
    let current = DateTime::from_timestamp_millis(super::hour_floor(now.timestamp_millis())).unwrap_or(now);
    db::metering::state_or_set(pool, "reservations_from", current).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR_MS;

    #[test]
    fn a_reservation_is_cut_where_the_quota_changes_and_nothing_is_charged_while_it_is_zero() {
        let rates = [RateChange { from_ms: 0, micros_per_gpu_hour: 1_000_000 }];
        // 4 reserved from 00:30, 8 from 01:15, none from 02:00.
        let quota = [(H / 2, 4), (H + H / 4, 8), (2 * H, 0)];
        let p = reserved_pieces(0, 3 * H, &quota, &rates);
        let got: Vec<(i64, i64, i32)> = p.iter().map(|p| (p.start_ms, p.end_ms, p.reserved)).collect();
        assert_eq!(got, vec![(H / 2, H, 4), (H, H + H / 4, 4), (H + H / 4, 2 * H, 8)]);
    }
}
