//! How pages write money and GPU time: money to the cent with its currency, GPU-hours to two
//! decimals, each rounded once from the ledger's exact integer (see `metering::figures`).

pub use crate::metering::figures::{cents, gpu_hours};

/// Micro-units as money on a page: `12.35 USD`.
pub fn money(micros: i64, currency: &str) -> String {
    format!("{} {currency}", cents(micros))
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
    fn money_carries_its_currency() {
        assert_eq!(money(27_234_999, "USD"), "27.23 USD");
        assert_eq!(money(0, "EUR"), "0.00 EUR");
    }

    #[test]
    fn a_budget_amount_is_shown_in_its_unit() {
        assert_eq!(in_budget_unit("gpu-hours", 40, "USD"), "40 GPU-hours");
        assert_eq!(in_budget_unit("money", 10_000_000, "USD"), "10.00 USD");
    }
}
