//! Metering: turning usage intervals into ledger pieces, exactly.
//!
//! A usage interval (one per job attempt, opened at the backend's real start and closed at
//! its real stop) is cut into *pieces* that each lie within one UTC hour and under one rate:
//! the cuts fall on every hour boundary and on every rate change. Each piece becomes one
//! append-only ledger row keyed by (job, attempt, piece start), so metering the same interval
//! twice, or an open interval hour by hour and then once more when it closes, writes every
//! millisecond once.
//!
//! Time is whole milliseconds (timestamps are truncated to the millisecond before metering),
//! GPU time is `gpus × fraction_milli × milliseconds` (physical GPUs in thousandths), and money
//! is integer micro-units: no floating point anywhere, so a month of pieces sums to the unit
//! and the rollups, the exports and the ledger agree.

pub mod figures;
pub mod ledger;
pub mod reservations;

/// How the platform charges teams for GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Chargeback {
    /// A team pays for the GPU time its jobs ran.
    #[default]
    Usage,
    /// A team pays for its reserved quota every hour, used or not, plus the GPU time its
    /// jobs ran on borrowed (burst) capacity; use within its reserved quota costs nothing more.
    ReservedPlusBurst,
}

impl Chargeback {
    /// Parses `usage` or `reserved-plus-burst`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "usage" => Some(Self::Usage),
            "reserved-plus-burst" => Some(Self::ReservedPlusBurst),
            _ => None,
        }
    }

    /// The setting's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Usage => "usage",
            Self::ReservedPlusBurst => "reserved-plus-burst",
        }
    }
}

/// What bookings are priced with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pricing {
    /// ISO 4217 code of every amount.
    pub currency: String,
    pub chargeback: Chargeback,
}

impl Default for Pricing {
    fn default() -> Self {
        Self { currency: "USD".into(), chargeback: Chargeback::Usage }
    }
}

/// Milliseconds in an hour.
pub const HOUR_MS: i64 = 3_600_000;

/// A rate change of one GPU class: from `from_ms` on, each GPU of the class costs
/// `micros_per_gpu_hour` per hour (before the priority class's multiplier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateChange {
    pub from_ms: i64,
    pub micros_per_gpu_hour: i64,
}

/// A stretch of an interval within one hour and under one rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub start_ms: i64,
    pub end_ms: i64,
    /// The rate in force over the piece; 0 before the class's first rate.
    pub micros_per_gpu_hour: i64,
}

impl Piece {
    /// The piece's length in milliseconds.
    pub fn duration_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }
}

