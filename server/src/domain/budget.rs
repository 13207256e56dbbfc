//! Budgets: a limit per team per calendar month.

use chrono::{Datelike as _, NaiveDate};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::FieldError;

/// Largest budget amount (GPU-hours or micro-units): a quadrillion, far above any real
/// budget and far below `i64::MAX`, so sums of many budgets cannot overflow.
pub const MAX_BUDGET_AMOUNT: i64 = 1_000_000_000_000_000;

/// A calendar month, written `YYYY-MM`, stored as its first day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BudgetPeriod(NaiveDate);

impl BudgetPeriod {
    /// Parses `YYYY-MM`.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        let bad = || FieldError::new(field, "invalid_format", "must be a month written YYYY-MM");
        let (y, m) = value.split_once('-').ok_or_else(bad)?;
        if y.len() != 4 || m.len() != 2 {
            return Err(bad());
        }
        let year: i32 = y.parse().map_err(|_| bad())?;
        let month: u32 = m.parse().map_err(|_| bad())?;
        if !(2000..=2999).contains(&year) {
            return Err(FieldError::new(field, "out_of_range", "year must be between 2000 and 2999"));
        }
        NaiveDate::from_ymd_opt(year, month, 1).map(Self).ok_or_else(bad)
    }

    /// From a stored first-of-month date.
    pub fn from_date(date: NaiveDate) -> Self {
        Self(date.with_day(1).unwrap_or(date))
    }

    /// The first day of the month.
    pub fn first_day(self) -> NaiveDate {
        self.0
    }
}

impl std::fmt::Display for BudgetPeriod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.0.year(), self.0.month())
    }
}

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetUnit {
    /// Whole GPU-hours (a MIG slice counts by its fraction).
    GpuHours,
    /// Micro-units of the platform currency.
    Money,
}

impl BudgetUnit {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetUnit::GpuHours => "gpu-hours",
            BudgetUnit::Money => "money",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gpu-hours" => Some(BudgetUnit::GpuHours),
            "money" => Some(BudgetUnit::Money),
            _ => None,
        }
    }
}

/// What happens when a budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    /// Admission stops.
    Hard,
    /// Alerts only.
    Soft,
}

impl Enforcement {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Hard => "hard",
            Enforcement::Soft => "soft",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "hard" => Some(Enforcement::Hard),
            "soft" => Some(Enforcement::Soft),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_calendar_months() {
        let p = BudgetPeriod::parse("period", "2026-11").unwrap();
        assert_eq!(p.first_day(), NaiveDate::from_ymd_opt(2026, 11, 1).unwrap());
        assert_eq!(p.to_string(), "2026-11");
        for bad in ["2026-13", "2026-1", "26-11", "2026/11", "", "2026-11-01"] {
            assert!(BudgetPeriod::parse("period", bad).is_err(), "{bad}");
        }
    }
}
