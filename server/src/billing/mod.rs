//! Billing: what the ledger ([`crate::metering`]) means in money and to whom.
//!
//! - [`budgets`]: spend to date, forecasts, alerts, and what hard budgets leave for admission;
//! - [`export`]: a billing period as CSV, JSON lines or FinOps FOCUS, streamed, with a control
//!   record, byte-identical for a closed period;
//! - [`statement`]: a team's monthly statement.
//!
//! Chargeback is by usage: a team pays for the GPU time its jobs ran, at the rate card's
//! price in force at the time, times its priority class's multiplier.

use chrono::NaiveDate;

pub mod budgets;
pub mod export;
pub mod statement;

/// `YYYY-MM` of a period's first day.
pub fn period_name(period: NaiveDate) -> String {
    crate::domain::BudgetPeriod::from_date(period).to_string()
}
