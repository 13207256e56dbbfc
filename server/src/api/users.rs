//! Users, managed by platform admins.

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
    auth::Principal,
    db,
    ops::users::{self, NewUser, PasswordChange, UserPatch, UserView},
    state::AppState,
};

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
    let view = UserView::from(users::create(&state, &principal, &body).await?);
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

/// Changes a user's platform role, disabled flag or password. A user cannot remove their
/// own platform-admin role or disable themselves, so the platform always keeps an admin.
#[utoipa::path(
    patch, path = "/api/v1/users/{username}", tag = "users", operation_id = "update_user",
    params(("username" = String, Path, description = "User name")),
    request_body = UserPatch,
    responses((status = 200, body = UserView), (status = 404, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn update_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(username): Path<String>,
    ApiJson(body): ApiJson<UserPatch>,
) -> Result<Json<UserView>, ApiError> {
    let view = UserView::from(users::update(&state, &principal, &username, &body).await?);
    Ok(Json(view))
}

/// Changes the signed-in user's own password.
#[utoipa::path(
    post, path = "/api/v1/me/password", tag = "auth", operation_id = "change_password",
    request_body = PasswordChange,
    responses((status = 204), (status = 403, description = "API tokens have no password", body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn change_password(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<PasswordChange>,
) -> Result<StatusCode, ApiError> {
    users::change_password(&state, &principal, &body).await?;
    Ok(StatusCode::NO_CONTENT)
}
