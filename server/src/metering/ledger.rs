//! Booking usage intervals into the ledger.
//!
//! An attempt is booked up to a point in time: up to its end once it is closed (in the very
//! transaction that closes it), and while it runs up to the last completed hour (by the
//! metering pass), so that a month's bill holds every hour of a job that runs across its end.
//! Booking continues from the end of what is already booked, so each millisecond is booked
//! once whoever books it and however often. When an attempt turns out to have ended before
//! what was booked for it (its end was reported late), the excess is taken back by correction
//! rows that reference the pieces they correct.

use crate::domain::{GpuClassId, JobId};
use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{cost_micros, gpu_milli_ms, pieces, Chargeback, Pricing, RateChange};
use crate::db::{
    self,
    metering::{IntervalToMeter, MeteredPiece, NewLedgerRow},
    Tx,
};

/// Books attempt `attempt` of `job_id`: to its end when closed, else to `until` (a completed
/// hour's end). How many ledger rows were written; 0 when there is nothing new.
pub async fn book(
    tx: &mut Tx<'_>,
    job_id: JobId,
    attempt: i32,
    until: Option<DateTime<Utc>>,
    pricing: &Pricing,
) -> Result<u64, sqlx::Error> {
    book_many(tx, &[(job_id, attempt)], until, pricing).await
}

/// Books the attempts `keys` (job, attempt) as [`book`] does each, in four statements
/// whatever their number: a reconciler pass that ends a thousand attempts books them at once.
pub async fn book_many(
    tx: &mut Tx<'_>,
    keys: &[(JobId, i32)],
    until: Option<DateTime<Utc>>,
    pricing: &Pricing,
) -> Result<u64, sqlx::Error> {
    if keys.is_empty() {
        return Ok(0);
    }
    let intervals = db::metering::intervals_for_update(tx, keys).await?;
    if intervals.is_empty() {
        return Ok(0);
    }
    let keys: Vec<(JobId, i32)> = intervals.iter().map(|i| (i.job_id, i.attempt)).collect();
    let mut booked: HashMap<(JobId, i32), Vec<MeteredPiece>> = HashMap::new();
    for (job, attempt, piece) in db::metering::metered_pieces(tx, &keys).await? {
        booked.entry((job, attempt)).or_default().push(piece);
    }
    let mut classes: Vec<GpuClassId> = intervals.iter().map(|i| i.gpu_class_id).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut rates: HashMap<GpuClassId, Vec<(DateTime<Utc>, i64)>> = HashMap::new();
    for (class, from, rate) in db::metering::rates_of(tx, &classes).await? {
        rates.entry(class).or_default().push((from, rate));
    }
    let mut rows = Vec::new();
    for interval in &intervals {
        let Some(end) = interval.ended_at.or(until) else { continue };
        let pieces = booked.get(&(interval.job_id, interval.attempt)).map(Vec::as_slice).unwrap_or_default();
        // A pool's own price holds for the whole attempt; otherwise the rate card's changes.
        let pool_price = interval.rate_micros_per_gpu_hour.map(|rate| [(DateTime::<Utc>::UNIX_EPOCH, rate)]);
        let card = match &pool_price {
            Some(price) => price.as_slice(),
            None => rates.get(&interval.gpu_class_id).map(Vec::as_slice).unwrap_or_default(),
        };
        for row in rows_to_book(interval, pieces, card, end, pricing.chargeback) {
            rows.push((interval, row));
        }
    }
    db::metering::append(tx, &pricing.currency, &rows).await
}

