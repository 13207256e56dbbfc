//! Budgets per team per calendar month.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    error::ApiError,
    extract::{etag, ApiJson},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db::{self, budgets::BudgetRow},
    domain::{check_range, BudgetPeriod, BudgetUnit, Enforcement, MAX_BUDGET_AMOUNT},
    ops::{audit::record, Precondition},
    state::AppState,
};

/// A budget to set.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// What `amount` counts.
    pub unit: BudgetUnit,
    /// GPU-hours, or micro-units of the platform currency.
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

fn view(r: BudgetRow, currency: &str) -> BudgetView {
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

/// Lists a team's budgets, newest month first.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/budgets", tag = "budgets", operation_id = "list_budgets",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Vec<BudgetView>))
)]
pub async fn list_budgets(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
) -> Result<Json<Vec<BudgetView>>, ApiError> {
    let rows = db::budgets::list(&state.db, access.team.id).await?;
    Ok(Json(rows.into_iter().map(|r| view(r, &state.config.currency)).collect()))
}

/// Sets a team's budget for a month (`YYYY-MM`). Honours `If-Match`.
#[utoipa::path(
    put, path = "/api/v1/teams/{team}/budgets/{period}", tag = "budgets", operation_id = "put_budget",
    params(("team" = String, Path, description = "Team name"), ("period" = String, Path, description = "Month, YYYY-MM"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = BudgetSpec,
    responses((status = 200, body = BudgetView), (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn put_budget(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
    ApiJson(spec): ApiJson<BudgetSpec>,
) -> Result<(HeaderMap, Json<BudgetView>), ApiError> {
    let (_, period) = path;
    let period = BudgetPeriod::parse("period", &period)?;
    check_range("amount", spec.amount, 0, MAX_BUDGET_AMOUNT)?;
    let team = access.team;
    let mut tx = state.db.begin().await?;
    let before = db::budgets::get_for_update(&mut tx, team.id, period.first_day()).await?;
    if_match.check(before.as_ref().map_or(0, |b| b.version))?;
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
        &principal,
        "budget.put",
        "budget",
        &object,
        Some(team.id),
        before.map(|b| view(b, currency)).as_ref(),
        Some(&view(row.clone(), currency)),
    )
    .await?;
    tx.commit().await?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    Ok((headers, Json(view(row, currency))))
}

/// Removes a team's budget for a month.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/budgets/{period}", tag = "budgets", operation_id = "delete_budget",
    params(("team" = String, Path, description = "Team name"), ("period" = String, Path, description = "Month, YYYY-MM")),
    responses((status = 204), (status = 404, body = super::error::Problem))
)]
pub async fn delete_budget(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
) -> Result<StatusCode, ApiError> {
    let (_, period) = path;
    let period = BudgetPeriod::parse("period", &period)?;
    let team = access.team;
    let mut tx = state.db.begin().await?;
    let before =
        db::budgets::get_for_update(&mut tx, team.id, period.first_day()).await?.ok_or(ApiError::NotFound("budget"))?;
    if_match.check(before.version)?;
    db::budgets::delete(&mut tx, team.id, period.first_day()).await?;
    let object = format!("{}/{period}", team.name);
    record(
        &mut tx,
        &principal,
        "budget.delete",
        "budget",
        &object,
        Some(team.id),
        Some(&view(before, &state.config.currency)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
