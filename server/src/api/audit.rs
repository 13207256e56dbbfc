//! The audit log, readable by platform admins (everything) and team admins (their team).

use crate::domain::TeamId;
use axum::{extract::State, Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    error::ApiError,
    extract::{ListQuery, Page},
};
use crate::{
    auth::policy::TeamAccess,
    db::{self},
    domain::check_range,
    state::AppState,
};

/// One recorded change.
#[derive(Serialize, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who: `user:<name>` or `token:<team>/<name> (<id>)`.
    pub actor: String,
    /// What, e.g. `quota.put`.
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The object before the change; absent on create.
    #[schema(value_type = Option<Object>)]
    pub before: Option<serde_json::Value>,
    /// The object after the change; absent on delete.
    #[schema(value_type = Option<Object>)]
    pub after: Option<serde_json::Value>,
}

impl From<db::audit::AuditRow> for AuditEntry {
    fn from(r: db::audit::AuditRow) -> Self {
        Self {
            id: r.id,
            at: r.at,
            actor: r.actor,
            action: r.action,
            object_type: r.object_type,
            object_id: r.object_id,
            team: r.team,
            before: r.before,
            after: r.after,
        }
    }
}

/// Paging through the log, newest first.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Items per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Opaque cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

async fn page(state: &AppState, team: Option<TeamId>, params: AuditParams) -> Result<Page<AuditEntry>, ApiError> {
    let limit = params.limit.unwrap_or(50);
    check_range("limit", limit, 1, 200)?;
    let before = match params.cursor {
        Some(c) => Some(c.parse::<i64>().map_err(|_| {
            ApiError::field(crate::domain::FieldError::new(
                "cursor",
                "invalid_value",
                "is not a cursor this API issued",
            ))
        })?),
        None => None,
    };
    let mut rows = db::audit::list(&state.db, team, before, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(|r| r.id.to_string()) } else { None };
    Ok(Page { items: rows.into_iter().map(AuditEntry::from).collect(), next_cursor })
}

/// Every change on the platform, newest first.
#[utoipa::path(
    get, path = "/api/v1/audit-log", tag = "audit", operation_id = "list_audit_log",
    params(AuditParams),
    responses((status = 200, body = Page<AuditEntry>))
)]
pub async fn list_audit_log(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<AuditParams>,
) -> Result<Json<Page<AuditEntry>>, ApiError> {
    Ok(Json(page(&state, None, params).await?))
}

/// Changes to one team's objects, newest first.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/audit-log", tag = "audit", operation_id = "list_team_audit_log",
    params(("team" = String, Path, description = "Team name"), AuditParams),
    responses((status = 200, body = Page<AuditEntry>))
)]
pub async fn list_team_audit_log(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<AuditParams>,
) -> Result<Json<Page<AuditEntry>>, ApiError> {
    Ok(Json(page(&state, Some(access.team.id), params).await?))
}
