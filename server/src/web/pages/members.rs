//! A team's members, for its admins: add a user, change a role, remove.

use askama::Template;
use axum::{
    extract::{Path, State},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{
    administered_team, form_error, principal, render, signed_in, when, CurrentUser, NoFields, PageError, PortalForm,
    SignedIn,
};
use crate::{
    db::{self, teams::TeamRow, web_sessions::SessionUser},
    domain::TeamRole,
    ops,
    state::AppState,
};

/// A member as the page lists them.
pub struct MemberLine {
    pub username: String,
    pub role: String,
    /// "an admin", or the identity provider whose groups grant it.
    pub granted_by: String,
    pub since: String,
}

/// Where a membership came from, in words.
fn granted_by(source: Option<&str>) -> String {
    match source.and_then(|s| s.strip_prefix("oidc:")) {
        Some(provider) => format!("groups at provider {provider}"),
        None => "an admin".into(),
    }
}

#[derive(Template)]
#[template(path = "members.html")]
struct MembersPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    members: Vec<MemberLine>,
    roles: [&'static str; 3],
    ok: Option<String>,
    error: Option<String>,
    form_username: String,
}

async fn members_page(
    state: &AppState,
    user: &SessionUser,
    team: &TeamRow,
    ok: Option<String>,
    error: Option<String>,
    form_username: String,
) -> Result<Response, PageError> {
    let members = db::members::list(&state.db, team.id, None, 1000)
        .await?
        .into_iter()
        .map(|m| MemberLine {
            granted_by: granted_by(m.source.as_deref()),
            username: m.username,
            role: m.role,
            since: when(m.created_at),
        })
        .collect();
    Ok(render(&MembersPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        members,
        roles: ["admin", "member", "viewer"],
        ok,
        error,
        form_username,
    }))
}

/// A team's members, for its admins.
pub async fn team_members(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    members_page(&state, &user, &team, None, None, String::new()).await
}

/// The add-member and change-role form, as typed.
#[derive(Debug, Default, Deserialize)]
pub struct MemberForm {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub role: String,
}

/// Adds a member, or changes a member's role.
pub async fn set_member(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<MemberForm>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    let username = form.username.trim();
    let Some(role) = TeamRole::parse(&form.role) else {
        let error = Some("role: admin, member or viewer.".to_owned());
        return members_page(&state, &user, &team, None, error, username.to_owned()).await;
    };
    match ops::teams::set_member(&state, &principal(&user), &team, username, role).await {
        Ok(member) => {
            let ok = Some(format!("{} is now {} of {}.", member.username, role.as_str(), team.name));
            members_page(&state, &user, &team, ok, None, String::new()).await
        }
        Err(e) => {
            let error = Some(form_error(e)?);
            members_page(&state, &user, &team, None, error, username.to_owned()).await
        }
    }
}

/// Removes a member from its row's button.
pub async fn remove_member(
    State(state): State<AppState>,
    Path((name, username)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    ops::teams::remove_member(&state, &principal(&user), &team, &username).await?;
    Ok(Redirect::to(&format!("/teams/{}/members", team.name)).into_response())
}
