//! Authorization: every route declares a [`Policy`] in [`crate::api::ROUTE_POLICIES`]; the
//! [`authorize`] middleware enforces it before the handler runs and denies any route that
//! has none. Another team's objects answer 404, never 403, so existence does not leak.

use axum::{
    body::Body,
    extract::{FromRequestParts as _, MatchedPath, RawPathParams, Request, State},
    http::{request::Parts, Method},
    middleware::Next,
    response::Response,
};

use super::{authenticate, Authenticated, Principal};
use crate::{
    api::{error::ApiError, ROUTE_POLICIES},
    app::AppState,
    db::{self, teams::TeamRow},
    domain::{PlatformRole, TeamRole},
};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Anyone, signed in or not.
    Public,
    /// Any signed-in user or API token; the handler shows only what the caller may see.
    Authenticated,
    /// Platform admins only.
    PlatformAdmin,
    /// Finance and platform admins.
    Finance,
    /// Callers holding at least this role in the team named by the `{team}` path segment.
    /// Platform admins count as team admins, finance as viewers; a team role in an ancestor
    /// team applies to its descendants. Callers with no role in the team get 404.
    Team(TeamRole),
    /// Callers holding at least this role in the team owning the job named by the `{job}`
    /// path segment; others get 404, as for a job that does not exist.
    Job(TeamRole),
    /// Changes to a team's platform-managed settings (quotas, budgets, deletion): callers
    /// who cannot see the team get 404, those who can but are not platform admins 403.
    TeamPlatformAdmin,
}

/// A route and its policy.
#[derive(Debug, Clone, Copy)]
pub struct RoutePolicy {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template as registered, e.g. `/api/v1/teams/{team}`.
    pub path: &'static str,
    /// Who may call it.
    pub policy: Policy,
}

/// The team named in the path and the caller's role in it, for team-scoped handlers.
#[derive(Debug, Clone)]
pub struct TeamAccess {
    /// The team.
    pub team: TeamRow,
    /// The caller's effective role in it.
    pub role: TeamRole,
}

/// The job named in the path, for job-scoped handlers (its team is in [`TeamAccess`]).
#[derive(Debug, Clone, Copy)]
pub struct JobAccess {
    /// The job's id.
    pub id: uuid::Uuid,
}

/// The policy of a route, if it declares one.
pub fn policy_for(method: &str, path: &str) -> Option<Policy> {
    ROUTE_POLICIES.iter().find(|r| r.method == method && r.path == path).map(|r| r.policy)
}

/// Middleware: authenticates the caller and enforces the route's policy. Puts the
/// [`Principal`] (when signed in) and, for team routes, the [`TeamAccess`] into the
/// request's extensions.
pub async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    let request = match from_cached_token(&state, request, &next).await? {
        Ok(response) => return Ok(response),
        Err(request) => request,
    };
    let (parts, body) = request.into_parts();
    let policy = policy_of(&parts)?;
    let authenticated = match authenticate(&state, &parts.headers).await {
        Ok(a) => a,
        // A bad credential on a public route (e.g. signing in with an expired token still
        // attached) is ignored, not an error.
        Err(ApiError::Unauthenticated) if policy == Policy::Public => None,
        Err(e) => return Err(e),
    };
    authorize_as(&state, parts, body, authenticated, next).await
}

/// The one route served from cached credentials: single-job submission, what CI pipelines
/// send most. Everything else reads the caller from the database on every request.
const CACHED_ROUTE: (Method, &str) = (Method::POST, "/api/v1/teams/{team}/jobs");