/// The rows that bring the ledger of `interval` to `end`: new pieces after what is booked,
/// or, for a closed interval that ended before what is booked, corrections. Under the
/// reserved-plus-burst model, use within reserved quota is booked at no charge (its list
/// price is still recorded): the team pays for its reservation instead. Pure.
pub fn rows_to_book(
    interval: &IntervalToMeter,
    booked: &[MeteredPiece],
    rates: &[(DateTime<Utc>, i64)],
    end: DateTime<Utc>,
    chargeback: Chargeback,
) -> Vec<NewLedgerRow> {
    let charged = chargeback == Chargeback::Usage || interval.borrowing;
    let ms = |t: DateTime<Utc>| t.timestamp_millis();
    let start_ms = ms(interval.started_at);
    let end_ms = ms(end).max(start_ms);
    let booked_to = booked.iter().map(|p| ms(p.charge_end)).max().unwrap_or(start_ms);
    let (gpus, fraction, multiplier) = (interval.gpus, interval.fraction_milli, interval.price_multiplier_milli);
    let rates: Vec<RateChange> =
        rates.iter().map(|(from, rate)| RateChange { from_ms: ms(*from), micros_per_gpu_hour: *rate }).collect();
    let mut rows = Vec::new();
    for piece in pieces(booked_to, end_ms, &rates) {
        let duration = piece.duration_ms();
        rows.push(NewLedgerRow {
            kind: "usage",
            corrects: None,
            reason: None,
            charge_start: at(piece.start_ms),
            charge_end: at(piece.end_ms),
            duration_ms: duration,
            gpu_milli_ms: gpu_milli_ms(gpus, fraction, duration),
            rate_micros_per_gpu_hour: piece.micros_per_gpu_hour,
            price_multiplier_milli: multiplier,
            list_cost_micros: cost_micros(gpus, duration, piece.micros_per_gpu_hour, 1000),
            billed_cost_micros: if charged {
                cost_micros(gpus, duration, piece.micros_per_gpu_hour, multiplier)
            } else {
                0
            },
        });
    }
    if interval.ended_at.is_some() && end_ms < booked_to {
        for piece in booked.iter().filter(|p| !p.corrected && ms(p.charge_end) > end_ms) {
            let kept = (end_ms - ms(piece.charge_start)).clamp(0, piece.duration_ms);
            let taken = kept - piece.duration_ms;
            let (rate, mult) = (piece.rate_micros_per_gpu_hour, piece.price_multiplier_milli);
            // The difference of the rounded amounts, so that a piece and its correction sum
            // to exactly what booking the true span would have charged, under the terms the
            // piece was booked with (a piece booked at no charge stays free).
            let list = cost_micros(gpus, kept, rate, 1000) - piece.list_cost_micros;
            let billed = if piece.billed_cost_micros == 0 { 0 } else { cost_micros(gpus, kept, rate, mult) }
                - piece.billed_cost_micros;
            rows.push(NewLedgerRow {
                kind: "correction",
                corrects: Some(piece.id),
                reason: Some(format!(
                    "the attempt ended at {}, {} ms before the end of this booked piece",
                    end.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    -taken
                )),
                charge_start: piece.charge_start,
                charge_end: piece.charge_end,
                duration_ms: taken,
                gpu_milli_ms: gpu_milli_ms(gpus, fraction, taken),
                rate_micros_per_gpu_hour: rate,
                price_multiplier_milli: mult,
                list_cost_micros: list,
                billed_cost_micros: billed,
            });
        }
    }
    rows
}

