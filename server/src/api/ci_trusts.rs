//! A team's CI trust policies: which CI issuer's ID tokens the team exchanges for short-lived
//! API tokens (`POST /api/v1/auth/token-exchange`).

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Extension, Json,
};

use super::{
    error::ApiError,
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db,
    ops::ci_trusts::{self, CiTrustView, NewCiTrust},
    state::AppState,
};

/// Lists the team's CI trust policies in name order.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/ci-trusts", tag = "ci-trusts", operation_id = "list_ci_trusts",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<CiTrustView>))
)]
pub async fn list_ci_trusts(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<CiTrustView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::ci_trusts::list(&state.db, access.team.id, page.after.as_deref(), page.fetch()).await?;
    Ok(Json(page.page(rows, |t| t.name.clone(), CiTrustView::from)))
}

/// Creates a CI trust policy: the team's pipelines on the named CI issuer whose ID tokens
/// carry the audience and match every condition may exchange them for API tokens of the team
/// with the policy's role, living `token_ttl_seconds`. The issuer must be one of the
/// server's `[[ci_issuers]]`; at least one condition is required.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/ci-trusts", tag = "ci-trusts", operation_id = "create_ci_trust",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewCiTrust,
    responses((status = 201, body = CiTrustView), (status = 409, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn create_ci_trust(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    ApiJson(body): ApiJson<NewCiTrust>,
) -> Result<(StatusCode, Json<CiTrustView>), ApiError> {
    let view = ci_trusts::create(&state, &principal, &access.team, &body).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// A CI trust policy.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/ci-trusts/{trust}", tag = "ci-trusts", operation_id = "get_ci_trust",
    params(("team" = String, Path, description = "Team name"), ("trust" = String, Path, description = "Policy name")),
    responses((status = 200, body = CiTrustView), (status = 404, body = super::error::Problem))
)]
pub async fn get_ci_trust(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<Json<CiTrustView>, ApiError> {
    let (_, name) = path;
    Ok(Json(ci_trusts::get(&state, &access.team, &name).await?.into()))
}

/// Deletes a CI trust policy; the tokens exchanged under it that still live are revoked with it.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/ci-trusts/{trust}", tag = "ci-trusts", operation_id = "delete_ci_trust",
    params(("team" = String, Path, description = "Team name"), ("trust" = String, Path, description = "Policy name")),
    responses((status = 204), (status = 404, body = super::error::Problem))
)]
pub async fn delete_ci_trust(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (_, name) = path;
    ci_trusts::delete(&state, &principal, &access.team, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
