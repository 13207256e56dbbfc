//! Authorization rules: every route declares a [`Policy`] (the API's table of them is
//! `api::ROUTE_POLICIES`); the HTTP layer's `authorize` middleware enforces it before the
//! handler runs and denies any route that has none. Another team's objects answer 404,
//! never 403, so existence does not leak.

use super::Principal;
use crate::domain::JobId;
use crate::{
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
    pub id: JobId,
}

/// The caller's effective role in `team`, or `None` when it has none (and must not learn
/// that the team exists).
pub async fn team_role(
    db: &sqlx::PgPool,
    principal: &Principal,
    team: &TeamRow,
) -> Result<Option<TeamRole>, sqlx::Error> {
    Ok(match principal {
        Principal::User { platform_role: Some(PlatformRole::PlatformAdmin), .. } => Some(TeamRole::Admin),
        Principal::User { platform_role: Some(PlatformRole::Finance), .. } => Some(TeamRole::Viewer),
        Principal::User { id, .. } => {
            db::teams::effective_role(db, *id, team.id).await?.as_deref().and_then(TeamRole::parse)
        }
        Principal::Token { team_id, role, .. } => (*team_id == team.id).then_some(*role),
    })
}

/// The policy `routes` declares for a route, if any.
pub fn policy_for(routes: &[RoutePolicy], method: &str, path: &str) -> Option<Policy> {
    routes.iter().find(|r| r.method == method && r.path == path).map(|r| r.policy)
}
