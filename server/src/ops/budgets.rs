//! Budgets per team per calendar month.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Precondition, Result};
use crate::{
    auth::Principal,
    db::{self, budgets::BudgetRow, teams::TeamRow},
    domain::{check_range, BudgetPeriod, BudgetUnit, Enforcement, MAX_BUDGET_AMOUNT},
    state::AppState,
};

/// A budget to set.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// What `amount` counts.
    pub unit: BudgetUnit,
    /// GPU-hours, or micro-units of the platform currency.
    #[schema(minimum = 0, maximum = 1e15)]
    pub amount: i64,
    /// `hard`: admission stops when spent; `soft`: alerts only.
    pub enforcement: Enforcement,
}

/// A team's budget for one month.
#[derive(Serialize, ToSchema)]
pub struct BudgetView {
    /// The month, `YYYY-MM`.
    pub period: String,
    pub unit: BudgetUnit,
    pub amount: i64,
    pub enforcement: Enforcement,
    /// ISO 4217 currency of a money budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// The budget as the API shows it, money in `currency`.
pub fn view(r: BudgetRow, currency: &str) -> BudgetView {
    let unit = BudgetUnit::parse(&r.unit).unwrap_or(BudgetUnit::Money);
    BudgetView {
        period: BudgetPeriod::from_date(r.period).to_string(),
        unit,
        amount: r.amount,
        enforcement: Enforcement::parse(&r.enforcement).unwrap_or(Enforcement::Soft),
        currency: (unit == BudgetUnit::Money).then(|| currency.to_owned()),
        created_at: r.created_at,
        updated_at: r.updated_at,
        version: r.version,
    }
}

/// Sets `team`'s budget for the month `period` (`YYYY-MM`), audited.
pub async fn put(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    period: &str,
    precondition: &Precondition,
    spec: &BudgetSpec,
) -> Result<BudgetRow> {
    let period = BudgetPeriod::parse("period", period)?;
    check_range("amount", spec.amount, 0, MAX_BUDGET_AMOUNT)?;
    let mut tx = state.db.begin().await?;
    let before = db::budgets::get_for_update(&mut tx, team.id, period.first_day()).await?;
    precondition.check(before.as_ref().map_or(0, |b| b.version))?;
    let row = db::budgets::upsert(
        &mut tx,
        team.id,
        period.first_day(),
        spec.unit.as_str(),
        spec.amount,
        spec.enforcement.as_str(),
    )
    .await?;
    let currency = &state.config.currency;
    let object = format!("{}/{period}", team.name);
    record(
        &mut tx,
        principal,
        "budget.put",
        "budget",
        &object,
        Some(team.id),
        before.map(|b| view(b, currency)).as_ref(),
        Some(&view(row.clone(), currency)),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Removes `team`'s budget for the month `period`, audited.
pub async fn delete(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    period: &str,
    precondition: &Precondition,
) -> Result<()> {
    let period = BudgetPeriod::parse("period", period)?;
    let mut tx = state.db.begin().await?;
    let before =
        db::budgets::get_for_update(&mut tx, team.id, period.first_day()).await?.ok_or(Error::NotFound("budget"))?;
    precondition.check(before.version)?;
    db::budgets::delete(&mut tx, team.id, period.first_day()).await?;
    let object = format!("{}/{period}", team.name);
    record(
        &mut tx,
        principal,
        "budget.delete",
        "budget",
        &object,
        Some(team.id),
        Some(&view(before, &state.config.currency)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
