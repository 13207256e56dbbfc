//! Budgets per team per calendar month.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};

use super::{
    error::ApiError,
    extract::{etag, ApiJson},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db,
    ops::{
        budgets::{self, BudgetSpec, BudgetView},
        Precondition,
    },
    state::AppState,
};

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
    Ok(Json(rows.into_iter().map(|r| budgets::view(r, &state.config.currency)).collect()))
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
    let row = budgets::put(&state, &principal, &access.team, &period, &if_match, &spec).await?;
    let currency = &state.config.currency;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    Ok((headers, Json(budgets::view(row, currency))))
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
    budgets::delete(&state, &principal, &access.team, &period, &if_match).await?;
    Ok(StatusCode::NO_CONTENT)
}
