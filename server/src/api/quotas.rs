//! Quotas per team per GPU class: `reserved` (guaranteed), `burst` (how many more the team
//! may borrow) and `lendable` (how much of `reserved` others may borrow while idle).

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
    db::{self},
    ops::{
        self,
        quotas::{self, QuotaResult, QuotaSpec, QuotaView},
        Precondition,
    },
    state::AppState,
};

/// Lists a team's quotas.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/quotas", tag = "quotas", operation_id = "list_quotas",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Vec<QuotaView>))
)]
pub async fn list_quotas(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
) -> Result<Json<Vec<QuotaView>>, ApiError> {
    let rows = db::quotas::list(&state.db, access.team.id).await?;
    Ok(Json(rows.into_iter().map(QuotaView::from).collect()))
}

/// Reads a team's quota for one GPU class.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "get_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = QuotaView), (status = 404, body = super::error::Problem))
)]
pub async fn get_quota(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<(HeaderMap, Json<QuotaView>), ApiError> {
    let (_, class) = path;
    let class = ops::gpu_classes::find(&state, &class).await?;
    let row = db::quotas::get(&state.db, access.team.id, class.id).await?.ok_or(ApiError::NotFound("quota"))?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    Ok((headers, Json(QuotaView::from(row))))
}

/// Sets a team's quota for one GPU class. Children's reserved quota never exceeds their
/// parent's; reserving more than the platform's known capacity is allowed with a warning.
/// Honours `If-Match`.
#[utoipa::path(
    put, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "put_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = QuotaSpec,
    responses((status = 200, body = QuotaResult), (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn put_quota(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
    ApiJson(spec): ApiJson<QuotaSpec>,
) -> Result<(HeaderMap, Json<QuotaResult>), ApiError> {
    let (_, class_name) = path;
    let result = quotas::set(&state, &principal, access.team, &class_name, &spec, &if_match).await?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(result.quota.version));
    Ok((headers, Json(result)))
}

/// Removes a team's quota for one GPU class; refused while child teams reserve some.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "delete_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 204), (status = 404, body = super::error::Problem), (status = 409, body = super::error::Problem))
)]
pub async fn delete_quota(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
) -> Result<StatusCode, ApiError> {
    let (_, class_name) = path;
    quotas::delete(&state, &principal, &access.team, &class_name, &if_match).await?;
    Ok(StatusCode::NO_CONTENT)
}