/// Serves a single-job submission from the API token as it was last read
/// ([`super::TokenCache`]), saving a round trip; the write checks what was taken on trust
/// ([`db::jobs::WriteCheck`]). Any answer but success is thrown away and the request served
/// again the ordinary way, from the body kept for it: a changed credential or catalogue is
/// never acted on, and a revoked token learns nothing but 401. `Err` gives the request back
/// when it does not qualify.
async fn from_cached_token(
    state: &AppState,
    request: Request,
    next: &Next,
) -> Result<Result<Response, Request>, ApiError> {
    let qualifies = request.method() == CACHED_ROUTE.0
        && request.extensions().get::<MatchedPath>().is_some_and(|p| p.as_str() == CACHED_ROUTE.1)
        && !request.headers().contains_key(crate::api::idempotency::HEADER);
    let Some((authenticated, check)) = qualifies.then(|| state.tokens.get(request.headers())).flatten() else {
        return Ok(Err(request));
    };
    let (parts, body) = request.into_parts();
    // Kept whole for a second try; over the limit it is 413 either way.
    let body = axum::body::to_bytes(body, state.config.max_body_bytes).await.map_err(|_| ApiError::PayloadTooLarge)?;
    let mut trusted = parts.clone();
    trusted.extensions.insert(check);
    match authorize_as(state, trusted, Body::from(body.clone()), Some(authenticated), next.clone()).await {
        Ok(response) if !response.status().is_client_error() => Ok(Ok(response)),
        _ => Ok(Err(Request::from_parts(parts, Body::from(body)))),
    }
}

/// The declared policy of the request's route.
fn policy_of(parts: &Parts) -> Result<Policy, ApiError> {
    let path = parts.extensions.get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or_default();
    // Deny by default: a route without a declared policy is a bug, caught by tests.
    policy_for(parts.method.as_str(), path)
        .ok_or_else(|| ApiError::Internal(format!("route {} {path} has no policy", parts.method)))
}

/// Enforces the route's policy for `authenticated` and runs the handler.
async fn authorize_as(
    state: &AppState,
    mut parts: Parts,
    body: Body,
    authenticated: Option<Authenticated>,
    next: Next,
) -> Result<Response, ApiError> {
    let policy = policy_of(&parts)?;
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
            let params = RawPathParams::from_request_parts(&mut parts, state)
                .await
                .map_err(|_| ApiError::Internal(format!("{path} has no path parameters")))?;
            let id = params
                .iter()
                .find(|(k, _)| *k == "job")
                .and_then(|(_, v)| uuid::Uuid::parse_str(v).ok())
                .ok_or(ApiError::NotFound("job"))?;
            let team_id = db::jobs::team_of(&state.db, id).await?.ok_or(ApiError::NotFound("job"))?;
            let team = db::teams::by_id(&state.db, team_id).await?.ok_or(ApiError::NotFound("job"))?;
            let role = team_role(state, p, &team).await?.ok_or(ApiError::NotFound("job"))?;
            if role < min {
                return Err(ApiError::Forbidden);
            }
            parts.extensions.insert(TeamAccess { team, role });
            parts.extensions.insert(JobAccess { id });
        }
        (Policy::Team(_) | Policy::TeamPlatformAdmin, Some(p)) => {
            let params = RawPathParams::from_request_parts(&mut parts, state)
                .await
                .map_err(|_| ApiError::Internal(format!("{path} has no path parameters")))?;
            let name = params
                .iter()
                .find(|(k, _)| *k == "team")
                .map(|(_, v)| v.to_owned())
                .ok_or_else(|| ApiError::Internal(format!("{path} has no {{team}}")))?;
            let team = match token_team.filter(|t| t.name == name) {
                Some(team) => team,
                None => db::teams::by_name(&state.db, &name).await?.ok_or(ApiError::NotFound("team"))?,
            };
            let role = team_role(state, p, &team).await?.ok_or(ApiError::NotFound("team"))?;
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
    parts.extensions.insert(super::CatalogueVersion(catalogue_version));
    Ok(next.run(Request::from_parts(parts, body)).await)
}

/// The caller's effective role in `team`, or `None` when it has none (and must not learn
/// that the team exists).
pub async fn team_role(state: &AppState, principal: &Principal, team: &TeamRow) -> Result<Option<TeamRole>, ApiError> {
    Ok(match principal {
        Principal::User { platform_role: Some(PlatformRole::PlatformAdmin), .. } => Some(TeamRole::Admin),
        Principal::User { platform_role: Some(PlatformRole::Finance), .. } => Some(TeamRole::Viewer),
        Principal::User { id, .. } => {
            db::teams::effective_role(&state.db, *id, team.id).await?.as_deref().and_then(TeamRole::parse)
        }
        Principal::Token { team_id, role, .. } => (*team_id == team.id).then_some(*role),
    })
}
