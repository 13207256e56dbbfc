//! Idle policies: what the platform does with jobs whose GPUs stay idle.

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Extension, Json,
};

use super::{error::ApiError, extract::ApiJson};
use crate::{
    auth::{policy::TeamAccess, Principal},
    domain::IdlePolicyId,
    ops::idle_policies::{self, GoverningPolicy, IdlePolicySpec, IdlePolicyView},
    state::AppState,
};

/// Lists the idle policies: the platform's (no team), then each team's.
#[utoipa::path(
    get, path = "/api/v1/idle-policies", tag = "idle-policies", operation_id = "list_idle_policies",
    responses((status = 200, body = Vec<IdlePolicyView>), (status = 403, body = super::error::Problem))
)]
pub async fn list_idle_policies(State(state): State<AppState>) -> Result<Json<Vec<IdlePolicyView>>, ApiError> {
    Ok(Json(idle_policies::list(&state).await?))
}

/// Sets the idle policy of a scope (a team or every team, a priority class or every class),
/// replacing the one it had. A job is idle while its GPUs' SM activity (DCGM) stays below
/// `below_sm_active_percent`; after `idle_seconds` it is warned (a `idle` event, webhook
/// `job.idle`), and `notice_seconds` later the policy stops or preempts it with its grace
/// period, reason `idle`, unless its GPUs got busy. The most specific policy governs a job;
/// `exempt` opts its jobs out.
#[utoipa::path(
    put, path = "/api/v1/idle-policies", tag = "idle-policies", operation_id = "set_idle_policy",
    request_body = IdlePolicySpec,
    responses((status = 200, body = IdlePolicyView), (status = 403, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn set_idle_policy(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(spec): ApiJson<IdlePolicySpec>,
) -> Result<Json<IdlePolicyView>, ApiError> {
    Ok(Json(idle_policies::set(&state, &principal, &spec).await?))
}

/// What happens to the team's jobs whose GPUs stay idle: for each priority class, the idle
/// policy that governs them (the most specific of the team's and the platform's), in words.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/idle-policies", tag = "idle-policies", operation_id = "list_team_idle_policies",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Vec<GoverningPolicy>), (status = 404, body = super::error::Problem))
)]
pub async fn list_team_idle_policies(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
) -> Result<Json<Vec<GoverningPolicy>>, ApiError> {
    Ok(Json(idle_policies::governing_for_team(&state, access.team.id).await?))
}

/// Removes an idle policy.
#[utoipa::path(
    delete, path = "/api/v1/idle-policies/{policy}", tag = "idle-policies", operation_id = "delete_idle_policy",
    params(("policy" = Uuid, Path, description = "Idle policy id")),
    responses((status = 204), (status = 403, body = super::error::Problem), (status = 404, body = super::error::Problem))
)]
pub async fn delete_idle_policy(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(policy): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id: IdlePolicyId = policy.parse().map_err(|_| ApiError::NotFound("idle policy"))?;
    idle_policies::delete(&state, &principal, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
