//! The platform admins' users page: every user with their platform role and whether they may
//! sign in, a form to create one, and per user the buttons that change either. Every change
//! goes through `ops::users`, as the REST API's do, so it is checked and audited alike.

use askama::Template;
use axum::{
    extract::{Path, State},
    response::Response,
};
use serde::Deserialize;

use super::{
    form_error, platform_admin::require_platform_admin, platform_admin::Outcome, principal, render, signed_in, when,
    CurrentUser, PageError, PortalForm, SignedIn,
};
use crate::{
    db::{self, web_sessions::SessionUser},
    domain::PlatformRole,
    ops,
    state::AppState,
};

/// How many users the page lists; more would make a page nobody reads to the end.
const SHOWN: usize = 500;

/// The platform roles a form offers, `none` first.
const ROLES: [&str; 3] = ["none", "platform-admin", "finance"];

/// A user of the users table.
pub struct UserLine {
    pub username: String,
    /// `none`, `platform-admin` or `finance`.
    pub platform_role: String,
    pub disabled: bool,
    pub created: String,
    /// The signed-in admin's own row: the page offers no button that would lock them out.
    pub is_self: bool,
    /// The teams the user has a role in, `team (role)`, by team name; given on each team's
    /// members page.
    pub teams: String,
    /// How the user signs in: `with a password`, `through corp`, both, or `disabled`.
    pub signs_in: String,
}

#[derive(Template)]
#[template(path = "users.html")]
struct UsersPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    users: Vec<UserLine>,
    /// More users exist than the page lists.
    more: bool,
    shown: usize,
    roles: [&'static str; 3],
    outcome: Outcome,
    form: NewUserForm,
}

/// The new-user form, as typed.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NewUserForm {
    #[serde(default)]
    pub username: String,
    /// Never shown back: a refused form comes back with this field empty.
    #[serde(default)]
    pub password: String,
    /// `none`, `platform-admin` or `finance`.
    #[serde(default)]
    pub platform_role: String,
}

/// A platform role as the forms write it: `none` (or empty) for no role; `None` for neither.
fn platform_role(text: &str) -> Option<Option<PlatformRole>> {
    match text.trim() {
        "" | "none" => Some(None),
        other => PlatformRole::parse(other).map(Some),
    }
}

async fn users_page(
    state: &AppState,
    user: &SessionUser,
    outcome: Outcome,
    form: NewUserForm,
) -> Result<Response, PageError> {
    let mut rows = db::users::list(&state.db, None, SHOWN as i64 + 1).await?;
    let more = rows.len() > SHOWN;
    rows.truncate(SHOWN);
    let ids: Vec<_> = rows.iter().map(|u| u.id).collect();
    let mut teams: std::collections::HashMap<_, Vec<String>> = std::collections::HashMap::new();
    for m in db::members::of_users(&state.db, &ids).await? {
        teams.entry(m.user_id).or_default().push(format!("{} ({})", m.team, m.role));
    }
    let mut providers: std::collections::HashMap<_, Vec<String>> = std::collections::HashMap::new();
    for (id, provider) in db::identities::providers_of(&state.db, &ids).await? {
        providers.entry(id).or_default().push(format!("through {provider}"));
    }
    let users = rows
        .into_iter()
        .map(|u| UserLine {
            signs_in: if u.disabled {
                "disabled".to_owned()
            } else {
                let mut ways = providers.remove(&u.id).unwrap_or_default();
                // People created by a provider have no password hash at all (`!`).
                if u.password_hash.starts_with('$') {
                    ways.insert(0, "with a password".into());
                }
                ways.join(", ")
            },
            teams: teams.remove(&u.id).map_or_else(|| "none".to_owned(), |t| t.join(", ")),
            is_self: u.id == user.user_id,
            platform_role: u.platform_role.unwrap_or_else(|| "none".to_owned()),
            disabled: u.disabled,
            created: when(u.created_at),
            username: u.username,
        })
        .collect();
    Ok(render(&UsersPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        users,
        more,
        shown: SHOWN,
        roles: ROLES,
        outcome,
        // The password typed is never sent back to the browser.
        form: NewUserForm { password: String::new(), ..form },
    }))
}

