//! Who may do what: platform-wide roles and roles within a team.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A role within a team. Ordered: every admin is also a member, every member a viewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TeamRole {
    /// Reads the team's jobs, quotas, budgets and spend.
    Viewer,
    /// Also submits and cancels jobs.
    Member,
    /// Also manages members and API tokens of the team.
    Admin,
}

impl TeamRole {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TeamRole::Viewer => "viewer",
            TeamRole::Member => "member",
            TeamRole::Admin => "admin",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(TeamRole::Viewer),
            "member" => Some(TeamRole::Member),
            "admin" => Some(TeamRole::Admin),
            _ => None,
        }
    }
}

/// A role over the whole platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PlatformRole {
    /// Manages teams, quotas, GPU classes, the rate card and users; sees everything.
    PlatformAdmin,
    /// Reads every team's quotas, budgets, spend and billing exports; changes nothing.
    Finance,
}

impl PlatformRole {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PlatformRole::PlatformAdmin => "platform-admin",
            PlatformRole::Finance => "finance",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "platform-admin" => Some(PlatformRole::PlatformAdmin),
            "finance" => Some(PlatformRole::Finance),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_roles_are_ordered_from_viewer_to_admin() {
        assert!(TeamRole::Viewer < TeamRole::Member && TeamRole::Member < TeamRole::Admin);
        for role in [TeamRole::Viewer, TeamRole::Member, TeamRole::Admin] {
            assert_eq!(TeamRole::parse(role.as_str()), Some(role));
        }
        for role in [PlatformRole::PlatformAdmin, PlatformRole::Finance] {
            assert_eq!(PlatformRole::parse(role.as_str()), Some(role));
        }
    }
}
