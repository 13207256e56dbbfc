//! Signing in and finding out who you are.

use axum::{extract::State, Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    error::ApiError,
    extract::{ApiJson, ClientAddress},
};
use crate::{
    auth::Principal,
    domain::{PlatformRole, TeamRole},
    ops,
    state::AppState,
};

/// Credentials of a user.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The user's name.
    pub username: String,
    /// The user's password.
    pub password: String,
}

/// A short-lived access token.
#[derive(Serialize, ToSchema)]
pub struct TokenResponse {
    /// The JWT to send as `Authorization: Bearer <token>`.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Seconds until the token expires.
    pub expires_in: u64,
}

/// Exchanges a username and password for an access token.
#[utoipa::path(
    post, path = "/api/v1/auth/token", tag = "auth", operation_id = "create_access_token",
    request_body = TokenRequest,
    responses(
        (status = 200, description = "Signed in", body = TokenResponse),
        (status = 401, description = "Unknown user or wrong password (`invalid_credentials`)", body = super::error::Problem),
        (status = 429, description = "Too many failed sign-ins for this username from this address (`too_many_attempts`); \
                                      `Retry-After` says when to try again", body = super::error::Problem),
        (status = 422, description = "Malformed request", body = super::error::Problem),
    ),
    security(())
)]
pub async fn create_access_token(
    State(state): State<AppState>,
    client: ClientAddress,
    ApiJson(body): ApiJson<TokenRequest>,
) -> Result<Json<TokenResponse>, ApiError> {
    let user = ops::sign_in::verify(&state, &body.username, body.password, &client.0, ops::sign_in::Via::Api).await?;
    let token = state.keys.issue(user.id, chrono::Utc::now().timestamp());
    tracing::info!(user.name = %user.username, "access token issued");
    Ok(Json(TokenResponse { access_token: token, token_type: "Bearer", expires_in: state.keys.ttl().as_secs() }))
}

/// The caller as the service sees it.
#[derive(Serialize, ToSchema)]
pub struct Me {
    /// `user` or `token`.
    pub kind: &'static str,
    /// The user's name or the token's name.
    pub name: String,
    /// Platform role of a user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_role: Option<PlatformRole>,
    /// The team an API token is scoped to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The role of an API token in its team.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<TeamRole>,
}

/// Describes the authenticated caller.
#[utoipa::path(
    get, path = "/api/v1/me", tag = "auth", operation_id = "get_me",
    responses((status = 200, description = "The caller", body = Me), (status = 401, body = super::error::Problem))
)]
pub async fn get_me(Extension(principal): Extension<Principal>) -> Json<Me> {
    Json(match principal {
        Principal::User { username, platform_role, .. } => {
            Me { kind: "user", name: username, platform_role, team: None, role: None }
        }
        Principal::Token { name, team, role, .. } => {
            Me { kind: "token", name, platform_role: None, team: Some(team), role: Some(role) }
        }
    })
}
