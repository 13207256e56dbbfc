//! Who is calling and whether they may: the middleware that authenticates every request
//! (password-session JWTs and API tokens, read from the database on every request but one)
//! and enforces the route's declared [`Policy`], putting the caller and the team or job it
//! acts on into the request's extensions for the handler.

use crate::domain::JobId;
use crate::domain::UserId;
use axum::{
    body::Body,
    extract::{FromRequestParts as _, MatchedPath, RawPathParams, Request, State},
    http::{header, request::Parts, HeaderMap, Method},
    middleware::Next,
    response::Response,
};

use super::error::ApiError;
use crate::{
    auth::{
        api_token,
        policy::{policy_for, team_role, JobAccess, Policy, RoutePolicy, TeamAccess},
        Authenticated, CatalogueVersion, Principal,
    },
    db,
    domain::{PlatformRole, TeamRole},
    state::AppState,
};

/// The authorization middleware's state: the shared state and the routes' policies.
#[derive(Clone)]
pub struct Gate {
    /// The shared state.
    pub state: AppState,
    /// Every route's policy; a route not listed is refused.
    pub routes: &'static [RoutePolicy],
}

/// Middleware: authenticates the caller and enforces the route's policy. Puts the
/// [`Principal`] (when signed in) and, for team routes, the [`TeamAccess`] into the
/// request's extensions.
pub async fn authorize(State(gate): State<Gate>, request: Request, next: Next) -> Result<Response, ApiError> {
    let Gate { state, routes } = &gate;
    let request = match from_cached_token(state, routes, request, &next).await? {
        Ok(response) => return Ok(response),
        Err(request) => request,
    };
    let (parts, body) = request.into_parts();
    let policy = policy_of(routes, &parts)?;
    let authenticated = match authenticate(state, &parts.headers).await {
        Ok(a) => a,
        // A bad credential on a public route (e.g. signing in with an expired token still
        // attached) is ignored, not an error.
        Err(ApiError::Unauthenticated) if policy == Policy::Public => None,
        Err(e) => return Err(e),
    };
    authorize_as(state, routes, parts, body, authenticated, next).await
}

/// The one route served from cached credentials: single-job submission, what CI pipelines
/// send most. Everything else reads the caller from the database on every request.
const CACHED_ROUTE: (Method, &str) = (Method::POST, "/api/v1/teams/{team}/jobs");

/// Serves a single-job submission from the API token as it was last read
/// ([`TokenCache`](crate::auth::TokenCache)), saving a round trip; the write checks what was taken on trust
/// ([`db::jobs::WriteCheck`]). Any answer but success is thrown away and the request served
/// again the ordinary way, from the body kept for it: a changed credential or catalogue is
/// never acted on, and a revoked token learns nothing but 401. `Err` gives the request back
/// when it does not qualify.
async fn from_cached_token(
    state: &AppState,
    routes: &[RoutePolicy],
    request: Request,
    next: &Next,
) -> Result<Result<Response, Request>, ApiError> {
    let qualifies = request.method() == CACHED_ROUTE.0
        && request.extensions().get::<MatchedPath>().is_some_and(|p| p.as_str() == CACHED_ROUTE.1)
        && !request.headers().contains_key(super::idempotency::HEADER);
    let Some((authenticated, check)) = qualifies.then(|| state.tokens.get(request.headers())).flatten() else {
        return Ok(Err(request));
    };
    let (parts, body) = request.into_parts();
    // Kept whole for a second try; over the limit it is 413 either way.
    let body = axum::body::to_bytes(body, state.config.max_body_bytes).await.map_err(|_| ApiError::PayloadTooLarge)?;
    let mut trusted = parts.clone();
    trusted.extensions.insert(check);
    match authorize_as(state, routes, trusted, Body::from(body.clone()), Some(authenticated), next.clone()).await {
        Ok(response) if !response.status().is_client_error() => Ok(Ok(response)),
        _ => Ok(Err(Request::from_parts(parts, Body::from(body)))),
    }
}

/// The declared policy of the request's route.
fn policy_of(routes: &[RoutePolicy], parts: &Parts) -> Result<Policy, ApiError> {
    let path = parts.extensions.get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or_default();
    // Deny by default: a route without a declared policy is a bug, caught by tests.
    policy_for(routes, parts.method.as_str(), path)
        .ok_or_else(|| ApiError::Internal(format!("route {} {path} has no policy", parts.method).into()))
}

