//! Billing periods: closing a month so that its export never changes again, and the control
//! record a finance team checks an export against.

use chrono::{NaiveDate, Utc};

use super::{audit::record, Error, Result};
use crate::{
    auth::Principal,
    billing::{
        self,
        budgets::period_bounds,
        export::{Control, ExportError, Format},
    },
    db,
    domain::{BudgetPeriod, FieldError},
    state::AppState,
};

/// Closes the billing period `period` (`YYYY-MM`), audited: from then on its export never
/// changes, and usage booked late for it lands in the next open period as a correction.
/// Periods close in order, once they are over. The period's first day.
pub async fn close_period(state: &AppState, principal: &Principal, period: &str) -> Result<NaiveDate> {
    let period = BudgetPeriod::parse("period", period)?.first_day();
    if period_bounds(period).1 > Utc::now() {
        return Err(Error::field(FieldError::new("period", "not_over", "a period closes only after it ends")));
    }
    let mut tx = state.db.begin().await?;
    match db::metering::close_period(&mut tx, period, &principal.actor()).await? {
        db::metering::ClosePeriod::Closed => {}
        db::metering::ClosePeriod::AlreadyClosed => {
            return Err(Error::conflict("period_closed", Some("period"), "the period is already closed"))
        }
        db::metering::ClosePeriod::EarlierOpen(earlier) => {
            return Err(Error::conflict(
                "earlier_period_open",
                Some("period"),
                format!("close {} first: periods close in order", billing::period_name(earlier)),
            ))
        }
    }
    let name = billing::period_name(period);
    record(&mut tx, principal, "billing_period.close", "billing_period", &name, None, None::<&()>, Some(&name)).await?;
    tx.commit().await?;
    Ok(period)
}

/// The control record of an export, with whether its period is closed: a closed period's
/// describes every download of it, an open one's the export as it is now.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ExportControl {
    /// Whether the period is closed (its export no longer changes).
    pub closed: bool,
    #[serde(flatten)]
    pub control: Control,
}

/// The control record of the export of `period` (`YYYY-MM`) in `format`.
pub async fn export_control(state: &AppState, period: &str, format: Format) -> Result<ExportControl> {
    let period = BudgetPeriod::parse("period", period)?.first_day();
    let closed = db::metering::period_closed(&state.db, period).await?;
    let control =
        billing::export::control(&state.db, period, format, &state.config.currency).await.map_err(|e| match e {
            ExportError::Db(e) => Error::from(e),
            // Nobody reads the bytes, so nobody can go away.
            closed @ ExportError::Closed => Error::internal("computing an export control record", closed),
        })?;
    Ok(ExportControl { closed, control })
}
