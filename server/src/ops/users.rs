//! Users, managed by platform admins.

use crate::domain::UserId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, off_thread, Error, OnConstraint as _, Result};
use crate::{
    auth::{password, Principal},
    db::{self, audit::Change, users::UserRow},
    domain::{FieldError, Password, PlatformRole, Username},
    state::AppState,
};

/// A new user.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Login name: lowercase letters, digits, `-`, `.`, `_`.
    pub username: String,
    /// At least 12 characters.
    pub password: String,
    /// A platform-wide role, if any.
    #[serde(default)]
    pub platform_role: Option<PlatformRole>,
}

/// A user.
#[derive(Serialize, ToSchema)]
pub struct UserView {
    pub id: UserId,
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_role: Option<PlatformRole>,
    pub disabled: bool,
    pub created_at: DateTime<Utc>,
}

impl From<UserRow> for UserView {
    fn from(row: UserRow) -> Self {
        Self {
            id: row.id,
            username: row.username,
            platform_role: row.platform_role.as_deref().and_then(PlatformRole::parse),
            disabled: row.disabled,
            created_at: row.created_at,
        }
    }
}

/// Changes to a user. `platform_role: null` removes the platform role.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    /// A platform-wide role, or null for none.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<PlatformRole>)]
    pub platform_role: Option<Option<PlatformRole>>,
    /// A disabled user cannot sign in and their access tokens stop working at once.
    pub disabled: Option<bool>,
    /// A new password (at least 12 characters).
    pub password: Option<String>,
}

/// Distinguishes a field set to null (`Some(None)`) from an absent one (`None`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A password change.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordChange {
    pub current_password: String,
    /// At least 12 characters.
    pub new_password: String,
}

/// Creates a user, audited.
pub async fn create(state: &AppState, principal: &Principal, body: &NewUser) -> Result<UserRow> {
    let username = Username::parse("username", &body.username)?;
    let password = Password::parse("password", &body.password)?;
    let hash = off_thread(move || password::hash(password.expose())).await?;
    let mut tx = state.db.begin().await?;
    let user = db::users::insert(&mut tx, username.as_str(), &hash, body.platform_role.map(PlatformRole::as_str))
        .await
        .on_constraint("users_username_key", || {
            Error::conflict("username_taken", Some("username"), format!("user {username} already exists"))
        })?;
    let view = UserView::from(user.clone());
    db::audit::record(
        &mut tx,
        Change {
            actor: &principal.actor(),
            action: "user.create",
            object_type: "user",
            object_id: username.as_str(),
            team_id: None,
            before: None,
            after: Some(serde_json::to_value(&view).unwrap_or_default()),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(user)
}

/// Changes a user's platform role, disabled flag or password, audited. A user cannot remove
/// their own platform-admin role or disable themselves, so the platform always keeps an admin.
pub async fn update(state: &AppState, principal: &Principal, username: &str, body: &UserPatch) -> Result<UserRow> {
    let hash = match &body.password {
        Some(p) => {
            let p = Password::parse("password", p)?;
            Some(off_thread(move || password::hash(p.expose())).await?)
        }
        None => None,
    };
    let mut tx = state.db.begin().await?;
    let before = db::users::get_for_update(&mut tx, username).await?.ok_or(Error::NotFound("user"))?;
    let role = match body.platform_role {
        Some(role) => role,
        None => before.platform_role.as_deref().and_then(PlatformRole::parse),
    };
    let disabled = body.disabled.unwrap_or(before.disabled);
    if matches!(principal, Principal::User { id, .. } if *id == before.id) {
        if role != Some(PlatformRole::PlatformAdmin) {
            return Err(FieldError::new(
                "platform_role",
                "self_demotion",
                "you cannot remove your own platform-admin role",
            )
            .into());
        }
        if disabled {
            return Err(FieldError::new("disabled", "self_disable", "you cannot disable yourself").into());
        }
    }
    let row = db::users::update(&mut tx, before.id, role.map(PlatformRole::as_str), disabled, hash.as_deref()).await?;
    let view = UserView::from(row.clone());
    record(&mut tx, principal, "user.update", "user", username, None, Some(&UserView::from(before)), Some(&view))
        .await?;
    tx.commit().await?;
    Ok(row)
}

/// Changes the signed-in user's own password, given the current one; API tokens have none.
pub async fn change_password(state: &AppState, principal: &Principal, body: &PasswordChange) -> Result<()> {
    let Principal::User { username, .. } = &principal else { return Err(Error::Forbidden) };
    let new = Password::parse("new_password", &body.new_password)?;
    let mut tx = state.db.begin().await?;
    let user = db::users::get_for_update(&mut tx, username).await?.ok_or(Error::NotFound("user"))?;
    let (current, stored) = (body.current_password.clone(), user.password_hash.clone());
    let (ok, hash) = off_thread(move || (password::verify(&current, &stored), password::hash(new.expose()))).await?;
    if !ok {
        return Err(FieldError::new("current_password", "incorrect", "is not your current password").into());
    }
    let role = user.platform_role.clone();
    db::users::update(&mut tx, user.id, role.as_deref(), user.disabled, Some(&hash)).await?;
    record(&mut tx, principal, "user.password", "user", username, None, None::<&()>, None::<&()>).await?;
    tx.commit().await?;
    Ok(())
}
