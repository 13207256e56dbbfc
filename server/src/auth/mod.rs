//! Who is calling: users with passwords and short-lived JWT access tokens, and API tokens
//! for CI pipelines scoped to one team. What they may do is decided by [`policy`].

pub mod api_token;
pub mod jwt;
pub mod password;
pub mod policy;

use axum::http::{header, HeaderMap};
use uuid::Uuid;

use crate::{
    api::error::ApiError,
    app::AppState,
    db,
    domain::{PlatformRole, TeamRole},
};

/// An authenticated caller.
#[derive(Debug, Clone)]
pub enum Principal {
    /// A person, signed in with a password.
    User { id: Uuid, username: String, platform_role: Option<PlatformRole> },
    /// A CI pipeline's API token: one team, one role.
    Token { id: Uuid, name: String, team_id: Uuid, team: String, role: TeamRole },
}

impl Principal {
    /// A stable key scoping idempotency records to this caller.
    pub fn key(&self) -> String {
        match self {
            Principal::User { id, .. } => format!("user:{id}"),
            Principal::Token { id, .. } => format!("token:{id}"),
        }
    }

    /// How the audit log names this caller.
    pub fn actor(&self) -> String {
        match self {
            Principal::User { username, .. } => format!("user:{username}"),
            Principal::Token { name, id, team, .. } => format!("token:{team}/{name} ({id})"),
        }
    }

    /// The caller's platform role, if any.
    pub fn platform_role(&self) -> Option<PlatformRole> {
        match self {
            Principal::User { platform_role, .. } => *platform_role,
            Principal::Token { .. } => None,
        }
    }

    /// True for platform admins.
    pub fn is_platform_admin(&self) -> bool {
        self.platform_role() == Some(PlatformRole::PlatformAdmin)
    }
}

/// Who a request comes from.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub principal: Principal,
    /// An API token's team, read together with the token.
    pub token_team: Option<db::teams::TeamRow>,
    /// The submission catalogue's version, read together with an API token.
    pub catalogue_version: Option<i64>,
}

/// The submission catalogue's version as of this request's authentication, when it was read
/// then (API tokens); handlers that validate against the catalogue use a cached copy of
/// that version instead of reading it again.
#[derive(Debug, Clone, Copy)]
pub struct CatalogueVersion(pub Option<i64>);

/// Authenticates the request's bearer credential. `Ok(None)` when there is none; 401 when
/// one is present but not valid (expired, revoked, forged, unknown).
pub async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Option<Authenticated>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| ApiError::Unauthenticated)?;
    let (scheme, credential) = value.split_once(' ').ok_or(ApiError::Unauthenticated)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthenticated);
    }
    let credential = credential.trim();
    if credential.starts_with(api_token::PREFIX) {
        let hash = api_token::parse(credential).ok_or(ApiError::Unauthenticated)?;
        let auth = db::tokens::authenticate(&state.db, &hash).await?.ok_or(ApiError::Unauthenticated)?;
        let role =
            TeamRole::parse(&auth.role).ok_or_else(|| ApiError::Internal(format!("bad token role {}", auth.role)))?;
        let principal = Principal::Token {
            id: auth.id,
            name: auth.name,
            team_id: auth.team.id,
            team: auth.team.name.clone(),
            role,
        };
        let catalogue_version = Some(auth.catalogue_version);
        return Ok(Some(Authenticated { principal, token_team: Some(auth.team), catalogue_version }));
    }
    let claims = state.keys.verify(credential).ok_or(ApiError::Unauthenticated)?;
    let user_id: Uuid = claims.sub.parse().map_err(|_| ApiError::Unauthenticated)?;
    // Read the user on every request: a disabled user or a changed role takes effect at
    // once, not when the token expires.
    let user = db::users::by_id(&state.db, user_id).await?.ok_or(ApiError::Unauthenticated)?;
    if user.disabled {
        return Err(ApiError::Unauthenticated);
    }
    let principal = Principal::User {
        id: user.id,
        username: user.username,
        platform_role: user.platform_role.as_deref().and_then(PlatformRole::parse),
    };
    Ok(Some(Authenticated { principal, token_team: None, catalogue_version: None }))
}
