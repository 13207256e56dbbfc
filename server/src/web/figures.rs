//! How pages write money and GPU time: money to the cent with its currency, GPU-hours to two
//! decimals. Every page uses these; exports and the API keep the ledger's full precision
//! (`metering::micros_decimal`, `metering::gpu_hours_decimal`).
//!
//! Each figure is rounded once, from the exact integer the ledger holds, half away from
//! zero: a total is the rounding of the exact sum, so it agrees to the cent with the same
//! sum taken from an export.

use crate::metering::HOUR_MS;

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

/// Micro-units as money on a page: `12.35 USD`.
pub fn money(micros: i64, currency: &str) -> String {
    format!("{} {currency}", cents(micros))
}

/// Micro-units to the cent, without currency: `12.35`.
pub fn cents(micros: i64) -> String {
    hundredths(rounded(i128::from(micros), MICROS_PER_CENT))
}

/// GPU time (GPU-milli-milliseconds, the ledger's unit) as GPU-hours with two places: `3.25`.
pub fn gpu_hours(gpu_milli_ms: i64) -> String {
    hundredths(rounded(i128::from(gpu_milli_ms), UNITS_PER_CENTI_HOUR))
}

/// An amount in a budget's unit: whole GPU-hours for a `gpu-hours` budget, money otherwise.
pub fn in_budget_unit(unit: &str, amount: i64, currency: &str) -> String {
    match unit {
        "gpu-hours" => format!("{amount} GPU-hours"),
        _ => money(amount, currency),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_is_shown_to_the_cent_rounding_half_away_from_zero() {
        assert_eq!(money(27_234_999, "USD"), "27.23 USD");
        assert_eq!(money(27_235_000, "USD"), "27.24 USD");
        assert_eq!(money(0, "EUR"), "0.00 EUR");
        assert_eq!(money(4_999, "USD"), "0.00 USD");
        assert_eq!(money(5_000, "USD"), "0.01 USD");
        assert_eq!(money(-1_005_000, "USD"), "-1.01 USD");
        assert_eq!(money(-4_999, "USD"), "0.00 USD");
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

    #[test]
    fn a_budget_amount_is_shown_in_its_unit() {
        assert_eq!(in_budget_unit("gpu-hours", 40, "USD"), "40 GPU-hours");
        assert_eq!(in_budget_unit("money", 10_000_000, "USD"), "10.00 USD");
    }
}
