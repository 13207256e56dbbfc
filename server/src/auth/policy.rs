//! Authorization: every route declares a [`Policy`] in [`crate::api::ROUTE_POLICIES`]; the
//! [`authorize`] middleware enforces it before the handler runs and denies any route that
//! has none. Another team's objects answer 404, never 403, so existence does not leak.

use axum::{
    extract::{FromRequestParts as _, MatchedPath, RawPathParams, Request, State},
    middleware::Next,
    response::Response,
};

use super::{authenticate, Principal};
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
    let (mut parts, body) = request.into_parts();
    let path = parts.extensions.get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let Some(policy) = policy_for(parts.method.as_str(), &path) else {
        // Deny by default: a route without a declared policy is a bug, caught by tests.
        return Err(ApiError::Internal(format!("route {} {path} has no policy", parts.method)));
    };
    let (principal, token_team, catalogue_version) = match authenticate(&state, &parts.headers).await {
        Ok(Some(a)) => (Some(a.principal), a.token_team, a.catalogue_version),
        Ok(None) => (None, None, None),
        // A bad credential on a public route (e.g. signing in with an expired token still
        // attached) is ignored, not an error.
        Err(ApiError::Unauthenticated) if policy == Policy::Public => (None, None, None),
        Err(e) => return Err(e),
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
            let params = RawPathParams::from_request_parts(&mut parts, &state)
                .await
                .map_err(|_| ApiError::Internal(format!("{path} has no path parameters")))?;
            let id = params
                .iter()
                .find(|(k, _)| *k == "job")
                .and_then(|(_, v)| uuid::Uuid::parse_str(v).ok())
                .ok_or(ApiError::NotFound("job"))?;
            let team_id = db::jobs::team_of(&state.db, id).await?.ok_or(ApiError::NotFound("job"))?;
            let team = db::teams::by_id(&state.db, team_id).await?.ok_or(ApiError::NotFound("job"))?;
            let role = team_role(&state, p, &team).await?.ok_or(ApiError::NotFound("job"))?;
            if role < min {
                return Err(ApiError::Forbidden);
            }
            parts.extensions.insert(TeamAccess { team, role });
            parts.extensions.insert(JobAccess { id });
        }
        (Policy::Team(_) | Policy::TeamPlatformAdmin, Some(p)) => {
            let params = RawPathParams::from_request_parts(&mut parts, &state)
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
            let role = team_role(&state, p, &team).await?.ok_or(ApiError::NotFound("team"))?;
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
