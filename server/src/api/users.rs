//! Users, managed by platform admins.

use axum::{extract::State, http::StatusCode, Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    error::{ApiError, OnConstraint as _},
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    app::AppState,
    auth::{password, Principal},
    db::{self, audit::Change, users::UserRow},
    domain::{Password, PlatformRole, Username},
};

/// A new user.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Login name: lowercase letters, digits, `-`, `.`, `_`.
    pub username: String,
    /// At least 12 characters.
    pub password: String,
    /// A platform-wide role, if any.
    #[serde(default)]
    pub platform_role: Option<PlatformRole>,
}

/// A user.
#[derive(Serialize, ToSchema)]
pub struct UserView {
    pub id: Uuid,
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_role: Option<PlatformRole>,
    pub disabled: bool,
    pub created_at: DateTime<Utc>,
}

impl From<UserRow> for UserView {
    fn from(row: UserRow) -> Self {
        Self {
            id: row.id,
            username: row.username,
            platform_role: row.platform_role.as_deref().and_then(PlatformRole::parse),
            disabled: row.disabled,
            created_at: row.created_at,
        }
    }
}

/// Creates a user.
#[utoipa::path(
    post, path = "/api/v1/users", tag = "users", operation_id = "create_user",
    request_body = NewUser,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    responses(
        (status = 201, body = UserView),
        (status = 409, description = "Username taken", body = super::error::Problem),
        (status = 422, body = super::error::Problem),
    )
)]
pub async fn create_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<NewUser>,
) -> Result<(StatusCode, Json<UserView>), ApiError> {
    let username = Username::parse("username", &body.username)?;
    let password = Password::parse("password", &body.password)?;
    let hash = tokio::task::spawn_blocking(move || password::hash(password.expose()))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut tx = state.db.begin().await?;
    let user = db::users::insert(&mut tx, username.as_str(), &hash, body.platform_role.map(|r| r.as_str()))
        .await
        .on_constraint("users_username_key", || {
            ApiError::conflict("username_taken", Some("username"), format!("user {username} already exists"))
        })?;
    let view = UserView::from(user);
    db::audit::record(
        &mut tx,
        Change {
            actor: &principal.actor(),
            action: "user.create",
            object_type: "user",
            object_id: username.as_str(),
            team_id: None,
            before: None,
            after: Some(serde_json::to_value(&view).unwrap_or_default()),
        },
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Lists users by name.
#[utoipa::path(
    get, path = "/api/v1/users", tag = "users", operation_id = "list_users",
    params(PageParams),
    responses((status = 200, body = Page<UserView>))
)]
pub async fn list_users(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<UserView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::users::list(&state.db, page.after.as_deref(), page.fetch()).await?;
    Ok(Json(page.page(rows, |u| u.username.clone(), UserView::from)))
}
