//! Ledger integers rounded once for people: money to the cent, GPU time to hundredths of a
//! GPU-hour, half away from zero. Pages and sentences (a waiting job's reason) use these;
//! exports and the API keep the ledger's full precision ([`super::micros_decimal`],
//! [`super::gpu_hours_decimal`]). A total is the rounding of the exact sum, so it agrees to
//! the cent with the same sum taken from an export.

use super::HOUR_MS;

/// Micro-units in a cent.
const MICROS_PER_CENT: i128 = 10_000;
/// GPU-milli-milliseconds in a hundredth of a GPU-hour.
const UNITS_PER_CENTI_HOUR: i128 = HOUR_MS as i128 * 1000 / 100;

/// `n / d` rounded half away from zero (`d` positive).
fn rounded(n: i128, d: i128) -> i128 {
    let r = (n.abs() + d / 2) / d;
    if n < 0 {
        -r
    } else {
        r
    }
}

/// Hundredths as a decimal with two places, `-` only when it is not zero.
fn hundredths(v: i128) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let abs = v.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

/// Micro-units to the cent, without currency: `12.35`.
pub fn cents(micros: i64) -> String {
    hundredths(rounded(i128::from(micros), MICROS_PER_CENT))
}

/// GPU time (GPU-milli-milliseconds, the ledger's unit) as GPU-hours with two places: `3.25`.
pub fn gpu_hours(gpu_milli_ms: i64) -> String {
    hundredths(rounded(i128::from(gpu_milli_ms), UNITS_PER_CENTI_HOUR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_is_rounded_to_the_cent_half_away_from_zero() {
        assert_eq!(cents(27_234_999), "27.23");
        assert_eq!(cents(27_235_000), "27.24");
        assert_eq!(cents(0), "0.00");
        assert_eq!(cents(4_999), "0.00");
        assert_eq!(cents(5_000), "0.01");
        assert_eq!(cents(-1_005_000), "-1.01");
        assert_eq!(cents(-4_999), "0.00");
    }

    #[test]
    fn gpu_hours_are_shown_with_two_decimals() {
        let hour = HOUR_MS * 1000;
        assert_eq!(gpu_hours(hour), "1.00");
        assert_eq!(gpu_hours(hour * 64 / 100), "0.64");
        // A third of a GPU-hour.
        assert_eq!(gpu_hours(hour / 3), "0.33");
        assert_eq!(gpu_hours(hour * 2 / 3), "0.67");
        assert_eq!(gpu_hours(0), "0.00");
    }
}