/// The start of the UTC hour holding `ms`.
pub fn hour_floor(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// Cuts `[start_ms, end_ms)` at every hour boundary and every rate change, pricing each piece
/// by the rate in force at its start. `rates` must be sorted by `from_ms`. Empty when the
/// interval is.
pub fn pieces(start_ms: i64, end_ms: i64, rates: &[RateChange]) -> Vec<Piece> {
    let rate_at = |ms: i64| {
        let i = rates.partition_point(|r| r.from_ms <= ms);
        if i == 0 {
            0
        } else {
            rates[i - 1].micros_per_gpu_hour
        }
    };
    let mut out = Vec::new();
    let mut at = start_ms;
    while at < end_ms {
        let next_hour = hour_floor(at) + HOUR_MS;
        let next_rate = rates.iter().map(|r| r.from_ms).find(|&from| from > at).unwrap_or(i64::MAX);
        let end = end_ms.min(next_hour).min(next_rate);
        out.push(Piece { start_ms: at, end_ms: end, micros_per_gpu_hour: rate_at(at) });
        at = end;
    }
    out
}

/// GPU time of `gpus` units of a class whose units are `fraction_milli` thousandths of a
/// physical GPU, for `ms` milliseconds: physical GPU-milliseconds × 1000. Exact; a month of
/// 65,536 whole GPUs is about 1.7 × 10^17, far inside `i64`.
pub fn gpu_milli_ms(gpus: i32, fraction_milli: i32, ms: i64) -> i64 {
    i64::from(gpus) * i64::from(fraction_milli) * ms
}

/// What `gpus` units of a class cost for `ms` milliseconds at `micros_per_gpu_hour` per unit
/// and a price multiplier in thousandths, in micro-units, rounded half away from zero once at
/// the end. The product is taken in `i128`, where it cannot overflow.
pub fn cost_micros(gpus: i32, ms: i64, micros_per_gpu_hour: i64, multiplier_milli: i32) -> i64 {
    let numerator = i128::from(gpus) * i128::from(ms) * i128::from(micros_per_gpu_hour) * i128::from(multiplier_milli);
    let denominator = i128::from(HOUR_MS) * 1000;
    let rounded = (numerator.abs() + denominator / 2) / denominator;
    let signed = if numerator < 0 { -rounded } else { rounded };
    i64::try_from(signed).unwrap_or(if signed < 0 { i64::MIN } else { i64::MAX })
}

/// Formats integer micro-units as a decimal with six places (`12.500000`): exact, for exports.
pub fn micros_decimal(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let abs = micros.unsigned_abs();
    format!("{sign}{}.{:06}", abs / 1_000_000, abs % 1_000_000)
}

/// Formats GPU-milli-milliseconds as GPU-hours with nine decimal places. A GPU-hour is
/// 3.6 × 10^9 of these units, which no decimal expresses exactly; the exact integer travels
/// beside it in every export (`x_GpuMilliMs`), and nine places keep every piece within half a
/// nanohour of the truth.
pub fn gpu_hours_decimal(gpu_milli_ms: i64) -> String {
    const SCALE: i128 = 1_000_000_000;
    let units = i128::from(gpu_milli_ms);
    let denominator = i128::from(HOUR_MS) * 1000;
    let scaled = (units.abs() * SCALE + denominator / 2) / denominator;
    let sign = if units < 0 && scaled != 0 { "-" } else { "" };
    format!("{sign}{}.{:09}", scaled / SCALE, scaled % SCALE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR_MS;

    #[test]
    fn an_interval_is_cut_at_every_hour_without_losing_a_millisecond() {
        let start = 5 * H - 1;
        let end = 7 * H + 1;
        let p = pieces(start, end, &[RateChange { from_ms: 0, micros_per_gpu_hour: 10 }]);
        let spans: Vec<(i64, i64)> = p.iter().map(|p| (p.start_ms, p.end_ms)).collect();
        assert_eq!(spans, vec![(5 * H - 1, 5 * H), (5 * H, 6 * H), (6 * H, 7 * H), (7 * H, 7 * H + 1)]);
        assert_eq!(p.iter().map(Piece::duration_ms).sum::<i64>(), end - start);
    }

    #[test]
    fn a_rate_change_cuts_the_piece_and_each_side_keeps_its_price() {
        let rates = [
            RateChange { from_ms: 0, micros_per_gpu_hour: 2_000_000 },
            RateChange { from_ms: H + 1_800_000, micros_per_gpu_hour: 3_000_000 },
        ];
        let p = pieces(H, 2 * H, &rates);
        assert_eq!(
            p,
            vec![
                Piece { start_ms: H, end_ms: H + 1_800_000, micros_per_gpu_hour: 2_000_000 },
                Piece { start_ms: H + 1_800_000, end_ms: 2 * H, micros_per_gpu_hour: 3_000_000 },
            ]
        );
    }

    #[test]
    fn time_before_the_first_rate_is_free_and_an_empty_interval_has_no_pieces() {
        let p = pieces(0, 10, &[RateChange { from_ms: 5, micros_per_gpu_hour: 7 }]);
        assert_eq!(p[0].micros_per_gpu_hour, 0);
        assert_eq!(p[1].micros_per_gpu_hour, 7);
        assert!(pieces(10, 10, &[]).is_empty());
    }

    #[test]
    fn cost_is_exact_for_whole_hours_and_rounds_half_away_from_zero() {
        // Two GPUs for an hour at $2.50 and a 1.5 multiplier: $7.50.
        assert_eq!(cost_micros(2, H, 2_500_000, 1500), 7_500_000);
        // One GPU for 1 ms at $1/h: 0.2777... micros rounds to 0; 2 ms to 1 (0.555...).
        assert_eq!(cost_micros(1, 1, 1_000_000, 1000), 0);
        assert_eq!(cost_micros(1, 2, 1_000_000, 1000), 1);
        assert_eq!(cost_micros(1, -2, 1_000_000, 1000), -1);
        // A month of 65,536 GPUs at $100/h does not overflow.
        assert_eq!(cost_micros(65_536, 31 * 24 * H, 100_000_000, 1000), 65_536 * 31 * 24 * 100_000_000);
    }

    #[test]
    fn gpu_time_counts_mig_slices_by_their_fraction() {
        // Three 3g.40gb slices (3/7 of a GPU, 428 thousandths) for a minute.
        assert_eq!(gpu_milli_ms(3, 428, 60_000), 3 * 428 * 60_000);
    }

    #[test]
    fn decimals_are_exact_for_money_and_rounded_to_nine_places_for_hours() {
        assert_eq!(micros_decimal(12_500_000), "12.500000");
        assert_eq!(micros_decimal(-1), "-0.000001");
        assert_eq!(micros_decimal(0), "0.000000");
        assert_eq!(gpu_hours_decimal(1000 * H), "1.000000000");
        assert_eq!(gpu_hours_decimal(-1000 * H / 2), "-0.500000000");
        assert_eq!(gpu_hours_decimal(1), "0.000000000");
    }

    #[test]
    fn hours_floor_towards_the_past_even_before_the_epoch() {
        assert_eq!(hour_floor(H + 5), H);
        assert_eq!(hour_floor(-1), -H);
    }
}