fn at(ms: i64) -> DateTime<Utc> {
    // Every instant here comes from a `DateTime` in milliseconds, so it is in range.
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TeamId;

    fn t(ms: i64) -> DateTime<Utc> {
        at(ms)
    }

    fn interval(start: i64, end: Option<i64>) -> IntervalToMeter {
        IntervalToMeter {
            job_id: JobId::from_u128(0),
            attempt: 1,
            job_name: "j".into(),
            team_id: TeamId::from_u128(0),
            team_name: "t".into(),
            gpu_class_id: GpuClassId::from_u128(0),
            gpu_class: "h100".into(),
            priority_class: "production".into(),
            gpus: 2,
            fraction_milli: 1000,
            borrowing: false,
            started_at: t(start),
            ended_at: end.map(t),
            price_multiplier_milli: 1500,
            labels: serde_json::json!({}),
            rate_micros_per_gpu_hour: None,
        }
    }

    fn booked(rows: &[NewLedgerRow]) -> Vec<MeteredPiece> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| MeteredPiece {
                id: i as i64 + 1,
                charge_start: r.charge_start,
                charge_end: r.charge_end,
                duration_ms: r.duration_ms,
                rate_micros_per_gpu_hour: r.rate_micros_per_gpu_hour,
                price_multiplier_milli: r.price_multiplier_milli,
                list_cost_micros: r.list_cost_micros,
                billed_cost_micros: r.billed_cost_micros,
                corrected: false,
            })
            .collect()
    }

    const H: i64 = super::super::HOUR_MS;
    const RATES: [(i64, i64); 1] = [(0, 1_000_000)];

    fn rates() -> Vec<(DateTime<Utc>, i64)> {
        RATES.iter().map(|(from, r)| (t(*from), *r)).collect()
    }

    #[test]
    fn booking_hour_by_hour_then_at_the_end_books_each_millisecond_once() {
        let open = interval(H / 2, None);
        let first = rows_to_book(&open, &[], &rates(), t(2 * H), Chargeback::Usage);
        assert_eq!(first.iter().map(|r| r.duration_ms).sum::<i64>(), 2 * H - H / 2);
        let closed = interval(H / 2, Some(2 * H + 10));
        let rest = rows_to_book(&closed, &booked(&first), &rates(), t(2 * H + 10), Chargeback::Usage);
        assert_eq!(rest.len(), 1);
        assert_eq!((rest[0].charge_start, rest[0].duration_ms), (t(2 * H), 10));
        // Booking again finds nothing to add.
        let all: Vec<NewLedgerRow> = first.into_iter().chain(rest).collect();
        assert!(rows_to_book(&closed, &booked(&all), &rates(), t(2 * H + 10), Chargeback::Usage).is_empty());
    }

    #[test]
    fn an_end_reported_late_is_taken_back_by_corrections_that_sum_to_the_truth() {
        let open = interval(0, None);
        let first = rows_to_book(&open, &[], &rates(), t(2 * H), Chargeback::Usage);
        let closed = interval(0, Some(H + H / 4));
        let fixes = rows_to_book(&closed, &booked(&first), &rates(), t(H + H / 4), Chargeback::Usage);
        assert_eq!(fixes.len(), 1);
        assert_eq!((fixes[0].kind, fixes[0].corrects), ("correction", Some(2)));
        let total: i64 = first.iter().chain(&fixes).map(|r| r.duration_ms).sum();
        assert_eq!(total, H + H / 4);
        let cost: i64 = first.iter().chain(&fixes).map(|r| r.billed_cost_micros).sum();
        assert_eq!(cost, cost_micros(2, H, 1_000_000, 1500) + cost_micros(2, H / 4, 1_000_000, 1500));
        let gpu_time: i64 = first.iter().chain(&fixes).map(|r| r.gpu_milli_ms).sum();
        assert_eq!(gpu_time, 2 * 1000 * (H + H / 4));
    }

    #[test]
    fn under_reserved_plus_burst_only_borrowed_time_is_billed_and_its_list_price_kept() {
        let within = interval(0, Some(H));
        let rows = rows_to_book(&within, &[], &rates(), t(H), Chargeback::ReservedPlusBurst);
        assert_eq!((rows[0].billed_cost_micros, rows[0].list_cost_micros), (0, 2_000_000));
        let borrowed = IntervalToMeter { borrowing: true, ..interval(0, Some(H)) };
        let rows = rows_to_book(&borrowed, &[], &rates(), t(H), Chargeback::ReservedPlusBurst);
        assert_eq!(rows[0].billed_cost_micros, 3_000_000);
    }
}