/// Enforces the route's policy for `authenticated` and runs the handler.
async fn authorize_as(
    state: &AppState,
    routes: &[RoutePolicy],
    mut parts: Parts,
    body: Body,
    authenticated: Option<Authenticated>,
    next: Next,
) -> Result<Response, ApiError> {
    let policy = policy_of(routes, &parts)?;
    let path = parts.extensions.get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let (principal, token_team, catalogue_version) = match authenticated {
        Some(a) => (Some(a.principal), a.token_team, a.catalogue_version),
        None => (None, None, None),
    };
    match (policy, &principal) {
        (Policy::Public, _) => {}
        (_, None) => return Err(ApiError::Unauthenticated),
        (Policy::Authenticated, Some(_)) => {}
        (Policy::PlatformAdmin, Some(p)) => {
            if !p.is_platform_admin() {
                return Err(ApiError::Forbidden);
            }
        }
        (Policy::Finance, Some(p)) => {
            if p.platform_role().is_none() {
                return Err(ApiError::Forbidden);
            }
        }
        (Policy::Job(min), Some(p)) => {
            let id = path_param(&mut parts, &path, "job")
                .await?
                .and_then(|v| v.parse::<JobId>().ok())
                .ok_or(ApiError::NotFound("job"))?;
            let team_id = db::jobs::team_of(&state.db, id).await?.ok_or(ApiError::NotFound("job"))?;
            let team = db::teams::by_id(&state.db, team_id).await?.ok_or(ApiError::NotFound("job"))?;
            let role = team_role(&state.db, p, &team).await?.ok_or(ApiError::NotFound("job"))?;
            if role < min {
                return Err(ApiError::Forbidden);
            }
            parts.extensions.insert(TeamAccess { team, role });
            parts.extensions.insert(JobAccess { id });
        }
        (Policy::Team(_) | Policy::TeamPlatformAdmin, Some(p)) => {
            let name = path_param(&mut parts, &path, "team")
                .await?
                .ok_or_else(|| ApiError::Internal(format!("{path} has no {{team}}").into()))?;
            let team = match token_team.filter(|t| t.name == name) {
                Some(team) => team,
                None => db::teams::by_name(&state.db, &name).await?.ok_or(ApiError::NotFound("team"))?,
            };
            let role = team_role(&state.db, p, &team).await?.ok_or(ApiError::NotFound("team"))?;
            let allowed = match policy {
                Policy::Team(min) => role >= min,
                _ => p.is_platform_admin(),
            };
            if !allowed {
                return Err(ApiError::Forbidden);
            }
            parts.extensions.insert(TeamAccess { team, role });
        }
    }
    if let Some(p) = principal {
        parts.extensions.insert(p);
    }
    parts.extensions.insert(CatalogueVersion(catalogue_version));
    Ok(next.run(Request::from_parts(parts, body)).await)
}

/// The raw value of the path parameter `name` of the route `path`, if it has one.
async fn path_param(parts: &mut Parts, path: &str, name: &str) -> Result<Option<String>, ApiError> {
    let params = RawPathParams::from_request_parts(parts, &())
        .await
        .map_err(|_| ApiError::Internal(format!("{path} has no path parameters").into()))?;
    Ok(params.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_owned()))
}

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
        let role = TeamRole::parse(&auth.role)
            .ok_or_else(|| ApiError::Internal(format!("bad token role {}", auth.role).into()))?;
        let principal = Principal::Token {
            id: auth.id,
            name: auth.name,
            team_id: auth.team.id,
            team: auth.team.name.clone(),
            role,
        };
        let catalogue_version = Some(auth.catalogue_version);
        let authenticated = Authenticated { principal, token_team: Some(auth.team), catalogue_version };
        state.tokens.put(hash, &authenticated);
        return Ok(Some(authenticated));
    }
    let claims = state.keys.verify(credential).ok_or(ApiError::Unauthenticated)?;
    let user_id: UserId = claims.sub.parse().map_err(|_| ApiError::Unauthenticated)?;
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
