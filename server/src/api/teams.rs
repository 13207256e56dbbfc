//! Teams: the tenants, a tree addressed by name.

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db::{self, teams::TeamRow},
    domain::PlatformRole,
    ops::{
        teams::{self, MemberRole, MemberView, NewTeam, TeamPatch, TeamView},
        Precondition,
    },
    state::AppState,
};

fn with_etag(row: TeamRow) -> (HeaderMap, Json<TeamView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    (headers, Json(TeamView::from(row)))
}

/// Creates a team.
#[utoipa::path(
    post, path = "/api/v1/teams", tag = "teams", operation_id = "create_team",
    request_body = NewTeam,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    responses(
        (status = 201, body = TeamView),
        (status = 409, description = "Name taken", body = super::error::Problem),
        (status = 422, body = super::error::Problem),
    )
)]
pub async fn create_team(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<NewTeam>,
) -> Result<(StatusCode, HeaderMap, Json<TeamView>), ApiError> {
    let row = teams::create(&state, &principal, &body).await?;
    let (headers, body) = with_etag(row);
    Ok((StatusCode::CREATED, headers, body))
}

/// Lists the teams the caller can see: all of them for platform admins and finance, the
/// caller's teams and their descendants for others, the token's team for API tokens.
#[utoipa::path(
    get, path = "/api/v1/teams", tag = "teams", operation_id = "list_teams",
    params(PageParams),
    responses((status = 200, body = Page<TeamView>))
)]
pub async fn list_teams(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<TeamView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let after = page.after.as_deref();
    let rows = match &principal {
        Principal::User { platform_role: Some(PlatformRole::PlatformAdmin | PlatformRole::Finance), .. } => {
            db::teams::list_all(&state.db, after, page.fetch()).await?
        }
        Principal::User { id, .. } => db::teams::list_visible_to_user(&state.db, *id, after, page.fetch()).await?,
        Principal::Token { team, .. } => {
            let row = db::teams::by_name(&state.db, team).await?;
            row.into_iter().filter(|t| after.is_none_or(|a| t.name.as_str() > a)).collect()
        }
    };
    Ok(Json(page.page(rows, |t| t.name.clone(), TeamView::from)))
}

/// Reads a team.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}", tag = "teams", operation_id = "get_team",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = TeamView), (status = 404, body = super::error::Problem))
)]
pub async fn get_team(Extension(access): Extension<TeamAccess>) -> (HeaderMap, Json<TeamView>) {
    with_etag(access.team)
}

/// Changes a team's display name. Honours `If-Match`.
#[utoipa::path(
    patch, path = "/api/v1/teams/{team}", tag = "teams", operation_id = "update_team",
    params(("team" = String, Path, description = "Team name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = TeamPatch,
    responses((status = 200, body = TeamView), (status = 412, body = super::error::Problem))
)]
pub async fn update_team(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    if_match: Precondition,
    ApiJson(body): ApiJson<TeamPatch>,
) -> Result<(HeaderMap, Json<TeamView>), ApiError> {
    let row = teams::update(&state, &principal, access.team, &if_match, &body).await?;
    Ok(with_etag(row))
}

/// Deletes a team with no child teams, and everything it owns.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}", tag = "teams", operation_id = "delete_team",
    params(("team" = String, Path, description = "Team name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    responses((status = 204), (status = 409, description = "The team has child teams", body = super::error::Problem))
)]
pub async fn delete_team(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    if_match: Precondition,
) -> Result<StatusCode, ApiError> {
    teams::delete(&state, &principal, access.team, &if_match).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a team's members.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/members", tag = "teams", operation_id = "list_members",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<MemberView>))
)]
pub async fn list_members(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<MemberView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::members::list(&state.db, access.team.id, page.after.as_deref(), page.fetch()).await?;
    Ok(Json(page.page(rows, |m| m.username.clone(), MemberView::from)))
}

/// Adds a user to a team or changes their role.
#[utoipa::path(
    put, path = "/api/v1/teams/{team}/members/{username}", tag = "teams", operation_id = "put_member",
    params(("team" = String, Path, description = "Team name"), ("username" = String, Path, description = "User name")),
    request_body = MemberRole,
    responses((status = 200, body = MemberView), (status = 422, description = "No such user", body = super::error::Problem))
)]
pub async fn put_member(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    axum::extract::Path(path): axum::extract::Path<(String, String)>,
    ApiJson(body): ApiJson<MemberRole>,
) -> Result<Json<MemberView>, ApiError> {
    let (_, username) = path;
    Ok(Json(teams::set_member(&state, &principal, &access.team, &username, body.role).await?))
}

/// Removes a user from a team.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/members/{username}", tag = "teams", operation_id = "delete_member",
    params(("team" = String, Path, description = "Team name"), ("username" = String, Path, description = "User name")),
    responses((status = 204), (status = 404, body = super::error::Problem))
)]
pub async fn delete_member(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    axum::extract::Path(path): axum::extract::Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (_, username) = path;
    teams::remove_member(&state, &principal, &access.team, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}
