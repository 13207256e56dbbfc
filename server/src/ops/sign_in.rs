//! Signing in with a username and a password: one rule for the API's access tokens and the
//! portal's sessions.

use std::time::Instant;

use serde_json::json;

use super::{off_thread, Error, Result};
use crate::{
    auth::password,
    db::{self, audit::Change, users::UserRow},
    state::AppState,
};

/// Where a sign-in came from, as its audit entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `POST /api/v1/auth/token`: an access token.
    Api,
    /// The portal's sign-in form: a session.
    Portal,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Portal => "portal",
        }
    }
}

/// The most of a typed username a failed sign-in's audit entry keeps: names are at most 64
/// characters, and whatever else was typed there is not worth keeping.
const AUDITED_NAME_CHARS: usize = 64;

/// The enabled user `username` whose password is `password`, or
/// [`Error::InvalidCredentials`]. An unknown or disabled user costs the same hashing time as
/// a wrong password, so the answer's timing does not tell which usernames exist.
///
/// Refused outright when the configuration turns password sign-in off.
///
/// Guessing is throttled per username at the `client` address and per address (see
/// [`crate::auth::throttle`]): an attempt that comes too early is [`Error::Throttled`]
/// without the password being checked.
///
/// Each sign-in and each wrong password is in the platform's audit log (`user.sign_in`,
/// `user.sign_in_failed`) with where it came from (`via`, the address). Throttled attempts
/// are not: they write nothing, so a flood of them costs the database nothing.
pub async fn verify(state: &AppState, username: &str, password: String, client: &str, via: Via) -> Result<UserRow> {
    if !state.config.password_sign_in {
        return Err(Error::IdentityRefused {
            reason: "password sign-in is turned off here; sign in through your identity provider".into(),
        });
    }
    let throttle = &state.sign_in_throttle;
    throttle.check(username, client, Instant::now()).map_err(|retry_after| Error::Throttled { retry_after })?;
    let verdict = check_password(state, username, password).await;
    let (actor, action) = match &verdict {
        Ok(user) => {
            throttle.succeeded(username, client);
            (format!("user:{}", user.username), "user.sign_in")
        }
        Err(Error::InvalidCredentials) => {
            throttle.failed(username, client, Instant::now());
            ("anonymous".to_owned(), "user.sign_in_failed")
        }
        Err(_) => return verdict,
    };
    let name: String = username.chars().take(AUDITED_NAME_CHARS).collect();
    let mut tx = state.db.begin().await?;
    db::audit::record(
        &mut tx,
        Change {
            actor: &actor,
            action,
            object_type: "user",
            object_id: &name,
            team_id: None,
            before: None,
            after: Some(json!({"via": via.as_str(), "address": client})),
        },
    )
    .await?;
    tx.commit().await?;
    verdict
}

async fn check_password(state: &AppState, username: &str, password: String) -> Result<UserRow> {
    let user = db::users::by_username(&state.db, username).await?;
    match user {
        Some(user) if !user.disabled => {
            let stored = user.password_hash.clone();
            let ok = off_thread(move || password::verify(&password, &stored)).await?;
            ok.then_some(user).ok_or(Error::InvalidCredentials)
        }
        _ => {
            off_thread(move || password::verify_dummy(&password)).await?;
            Err(Error::InvalidCredentials)
        }
    }
}
