//! Teams: the tenants, a tree addressed by name.

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    audit::record,
    error::{ApiError, OnConstraint as _},
    extract::{etag, ApiJson, IfMatch, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    app::AppState,
    auth::{policy::TeamAccess, Principal},
    db::{self, teams::TeamRow},
    domain::{DisplayText, FieldError, PlatformRole, TeamName, TeamRole},
};

/// A new team.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTeam {
    /// Unique name, a DNS label: lowercase letters, digits and `-`.
    pub name: String,
    /// The parent team's name; absent for a top-level team (a department or a company).
    #[serde(default)]
    pub parent: Option<String>,
    /// Human-readable name.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// Changes to a team.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamPatch {
    /// Human-readable name.
    pub display_name: Option<String>,
}

/// A team.
#[derive(Serialize, ToSchema)]
pub struct TeamView {
    pub id: Uuid,
    pub name: String,
    /// The parent team's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub display_name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Changes with every update; sent as the `ETag`.
    pub version: i64,
}

impl From<TeamRow> for TeamView {
    fn from(row: TeamRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            parent: row.parent,
            display_name: row.display_name,
            created_at: row.created_at,
            updated_at: row.updated_at,
            version: row.version,
        }
    }
}

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
    let row = create(&state, &principal, &body).await?;
    let (headers, body) = with_etag(row);
    Ok((StatusCode::CREATED, headers, body))
}

/// Creates a team, audited; the API and the portal's admin page both call this.
pub async fn create(state: &AppState, principal: &Principal, body: &NewTeam) -> Result<TeamRow, ApiError> {
    let name = TeamName::parse("name", &body.name)?;
    let display = DisplayText::parse("display_name", body.display_name.as_deref().unwrap_or(""), 200)?;
    let parent = match &body.parent {
        Some(p) => {
            let p = TeamName::parse("parent", p)?;
            let row = db::teams::by_name(&state.db, p.as_str()).await?.ok_or_else(|| {
                ApiError::field(FieldError::new("parent", "not_found", format!("team {p} does not exist")))
            })?;
            Some(row)
        }
        None => None,
    };
    let mut tx = state.db.begin().await?;
    if let Some(p) = &parent {
        // The parent must still exist when we commit.
        db::teams::lock(&mut tx, p.id).await?.ok_or_else(|| {
            ApiError::field(FieldError::new("parent", "not_found", format!("team {} does not exist", p.name)))
        })?;
    }
    let row = db::teams::insert(&mut tx, name.as_str(), parent.as_ref().map(|p| p.id), display.as_str())
        .await
        .on_constraint("teams_name_key", || {
            ApiError::conflict("team_exists", Some("name"), format!("team {name} already exists"))
        })?;
    record(
        &mut tx,
        principal,
        "team.create",
        "team",
        name.as_str(),
        Some(row.id),
        None::<&()>,
        Some(&TeamView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
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
    if_match: IfMatch,
    ApiJson(body): ApiJson<TeamPatch>,
) -> Result<(HeaderMap, Json<TeamView>), ApiError> {
    let before = access.team;
    let display = match &body.display_name {
        Some(d) => DisplayText::parse("display_name", d, 200)?,
        None => DisplayText::parse("display_name", &before.display_name, 200)?,
    };
    let mut tx = state.db.begin().await?;
    let version = db::teams::lock(&mut tx, before.id).await?.ok_or(ApiError::NotFound("team"))?;
    if_match.check(version)?;
    let row = db::teams::update(&mut tx, before.id, display.as_str()).await?;
    record(
        &mut tx,
        &principal,
        "team.update",
        "team",
        &row.name,
        Some(row.id),
        Some(&TeamView::from(before)),
        Some(&TeamView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
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
    if_match: IfMatch,
) -> Result<StatusCode, ApiError> {
    let team = access.team;
    let mut tx = state.db.begin().await?;
    let version = db::teams::lock(&mut tx, team.id).await?.ok_or(ApiError::NotFound("team"))?;
    if_match.check(version)?;
    if db::teams::has_children(&mut tx, team.id).await? {
        return Err(ApiError::conflict(
            "team_has_children",
            None,
            format!("team {} has child teams; delete them first", team.name),
        ));
    }
    db::teams::delete(&mut tx, team.id).await.on_constraint("teams_parent_id_fkey", || {
        ApiError::conflict("team_has_children", None, "the team has child teams")
    })?;
    record(
        &mut tx,
        &principal,
        "team.delete",
        "team",
        &team.name,
        Some(team.id),
        Some(&TeamView::from(team.clone())),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A member of a team.
#[derive(Serialize, ToSchema)]
pub struct MemberView {
    pub username: String,
    pub role: TeamRole,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<db::members::MemberRow> for MemberView {
    fn from(row: db::members::MemberRow) -> Self {
        Self {
            username: row.username,
            role: TeamRole::parse(&row.role).unwrap_or(TeamRole::Viewer),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// A member's role.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberRole {
    /// The role in the team.
    pub role: TeamRole,
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
    Ok(Json(set_member(&state, &principal, &access.team, &username, body.role).await?))
}

/// Adds `username` to `team` with `role`, or changes their role, audited.
pub async fn set_member(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    username: &str,
    role: TeamRole,
) -> Result<MemberView, ApiError> {
    let username = crate::domain::Username::parse("username", username)?;
    let user = db::users::by_username(&state.db, username.as_str()).await?.ok_or_else(|| {
        ApiError::field(FieldError::new("username", "not_found", format!("user {username} does not exist")))
    })?;
    let mut tx = state.db.begin().await?;
    let before = db::members::get_for_update(&mut tx, team.id, user.id).await?;
    let row = db::members::upsert(&mut tx, team.id, user.id, role.as_str()).await?;
    let object = format!("{}/{}", team.name, username);
    record(
        &mut tx,
        principal,
        "member.put",
        "member",
        &object,
        Some(team.id),
        before.map(MemberView::from).as_ref(),
        Some(&MemberView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(MemberView::from(row))
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
    remove_member(&state, &principal, &access.team, &username).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes `username` from `team`, audited.
pub async fn remove_member(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    username: &str,
) -> Result<(), ApiError> {
    let user = db::users::by_username(&state.db, username).await?.ok_or(ApiError::NotFound("member"))?;
    let mut tx = state.db.begin().await?;
    let before = db::members::get_for_update(&mut tx, team.id, user.id).await?.ok_or(ApiError::NotFound("member"))?;
    db::members::delete(&mut tx, team.id, user.id).await?;
    let object = format!("{}/{}", team.name, username);
    record(
        &mut tx,
        principal,
        "member.delete",
        "member",
        &object,
        Some(team.id),
        Some(&MemberView::from(before)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
