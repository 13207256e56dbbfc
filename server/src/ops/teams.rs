//! Teams: the tenants, a tree addressed by name.

use crate::domain::TeamId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, OnConstraint as _, Precondition, Result};
use crate::{
    auth::Principal,
    db::{self, teams::TeamRow},
    domain::{DisplayText, FieldError, TeamName, TeamRole},
    state::AppState,
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
    pub id: TeamId,
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

/// Creates a team, audited; the API and the portal's admin page both call this.
pub async fn create(state: &AppState, principal: &Principal, body: &NewTeam) -> Result<TeamRow> {
    let name = TeamName::parse("name", &body.name)?;
    let display = DisplayText::parse("display_name", body.display_name.as_deref().unwrap_or(""), 200)?;
    let parent = match &body.parent {
        Some(p) => {
            let p = TeamName::parse("parent", p)?;
            let row = db::teams::by_name(&state.db, p.as_str()).await?.ok_or_else(|| {
                Error::field(FieldError::new("parent", "not_found", format!("team {p} does not exist")))
            })?;
            Some(row)
        }
        None => None,
    };
    let mut tx = state.db.begin().await?;
    if let Some(p) = &parent {
        // The parent must still exist when we commit.
        db::teams::lock(&mut tx, p.id).await?.ok_or_else(|| {
            Error::field(FieldError::new("parent", "not_found", format!("team {} does not exist", p.name)))
        })?;
    }
    let row = db::teams::insert(&mut tx, name.as_str(), parent.as_ref().map(|p| p.id), display.as_str())
        .await
        .on_constraint("teams_name_key", || {
            Error::conflict("team_exists", Some("name"), format!("team {name} already exists"))
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

/// A member of a team.
#[derive(Serialize, ToSchema)]
pub struct MemberView {
    pub username: String,
    pub role: TeamRole,
    /// Where the membership came from: `oidc:{provider}` when an identity provider's groups
    /// grant it (it follows them at each sign-in), absent when an admin made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<db::members::MemberRow> for MemberView {
    fn from(row: db::members::MemberRow) -> Self {
        Self {
            username: row.username,
            role: TeamRole::parse(&row.role).unwrap_or(TeamRole::Viewer),
            source: row.source,
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

/// Adds `username` to `team` with `role`, or changes their role, audited.
pub async fn set_member(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    username: &str,
    role: TeamRole,
) -> Result<MemberView> {
    let username = crate::domain::Username::parse("username", username)?;
    let user = db::users::by_username(&state.db, username.as_str()).await?.ok_or_else(|| {
        Error::field(FieldError::new("username", "not_found", format!("user {username} does not exist")))
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

/// Removes `username` from `team`, audited.
pub async fn remove_member(state: &AppState, principal: &Principal, team: &TeamRow, username: &str) -> Result<()> {
    let user = db::users::by_username(&state.db, username).await?.ok_or(Error::NotFound("member"))?;
    let mut tx = state.db.begin().await?;
    let before = db::members::get_for_update(&mut tx, team.id, user.id).await?.ok_or(Error::NotFound("member"))?;
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

/// Changes a team's display name, audited.
pub async fn update(
    state: &AppState,
    principal: &Principal,
    team: TeamRow,
    precondition: &Precondition,
    body: &TeamPatch,
) -> Result<TeamRow> {
    let before = team;
    let display = match &body.display_name {
        Some(d) => DisplayText::parse("display_name", d, 200)?,
        None => DisplayText::parse("display_name", &before.display_name, 200)?,
    };
    let mut tx = state.db.begin().await?;
    let version = db::teams::lock(&mut tx, before.id).await?.ok_or(Error::NotFound("team"))?;
    precondition.check(version)?;
    let row = db::teams::update(&mut tx, before.id, display.as_str()).await?;
    record(
        &mut tx,
        principal,
        "team.update",
        "team",
        &row.name,
        Some(row.id),
        Some(&TeamView::from(before)),
        Some(&TeamView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Deletes a team with no child teams, and everything it owns, audited.
pub async fn delete(state: &AppState, principal: &Principal, team: TeamRow, precondition: &Precondition) -> Result<()> {
    let mut tx = state.db.begin().await?;
    let version = db::teams::lock(&mut tx, team.id).await?.ok_or(Error::NotFound("team"))?;
    precondition.check(version)?;
    if db::teams::has_children(&mut tx, team.id).await? {
        return Err(Error::conflict(
            "team_has_children",
            None,
            format!("team {} has child teams; delete them first", team.name),
        ));
    }
    db::teams::delete(&mut tx, team.id).await.on_constraint("teams_parent_id_fkey", || {
        Error::conflict("team_has_children", None, "the team has child teams")
    })?;
    record(
        &mut tx,
        principal,
        "team.delete",
        "team",
        &team.name,
        Some(team.id),
        Some(&TeamView::from(team.clone())),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