/// The users page, for platform admins.
pub async fn users(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    users_page(&state, &user, Outcome::default(), NewUserForm::default()).await
}

/// Creates a user from the form; a refusal names the field and keeps what was typed.
pub async fn create_user(
    State(state): State<AppState>,
    PortalForm { user, form }: PortalForm<NewUserForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let error = |message: String| Outcome { section: "create", ok: None, error: Some(message) };
    let Some(role) = platform_role(&form.platform_role) else {
        let outcome = error("platform_role: none, platform-admin or finance".to_owned());
        return users_page(&state, &user, outcome, form).await;
    };
    let request = ops::users::NewUser {
        username: form.username.trim().to_owned(),
        password: form.password.clone(),
        platform_role: role,
    };
    let (outcome, kept) = match ops::users::create(&state, &principal(&user), &request).await {
        Ok(created) => (
            Outcome { section: "create", ok: Some(format!("User {} created.", created.username)), error: None },
            NewUserForm::default(),
        ),
        // A taken name is a conflict without a field in its sentence; the page names it.
        Err(ops::Error::Conflict { detail, field: Some(field), .. }) => (error(format!("{field}: {detail}")), form),
        Err(e) => (error(form_error(e)?), form),
    };
    users_page(&state, &user, outcome, kept).await
}

/// A user row's form: one of its buttons, each sending only what it changes.
#[derive(Debug, Default, Deserialize)]
pub struct UserChangeForm {
    /// `none`, `platform-admin` or `finance`, when the role form was sent.
    #[serde(default)]
    pub platform_role: Option<String>,
    /// `true` or `false`, when the disable or enable button was pressed.
    #[serde(default)]
    pub disabled: Option<String>,
}

/// Disables or enables a user, or changes their platform role. Refused, in words, for the
/// admin's own account when it would lock them out (`ops::users::update` holds that rule).
pub async fn change_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
    PortalForm { user, form }: PortalForm<UserChangeForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let error = |message: String| Outcome { section: "users", ok: None, error: Some(message) };
    let role = match form.platform_role.as_deref().map(platform_role) {
        None => None,
        Some(Some(role)) => Some(role),
        Some(None) => {
            let outcome = error("platform_role: none, platform-admin or finance".to_owned());
            return users_page(&state, &user, outcome, NewUserForm::default()).await;
        }
    };
    let disabled = match form.disabled.as_deref().map(str::trim) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => {
            let outcome = error("disabled: true or false".to_owned());
            return users_page(&state, &user, outcome, NewUserForm::default()).await;
        }
    };
    let patch = ops::users::UserPatch { platform_role: role, disabled, password: None };
    let outcome = match ops::users::update(&state, &principal(&user), &username, &patch).await {
        Ok(row) => {
            let role = row.platform_role.as_deref().unwrap_or("none");
            let access = if row.disabled { "disabled: cannot sign in" } else { "may sign in" };
            Outcome {
                section: "users",
                ok: Some(format!("{}: platform role {role}, {access}.", row.username)),
                error: None,
            }
        }
        Err(e) => error(form_error(e)?),
    };
    users_page(&state, &user, outcome, NewUserForm::default()).await
}

#[cfg(test)]
mod tests {
    use super::platform_role;
    use crate::domain::PlatformRole;

    #[test]
    fn a_forms_platform_role_is_none_a_role_or_refused() {
        assert_eq!(platform_role("none"), Some(None));
        assert_eq!(platform_role(""), Some(None));
        assert_eq!(platform_role("finance"), Some(Some(PlatformRole::Finance)));
        assert_eq!(platform_role("platform-admin"), Some(Some(PlatformRole::PlatformAdmin)));
        assert_eq!(platform_role("owner"), None);
    }
}
